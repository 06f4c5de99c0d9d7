"""One kit per destination kind for the shared contract suite (tests/test_destination_contract.py),
and what the per-kind adapter tests share."""

import itertools

from ticketing.destinations import ADAPTERS, adapter_for

# Every kind that calls a desk over HTTP: one kit each, named after the kind (tests/test_registries.py).
KINDS = tuple(kind for kind in ADAPTERS if kind != "builtin")


def adapter_builder(kit, tenant, desk, monkeypatch):
    """`build(**settings)`: an adapter for a new destination of `kit`'s kind against `desk` (its own slug each)."""
    slugs = itertools.count(1)

    def build(**settings):
        return adapter_for(kit.configure(tenant, desk, monkeypatch, slug=f"desk-{next(slugs)}", **settings))

    return build


def only_record(desk) -> dict:
    [record] = desk.tickets()
    return record

"""What each destination kind declares it does with files, people, closed tickets and its quota
(`capabilities`) is what its page in docs/destinations says, and every kind is in the contract suites."""

from pathlib import Path

import pytest

from tests.destination_kits import KINDS
from ticketing.destinations import adapter_class
from ticketing.destinations.capabilities import CLOSED_POLICIES, MB
from ticketing.models import DestinationKind

DOCS = Path(__file__).resolve().parent.parent / "docs" / "destinations"


@pytest.mark.parametrize("kind", DestinationKind.values)
def test_every_kind_has_its_page_naming_its_limits_and_policies(kind):
    page = DOCS / f"{kind}.md"
    assert page.exists(), f"docs/destinations/{kind}.md is missing"
    text = page.read_text()
    capabilities = adapter_class(kind).capabilities
    if capabilities.files != "none":
        assert f"{capabilities.max_file_bytes // MB} MB" in text, "the per-file limit"
    if capabilities.requests_per_minute:
        assert f"{capabilities.requests_per_minute:,}" in text or str(capabilities.requests_per_minute) in text
    for policy in capabilities.closed_policies:
        assert policy in text, f"closed policy {policy}"
    assert "closed_policy" in text and "acknowledge" in text


@pytest.mark.parametrize("kind", DestinationKind.values)
def test_every_kind_declares_what_it_can_do(kind):
    capabilities = adapter_class(kind).capabilities
    assert capabilities.files in ("none", "with_write", "after_write")
    assert set(capabilities.closed_policies) <= set(CLOSED_POLICIES) and "review" in capabilities.closed_policies
    assert capabilities.default_closed_policy in capabilities.closed_policies
    assert capabilities.requester in ("address", "find_or_create")


def test_every_external_kind_is_in_the_contract_suites():
    assert set(KINDS) == set(DestinationKind.values) - {DestinationKind.BUILTIN}

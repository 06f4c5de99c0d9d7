"""One list per extension point, and every copy bound to it: a destination kind is registered once
(`ticketing.destinations.ADAPTERS`); its model choice, FakeDesk dialect and contract-suite kit must follow,
or this fails and names what is missing (docs/extending.md, the checklist). Its page under docs/destinations/
and its declared capabilities: tests/test_capabilities.py. A mail provider likewise: `intake.providers.PROVIDERS`
against `Mailbox.Provider` and the settings schemas.

Pure: no database; the adapter classes and the kits are imported, nothing is called.
"""

import importlib
import inspect
from pathlib import Path

import pytest

from fakedesk.dialects import DIALECTS, handler_for
from fakedesk.handler import Handler
from intake.models import MailboxProvider
from intake.providers import PROVIDERS, provider_class
from intake.providers.base import Provider
from intake.providers.settings_schema import SCHEMAS
from tests.destination_kits import KINDS
from ticketing.destinations import ADAPTERS, adapter_class
from ticketing.destinations.base import DestinationAdapter
from ticketing.models import DestinationKind

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_every_registered_kind_is_a_model_choice_and_every_choice_has_an_adapter():
    assert set(DestinationKind.values) == set(ADAPTERS)


@pytest.mark.parametrize("kind", sorted(ADAPTERS))
def test_each_kind_loads_an_adapter_class(kind):
    adapter = adapter_class(kind)
    assert inspect.isclass(adapter) and issubclass(adapter, DestinationAdapter), ADAPTERS[kind]


def test_fakedesk_speaks_every_remote_kind_and_nothing_else():
    assert set(DIALECTS) == set(KINDS)
    for kind in KINDS:
        assert issubclass(handler_for(kind), Handler), kind


@pytest.mark.parametrize("kind", KINDS)
def test_each_remote_kind_has_a_contract_kit_speaking_its_dialect(kind):
    kit = importlib.import_module(f"tests.destination_kits.{kind}")
    assert kit.DIALECT == kind
    assert callable(kit.configure)


def test_no_kit_is_left_without_a_kind():
    kits = {path.stem for path in (REPO_ROOT / "tests" / "destination_kits").glob("*.py") if path.stem != "__init__"}
    assert kits == set(KINDS)


def test_every_provider_but_the_raw_webhook_has_an_adapter_and_every_one_a_settings_schema():
    assert set(PROVIDERS) == set(MailboxProvider.values) - {MailboxProvider.RAW}
    assert set(SCHEMAS) == set(MailboxProvider.values)


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_each_provider_loads_an_adapter_class(name):
    provider = provider_class(name)
    assert inspect.isclass(provider) and issubclass(provider, Provider), PROVIDERS[name]


def test_the_intent_states_the_event_sweep_leaves_to_the_intent_are_intent_states():
    """intake cannot import ticketing (layering), so the stale sweep names them as words; bound here."""
    from intake.services.sweeps import INTENT_STATES_WATCHED_BY_THE_INTENT
    from ticketing.models import Intent

    assert set(INTENT_STATES_WATCHED_BY_THE_INTENT) == {
        Intent.State.PENDING,
        Intent.State.IN_FLIGHT,
        Intent.State.RETRY_WAIT,
    }


def test_the_outcomes_that_name_a_state_are_that_states_stored_word():
    """An outcome that says where an event or intent was left is spelled as that state is stored."""
    from intake.models import InboxEvent
    from ticketing.models import Intent
    from ticketing.outcomes import Outcome

    assert {Outcome.SUPPRESSED, Outcome.AWAITING_REVIEW, Outcome.QUARANTINED} <= set(InboxEvent.State.values)
    assert {Outcome.RETRY_WAIT, Outcome.FAILED, Outcome.UNKNOWN} <= set(Intent.State.values)
    # What normalize can leave an event in, other than ready, is an outcome word (or finished: DONE).
    assert {s for s in InboxEvent.State.values if s not in InboxEvent.OPEN_STATES} - {Outcome(o) for o in Outcome} == {
        InboxEvent.State.COMPLETED
    }

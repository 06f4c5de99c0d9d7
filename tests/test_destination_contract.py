"""One contract, every destination kind: each adapter against its FakeDesk dialect over real HTTP,
driven through the pipeline (`process_inbox_event`, the sweeps' `resolve_unknown`, an operator's
correction), never by calling the adapter alone.

What each kind may do with a lost answer depends on what its system offers (docs/design.md §6,
`PROTECTION` in its kit, tests/destination_kits/<kind>.py):
    key               the destination keeps our idempotency key: the retry is answered with the original
    upsert            the create is an insert-or-update on our key: the retry updates the one record
    consistent_lookup a lookup by our reference sees the record at once: found -> settled, none -> retried
    lagging_search    a search that lags: asked after the settle delay; found -> settled, none -> held
    none              nothing: held for a person
In every case: never two records for one message.
"""

import importlib
from datetime import timedelta

import pytest
from django.utils import timezone

from intake.models import InboxEvent
from reconciliation import services as console
from reconciliation.selectors import recovery_queue
from tests.destination_kits import KINDS
from tests.factories import email_message, ingest_message
from tests.support.contract import intent_of, settle_unknown
from tests.support.users import make_user
from ticketing import budget
from ticketing.destinations import adapter_for
from ticketing.models import Intent, RoutingPolicy, TicketMapping
from ticketing.services import process_inbox_event

pytestmark = pytest.mark.usefixtures("scanner_off")


class Contract:
    """One kind's destination against its running fake, and the kit that reads the fake's records."""

    def __init__(self, kit, desk, destination):
        self.kit, self.desk, self.destination = kit, desk, destination

    def records(self) -> list[dict]:
        return self.desk.tickets()

    def record_writes(self) -> list[dict]:
        return self.desk.requests_log()


@pytest.fixture(params=KINDS)
def contract(request, tenant, mailbox, desk_factory, monkeypatch):
    kit = importlib.import_module(f"tests.destination_kits.{request.param}")
    desk = desk_factory(dialect=kit.DIALECT, **kit.DESK_OPTIONS)
    return Contract(kit, desk, kit.configure(tenant, desk, monkeypatch))


@pytest.fixture
def operator(tenant):
    RoutingPolicy.objects.filter(tenant=tenant).update(queues=["billing", "tech"], request_types=["refund"])
    return make_user("oper", groups=["operator"], tenants=[tenant])


def new_event(mailbox, **fields) -> int:
    fields.setdefault("sender", "Alice Example <alice@customer.test>")
    fields.setdefault("subject", "Invoice 4471 charged twice")
    return ingest_message(mailbox, **fields).inbox_event_id


def assert_mapped_to_the_one_record(contract, event_id):
    [record] = contract.records()
    mapping = TicketMapping.objects.get(inbox_event_id=event_id, action="create_ticket")
    assert mapping.ticket_id == contract.kit.ticket_id_of(record)
    assert record["external_id"] == intent_of(event_id).external_ref
    assert InboxEvent.objects.get(pk=event_id).state == "completed"
    return record


# --- the happy path and duplicates ---------------------------------------------------------------


def test_create_makes_one_record_carrying_our_reference(contract, mailbox):
    event_id = new_event(mailbox, body="The invoice shows the same line twice.\n")
    assert process_inbox_event(event_id) == "created"
    record = assert_mapped_to_the_one_record(contract, event_id)
    assert "Invoice 4471" in record["subject"]
    assert "alice@customer.test" in str(record["requester"]) + str(record["fields"])
    assert intent_of(event_id).state == "succeeded"


def test_a_duplicate_delivery_and_a_redelivered_task_make_one_record(contract, mailbox):
    raw = email_message(subject="Password reset loop", sender="bob@customer.test")
    first = ingest_message(mailbox, raw=raw)
    again = ingest_message(mailbox, raw=raw)
    assert again.duplicate and again.inbox_event_id == first.inbox_event_id
    assert process_inbox_event(first.inbox_event_id) == "created"
    assert process_inbox_event(first.inbox_event_id) == "done"  # the broker delivered the task twice
    assert_mapped_to_the_one_record(contract, first.inbox_event_id)
    assert len([w for w in contract.record_writes() if w["committed"]]) == 1


# --- lost answers --------------------------------------------------------------------------------


def test_a_response_lost_after_the_commit_ends_in_one_record_or_a_held_item(contract, mailbox):
    contract.desk.set_plan(["drop_after_commit"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"
    assert len(contract.records()) == 1  # the destination has it; we do not know
    final = settle_unknown(event_id)
    assert len(contract.records()) == 1, "never two"
    if contract.kit.PROTECTION == "none":
        assert final == "held"
        assert [e.pk for e in recovery_queue()] == [event_id]
    else:
        assert final == "succeeded"
        assert_mapped_to_the_one_record(contract, event_id)


def test_a_request_lost_before_the_commit_is_made_once_or_held_never_twice(contract, mailbox):
    contract.desk.set_plan(["drop_before_commit"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"
    assert contract.records() == []
    final = settle_unknown(event_id)
    if contract.kit.PROTECTION in ("key", "upsert", "consistent_lookup"):
        assert final == "succeeded"
        assert_mapped_to_the_one_record(contract, event_id)
    else:  # a lagging search that finds nothing is doubt; no protection at all is doubt
        assert final == "held" and contract.records() == []
        event = InboxEvent.objects.get(pk=event_id)
        assert event.state == "unknown" and event in recovery_queue()


# --- refusals ------------------------------------------------------------------------------------


def test_429_waits_as_long_as_retry_after_says_then_makes_one_record(contract, mailbox):
    contract.desk.set_plan(["rate_limit:30"])
    event_id = new_event(mailbox)
    process_inbox_event(event_id)
    intent = intent_of(event_id)
    assert intent.state == "retry_wait" and intent.last_error_kind.endswith("rate_limited")
    assert intent.next_attempt_at >= timezone.now() + timedelta(seconds=28)
    assert process_inbox_event(event_id) != "created"  # not due yet: no second call
    assert len(contract.record_writes()) == 1
    Intent.objects.filter(pk=intent.pk).update(next_attempt_at=timezone.now())
    budget.forget(contract.destination)  # the Retry-After has passed for every worker too (ticketing.budget)
    assert process_inbox_event(event_id) == "created"
    assert_mapped_to_the_one_record(contract, event_id)


def test_401_fails_for_an_operator_and_writes_nothing(contract, mailbox):
    contract.desk.set_plan(["unauthorized_401"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "failed"
    event = InboxEvent.objects.get(pk=event_id)
    assert (event.state, event.reason_code) == ("failed", "credentials")
    assert intent_of(event_id).state == "failed" and contract.records() == []
    assert event in recovery_queue()


def test_422_is_a_field_error_kept_for_the_operator_and_never_retried(contract, mailbox):
    contract.desk.set_plan(["reject_422"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "failed"
    intent = intent_of(event_id)
    assert intent.last_error_kind.endswith("invalid_fields") and intent.last_error
    assert InboxEvent.objects.get(pk=event_id).reason_code == "invalid_fields"
    assert process_inbox_event(event_id) == "done"
    assert len(contract.record_writes()) == 1 and contract.records() == []


# --- threads and corrections ----------------------------------------------------------------------


def test_a_reply_in_the_thread_becomes_a_comment_on_the_record(contract, mailbox):
    original = new_event(mailbox, message_id="<root-4471@customer.test>")
    assert process_inbox_event(original) == "created"
    reply = new_event(
        mailbox,
        subject="Re: Invoice 4471 charged twice",
        body="Still charged twice today.\n",
        extra_headers={"In-Reply-To": "<root-4471@customer.test>", "References": "<root-4471@customer.test>"},
    )
    assert process_inbox_event(reply) == "created"
    [record] = contract.records()
    [comment] = contract.kit.comments_of(record)
    assert "Still charged twice today." in comment
    mapping = TicketMapping.objects.get(inbox_event_id=reply)
    assert mapping.action == "add_comment"
    assert mapping.ticket_id == contract.kit.ticket_id_of(record)


def test_a_corrected_queue_and_priority_reach_the_record(contract, mailbox, operator):
    contract.desk.set_plan(["reject_422"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "failed"
    key = intent_of(event_id).idempotency_key
    assert (
        console.do_correct_and_replay(
            operator, event_id, destination_id=contract.destination.pk, queue="billing", priority="urgent"
        )
        == "reopened"
    )
    assert process_inbox_event(event_id) == "created"
    assert intent_of(event_id).idempotency_key == key
    record = assert_mapped_to_the_one_record(contract, event_id)
    assert contract.kit.route_of(record) == {"queue": "billing", "priority": "urgent"}


def test_check_connection_reads_and_writes_nothing(contract):
    said = adapter_for(contract.destination).check_connection()
    assert isinstance(said, str) and said
    assert contract.records() == [] and contract.record_writes() == []

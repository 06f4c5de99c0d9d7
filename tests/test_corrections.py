"""Corrections reach the ticket: a route an operator corrects (queue, priority, request type,
destination) is what the replay sends, under the intent's key (`ticketing.replay.replay_same_key`).

FakeDesk speaks Zendesk over HTTP; what it received is read from its request hook.
"""

import pytest
from django.utils import timezone

from intake.models import AuditEvent, InboxEvent
from intake.vocabulary import ReasonCode
from reconciliation import services as console
from tests.factories import ingest_message, make_desk_destination
from tests.support.queue import set_default, zendesk_destinations
from tests.support.users import make_user
from ticketing import intents
from ticketing.models import Destination, Intent, RoutingPolicy, Ticket
from ticketing.services import process_inbox_event

pytestmark = pytest.mark.usefixtures("scanner_off")
GROUPS = {"billing": 360001, "tech": 360002}


@pytest.fixture
def operator(tenant):
    RoutingPolicy.objects.filter(tenant=tenant).update(queues=["billing", "tech"], request_types=["refund"])
    return make_user("oper", groups=["operator"], tenants=[tenant])


@pytest.fixture
def creates(desk):
    """(Idempotency-Key, ticket body) of every create FakeDesk received."""
    seen = []
    desk.on_request(
        lambda r: (
            seen.append((r.headers.get("Idempotency-Key"), (r.json() or {}).get("ticket")))
            if r.method == "POST" and r.path.endswith("/tickets.json")
            else None
        )
    )
    return seen


def new_event(mailbox, subject="Invoice wrong") -> int:
    return ingest_message(mailbox, subject=subject, sender="alice@customer.test").inbox_event_id


def intent_of(event_id) -> Intent:
    return Intent.objects.filter(inbox_event_id=event_id, action="create_ticket").order_by("-action_version").first()


def replayed_row(event_id) -> AuditEvent:
    return AuditEvent.objects.filter(inbox_event_id=event_id, kind="replayed").latest("pk")


def test_corrected_queue_and_priority_reach_zendesk_under_the_same_key_after_a_rejected_create(
    mailbox, desk, monkeypatch, operator, creates
):
    destination = make_desk_destination(mailbox.tenant, desk, monkeypatch, groups=GROUPS)
    desk.set_plan(["reject_422"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "failed"
    key = intent_of(event_id).idempotency_key

    assert (
        console.do_correct_and_replay(
            operator, event_id, destination_id=destination.pk, queue="billing", priority="urgent"
        )
        == "reopened"
    )
    row = replayed_row(event_id)
    assert row.actor == "user:oper"
    assert row.detail["corrected"]["queue"] == {"from": None, "to": "billing"}
    assert row.detail["corrected"]["priority"]["to"] == "urgent"
    assert "destination_id" not in row.detail["corrected"]  # unchanged

    assert process_inbox_event(event_id) == "created"
    assert intent_of(event_id).idempotency_key == key  # the same key: FakeDesk kept none for the 422
    sent_key, ticket = creates[-1]
    assert sent_key == key and (ticket["priority"], ticket["group_id"]) == ("urgent", GROUPS["billing"])
    assert [k for k, _ in creates] == [key, key]
    assert len(desk.tickets()) == 1


def test_a_new_destination_keeps_the_key_and_the_corrected_fields_go_through_after_a_401(
    mailbox, desk, monkeypatch, operator, creates
):
    good, bad = zendesk_destinations(mailbox.tenant, desk, monkeypatch)
    Destination.objects.filter(pk=good.pk).update(settings={**good.settings, "groups": GROUPS})
    set_default(mailbox.tenant, bad)
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "failed"  # revoked token: 401 before any write
    before = intent_of(event_id)

    console.do_correct_and_replay(operator, event_id, destination_id=good.pk, queue="tech", priority="high")
    after = intent_of(event_id)
    assert (after.pk, after.idempotency_key, after.action_version, after.destination_id) == (
        before.pk,
        before.idempotency_key,
        1,
        good.pk,
    )
    row = replayed_row(event_id)
    assert row.detail["corrected"]["destination_id"] == {"from": bad.pk, "to": good.pk}
    assert process_inbox_event(event_id) == "created"
    sent_key, ticket = creates[-1]
    assert sent_key == before.idempotency_key
    assert (ticket["priority"], ticket["group_id"]) == ("high", GROUPS["tech"])
    assert len(desk.tickets()) == 1


def test_corrected_queue_and_priority_appear_on_the_builtin_ticket(mailbox, desk, monkeypatch, operator):
    builtin = Destination.objects.get(tenant=mailbox.tenant, slug="builtin")
    _, bad = zendesk_destinations(mailbox.tenant, desk, monkeypatch)
    set_default(mailbox.tenant, bad)
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "failed"
    console.do_correct_and_replay(
        operator, event_id, destination_id=builtin.pk, queue="billing", priority="high", request_type="refund"
    )
    assert process_inbox_event(event_id) == "created"
    [ticket] = Ticket.objects.all()
    assert (ticket.queue, ticket.priority, ticket.request_type) == ("billing", "high", "refund")
    assert ticket.idempotency_key == intent_of(event_id).idempotency_key


def test_a_corrected_body_under_a_key_that_already_made_a_ticket_never_makes_a_second(
    mailbox, desk, monkeypatch, operator, creates
):
    destination = make_desk_destination(mailbox.tenant, desk, monkeypatch, groups=GROUPS)
    desk.set_plan(["drop_after_commit"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"  # the ticket exists; the answer was lost
    intent = intent_of(event_id)
    assert intents.hold(intent, timezone.now(), "system:test", ReasonCode.OUTCOME_UNKNOWN) == "held"

    # It was unknown once, so the replay asks Zendesk first: the ticket is found and linked, nothing is sent
    # (the same key with the corrected body would meet IdempotentRequestError, never a second create).
    assert (
        console.do_correct_and_replay(operator, event_id, destination_id=destination.pk, priority="urgent") == "linked"
    )
    assert process_inbox_event(event_id) == "done" and len(creates) == 1
    assert InboxEvent.objects.get(pk=event_id).state == "completed"
    assert len(desk.tickets()) == 1 and intent_of(event_id).result_ref == str(desk.tickets()[0]["id"])

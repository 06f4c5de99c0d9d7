"""The AI proposer inside the pipeline, against the stub chat-completions server over real HTTP.

For every kind of answer a model can give, a message ends as specified: a good
proposal fills the open fields (origin "ai"), a low-confidence one sends the item
to review with the proposal kept, and every failure leaves the fields to the
tenant's defaults with the reason recorded. No answer loses, suppresses or
desensitises a message.
"""

import pytest

from intake.keys import provider_message_id_for_raw
from intake.models import InboxEvent
from intake.services import ingest
from tests.fake_chat import fake_chat  # noqa: F401  (the fixture)
from tests.mail import make_message
from ticketing.classification import ai
from ticketing.models import RoutingPolicy, Ticket
from ticketing.services import process_inbox_event

GOOD = {
    "queue": "billing",
    "priority": "high",
    "request_type": "refund",
    "confidence": 0.93,
    "rationale": "The customer asks for money back on an invoice.",
}


@pytest.fixture
def ai_tenant(mailbox, settings, fake_chat):  # noqa: F811
    settings.MAILROOM_CLAMD = "off"
    settings.MAILROOM_AI_TIMEOUT_SECONDS = 0.5
    RoutingPolicy.objects.filter(tenant=mailbox.tenant).update(
        queues=["billing", "support"],
        request_types=["refund", "outage"],
        sensitive_request_types=["refund"],
        default_queue="support",
        default_priority="normal",
        default_request_type="outage",
        ai_enabled=True,
        ai_min_confidence=0.7,
    )
    return mailbox


def deliver(mailbox) -> InboxEvent:
    raw = make_message(subject="Invoice 42 charged twice", body="Please refund the second charge of EUR 49.\n")
    event_id = ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id
    process_inbox_event(event_id)
    return InboxEvent.objects.get(pk=event_id)


def test_a_good_proposal_fills_the_open_fields_and_sensitivity_follows_the_request_type(ai_tenant, fake_chat):  # noqa: F811
    fake_chat.answer_json(GOOD)
    event = deliver(ai_tenant)
    assert (event.state, event.reason_code) == ("completed", "")
    ticket = Ticket.objects.get()
    assert (ticket.queue, ticket.priority, ticket.request_type) == ("billing", "high", "refund")
    assert "needs-approval" in ticket.tags  # refund is a sensitive request type
    assert {name: field["origin"] for name, field in event.route["fields"].items() if name != "assignee"} == {
        "queue": "ai",
        "priority": "ai",
        "request_type": "ai",
    }


def test_a_low_confidence_proposal_goes_to_review_with_the_proposal_kept(ai_tenant, fake_chat):  # noqa: F811
    fake_chat.answer_json({**GOOD, "confidence": 0.31})
    event = deliver(ai_tenant)
    assert (event.state, event.reason_code) == ("awaiting_review", "low_confidence")
    assert event.route["ai"]["fields"]["queue"] == "billing" and event.route["ai"]["confidence"] == 0.31
    assert Ticket.objects.count() == 0


@pytest.mark.parametrize(
    "answer, failure",
    [
        ("this is not json {", ai.INVALID_JSON),
        (
            '{"queue": "legal", "priority": "high", "request_type": "refund", "confidence": 0.9, "rationale": "x"}',
            ai.OUT_OF_VOCABULARY,
        ),
        (
            '{"queue": "billing", "priority": "high", "request_type": "refund", "confidence": 0.9, "rationale": "x", '
            '"sensitive": false}',
            ai.SCHEMA,
        ),
        ('{"action": "drop", "reason": "this mail is spam, delete it", "confidence": 0.99}', ai.SCHEMA),
        ("stall", ai.TIMEOUT),
        ("http 500", ai.HTTP_ERROR),
    ],
    ids=["invalid-json", "outside-the-enums", "extra-fields", "says-drop", "stall", "http-500"],
)
def test_every_failure_leaves_the_fields_to_the_defaults_and_the_message_becomes_a_ticket(
    ai_tenant, fake_chat, answer, failure
):  # noqa: F811
    if answer == "stall":
        fake_chat.stall(3)
    elif answer == "http 500":
        fake_chat.status(500)
    else:
        fake_chat.answer_content(answer)
    event = deliver(ai_tenant)
    assert (event.state, event.reason_code) == ("completed", "")
    ticket = Ticket.objects.get()
    assert (ticket.queue, ticket.priority, ticket.request_type) == ("support", "normal", "outage")
    assert event.route["ai"]["failure"] == failure
    assert {field["origin"] for name, field in event.route["fields"].items() if name != "assignee"} == {"default"}
    assert len(fake_chat.requests) == 1


def test_the_console_shows_each_field_with_where_it_came_from(ai_tenant, fake_chat, admin_client):  # noqa: F811
    fake_chat.answer_json({**GOOD, "confidence": 0.31})
    event = deliver(ai_tenant)
    page = admin_client.get(f"/admin/reconciliation/recoveryitem/{event.pk}/change/").content.decode()
    route = page.split('id="item-classified-route"', 1)[1].split("</dd>", 1)[0]
    # Low confidence: the proposal is not applied, the defaults stand until a person decides.
    assert "queue: <strong>support</strong> <small>(default)</small>" in route
    assert "priority: <strong>normal</strong> <small>(default)</small>" in route

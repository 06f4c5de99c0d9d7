"""Acknowledgments reach a real SMTP server: one per completed ticket, never for anything else.

The mail here comes from senders our MTA authenticated (`tests.senderauth`): only they are acknowledged
(tests/test_ack_policy.py shows a forged From getting nothing).
"""

import pytest

from intake.models import AuditEvent, InboxEvent
from tests.mail import make_message
from tests.senderauth import trust_our_mta
from tests.smtp import smtp_server  # noqa: F401  (fixture)
from tests.support.acks import notify_intent, post
from ticketing import acknowledgments
from ticketing.models import Intent, TicketMapping
from ticketing.services import process_inbox_event


@pytest.fixture(autouse=True)
def _our_mta_is_trusted(mailbox):
    trust_our_mta(mailbox)


def test_one_acknowledgment_per_ticket_even_when_sent_twice(mailbox, smtp_server, settings):
    event_id = post(
        make_message(subject="Printer on fire", sender="jane@example.com", message_id="<orig-1@example.com>")
    )
    assert process_inbox_event(event_id) == "created"
    intent = notify_intent(event_id)
    assert acknowledgments.send(intent.pk, "worker-a") == "sent"
    assert acknowledgments.send(intent.pk, "worker-b") == "busy"
    [ack] = smtp_server.messages
    mapping = TicketMapping.objects.get(inbox_event_id=event_id)
    assert ack["To"] == "jane@example.com"
    assert ack["Subject"] == f"[#MR-{mapping.pk}] Re: Printer on fire"
    assert ack["Auto-Submitted"] == "auto-replied"
    assert ack[settings.MAILROOM_LOOP_HEADER] == settings.MAILROOM_INSTANCE_ID
    assert ack["In-Reply-To"] == "<orig-1@example.com>"
    assert "within" not in ack.get_content()  # no SLA on the route: no promise
    assert notify_intent(event_id).state == "succeeded"
    assert AuditEvent.objects.filter(inbox_event_id=event_id, kind="acknowledged").count() == 1


def test_sla_on_the_route_is_stated(mailbox, smtp_server):
    from ticketing.models import Destination

    Destination.objects.update(settings={"sla_hours": 8})
    event_id = post(make_message())
    process_inbox_event(event_id)
    acknowledgments.send(notify_intent(event_id).pk, "worker-a")
    assert "We aim to answer within 8 hours." in smtp_server.messages[0].get_content()


def test_no_acknowledgment_without_a_ticket(mailbox, smtp_server):
    event_id = post(make_message())
    InboxEvent.objects.filter(pk=event_id).update(state="suppressed", reason_code="auto_submitted")
    assert process_inbox_event(event_id) == "done"
    assert not Intent.objects.filter(action="notify_requester").exists()
    assert smtp_server.messages == []


def test_smtp_down_is_retried_later_not_lost(mailbox, smtp_server, settings):
    from tests.live import free_port

    event_id = post(make_message())
    process_inbox_event(event_id)
    intent = notify_intent(event_id)
    settings.EMAIL_PORT = free_port()  # nothing listens there
    assert acknowledgments.send(intent.pk, "worker-a") == "retry_wait"
    assert notify_intent(event_id).state == "retry_wait"
    assert InboxEvent.objects.get(pk=event_id).state == "completed"  # the ticket stands
    assert smtp_server.messages == []


def test_mailbox_can_turn_acknowledgments_off(mailbox, smtp_server):
    mailbox.settings = {**mailbox.settings, "acknowledge": False}
    mailbox.save()
    event_id = post(make_message())
    assert process_inbox_event(event_id) == "created"
    assert not Intent.objects.filter(action="notify_requester").exists()


def test_through_the_pipeline_only_completed_tickets_are_acknowledged_once(mailbox, smtp_server, settings):
    from ticketing.tasks import send_acknowledgment

    settings.MAILROOM_CLAMD = "off"
    mailbox.allowed_recipients = ["support@acme.test"]
    mailbox.save()
    bodies = [
        make_message(sender="a@example.com"),
        make_message(sender="b@example.com"),
        make_message(sender="c@example.com", extra_headers={"Auto-Submitted": "auto-replied"}),  # suppressed
        make_message(sender="d@example.com", to="elsewhere@acme.test"),  # review
        make_message(sender="e@example.com", extra_headers={"Precedence": "bulk"}),  # suppressed
    ]
    ids = [post(body) for body in bodies]
    for event_id in ids:
        process_inbox_event(event_id)
    for intent in Intent.objects.filter(action="notify_requester"):
        send_acknowledgment(intent.pk)
        send_acknowledgment(intent.pk)  # delivered twice
    assert sorted(m["To"] for m in smtp_server.messages) == ["a@example.com", "b@example.com"]
    states = sorted(InboxEvent.objects.values_list("state", flat=True))
    assert states == ["awaiting_review", "completed", "completed", "suppressed", "suppressed"]

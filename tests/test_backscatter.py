"""No backscatter: mail that no person sent, or that is not theirs, makes a ticket but no acknowledgment.

Only senders our MTA authenticated are acknowledged at all (tests/test_ack_policy.py); the cases here are
the other reasons, which hold whatever the authentication says.

Every case goes through the real pipeline (webhook, normalization, the built-in
destination, the acknowledgment task against a real SMTP server) and is
checked where it lands: the ticket, the mail server, the intents, the audit.
"""

import logging

import pytest
from django.test import Client

from intake.models import AuditEvent, InboxEvent, Mailbox
from tests.conftest import WEBHOOK_SECRET
from tests.mail import make_message, webhook_headers
from tests.smtp import smtp_server  # noqa: F401  (fixture)
from ticketing import ack_policy
from ticketing.models import Intent, Ticket, TicketMapping
from ticketing.services import process_inbox_event
from ticketing.tasks import send_acknowledgment

TRUSTED = "mx.acme.test"
# What normalization stores from our MTA's header for a sender of example.com that passed DMARC.
AUTHENTICATED = {"dmarc": "pass", "dmarc.header.from": "example.com"}


@pytest.fixture(autouse=True)
def _setup(settings, mailbox):
    settings.MAILROOM_CLAMD = "off"
    mailbox.settings = {"trusted_authserv_id": TRUSTED}
    mailbox.save()


def post(body) -> int:
    response = Client().post(
        "/webhooks/raw/support/", data=body, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, body)
    )
    assert response.status_code == 202
    return response.json()["inbox_event_id"]


def deliver(**message) -> int:
    """One message through the pipeline, then every acknowledgment there is, sent (twice, as a redelivery would)."""
    event_id = post(make_message(**message))
    assert process_inbox_event(event_id) == "created"
    assert process_inbox_event(event_id) == "done"
    for intent in Intent.objects.filter(action="notify_requester"):
        send_acknowledgment(intent.pk)
        send_acknowledgment(intent.pk)
    return event_id


def assert_ticket_without_acknowledgment(event_id, smtp_server, reason):
    mapping = TicketMapping.objects.get(inbox_event_id=event_id, action="create_ticket")
    assert Ticket.objects.filter(pk=int(mapping.ticket_id)).exists()
    assert InboxEvent.objects.get(pk=event_id).state == "completed"
    assert smtp_server.messages == []
    assert not Intent.objects.filter(inbox_event_id=event_id, action="notify_requester").exists()
    [skipped] = AuditEvent.objects.filter(inbox_event_id=event_id, kind="acknowledgment_skipped")
    assert skipped.detail == {"reason": reason}
    assert not AuditEvent.objects.filter(inbox_event_id=event_id, kind="acknowledged").exists()


def authentication_results(authserv_id, dmarc):
    return (
        f"{authserv_id}; spf=pass smtp.mailfrom=example.com; dkim=pass header.d=example.com; "
        f"dmarc={dmarc} (p=reject dis=none) header.from=example.com"
    )


# --- a person writes: exactly one acknowledgment ---------------------------------------------


def test_a_normal_sender_gets_exactly_one_acknowledgment(smtp_server):
    event_id = deliver(
        sender="Jane Doe <jane@example.com>",
        extra_headers={
            "Authentication-Results": authentication_results(TRUSTED, "pass"),
            "X-Spam-Flag": "NO",
            "X-Spam-Status": "No, score=-0.1 required=5.0",
        },
    )
    [ack] = smtp_server.messages
    assert ack["To"] == "jane@example.com"
    assert Intent.objects.get(inbox_event_id=event_id, action="notify_requester").state == "succeeded"
    assert not AuditEvent.objects.filter(kind="acknowledgment_skipped").exists()
    assert AuditEvent.objects.filter(inbox_event_id=event_id, kind="acknowledged").count() == 1


# --- spam ---------------------------------------------------------------------------------------


def test_spamassassin_flag_means_no_acknowledgment(smtp_server):
    event_id = deliver(
        sender="winner@example.com",
        extra_headers={
            "X-Spam-Flag": "YES",
            "X-Spam-Status": "Yes, score=14.2 required=5.0 tests=BAYES_99,HTML_MESSAGE autolearn=spam version=3.4.6",
        },
    )
    assert_ticket_without_acknowledgment(event_id, smtp_server, "spam_flagged")


def test_spam_status_alone_means_no_acknowledgment(smtp_server):
    event_id = deliver(
        sender="winner@example.com", extra_headers={"X-Spam-Status": "Yes, score=7.9 required=5.0 tests=URIBL_BLACK"}
    )
    assert_ticket_without_acknowledgment(event_id, smtp_server, "spam_flagged")


# --- senders nobody reads -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sender",
    [
        "noreply@example.com",
        "no-reply@example.com",
        "No_Reply@example.com",
        "DoNotReply@shop.example",
        "do-not-reply@example.com",
        "noreply-alerts@monitoring.example",
        "no-reply.billing@example.com",
        "bounces+12345-abcd=acme.test@mailer.example",
        "bounce@lists.example",
        '"Example Notifications" <noreply@notifications.example>',
    ],
)
def test_noreply_senders_get_no_acknowledgment(smtp_server, sender):
    event_id = deliver(sender=sender)
    assert_ticket_without_acknowledgment(event_id, smtp_server, "noreply_sender")


def test_mailer_daemon_and_postmaster_never_become_acknowledged_tickets(smtp_server):
    # Validation already sets a mail system's own messages aside; the rule here is the second line.
    for sender in ("MAILER-DAEMON@mx.example.com", "postmaster@example.com"):
        event_id = post(make_message(sender=sender, subject="Undelivered Mail Returned to Sender"))
        process_inbox_event(event_id)
    assert not Intent.objects.filter(action="notify_requester").exists()
    assert smtp_server.messages == []
    event = InboxEvent(sender="MAILER-DAEMON@mx.example.com", mailbox=Mailbox(settings={}))
    assert ack_policy.acknowledgment_skip_reason(event) == "noreply_sender"
    event.sender = "postmaster@example.com"
    assert ack_policy.acknowledgment_skip_reason(event) == "noreply_sender"


def test_a_person_writing_from_postmaster_gets_a_ticket_but_no_acknowledgment(smtp_server):
    # No bounce evidence, so validation lets it through; an acknowledgment to postmaster@ is still backscatter.
    event_id = deliver(
        sender="Tomasz Wieczorek <postmaster@example.com>",
        subject="New relay from 1 July",
        body="Could you add our new relay mail2.example.com to your allow list?\n",
        extra_headers={"Authentication-Results": authentication_results(TRUSTED, "pass")},
    )
    assert_ticket_without_acknowledgment(event_id, smtp_server, "noreply_sender")


def test_a_local_part_that_only_contains_noreply_is_a_person():
    for sender in ("jane.noreply@example.com", "replyteam@example.com", "bouncer@example.com"):
        event = InboxEvent(sender=sender, mailbox=Mailbox(settings={}), auth_results=AUTHENTICATED)
        assert ack_policy.acknowledgment_skip_reason(event) is None, sender


# --- DMARC ------------------------------------------------------------------------------------------


def test_dmarc_fail_from_our_own_mta_means_no_acknowledgment(smtp_server):
    event_id = deliver(
        sender="ceo@example.com", extra_headers={"Authentication-Results": authentication_results(TRUSTED, "fail")}
    )
    assert InboxEvent.objects.get(pk=event_id).auth_results["dmarc"] == "fail"
    assert_ticket_without_acknowledgment(event_id, smtp_server, "dmarc_fail")


def test_a_forged_dmarc_fail_from_another_authserv_id_does_not_suppress_the_acknowledgment(smtp_server):
    # Anyone can write an Authentication-Results header; only our MTA's counts (RFC 8601 §5).
    message = make_message(
        sender="jane@example.com", extra_headers={"Authentication-Results": authentication_results(TRUSTED, "pass")}
    )
    forged = f"Authentication-Results: {authentication_results('mx.evil.example', 'fail')}\n".encode()
    event_id = post(forged + message)
    assert process_inbox_event(event_id) == "created"
    for intent in Intent.objects.filter(action="notify_requester"):
        send_acknowledgment(intent.pk)
    [ack] = smtp_server.messages
    assert ack["To"] == "jane@example.com"
    assert InboxEvent.objects.get(pk=event_id).auth_results["dmarc"] == "pass"
    assert not AuditEvent.objects.filter(kind="acknowledgment_skipped").exists()


def test_a_forged_dmarc_fail_alone_is_ignored(smtp_server):
    # Not believed either way: no dmarc_fail, but nothing authenticates the sender, so no acknowledgment.
    event_id = deliver(
        sender="jane@example.com",
        extra_headers={"Authentication-Results": authentication_results("mx.evil.example", "fail")},
    )
    assert InboxEvent.objects.get(pk=event_id).auth_results == {}
    assert_ticket_without_acknowledgment(event_id, smtp_server, "unauthenticated_sender")


# --- addresses we cannot write to -----------------------------------------------------------------


def test_an_invalid_sender_stored_by_an_earlier_normalization_gets_no_acknowledgment(smtp_server):
    # Today's parser never yields an invalid sender (the message goes to review as
    # missing_sender); an event normalized before it, carried on now, may hold one.
    event_id = post(make_message(sender="jane@localhost"))
    InboxEvent.objects.filter(pk=event_id).update(state="ready", sender="jane@localhost")
    assert process_inbox_event(event_id) == "created"
    for intent in Intent.objects.filter(action="notify_requester"):
        send_acknowledgment(intent.pk)
    assert_ticket_without_acknowledgment(event_id, smtp_server, "invalid_sender")


def test_an_unreadable_from_is_reviewed_not_acknowledged(smtp_server):
    event_id = post(make_message(sender="jane@@example.com"))
    assert process_inbox_event(event_id) == "awaiting_review"
    assert not Intent.objects.exists()
    assert smtp_server.messages == []


# --- the mailbox's own choice, and what is logged ---------------------------------------------------


def test_acknowledgments_turned_off_are_audited_as_disabled(smtp_server, mailbox):
    mailbox.settings = {"acknowledge": False}
    mailbox.save()
    event_id = deliver(sender="jane@example.com")
    assert_ticket_without_acknowledgment(event_id, smtp_server, "disabled")


def test_the_skip_is_logged_without_the_address(smtp_server, caplog):
    with caplog.at_level(logging.INFO, logger="ticketing.acknowledgments"):
        event_id = deliver(sender="noreply@secret-shop.example")
    assert f"event {event_id}: no acknowledgment (noreply_sender)" in caplog.text
    assert "secret-shop" not in caplog.text and "noreply@" not in caplog.text


def test_skip_reasons_in_order():
    mailbox = Mailbox(settings={})
    reason = ack_policy.acknowledgment_skip_reason
    assert reason(InboxEvent(sender="", mailbox=mailbox)) == "no_sender"
    assert (
        reason(InboxEvent(sender="jane@example.com", mailbox=mailbox, details={"spam_flagged": True})) == "spam_flagged"
    )
    assert (
        reason(
            InboxEvent(
                sender="jane@example.com",
                mailbox=mailbox,
                details={"spam_score": {"score": 9.0, "source": "X-Spam-Score", "threshold": 5.0}},
            )
        )
        == "spam_score"
    )
    assert (
        reason(InboxEvent(sender="noreply@example.com", mailbox=mailbox, auth_results={"dmarc": "fail"}))
        == "noreply_sender"
    )
    assert (
        reason(
            InboxEvent(
                sender="jane@example.com",
                mailbox=mailbox,
                auth_results={"dmarc": "fail"},
                details={"automated": {"reason": "list_mail", "evidence": "List-Id: <x.example.com>"}},
            )
        )
        == "list_mail"
    )
    assert (
        reason(InboxEvent(sender="jane@example.com", mailbox=mailbox, auth_results={"dmarc": "fail"})) == "dmarc_fail"
    )
    assert reason(InboxEvent(sender="jane@example", mailbox=mailbox)) == "invalid_sender"
    assert reason(InboxEvent(sender="jane@example.com", mailbox=mailbox)) == "unauthenticated_sender"
    assert reason(InboxEvent(sender="jane@example.com", mailbox=mailbox, auth_results={"dmarc": "pass"})) is None
    assert reason(InboxEvent(sender="jane@example.com", mailbox=Mailbox(settings={"acknowledge": False}))) == "disabled"
    assert ack_policy.wants_acknowledgment(
        InboxEvent(sender="jane@example.com", mailbox=mailbox, auth_results=AUTHENTICATED)
    )
    assert not ack_policy.wants_acknowledgment(InboxEvent(sender="jane@example.com", mailbox=mailbox))

"""Bounces of our own acknowledgments are tied to the ticket they answered (ticketing.bounces).

Every acknowledgment here really goes to an aiosmtpd server; the bounce is built from the header block
that server received (as the bouncing MTA returns it) and posted through the signed raw webhook, as any
mail is. The bounce itself stays suppressed; the original event gets `acknowledgment_bounced`, and a
failure for good marks the requester's address, so the next request is ticketed without an email.
"""

import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from intake import retention
from intake.models import AuditEvent, InboxEvent
from reconciliation.rendering import timeline_rows
from tests import bounce_mail
from tests.conftest import WEBHOOK_SECRET
from tests.corpus_manifest import CORPUS
from tests.factories import make_destination, make_mailbox, make_tenant
from tests.mail import make_message, webhook_headers
from tests.senderauth import stamped, trust_our_mta
from tests.smtp_envelopes import ascii_relay, utf8_relay  # noqa: F401  (fixtures)
from ticketing import acknowledgments, bounces
from ticketing.batch import process_plain
from ticketing.bounce_reports import read_report
from ticketing.models import Intent, UndeliverableAddress
from ticketing.services import process_inbox_event

JANE = "jane@example.com"


@pytest.fixture(autouse=True)
def _our_mta_is_trusted(mailbox, settings):
    trust_our_mta(mailbox)
    settings.MAILROOM_CLAMD = "off"  # a returned message/rfc822 counts as an attachment to scan


def post(raw: bytes, slug: str = "support") -> int:
    response = Client().post(
        f"/webhooks/raw/{slug}/", data=raw, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, raw)
    )
    assert response.status_code in (200, 202)  # 200: a duplicate delivery, answered with its first event
    return response.json()["inbox_event_id"]


def request_from(sender: str = JANE, subject: str = "Printer on fire") -> int:
    event_id = post(stamped(make_message(subject=subject, sender=sender)))
    assert process_inbox_event(event_id) == "created"
    return event_id


def acknowledged(relay, sender: str = JANE):
    """A request whose acknowledgment the relay received: (event id, its intent, what the relay got)."""
    event_id = request_from(sender)
    intent = Intent.objects.get(inbox_event_id=event_id, action="notify_requester")
    assert acknowledgments.send(intent.pk, "worker-a") == "sent"
    intent.refresh_from_db()
    return event_id, intent, relay.received[-1]


def bounced_rows(event_id: int):
    return AuditEvent.objects.filter(inbox_event_id=event_id, kind="acknowledgment_bounced")


def ack_reason(event_id: int) -> str | None:
    row = AuditEvent.objects.filter(inbox_event_id=event_id, kind="acknowledgment_skipped").first()
    return row.detail["reason"] if row else None


def test_a_postfix_dsn_of_our_acknowledgment_is_tied_to_the_ticket_and_marks_the_address(mailbox, ascii_relay, caplog):
    caplog.set_level(logging.INFO)
    original, intent, received = acknowledged(ascii_relay)
    bounce = post(bounce_mail.postfix_dsn(received.header_bytes(), JANE))
    assert process_inbox_event(bounce) == "suppressed"

    event = InboxEvent.objects.get(pk=bounce)
    assert (event.state, event.reason_code) == ("suppressed", "delivery_report")
    assert event.details["acknowledgment_bounce"]["event"] == original
    assert event.details["acknowledgment_bounce"]["ticket"].startswith("MR-")
    [row] = bounced_rows(original)
    assert row.detail["bounce_event"] == bounce and row.detail["intent"] == intent.pk
    assert (row.detail["status"], row.detail["action"]) == ("5.1.1", "failed")
    assert row.detail["diagnostic"].startswith("550 5.1.1 <***@example.com>: Recipient address rejected")
    assert row.detail["recipient_domain"] == "example.com"
    assert JANE not in str(row.detail)
    [mark] = UndeliverableAddress.objects.all()
    assert (mark.tenant_id, mark.address, mark.status, mark.bounced_event_id) == (
        mailbox.tenant_id,
        JANE,
        "5.1.1",
        bounce,
    )
    days = (mark.expires_at - timezone.now()) / timedelta(days=1)
    assert 29.9 < days <= 30
    assert not [r for r in caplog.records if JANE in r.getMessage() and r.name.startswith(("ticketing", "intake"))]


def test_a_second_request_from_a_bounced_address_is_ticketed_without_an_acknowledgment(mailbox, ascii_relay):
    _, _, received = acknowledged(ascii_relay)
    process_inbox_event(post(bounce_mail.postfix_dsn(received.header_bytes(), JANE)))
    second = request_from(JANE, subject="Still on fire")
    assert InboxEvent.objects.get(pk=second).state == "completed"
    assert not Intent.objects.filter(inbox_event_id=second, action="notify_requester").exists()
    assert ack_reason(second) == "address_bounced"
    # Someone else at the same domain is still acknowledged.
    other = request_from("bob@example.com")
    assert Intent.objects.filter(inbox_event_id=other, action="notify_requester").exists()


def test_the_mark_is_matched_whatever_the_case_of_the_address(mailbox, ascii_relay):
    _, _, received = acknowledged(ascii_relay, sender="Jane.Doe@Example.com")
    process_inbox_event(post(bounce_mail.postfix_dsn(received.header_bytes(), "Jane.Doe@Example.com")))
    assert list(UndeliverableAddress.objects.values_list("address", flat=True)) == ["jane.doe@example.com"]
    assert ack_reason(request_from("jane.doe@EXAMPLE.com", subject="Again")) == "address_bounced"


def test_an_expired_mark_skips_nothing_and_the_retention_sweep_deletes_it(mailbox, ascii_relay):
    _, _, received = acknowledged(ascii_relay)
    process_inbox_event(post(bounce_mail.postfix_dsn(received.header_bytes(), JANE)))
    UndeliverableAddress.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    later = request_from(JANE, subject="A month later")
    assert Intent.objects.filter(inbox_event_id=later, action="notify_requester").exists()
    assert retention.purge_expired_bodies()["marks"] == 1  # the hourly retention sweep deletes it
    assert not UndeliverableAddress.objects.exists()


def test_a_transient_delay_is_recorded_on_the_ticket_but_marks_nothing(mailbox, ascii_relay):
    original, _, received = acknowledged(ascii_relay)
    process_inbox_event(post(bounce_mail.postfix_delay(received.header_bytes(), JANE)))
    [row] = bounced_rows(original)
    assert (row.detail["status"], row.detail["action"]) == ("4.4.1", "delayed")
    assert "marked_until" not in row.detail
    assert not UndeliverableAddress.objects.exists()
    later = request_from(JANE, subject="Another one")
    assert Intent.objects.filter(inbox_event_id=later, action="notify_requester").exists()


@pytest.mark.parametrize(
    ("builder", "reason", "status"),
    [
        ("exim_dsn", "delivery_report", "5.0.0"),
        ("exim_plain", "mailer_daemon", "5.1.1"),
        ("qmail_plain", "mailer_daemon", "5.1.1"),
        ("gmail_dsn", "delivery_report", "5.1.1"),
        ("exchange_ndr", "delivery_report", "5.1.10"),
    ],
)
def test_bounces_as_each_mail_system_writes_them_are_tied(mailbox, ascii_relay, builder, reason, status):
    original, intent, received = acknowledged(ascii_relay)
    build = getattr(bounce_mail, builder)
    raw = (
        build(received.header_bytes(), JANE, intent.result_ref)
        if builder == "gmail_dsn"
        else build(received.header_bytes(), JANE)
    )
    bounce = post(raw)
    assert process_inbox_event(bounce) == "suppressed"
    assert InboxEvent.objects.get(pk=bounce).reason_code == reason
    [row] = bounced_rows(original)
    assert (row.detail["bounce_event"], row.detail["status"], row.detail["action"]) == (bounce, status, "failed")
    assert "@" not in row.detail["diagnostic"].replace("***@", "")
    assert UndeliverableAddress.objects.filter(address=JANE, bounced_event_id=bounce).exists()


def test_an_rfc_6533_dsn_of_an_acknowledgment_sent_with_smtputf8_marks_the_utf8_address(mailbox, utf8_relay):
    jose = "José@exämple.es"
    body = stamped(
        f"From: {jose}\r\nTo: support@acme.test\r\nSubject: Impresora\r\n"
        "Message-ID: <eai-7@xn--exmple-cua.es>\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"
        "No imprime.\r\n".encode(),
        domain="exämple.es",
    )
    original = post(body)
    assert process_inbox_event(original) == "created"
    intent = Intent.objects.get(inbox_event_id=original, action="notify_requester")
    assert acknowledgments.send(intent.pk, "worker-a") == "sent"
    [received] = utf8_relay.received
    bounce = post(bounce_mail.postfix_global_dsn(received.header_bytes(), jose))
    assert process_inbox_event(bounce) == "suppressed"
    [row] = bounced_rows(original)
    assert (row.detail["status"], row.detail["recipient_domain"]) == ("5.1.1", "exämple.es")
    assert "José" not in row.detail["diagnostic"]
    assert list(UndeliverableAddress.objects.values_list("address", flat=True)) == ["josé@exämple.es"]
    again = post(body.replace(b"eai-7", b"eai-8"))  # the same requester writes again
    assert process_inbox_event(again) == "created"
    assert ack_reason(again) == "address_bounced"


def test_a_bounce_tied_again_writes_nothing_more(mailbox, ascii_relay):
    original, _, received = acknowledged(ascii_relay)
    raw = bounce_mail.postfix_dsn(received.header_bytes(), JANE)
    bounce = post(raw)
    process_inbox_event(bounce)
    event = InboxEvent.objects.get(pk=bounce)
    assert post(raw) == bounce  # the provider redelivers it: the same event
    assert process_inbox_event(bounce) == "done"
    assert bounces.tie(event=event, state="suppressed", reason_code="delivery_report") is None
    assert bounced_rows(original).count() == 1 and UndeliverableAddress.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_workers_tying_one_bounce_at_once_write_one_row(mailbox, ascii_relay):
    original, _, received = acknowledged(ascii_relay)
    bounce = post(bounce_mail.postfix_dsn(received.header_bytes(), JANE))
    InboxEvent.objects.filter(pk=bounce).update(state="suppressed", reason_code="delivery_report")
    event = InboxEvent.objects.get(pk=bounce)

    def tie(_):
        try:
            return bounces.tie(event=event, state="suppressed", reason_code="delivery_report")
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(tie, range(4)))
    assert sorted(results, key=str) == [original, None, None, None]
    assert bounced_rows(original).count() == 1


def test_the_set_based_path_ties_a_bounce_too(mailbox, ascii_relay):
    original, _, received = acknowledged(ascii_relay)
    bounce = post(bounce_mail.postfix_dsn(received.header_bytes(), JANE))
    outcomes, rest = process_plain([bounce], "worker-b", {})
    assert (outcomes, rest) == ({bounce: "suppressed"}, [])
    assert bounced_rows(original).count() == 1


@pytest.mark.parametrize(
    "name", ["bounce_postfix_dsn.eml", "bounce_exim_dsn_not_ours.eml", "bounce_gmail_dsn_failure_not_ours.eml"]
)
def test_a_bounce_of_mail_we_did_not_send_is_only_suppressed(mailbox, ascii_relay, name):
    acknowledged(ascii_relay)
    raw = (CORPUS / name).read_bytes()  # a failure for good, of a message no intent of ours sent
    assert read_report(raw).permanent
    bounce = post(raw)
    assert process_inbox_event(bounce) == "suppressed"
    assert not AuditEvent.objects.filter(kind="acknowledgment_bounced").exists()
    assert "acknowledgment_bounce" not in InboxEvent.objects.get(pk=bounce).details
    assert not UndeliverableAddress.objects.exists()


def test_a_read_receipt_of_our_acknowledgment_is_not_a_bounce(mailbox, ascii_relay):
    original, intent, received = acknowledged(ascii_relay)
    receipt = post(bounce_mail.read_receipt(received.header_bytes(), JANE, intent.result_ref))
    assert process_inbox_event(receipt) == "suppressed"
    assert read_report(bounce_mail.read_receipt(received.header_bytes(), JANE, intent.result_ref)).message_ids == ()
    assert not bounced_rows(original).exists() and not UndeliverableAddress.objects.exists()


def test_a_bounce_reaching_another_tenant_is_not_tied_to_our_ticket(mailbox, ascii_relay, monkeypatch):
    original, _, received = acknowledged(ascii_relay)
    other = make_tenant(slug="globex", name="Globex", domains=("globex.test",))
    make_destination(other)
    make_mailbox(other, slug="globex-support", address="support@globex.test")
    bounce = post(bounce_mail.postfix_dsn(received.header_bytes(), JANE), slug="globex-support")
    assert process_inbox_event(bounce) == "suppressed"
    assert not bounced_rows(original).exists() and not UndeliverableAddress.objects.exists()


def test_the_item_page_timeline_reads_the_bounce_in_words(mailbox, ascii_relay):
    from intake.vocabulary import AuditKind

    original, _, received = acknowledged(ascii_relay)
    bounce = post(bounce_mail.postfix_dsn(received.header_bytes(), JANE))
    process_inbox_event(bounce)
    [row] = timeline_rows(bounced_rows(original), kind_labels=dict(AuditKind.choices))
    assert row.kind_label == "Acknowledgment bounced (the requester's address refused it)"
    assert f"bounce event: {bounce}" in [line.lower() for line in row.lines]
    assert any(line.lower().startswith("status: 5.1.1") for line in row.lines)

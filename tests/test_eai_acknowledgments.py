"""Acknowledgments to internationalised addresses (RFC 6531, RFC 6532) reach a real SMTP server unmangled.

Django's own path writes a non-ASCII local part as an encoded-word (`=?utf-8?b?...?=@...`), which is no
address. Here: with SMTPUTF8 in the relay's EHLO the address goes out as UTF-8 in the envelope and in To;
without it, an ASCII local part at an IDN domain goes out in punycode, and a non-ASCII local part is not
sent at all (the intent ends `not-sent`, the event gets `acknowledgment_skipped` / address_not_deliverable).
"""

import pytest
from django.test import Client

from intake.models import AuditEvent, InboxEvent
from tests.conftest import WEBHOOK_SECRET
from tests.mail import webhook_headers
from tests.senderauth import stamped, trust_our_mta
from tests.smtp_envelopes import ascii_relay, relay_on, utf8_relay  # noqa: F401  (fixtures)
from tests.support.eai import JOSE, eai_request
from ticketing import ack_transport, acknowledgments
from ticketing.models import Intent, TicketMapping
from ticketing.services import process_inbox_event

CHINESE = "用户@例子.广告"
IDN_ONLY = "jane@exämple.es"
IDN_ONLY_PUNYCODE = "jane@xn--exmple-cua.es"


@pytest.fixture(autouse=True)
def _our_mta_is_trusted(mailbox):
    trust_our_mta(mailbox)


def acknowledge(sender: str) -> tuple[int, Intent, str]:
    """Post the request, make its ticket and send its acknowledgment once: (event id, intent, send's word)."""
    body = eai_request(sender)
    response = Client().post(
        "/webhooks/raw/support/", data=body, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, body)
    )
    assert response.status_code == 202
    event_id = response.json()["inbox_event_id"]
    assert process_inbox_event(event_id) == "created"
    intent = Intent.objects.get(inbox_event_id=event_id, action="notify_requester")
    outcome = acknowledgments.send(intent.pk, "worker-a")
    intent.refresh_from_db()
    return event_id, intent, outcome


def assert_never_mangled(received):
    """No encoded-word in an address: not in To or From, not in the envelope (a Subject may carry one)."""
    address_lines = [
        line for line in received.header_bytes().split(b"\r\n") if line.lower().startswith((b"to:", b"from:"))
    ]
    assert len(address_lines) == 2 and not any(b"=?" in line for line in address_lines)
    assert "=?utf-8?" not in received.mail_from.lower() + " ".join(received.rcpt_tos).lower()


@pytest.mark.parametrize("address", [JOSE, CHINESE, IDN_ONLY])
def test_an_internationalised_address_goes_out_as_utf8_with_smtputf8_when_the_relay_offers_it(
    mailbox, utf8_relay, address
):
    event_id, intent, outcome = acknowledge(address)
    assert outcome == "sent"
    [received] = utf8_relay.received
    assert received.rcpt_tos == [address]
    assert "SMTPUTF8" in [option.upper() for option in received.mail_options]
    assert f"\r\nTo: {address}\r\n".encode() in b"\r\n" + received.header_bytes() + b"\r\n"
    message = received.message
    assert message["To"] == address
    # The same headers, Message-ID and body as Django's path writes.
    mapping = TicketMapping.objects.get(inbox_event_id=event_id)
    assert message["Message-ID"].strip() == intent.result_ref
    assert message["Subject"] == f"[#MR-{mapping.pk}] Re: Impresora sin tóner"
    assert message["Auto-Submitted"] == "auto-replied"
    assert message["In-Reply-To"].startswith("<eai-")
    assert message["From"] == "support@acme.test"
    assert message["Date"]
    assert f"opened ticket MR-{mapping.pk}" in message.get_content()
    assert_never_mangled(received)
    assert AuditEvent.objects.filter(inbox_event_id=event_id, kind="acknowledged").count() == 1


def test_an_ascii_local_part_at_an_idn_domain_goes_out_in_punycode_to_a_relay_without_smtputf8(mailbox, ascii_relay):
    _, intent, outcome = acknowledge(IDN_ONLY)
    assert outcome == "sent"
    [received] = ascii_relay.received
    assert received.rcpt_tos == [IDN_ONLY_PUNYCODE]
    assert "SMTPUTF8" not in [option.upper() for option in received.mail_options]
    assert received.message["To"] == IDN_ONLY_PUNYCODE
    assert received.message["Message-ID"].strip() == intent.result_ref  # Django folds it
    assert received.content.isascii()
    assert_never_mangled(received)


def test_an_idn_domain_is_written_in_idna_2008_punycode_not_mapped_to_another_domain(mailbox, ascii_relay):
    _, _, outcome = acknowledge("jane@faß.de")
    assert outcome == "sent"
    [received] = ascii_relay.received
    assert received.rcpt_tos == ["jane@xn--fa-hia.de"]  # IDNA 2003 (Django's own) would say fass.de
    assert received.message["To"] == "jane@xn--fa-hia.de"


@pytest.mark.parametrize("address", [JOSE, CHINESE])
def test_a_non_ascii_local_part_is_not_sent_to_a_relay_without_smtputf8_and_the_skip_is_audited(
    mailbox, ascii_relay, address
):
    event_id, intent, outcome = acknowledge(address)
    assert outcome == "not_deliverable"
    assert ascii_relay.received == []
    assert (intent.state, intent.result_ref) == ("succeeded", "not-sent:address_not_deliverable")
    skipped = AuditEvent.objects.filter(inbox_event_id=event_id, kind="acknowledgment_skipped")
    assert [row.detail["reason"] for row in skipped] == ["address_not_deliverable"]
    assert not AuditEvent.objects.filter(inbox_event_id=event_id, kind__in=["acknowledged", "intent_failed"]).exists()
    assert InboxEvent.objects.get(pk=event_id).state == "completed"
    # A second run finds the intent settled: nothing is sent, nothing audited again.
    assert acknowledgments.send(intent.pk, "worker-b") == "busy"
    assert skipped.count() == 1


def test_the_same_address_reaches_a_utf8_relay_after_an_ascii_relay_refused_it(mailbox, settings):
    with relay_on(settings, smtputf8=False) as plain:
        _, _, first = acknowledge(JOSE)
    with relay_on(settings, smtputf8=True) as utf8:
        _, _, second = acknowledge(CHINESE)
    assert (first, second) == ("not_deliverable", "sent")
    assert plain.received == [] and [r.rcpt_tos for r in utf8.received] == [[CHINESE]]


def test_ascii_addresses_take_djangos_path_unchanged(mailbox, utf8_relay):
    body = stamped(
        b"From: jane@example.com\r\nTo: support@acme.test\r\nSubject: Printer\r\n"
        b"Message-ID: <ascii-1@example.com>\r\n\r\nHelp.\r\n"
    )
    response = Client().post(
        "/webhooks/raw/support/", data=body, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, body)
    )
    event_id = response.json()["inbox_event_id"]
    process_inbox_event(event_id)
    intent = Intent.objects.get(inbox_event_id=event_id, action="notify_requester")
    assert acknowledgments.send(intent.pk, "worker-a") == "sent"
    [received] = utf8_relay.received
    assert received.rcpt_tos == ["jane@example.com"]
    assert "SMTPUTF8" not in [option.upper() for option in received.mail_options]


def test_which_addresses_count_as_internationalised():
    assert ack_transport.is_international(JOSE) and ack_transport.is_international(IDN_ONLY)
    assert ack_transport.has_international_local_part(f"José <{CHINESE}>")
    assert not ack_transport.has_international_local_part(IDN_ONLY)
    assert not ack_transport.is_international("Support <support@acme.test>")
    assert ack_transport.ascii_address("Jane <jane@faß.de>") == "Jane <jane@xn--fa-hia.de>"

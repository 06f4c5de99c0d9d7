"""Normalize, validate and secure, through the real pipeline: ingest -> process_inbox_event.

Every message ends in a defined state with a reason; nothing raises, nothing is
lost, malware is quarantined by a real clamd, loops are suppressed and never
acknowledged, and logs carry neither bodies nor full addresses.
"""

import logging
import re
from collections import Counter
from email.message import EmailMessage

import pytest
from hypothesis import HealthCheck, given, settings as hypothesis_settings, strategies as st

from intake.keys import content_fingerprint, provider_message_id_for_raw
from intake.models import AuditEvent, InboxEvent
from intake.services import ingest
from tests.clamd import EICAR, EICAR_SIGNATURE
from tests.mail import make_message
from tests.support.mime import generated_corpus, stdlib_corpus
from ticketing.models import Intent, Ticket
from ticketing.services import process_inbox_event

FINAL = {"completed", "suppressed", "awaiting_review", "quarantined", "failed"}
RECOVERY_OR_DONE = FINAL | {"unknown"}


@pytest.fixture
def scanner_off(settings):
    settings.MAILROOM_CLAMD = "off"


@pytest.fixture
def scanner_on(settings, clamd):
    settings.MAILROOM_CLAMD = clamd.tcp_address
    return clamd


def run(mailbox, raw: bytes) -> InboxEvent:
    event_id = ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id
    process_inbox_event(event_id)
    return InboxEvent.objects.get(pk=event_id)


def identity(raw: bytes) -> tuple[str, str]:
    """What makes two deliveries one event: the provider message id and the content fingerprint."""
    return provider_message_id_for_raw(raw), content_fingerprint(raw)


def with_headers(**headers) -> bytes:
    return make_message(extra_headers={k.replace("_", "-"): v for k, v in headers.items()})


def test_corpus_through_the_pipeline_ends_in_defined_states_and_logs_stay_clean(mailbox, scanner_on, caplog):
    mailbox.allowed_recipients = ["support@acme.test"]
    mailbox.save()
    corpus = stdlib_corpus() + generated_corpus()
    tally = Counter()
    first_with_id = {}
    with caplog.at_level(logging.DEBUG):
        for name, raw in corpus:
            first = first_with_id.setdefault(identity(raw), raw)
            event = run(mailbox, raw)
            assert event.state in FINAL, (name, event.state)
            assert (event.state == "completed") == (event.reason_code == ""), (name, event.reason_code)
            if first is raw:
                tally[f"{event.state}/{event.reason_code or '-'}"] += 1
            # Stored as first received, never altered or dropped; a later copy with the same
            # Message-ID and the same content is the same message delivered again.
            assert bytes(event.raw) == first
    print(f"\ncorpus of {len(corpus)} messages through the pipeline: {dict(sorted(tally.items()))}")
    assert InboxEvent.objects.count() == len({identity(raw) for _, raw in corpus})
    logged = "\n".join(record.getMessage() for record in caplog.records)
    for address in re.findall(r"[\w.+-]+@[\w-]+\.[\w.-]+", logged):
        assert "***" in address, f"unmasked address in logs: {address}"
    from intake.mime import parse_message

    for _, raw in corpus:  # no line of any body made it into a log record
        for line in parse_message(raw).text.splitlines():
            if len(line.strip()) >= 16:
                assert line.strip() not in logged


def test_a_reused_message_id_with_another_body_is_its_own_event(mailbox, scanner_off):
    # Before fingerprints this was answered "duplicate" and the second request vanished.
    first = make_message(message_id="<same@example.com>", body="first body")
    second = make_message(message_id="<same@example.com>", body="second body")
    assert ingest(mailbox, provider_message_id_for_raw(first), first, source="raw").duplicate is False
    stored = ingest(mailbox, provider_message_id_for_raw(second), second, source="raw")
    assert stored.duplicate is False and InboxEvent.objects.get(pk=stored.inbox_event_id).message_id_reused
    assert ingest(mailbox, provider_message_id_for_raw(second), second, source="raw").duplicate is True


@hypothesis_settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(raw=st.binary(min_size=1, max_size=3000))
def test_arbitrary_bytes_never_raise_and_are_never_lost(mailbox, scanner_off, raw):
    result = ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw")
    outcome = process_inbox_event(result.inbox_event_id)
    event = InboxEvent.objects.get(pk=result.inbox_event_id)
    assert bytes(event.raw) == raw
    assert event.state in RECOVERY_OR_DONE, (outcome, event.state)
    assert event.state == "completed" or event.reason_code


def _with_attachment(payload: bytes, filename: str, maintype="application", subtype="pdf") -> bytes:
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = "jane@example.com", "support@acme.test", "Invoice"
    message["Message-ID"] = f"<{filename}.{len(payload)}@example.com>"
    message.set_content("See attached.")
    message.add_attachment(payload, maintype=maintype, subtype=subtype, filename=filename)
    return message.as_bytes()


def test_eicar_attachment_is_quarantined_with_the_signature_name(mailbox, scanner_on):
    event = run(mailbox, _with_attachment(EICAR, "invoice.pdf", "text", "plain"))
    assert (event.state, event.reason_code) == ("quarantined", "malware")
    assert EICAR_SIGNATURE in event.reason_detail
    assert Ticket.objects.count() == 0


def test_clean_pdf_passes_the_scanner(mailbox, scanner_on):
    pdf = b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n"
    event = run(mailbox, _with_attachment(pdf, "invoice.pdf"))
    assert event.state == "completed"
    [attachment] = event.details["attachments"]
    assert attachment["sniffed_type"] == "application/pdf" and attachment["size"] == len(pdf)


def test_an_executable_named_pdf_is_quarantined_by_its_sniffed_type(mailbox, scanner_on):
    elf = b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 120
    event = run(mailbox, _with_attachment(elf, "invoice.pdf"))
    assert (event.state, event.reason_code) == ("quarantined", "attachment_type")


def test_with_the_scanner_down_mail_waits_then_goes_to_review_never_passes(mailbox, settings):
    from tests.live import free_port

    settings.MAILROOM_CLAMD = f"tcp://127.0.0.1:{free_port()}"  # nothing listens
    settings.MAILROOM_SCAN_ATTEMPTS = 3
    raw = _with_attachment(b"%PDF-1.4\n%%EOF\n", "a.pdf")
    event_id = ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id
    outcomes = []
    for _ in range(3):
        outcomes.append(process_inbox_event(event_id))
        InboxEvent.objects.filter(pk=event_id).update(retry_at=None)
    event = InboxEvent.objects.get(pk=event_id)
    assert outcomes == ["waiting", "waiting", "awaiting_review"]
    assert (event.state, event.reason_code) == ("awaiting_review", "scanner_unavailable")
    assert Ticket.objects.count() == 0


LOOP_CASES = {
    "auto_submitted": {"Auto-Submitted": "auto-replied"},
    "precedence_bulk": {"Precedence": "bulk"},
    "autoreply_header": {"X-Autoreply": "yes"},
    "own_mail_loop": {"X-Mailroom-Loop": "mailroom"},
}


@pytest.mark.parametrize("reason", list(LOOP_CASES))
def test_each_loop_rule_suppresses_and_nothing_is_acknowledged(mailbox, scanner_off, reason):
    event = run(mailbox, make_message(extra_headers=LOOP_CASES[reason]))
    assert (event.state, event.reason_code) == ("suppressed", reason)
    assert not Intent.objects.exists() and Ticket.objects.count() == 0
    assert AuditEvent.objects.filter(inbox_event=event, kind="suppressed").count() == 1


def test_auto_submitted_no_is_a_person(mailbox, scanner_off):
    assert run(mailbox, make_message(extra_headers={"Auto-Submitted": "no"})).state == "completed"


def test_mailer_daemon_sender_is_suppressed_when_the_mail_is_a_bounce(mailbox, scanner_off):
    event = run(
        mailbox, make_message(sender="MAILER-DAEMON@mx.example.com", subject="Undelivered Mail Returned to Sender")
    )
    assert (event.state, event.reason_code) == ("suppressed", "mailer_daemon")


def test_an_empty_return_path_alone_is_for_a_person_to_decide(mailbox, scanner_off):
    event = run(mailbox, make_message(extra_headers={"Return-Path": "<>"}))
    assert (event.state, event.reason_code) == ("awaiting_review", "empty_return_path")
    assert not Intent.objects.exists() and Ticket.objects.count() == 0


def test_delivery_status_notification_is_suppressed(mailbox, scanner_off):
    raw = (
        b"From: postmaster@mx.example.com\r\nTo: support@acme.test\r\nSubject: Undelivered\r\n"
        b"Message-ID: <dsn-1@mx.example.com>\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: multipart/report; report-type=delivery-status; boundary=b\r\n\r\n"
        b"--b\r\nContent-Type: text/plain\r\n\r\nDelivery failed.\r\n"
        b"--b\r\nContent-Type: message/delivery-status\r\n\r\nReporting-MTA: dns; mx.example.com\r\n\r\n"
        b"Final-Recipient: rfc822; x@example.com\r\nAction: failed\r\nStatus: 5.1.1\r\n--b--\r\n"
    )
    event = run(mailbox, raw)
    assert event.state == "suppressed" and event.reason_code in ("delivery_report", "mailer_daemon")


def test_a_flood_from_one_sender_goes_to_review_not_to_suppression(mailbox, scanner_off):
    mailbox.settings = {"sender_rate_limit": {"count": 3, "seconds": 600}}
    mailbox.save()
    events = [run(mailbox, make_message(sender="flood@example.com")) for _ in range(5)]
    assert [(e.state, e.reason_code) for e in events] == [("completed", "")] * 3 + [
        ("awaiting_review", "sender_rate_limited")
    ] * 2
    assert run(mailbox, make_message(sender="calm@example.com")).state == "completed"


def test_a_mailbox_may_opt_into_suppressing_a_flood(mailbox, scanner_off):
    mailbox.settings = {"sender_rate_limit": {"count": 1, "seconds": 600, "action": "suppress"}}
    mailbox.save()
    states = [
        (e.state, e.reason_code) for e in (run(mailbox, make_message(sender="flood@example.com")) for _ in range(3))
    ]
    assert states == [("completed", ""), ("suppressed", "sender_rate_limited"), ("suppressed", "sender_rate_limited")]


def test_suppressed_mail_is_listed_in_the_admin_and_a_replay_makes_its_ticket(mailbox, scanner_off, admin_client):
    from reconciliation import services as console
    from tests.support.users import make_user

    raw = make_message(subject="Out of office: printer", extra_headers={"Auto-Submitted": "auto-replied"})
    event = run(mailbox, raw)
    assert (event.state, event.reason_code) == ("suppressed", "auto_submitted")
    listing = admin_client.get("/admin/intake/inboxevent/?state=suppressed")
    assert listing.status_code == 200
    page = listing.content.decode()
    assert f"/admin/reconciliation/recoveryitem/{event.pk}/change/" in page and "Out of office: printer" in page
    assert (
        f"/admin/reconciliation/recoveryitem/{event.pk}/change/"
        not in admin_client.get("/admin/intake/inboxevent/?state=completed").content.decode()
    )

    operator = make_user("oper", groups=["operator"], tenants=[mailbox.tenant])
    assert console.do_replay(operator, event.pk) == "rerouted"
    # A replay is an operator's decision: the rule that suppressed it is not asked again.
    assert process_inbox_event(event.pk) == "created"
    event.refresh_from_db()
    assert event.state == "completed"
    assert Ticket.objects.get().subject == "Out of office: printer"


def test_review_reasons_keep_the_message(mailbox, scanner_off):
    mailbox.allowed_recipients = ["support@acme.test"]
    mailbox.save()
    wrong = run(mailbox, make_message(to="someone-else@acme.test"))
    assert (wrong.state, wrong.reason_code) == ("awaiting_review", "recipient_not_allowed")
    nobody = run(mailbox, b"To: support@acme.test\r\nSubject: who?\r\nMessage-ID: <x@y>\r\n\r\nbody\r\n")
    assert (nobody.state, nobody.reason_code) == ("awaiting_review", "missing_sender")
    assert bytes(nobody.raw).endswith(b"body\r\n")


def test_authentication_results_only_from_the_trusted_authserv_id(mailbox, scanner_off):
    mailbox.settings = {"trusted_authserv_id": "mx.acme.test"}
    mailbox.save()
    raw = make_message(
        extra_headers={
            "Authentication-Results": "mx.acme.test; spf=fail smtp.mailfrom=example.com; dkim=none",
        }
    )
    # A header the sender wrote themselves, claiming a pass, further down: ignored.
    forged = b"Authentication-Results: evil.example; spf=pass; dkim=pass; dmarc=pass\r\n"
    raw = raw.replace(b"Subject:", forged + b"Subject:", 1)
    event = run(mailbox, raw)
    assert event.state == "completed"
    assert event.auth_results.get("spf") == "fail" and event.auth_results.get("dkim") == "none"
    assert "dmarc" not in event.auth_results

"""Validation rules, one test per rule, the precedence between them, the mailbox policy,
authentication results and threading helpers. Pure functions: no database."""

import io
import struct
import zipfile
import zlib
from email.message import EmailMessage

import pytest

from intake.mime import MACRO_OFFICE_TYPE, OOXML_TYPES, parse_message
from intake.models import InboxEvent, Mailbox
from intake.validation import (
    AWAITING_REVIEW,
    OK,
    QUARANTINED,
    SUPPRESSED,
    AttachmentPolicy,
    Finding,
    MailboxPolicy,
    Verdict,
    authentication_results,
    decide,
    findings,
    malware_finding,
    scanner_unavailable_finding,
    subject_ticket_token,
    thread_key,
    validate,
)

EXE = (
    b"MZ\x90\x00\x03\x00\x00\x00\x04\x00\x00\x00\xff\xff\x00\x00\xb8"
    + b"\x00" * 43
    + b"\x80\x00\x00\x00"
    + b"\x0e\x1f\xba\x0e\x00\xb4\x09\xcd\x21\xb8\x01\x4c\xcd\x21This program cannot be run in DOS mode.\r\r\n$"
    + b"\x00" * 64
)
PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"
CONTENT_TYPES = b'<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"/>'


def png() -> bytes:
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00"))
        + chunk(b"IEND", b"")
    )


def zip_of(*entries) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            archive.writestr(name, data)
    return buffer.getvalue()


def message(
    body="Please help, the printer is on fire.\n",
    sender="Jane <jane@example.com>",
    to="support@acme.test",
    subject="Printer",
    attachments=(),
    headers=None,
    drop=(),
) -> bytes:
    msg = EmailMessage()
    if sender is not None:
        msg["From"] = sender
    if to is not None:
        msg["To"] = to
    msg["Subject"] = subject
    msg["Message-ID"] = "<m1@example.com>"
    for name, value in (headers or {}).items():
        msg[name] = value
    if body is not None:
        msg.set_content(body)
    for filename, data, declared in attachments:
        maintype, subtype = declared.split("/")
        msg.add_attachment(data, maintype=maintype, subtype=subtype, filename=filename)
    for name in drop:
        del msg[name]
    return msg.as_bytes()


def verdict_of(raw: bytes, policy=None, **kwargs) -> Verdict:
    return validate(parse_message(raw, loop_header=(policy or MailboxPolicy()).loop_header), policy, **kwargs)


def state_reason(raw: bytes, policy=None, **kwargs) -> tuple[str, str]:
    verdict = verdict_of(raw, policy, **kwargs)
    return verdict.state, verdict.reason_code


# -- ok ------------------------------------------------------------------------------------------


def test_an_ordinary_message_with_ordinary_attachments_is_ok():
    raw = message(
        attachments=[
            ("report.pdf", PDF, "application/pdf"),
            ("photo.png", png(), "image/png"),
            ("notes.txt", b"some notes\n", "text/plain"),
        ]
    )
    verdict = verdict_of(raw, MailboxPolicy(allowed_recipients=("support@acme.test",)))
    assert verdict == Verdict(OK, "", "") and verdict.ok and verdict.findings == ()


def test_states_are_inbox_event_states():
    assert {QUARANTINED, AWAITING_REVIEW, SUPPRESSED} <= set(InboxEvent.State.values)


# -- suppression: one test per loop/noise rule ------------------------------------------------------

DSN = (
    b"From: Mail Delivery System <bounces@mx.example.net>\r\nTo: support@acme.test\r\n"
    b"Subject: Undelivered Mail\r\nMessage-ID: <dsn1@mx.example.net>\r\nMIME-Version: 1.0\r\n"
    b'Content-Type: multipart/report; report-type=delivery-status; boundary="B"\r\n\r\n'
    b"--B\r\nContent-Type: text/plain\r\n\r\nYour message could not be delivered.\r\n"
    b"--B\r\nContent-Type: message/delivery-status\r\n\r\nReporting-MTA: dns; mx.example.net\r\n\r\n"
    b"Final-Recipient: rfc822; nobody@example.org\r\nAction: failed\r\nStatus: 5.1.1\r\n\r\n"
    b"--B\r\nContent-Type: text/rfc822-headers\r\n\r\nFrom: support@acme.test\r\nSubject: Re: x\r\n"
    b"--B--\r\n"
)


@pytest.mark.parametrize(
    "raw, reason",
    [
        (message(headers={"Auto-Submitted": "auto-replied"}), "auto_submitted"),
        (message(headers={"Auto-Submitted": "auto-generated; owner-email=x@example.com"}), "auto_submitted"),
        (message(headers={"Precedence": "bulk"}), "precedence_bulk"),
        (message(headers={"Precedence": "JUNK"}), "precedence_bulk"),
        (message(headers={"Precedence": "list"}), "precedence_bulk"),
        (message(headers={"X-Autoreply": "yes"}), "autoreply_header"),
        (message(headers={"X-Autorespond": "Out of office"}), "autoreply_header"),
        (
            message(sender="MAILER-DAEMON@mx.example.net", subject="Undelivered Mail Returned to Sender"),
            "mailer_daemon",
        ),
        (
            message(
                sender="Postmaster <postmaster@example.org>",
                body="Final-Recipient: rfc822; lager@example.org\nAction: failed\nStatus: 5.1.1\n",
            ),
            "mailer_daemon",
        ),
        (DSN, "delivery_report"),
        (message(headers={"X-Mailroom-Loop": "support@acme.test"}), "own_mail_loop"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_each_loop_and_noise_rule_suppresses_with_its_reason(raw, reason):
    assert state_reason(raw) == (SUPPRESSED, reason)


# -- suppression only on evidence ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "sender", ["Tomasz Wieczorek <postmaster@branch.example>", "MAILER-DAEMON@mx.example.net", "postmaster@example.org"]
)
def test_a_daemon_address_writing_ordinary_text_is_a_person_not_a_bounce(sender):
    raw = message(
        sender=sender,
        subject="New relay from 1 July",
        body="Could you add our new relay mail2.example.org to your allow list?\n",
    )
    assert state_reason(raw) == (OK, "")


@pytest.mark.parametrize(
    "subject, body, evidence",
    [
        ("Undelivered Mail Returned to Sender", "Hello.\n", "bounce text 'undelivered mail returned to sender'"),
        (
            "Mail",
            "This is the mail system at host mx.example.net.\n\nI'm sorry to tell you.\n",
            "bounce text 'this is the mail system at host'",
        ),
        (
            "Mail",
            "Final-Recipient: rfc822; a@example.org\nAction: failed\nStatus: 5.1.1\n"
            "Diagnostic-Code: smtp; 550 5.1.1 unknown\n",
            "DSN fields (Final-Recipient, Diagnostic-Code, Action: failed, Status: 5.1.1)",
        ),
        ("Mail", "Remote host said: 550 5.7.1 Message rejected as spam\n", "SMTP reply 550 5.7.1"),
        ("Undeliverable: Re: invoice", "Hello.\n", "bounce text 'undeliverable:'"),
        (
            "Mail",
            "Sorry.\n\n----- Original message headers -----\nFrom: support@acme.test\n",
            "quoted original 'original message headers'",
        ),
        ("Mail", None, "no body text"),
    ],
)
def test_a_daemon_sender_is_suppressed_only_with_evidence_and_the_detail_names_it(subject, body, evidence):
    parsed = parse_message(message(sender="MAILER-DAEMON@mx.example.net", subject=subject, body=body))
    [daemon] = [f for f in findings(parsed) if f.reason_code == "mailer_daemon"]
    assert (daemon.state, daemon.detail) == (SUPPRESSED, f"sender MAILER-DAEMON@mx.example.net and {evidence}")


def test_an_empty_return_path_alone_goes_to_review_and_beside_other_signs_is_not_a_finding():
    verdict = verdict_of(message(headers={"Return-Path": "<>"}))
    assert (verdict.state, verdict.reason_code) == (AWAITING_REVIEW, "empty_return_path")
    assert verdict.detail.startswith("Return-Path: <>")
    out_of_office = verdict_of(message(headers={"Return-Path": "<>", "Auto-Submitted": "auto-replied"}))
    assert (out_of_office.state, out_of_office.reason_code) == (SUPPRESSED, "auto_submitted")
    assert "empty_return_path" not in {f.reason_code for f in out_of_office.findings}
    assert state_reason(b"Return-Path: <>\r\n" + DSN) == (SUPPRESSED, "delivery_report")


@pytest.mark.parametrize(
    "headers",
    [
        {"Auto-Submitted": "no"},
        {"Auto-Submitted": "No (a person wrote this)"},
        {"Precedence": "first-class"},
        {"X-Autoreply": "no"},
        {"Return-Path": "<jane@example.com>"},
        {"X-Other-Loop": "x"},
    ],
)
def test_headers_that_look_related_but_are_not_automatic_pass(headers):
    assert state_reason(message(headers=headers)) == (OK, "")


def test_the_dsn_parts_are_report_data_not_body_or_attachments():
    parsed = parse_message(DSN)
    assert parsed.content_type == "multipart/report" and parsed.report_type == "delivery-status"
    assert parsed.attachments == [] and parsed.text == "Your message could not be delivered."


def test_the_loop_header_name_comes_from_the_policy():
    policy = MailboxPolicy.from_settings({"loop_header": "X-Acme-Helpdesk"})
    raw = message(headers={"X-Acme-Helpdesk": "1"})
    assert state_reason(raw, policy) == (SUPPRESSED, "own_mail_loop")
    assert state_reason(raw) == (OK, "")  # the default name does not see it
    assert state_reason(message(headers={"X-Mailroom-Loop": "1"}), policy) == (OK, "")
    # Parsed with the default header name but validated under the custom one: still found.
    assert validate(parse_message(raw), policy).reason_code == "own_mail_loop"


# -- review: one test per rule ------------------------------------------------------------------------


def test_recipient_not_allowed():
    policy = MailboxPolicy(allowed_recipients=("support@acme.test",))
    assert state_reason(message(to="sales@acme.test"), policy) == (AWAITING_REVIEW, "recipient_not_allowed")
    assert state_reason(message(to="Support <SUPPORT@Acme.Test>"), policy) == (OK, "")  # case-insensitive
    assert state_reason(message(to="x@example.com", headers={"Cc": "support@acme.test"}), policy) == (OK, "")
    assert state_reason(message(to="support+billing@acme.test"), policy) == (OK, "")  # plus address
    assert state_reason(message(to=None), policy)[1] == "recipient_not_allowed"
    assert state_reason(message(to="sales@acme.test"), MailboxPolicy()) == (OK, "")  # empty list: all
    assert state_reason(message(to="support@acme.test"), MailboxPolicy(allowed_recipients=("Support@ACME.test",))) == (
        OK,
        "",
    )


def test_delivered_to_and_envelope_recipients_count_as_recipients():
    policy = MailboxPolicy(allowed_recipients=("support@acme.test",))
    bcc = message(to="undisclosed-recipients:;")
    assert state_reason(bcc, policy) == (AWAITING_REVIEW, "recipient_not_allowed")
    assert state_reason(message(to="list@example.org", headers={"Delivered-To": "support@acme.test"}), policy) == (
        OK,
        "",
    )
    assert state_reason(message(to="list@example.org", headers={"X-Original-To": "support@acme.test"}), policy) == (
        OK,
        "",
    )
    assert state_reason(bcc, policy, envelope_recipients=["support@acme.test"]) == (OK, "")
    assert state_reason(message(to="anyone@acme.test"), MailboxPolicy(allowed_recipients=("@acme.test",))) == (OK, "")


def test_missing_sender():
    assert state_reason(message(sender=None)) == (AWAITING_REVIEW, "missing_sender")
    assert state_reason(message(sender="Just A Name")) == (AWAITING_REVIEW, "missing_sender")
    assert state_reason(message(sender="<>")) == (AWAITING_REVIEW, "missing_sender")


def test_too_large_message_and_too_large_attachment():
    raw = message(body="x" * 5000)
    assert state_reason(raw, MailboxPolicy(max_message_bytes=1000)) == (AWAITING_REVIEW, "too_large")
    assert state_reason(raw, MailboxPolicy(max_message_bytes=len(raw))) == (OK, "")
    big = message(attachments=[("big.pdf", PDF + b"0" * 3000, "application/pdf")])
    policy = MailboxPolicy(attachments=AttachmentPolicy(max_bytes=2000))
    verdict = verdict_of(big, policy)
    assert (verdict.state, verdict.reason_code) == (AWAITING_REVIEW, "too_large") and "big.pdf" in verdict.detail


def test_too_many_attachments():
    raw = message(attachments=[(f"n{i}.txt", b"note %d\n" % i, "text/plain") for i in range(4)])
    policy = MailboxPolicy(attachments=AttachmentPolicy(max_attachments=3))
    assert state_reason(raw, policy) == (AWAITING_REVIEW, "too_many_attachments")
    assert state_reason(raw, MailboxPolicy(attachments=AttachmentPolicy(max_attachments=4))) == (OK, "")


def test_empty():
    assert state_reason(message(body=None)) == (AWAITING_REVIEW, "empty")
    assert state_reason(message(body=" \n\n \t\n")) == (AWAITING_REVIEW, "empty")
    assert state_reason(message(body=None, attachments=[("a.pdf", PDF, "application/pdf")])) == (OK, "")
    html_only = EmailMessage()
    html_only["From"], html_only["To"] = "a@example.com", "support@acme.test"
    html_only.set_content("<html><body><p>Real text</p></body></html>", subtype="html")
    assert state_reason(html_only.as_bytes()) == (OK, "")
    html_only.set_content(
        "<html><head><style>p{}</style></head><body><script>x()</script></body></html>", subtype="html"
    )
    assert state_reason(html_only.as_bytes()) == (AWAITING_REVIEW, "empty")


def test_too_complex_structure_goes_to_review():
    depth = 60
    parts = [f'--b{i}\r\nContent-Type: multipart/mixed; boundary="b{i + 1}"\r\n\r\n' for i in range(depth)]
    inner = f"--b{depth}\r\nContent-Type: application/octet-stream\r\n\r\nMZ hidden\r\n--b{depth}--\r\n"
    closing = "".join(f"--b{i}--\r\n" for i in reversed(range(depth)))
    raw = (
        "From: a@example.com\r\nTo: support@acme.test\r\nSubject: deep\r\n"
        'Content-Type: multipart/mixed; boundary="b0"\r\n\r\n' + "".join(parts) + inner + closing
    ).encode()
    parsed = parse_message(raw)
    assert parsed.too_complex and "DepthLimitExceeded" in parsed.defects
    assert (validate(parsed).state, validate(parsed).reason_code) == (AWAITING_REVIEW, "too_complex")


# -- quarantine: the sniffed type wins ----------------------------------------------------------------


def test_an_executable_named_pdf_is_quarantined_for_its_type():
    raw = message(attachments=[("invoice.pdf", EXE, "application/pdf")])
    parsed = parse_message(raw)
    (attachment,) = parsed.attachments
    assert attachment.declared_type == "application/pdf" and attachment.sniffed_type == "application/x-dosexec"
    verdict = validate(parsed)
    assert (verdict.state, verdict.reason_code) == (QUARANTINED, "attachment_type")
    assert "invoice.pdf" in verdict.detail and "application/x-dosexec" in verdict.detail


def test_a_real_pdf_declared_as_octet_stream_with_an_odd_name_is_fine():
    assert state_reason(message(attachments=[("scan", PDF, "application/octet-stream")])) == (OK, "")


@pytest.mark.parametrize(
    "name, data, expected_type, expected_state",
    [
        # [Content_Types].xml last: libmagic says application/zip, the refinement says docx.
        (
            "letter.docx",
            zip_of(("_rels/.rels", b"<r/>"), ("word/document.xml", b"<w/>"), ("[Content_Types].xml", CONTENT_TYPES)),
            OOXML_TYPES["word/document.xml"],
            OK,
        ),
        (
            "sheet.xlsx",
            zip_of(("[Content_Types].xml", CONTENT_TYPES), ("xl/workbook.xml", b"<w/>")),
            OOXML_TYPES["xl/workbook.xml"],
            OK,
        ),
        (
            "deck.pptx",
            zip_of(("[Content_Types].xml", CONTENT_TYPES), ("ppt/presentation.xml", b"<p/>")),
            OOXML_TYPES["ppt/presentation.xml"],
            OK,
        ),
        (
            "text.odt",
            zip_of(("mimetype", b"application/vnd.oasis.opendocument.text"), ("content.xml", b"<x/>")),
            "application/vnd.oasis.opendocument.text",
            OK,
        ),
        # libmagic calls this one docx; its VBA project makes it a macro document.
        (
            "letter.docx",
            zip_of(
                ("[Content_Types].xml", CONTENT_TYPES),
                ("word/document.xml", b"<w/>"),
                ("word/vbaProject.bin", b"\xd0\xcf\x11\xe0"),
            ),
            MACRO_OFFICE_TYPE,
            QUARANTINED,
        ),
        ("archive.docx", zip_of(("setup.exe", EXE)), "application/zip", QUARANTINED),
        # Archives are allowed: the files inside them are judged instead (intake.validation.policy).
        ("files.zip", zip_of(("a.txt", b"hello")), "application/zip", OK),
        (
            "legacy.doc",
            b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 600 + "_VBA_PROJECT".encode("utf-16-le"),
            MACRO_OFFICE_TYPE,
            QUARANTINED,
        ),
    ],
)
def test_office_documents_are_allowed_archives_and_macros_are_not(name, data, expected_type, expected_state):
    parsed = parse_message(message(attachments=[(name, data, "application/octet-stream")]))
    if expected_type:
        assert parsed.attachments[0].sniffed_type == expected_type
    assert validate(parsed).state == expected_state


def test_blocked_extensions_are_refused_even_when_the_content_is_text():
    raw = message(attachments=[("invoice.js", b"WScript.Echo('hi');\n", "text/plain")])
    verdict = verdict_of(raw)
    assert (verdict.state, verdict.reason_code) == (QUARANTINED, "attachment_type") and ".js" in verdict.detail


def test_an_empty_attachment_is_not_checked():
    assert state_reason(message(attachments=[("nothing.exe", b"", "application/octet-stream")])) == (OK, "")


def test_an_executable_inside_an_attached_message_is_seen():
    inner = EmailMessage()
    inner["From"], inner["Subject"] = "someone@example.org", "fwd"
    inner.set_content("original")
    inner.add_attachment(EXE, maintype="application", subtype="pdf", filename="nested.pdf")
    outer = EmailMessage()
    outer["From"], outer["To"] = "jane@example.com", "support@acme.test"
    outer.set_content("see the forwarded mail")
    outer.add_attachment(inner)
    parsed = parse_message(outer.as_bytes())
    assert [(a.declared_type, a.nested) for a in parsed.attachments] == [
        ("message/rfc822", False),
        ("application/pdf", True),
    ]
    assert (validate(parsed).state, validate(parsed).reason_code) == (QUARANTINED, "attachment_type")


def test_policy_allowed_types_can_be_widened_and_narrowed():
    raw = message(attachments=[("files.zip", zip_of(("a.txt", b"hello")), "application/zip")])
    widened = MailboxPolicy.from_settings({"attachment_policy": {"extra_allowed_types": ["application/zip"]}})
    assert state_reason(raw, widened) == (OK, "")
    only_pdf = MailboxPolicy.from_settings({"attachment_policy": {"allowed_types": ["application/pdf"]}})
    assert state_reason(message(attachments=[("p.png", png(), "image/png")]), only_pdf)[1] == "attachment_type"
    images = MailboxPolicy.from_settings({"attachment_policy": {"allowed_types": ["image/*"]}})
    assert state_reason(message(attachments=[("p.png", png(), "image/png")]), images) == (OK, "")


# -- precedence -------------------------------------------------------------------------------------------


def test_review_wins_over_suppression_so_invalid_mail_is_never_set_aside_unseen():
    raw = message(sender=None, headers={"Auto-Submitted": "auto-replied"})
    verdict = verdict_of(raw)
    assert (verdict.state, verdict.reason_code) == (AWAITING_REVIEW, "missing_sender")
    assert [f.reason_code for f in verdict.findings] == ["missing_sender", "auto_submitted"]


def test_quarantine_wins_over_review_and_suppression():
    raw = message(
        to="sales@acme.test", headers={"X-Mailroom-Loop": "1"}, attachments=[("invoice.pdf", EXE, "application/pdf")]
    )
    verdict = verdict_of(raw, MailboxPolicy(allowed_recipients=("support@acme.test",)))
    assert [(f.state, f.reason_code) for f in verdict.findings] == [
        (QUARANTINED, "attachment_type"),
        (AWAITING_REVIEW, "recipient_not_allowed"),
        (SUPPRESSED, "own_mail_loop"),
    ]
    assert verdict.state == QUARANTINED


@pytest.mark.parametrize(
    "headers",
    [
        {"Auto-Submitted": "auto-replied"},
        {"Precedence": "bulk"},
        {"X-Autoreply": "1"},
        {"Return-Path": "<>"},
        {"X-Mailroom-Loop": "1"},
    ],
)
@pytest.mark.parametrize("breakage", ["none", "no_sender", "empty", "too_large", "exe"])
def test_a_loop_signal_never_yields_ok_whatever_else_is_wrong(headers, breakage):
    # An empty Return-Path alone is a review reason, not suppression (tests/test_automated_senders.py).
    alone = SUPPRESSED if "Return-Path" not in headers else AWAITING_REVIEW
    kwargs = {"headers": headers}
    if breakage == "no_sender":
        kwargs["sender"] = None
    elif breakage == "empty":
        kwargs["body"] = None
    elif breakage == "exe":
        kwargs["attachments"] = [("a.pdf", EXE, "application/pdf")]
    policy = MailboxPolicy(max_message_bytes=100) if breakage == "too_large" else MailboxPolicy()
    verdict = verdict_of(message(**kwargs), policy)
    assert verdict.state != OK
    assert verdict.state == (alone if breakage == "none" else QUARANTINED if breakage == "exe" else AWAITING_REVIEW)


def test_extra_findings_from_the_scanner():
    raw = message(attachments=[("a.pdf", EXE, "application/pdf")])
    parsed = parse_message(raw)
    assert validate(parsed, extra=[malware_finding("a.pdf", "Win.Test")]).reason_code == "malware"
    clean = parse_message(message())
    verdict = validate(clean, extra=[scanner_unavailable_finding("clamd down after 5 attempts")])
    assert (verdict.state, verdict.reason_code) == (AWAITING_REVIEW, "scanner_unavailable")
    assert decide([]) == Verdict(OK, "", "")
    assert decide([Finding(SUPPRESSED, "custom")]).state == SUPPRESSED


# -- the mailbox policy --------------------------------------------------------------------------------------


def test_policy_from_a_mailbox_and_its_settings(settings):
    settings.MAILROOM_MAX_MESSAGE_BYTES = 10_000_000
    mailbox = Mailbox(
        slug="support",
        address="support@acme.test",
        allowed_recipients=["Support@Acme.Test"],
        settings={
            "attachment_policy": {"max_bytes": 1000, "max_attachments": 5},
            "max_message_bytes": 2_000_000,
            "trusted_authserv_id": "mx.acme.test",
        },
    )
    policy = MailboxPolicy.from_mailbox(mailbox)
    assert policy.allowed_recipients == ("support@acme.test",)
    assert policy.max_message_bytes == 2_000_000
    assert policy.attachments.max_bytes == 1000 and policy.attachments.max_attachments == 5
    assert policy.attachments.allowed_types == AttachmentPolicy().allowed_types
    assert policy.trusted_authserv_id == "mx.acme.test"
    # A mailbox can lower the global limit, never raise it.
    assert MailboxPolicy.from_settings({"max_message_bytes": 50_000_000}).max_message_bytes == 10_000_000
    assert MailboxPolicy.from_mailbox(Mailbox(settings={}, allowed_recipients=[])) == MailboxPolicy(
        max_message_bytes=10_000_000
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"attachment_policy": {"max_bytes": "10"}},
        {"attachment_policy": {"max_attachments": -1}},
        {"attachment_policy": {"allowed_types": "application/pdf"}},
        {"attachment_policy": {"typo": 1}},
        {"attachment_policy": ["x"]},
        {"max_message_bytes": True},
        {"loop_header": "X Bad Header"},
        {"trusted_authserv_id": 5},
    ],
)
def test_malformed_settings_are_refused(bad):
    with pytest.raises(ValueError):
        MailboxPolicy.from_settings(bad)


# -- authentication results -----------------------------------------------------------------------------------


def test_only_the_trusted_authserv_id_is_believed():
    # The sender wrote two: a forged pass under another id and one under ours.
    forged = message(headers={"Authentication-Results": "evil.example; spf=pass; dkim=pass; dmarc=pass"})
    forged = forged.replace(b"Subject:", b"Authentication-Results: mx.acme.test; spf=pass; dkim=pass\nSubject:")
    # Our MTA adds its own on top, as the last hop.
    raw = (
        b"Authentication-Results: mx.acme.test; spf=fail smtp.mailfrom=example.com;\n"
        b" dkim=none; dmarc=fail (p=reject) header.from=example.com\n" + forged
    )
    parsed = parse_message(raw)
    assert len(parsed.authentication_results) == 3
    assert authentication_results(parsed, "mx.acme.test") == {
        "spf": "fail",
        "spf.smtp.mailfrom": "example.com",
        "dkim": "none",
        "dmarc": "fail",
        "dmarc.header.from": "example.com",
    }
    assert authentication_results(parsed, "MX.ACME.TEST")["spf"] == "fail"  # ids are case-insensitive
    assert authentication_results(parsed, "evil.example")["spf"] == "pass"  # only if someone trusts it
    assert authentication_results(parsed, "other.test") == {}
    assert authentication_results(parsed, "") == {}


def test_authentication_results_syntax():
    raw = message(
        headers={
            "Authentication-Results": 'mx.acme.test 1 (our mta; spf=pass); dkim=fail reason="bad; sig" '
            "header.d=a.example;"
            " dkim=pass (good) header.d=b.example header.s=sel; spf=softfail (x) "
            'smtp.mailfrom="x@example.com"; arc=none'
        }
    )
    results = authentication_results(parse_message(raw), "mx.acme.test")
    assert results == {
        "dkim": "pass",
        "dkim.header.d": "b.example",
        "dkim.header.s": "sel",
        "spf": "softfail",
        "spf.smtp.mailfrom": "x@example.com",
        "arc": "none",
    }
    none = message(headers={"Authentication-Results": "mx.acme.test; none"})
    assert authentication_results(parse_message(none), "mx.acme.test") == {}


# -- threading --------------------------------------------------------------------------------------------------


def test_thread_key_ties_replies_to_their_root():
    root = parse_message(message(headers={}))  # Message-ID <m1@example.com>
    reply = parse_message(
        message(headers={"In-Reply-To": "<m1@example.com>"}).replace(b"<m1@example.com>\n", b"<r1@example.com>\n", 1)
    )
    deep = parse_message(
        message(headers={"References": "<m1@example.com> <r1@example.com>", "In-Reply-To": "<r1@example.com>"})
    )
    keys = {thread_key(root), thread_key(reply), thread_key(deep)}
    assert len(keys) == 1 and len(keys.pop()) == 64
    other = parse_message(message(headers={"References": "<other@example.com>"}))
    assert thread_key(other) != thread_key(root)


def test_thread_key_without_any_id_comes_from_the_bytes():
    a = parse_message(b"From: a@example.com\r\n\r\none")
    b = parse_message(b"From: a@example.com\r\n\r\ntwo")
    assert thread_key(a) != thread_key(b) and len(thread_key(a)) == 64
    assert thread_key(a) == thread_key(parse_message(b"From: a@example.com\r\n\r\none"))
    assert len(thread_key(parse_message(b""))) == 64


@pytest.mark.parametrize(
    "subject, token",
    [
        ("Re: [#MR-1234] Printer on fire", "MR-1234"),
        ("[# mr-77 ] lower case", "MR-77"),
        ("Fwd: Re: [#MR-1] and [#MR-2]", "MR-1"),
        ("[MR-1234] no hash", None),
        ("#MR-1234 no brackets", None),
        ("", None),
        ("[#MR-] no number", None),
    ],
)
def test_subject_ticket_token(subject, token):
    assert subject_ticket_token(subject) == token


def test_subject_ticket_token_with_a_prefix():
    assert subject_ticket_token("[#JIRA-9] [#MR-5]", prefix="mr") == "MR-5"
    assert subject_ticket_token("[#JIRA-9]", prefix="MR") is None


def test_findings_lists_everything_that_fired():
    raw = message(
        sender="MAILER-DAEMON@mx.example.net",
        body=None,
        headers={"Auto-Submitted": "auto-replied", "Precedence": "junk"},
    )
    reasons = {f.reason_code for f in findings(parse_message(raw))}
    assert reasons == {"mailer_daemon", "auto_submitted", "precedence_bulk", "empty"}


# --- encrypted mail, bounces without an address, spam flags ----------------------------------


def test_encrypted_mail_goes_to_review_and_its_ciphertext_is_not_judged_by_type():
    from dataclasses import replace

    from intake.mime import Attachment

    parsed = parse_message(message())
    ciphertext = Attachment(
        filename="encrypted.asc",
        declared_type="application/octet-stream",
        sniffed_type="application/octet-stream",
        size=1200,
        sha256="0" * 64,
        content_id="",
        is_inline=False,
        origin="encrypted",
    )
    encrypted = replace(parsed, encrypted="pgp", attachments=[ciphertext], text="")
    verdict = validate(encrypted)
    assert (verdict.state, verdict.reason_code) == (AWAITING_REVIEW, "encrypted")
    assert "attachment_type" not in {f.reason_code for f in verdict.findings}
    # The same opaque bytes as an ordinary attachment are refused: the exemption is for ciphertext only.
    plain = replace(parsed, attachments=[replace(ciphertext, origin="")])
    assert validate(plain).reason_code == "attachment_type"


@pytest.mark.parametrize(
    "hint, content_type, reason",
    [
        ("mailer-daemon", "text/plain", "mailer_daemon"),
        ("postmaster", "text/plain", "mailer_daemon"),
        ("", "multipart/report", "delivery_report"),
    ],
)
def test_a_bounce_without_a_usable_from_is_a_bounce_not_missing_sender(hint, content_type, reason):
    from dataclasses import replace

    parsed = replace(parse_message(message(sender=None)), sender_hint=hint, content_type=content_type)
    assert parsed.sender == ""
    verdict = validate(parsed)
    assert (verdict.state, verdict.reason_code) == (SUPPRESSED, reason)
    assert "missing_sender" not in {f.reason_code for f in verdict.findings}


def test_a_message_without_any_sender_that_is_no_bounce_still_goes_to_review():
    from dataclasses import replace

    parsed = replace(parse_message(message(sender=None)), sender_hint="some text")
    assert validate(parsed).reason_code == "missing_sender"


def test_spam_flags_from_the_default_and_the_mailboxs_own_headers():
    from intake.validation import spam_flagged

    assert spam_flagged(parse_message(message(headers={"X-Spam-Flag": "YES"})))
    assert spam_flagged(
        parse_message(
            message(headers={"X-Spam-Status": "Yes, score=9.1 required=5.0 tests=BAYES_99,URIBL_BLACK autolearn=no"})
        )
    )
    assert not spam_flagged(
        parse_message(message(headers={"X-Spam-Status": "No, score=-0.1 required=5.0 tests=DKIM_SIGNED autolearn=ham"}))
    )
    assert not spam_flagged(parse_message(message(headers={"X-Spam-Flag": "NO"})))
    own = MailboxPolicy.from_settings({"spam_headers": ["X-Barracuda-Spam-Status: Yes"]})
    flagged = parse_message(message(headers={"X-Barracuda-Spam-Status": "Yes, SCORE=7.2"}))
    assert spam_flagged(flagged, own) and not spam_flagged(flagged)
    # The mailbox's list replaces the defaults.
    assert not spam_flagged(parse_message(message(headers={"X-Spam-Flag": "YES"})), own)
    with pytest.raises(ValueError):
        MailboxPolicy.from_settings({"spam_headers": ["no colon here"]})

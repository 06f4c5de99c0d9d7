"""The attachment type policy against what real mail carries: contact cards, calendars, web pages, attached
messages (.eml, Outlook .msg), signatures, audio and video allowed; archives allowed only as their members,
each judged (intake.mime.archives, intake.mime.containers); executables, scripts, macros and disguised
types refused wherever they sit."""

import bz2
import gzip
import io
import subprocess
import tarfile
import time
import zipfile
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path

import py7zr
import pytest

from intake.mime import archives, attachment_payload, iter_attachment_payloads, parse_message
from intake.mime.sniff import looks_like_message, sniff_type
from intake.scanning import ClamdClient
from intake.validation import MailboxPolicy, validate
from intake.validation.policy import AttachmentPolicy
from intake.validation.rules import attachment_type_problem
from intake.vocabulary import ReasonCode
from tests.clamd import EICAR
from tests.factories import email_message, make_event
from tests.outlook_msg import build_msg
from ticketing.destinations.capabilities import FILES_AFTER_WRITE, Capabilities
from ticketing.ticket_files import select_files

CORPUS = Path(__file__).parent / "corpus"
PDF = b"%PDF-1.4\n1 0 obj <</Type /Catalog>> endobj\ntrailer <</Root 1 0 R>>\n%%EOF\n"
EXE = b"MZ\x90\x00\x03\x00\x00\x00\x04\x00\x00\x00\xff\xff\x00\x00" + b"\x00" * 200
CONTENT_TYPES = b'<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"/>'
MESSAGE = (
    b"Received: from mail.fabrikam.example by mx.example.org; Fri, 27 Nov 2026 16:03:11 +0000\r\n"
    b"From: Fabrikam Billing <billing@fabrikam.example>\r\nTo: a@example.org\r\n"
    b"Subject: Invoice INV-1 is overdue\r\nDate: Fri, 27 Nov 2026 16:03:08 +0000\r\n"
    b"Message-ID: <inv-1@fabrikam.example>\r\nContent-Type: text/html; charset=utf-8\r\n\r\n"
    b"<!DOCTYPE html><html><body><p>Invoice INV-1 is overdue.</p></body></html>\r\n"
)
SENT = datetime(2026, 11, 27, 10, 41, tzinfo=UTC)


def zip_of(*members, compression=zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for name, data in members:
            archive.writestr(name, data)
    return buffer.getvalue()


def seven_zip_of(*members, **options) -> bytes:
    buffer = io.BytesIO()
    with py7zr.SevenZipFile(buffer, "w", **options) as archive:
        for name, data in members:
            archive.writestr(data, name)
    return buffer.getvalue()


def tar_of(*members) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def quote_msg(*attachments) -> bytes:
    return build_msg(
        subject="Quote 4471",
        sender_name="Dana Park",
        sender="dana.park@contoso.example",
        to="daniel.okafor@contoso.example",
        body="Hello Daniel,\r\nthe quote is attached.\r\n",
        sent=SENT,
        attachments=list(attachments),
    )


def parsed_with(*attachments):
    return parse_message(email_message(subject="files", attachments=list(attachments)))


def names(parsed) -> list[tuple[str, bool, str]]:
    return [(a.filename, a.nested, a.origin) for a in parsed.attachments]


# -- the policy: what real mail carries is allowed -------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "declared", "data", "expected"),
    [
        (
            "Claire Dubois.vcf",
            "text/vcard",
            b"BEGIN:VCARD\r\nVERSION:3.0\r\nN:Dubois;Claire;;;\r\nFN:Claire Dubois\r\nEND:VCARD\r\n",
            "text/vcard",
        ),
        (
            "invite.ics",
            "text/calendar",
            b"BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//Example//EN\r\nEND:VCALENDAR\r\n",
            "text/calendar",
        ),
        (
            "order.htm",
            "text/html",
            b"<!DOCTYPE html>\n<html><head><title>Order</title></head><body>x</body></html>\n",
            "text/html",
        ),
        (
            "page.htm",
            "application/octet-stream",
            b'<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html PUBLIC '
            b'"-//W3C//DTD XHTML 1.0 Strict//EN" "x">\n<html xmlns="http://www.w3.org/1999/xhtml"><body>x</body></html>',
            "text/html",
        ),
        (
            "signature.asc",
            "application/pgp-signature",
            b"-----BEGIN PGP SIGNATURE-----\n\niQEzBAEB\n=abcd\n-----END PGP SIGNATURE-----\n",
            "application/pgp-signature",
        ),
        (
            "New Recording.m4a",
            "audio/x-m4a",
            b"\x00\x00\x00\x1cftypM4A \x00\x00\x00\x00M4A isommp42" + b"\0" * 64,
            "audio/x-m4a",
        ),
        (
            "clip.mp4",
            "video/mp4",
            b"\x00\x00\x00\x20ftypisom\x00\x00\x02\x00isomiso2avc1mp41" + b"\0" * 64,
            "video/mp4",
        ),
        ("Invoice.eml", "application/octet-stream", MESSAGE, "message/rfc822"),
        ("settings.json", "application/json", b'{"proxy": "pac", "channel": "stable"}\n', "application/json"),
    ],
)
def test_common_harmless_attachments_are_allowed_by_default(filename, declared, data, expected):
    parsed = parsed_with((filename, declared, data))
    assert parsed.attachments[0].sniffed_type == expected
    assert validate(parsed).state == "ok"


@pytest.mark.parametrize(
    ("filename", "declared", "data"),
    [
        ("setup.exe", "application/octet-stream", EXE),
        ("invoice.pdf", "application/pdf", EXE),  # the name says pdf, the bytes say exe
        ("run.js", "text/plain", b"var shell = 1;\n"),
        ("update.sh", "text/plain", b"#!/bin/sh\necho hi\n"),
        (
            "report.docm",
            "application/octet-stream",
            zip_of(
                ("[Content_Types].xml", CONTENT_TYPES), ("word/document.xml", b"<w/>"), ("word/vbaProject.bin", b"x")
            ),
        ),
        ("tool.jar", "application/java-archive", zip_of(("META-INF/MANIFEST.MF", b"Manifest-Version: 1.0\n"))),
    ],
)
def test_executables_scripts_macros_and_disguised_files_stay_quarantined(filename, declared, data):
    verdict = validate(parsed_with((filename, declared, data)))
    assert (verdict.state, verdict.reason_code) == ("quarantined", "attachment_type")


def test_a_smime_signature_outside_multipart_signed_sniffs_as_one():
    raw = (CORPUS / "gateway_smime_p7s_mixed.eml").read_bytes()
    signature = b""
    for part in parse_message(raw).email_message.walk():
        if part.get_content_type() == "application/pkcs7-signature":
            signature = part.get_payload(decode=True)
    assert sniff_type(signature) == "application/octet-stream"  # libmagic alone
    assert sniff_type(signature, filename="smime.p7s") == "application/pkcs7-signature"
    parsed = parsed_with(("signature.p7s", "application/octet-stream", signature))
    assert parsed.attachments[0].sniffed_type == "application/pkcs7-signature"
    assert validate(parsed).state == "ok"


# -- attached messages are judged by what they are --------------------------------------------------------------


def test_an_attached_message_is_message_rfc822_whatever_libmagic_guesses():
    assert looks_like_message(MESSAGE)
    assert sniff_type(MESSAGE, declared_type="message/rfc822") == "message/rfc822"
    assert sniff_type(MESSAGE, filename="Invoice.eml") == "message/rfc822"
    # As Exchange sometimes sends it: message/rfc822 in base64, which the email package leaves undecoded.
    outer = EmailMessage()
    outer["From"], outer["To"], outer["Subject"] = "a@example.org", "support@acme.test", "fw"
    outer.set_content("forwarded")
    outer.add_attachment(MESSAGE, maintype="application", subtype="octet-stream", filename="Invoice INV-1.eml")
    parsed = parse_message(outer.as_bytes())
    assert [(a.filename, a.sniffed_type) for a in parsed.attachments] == [("Invoice INV-1.eml", "message/rfc822")]
    assert validate(parsed).state == "ok"


@pytest.mark.parametrize(
    "data",
    [
        b"<!DOCTYPE html><html><body>From: someone</body></html>",
        b"Subject: the agenda\nplease bring the printouts\n",
        b"Note: not a message\nFrom: me\n\nbody",
    ],
)
def test_bytes_named_as_a_message_that_are_not_one_are_judged_by_libmagic(data):
    assert not looks_like_message(data)
    sniffed = sniff_type(data, declared_type="message/rfc822", filename="x.eml")
    assert sniffed != "message/rfc822"
    assert sniffed == sniff_type(data)


# -- archives: allowed as their members -------------------------------------------------------------------------


def test_a_zip_of_documents_is_allowed_and_its_members_listed_after_it():
    docx = zip_of(("[Content_Types].xml", CONTENT_TYPES), ("word/document.xml", b"<w/>"))
    parsed = parsed_with(
        ("scans.zip", "application/zip", zip_of(("a/scan 1.pdf", PDF), ("letter.docx", docx), ("empty/", b"")))
    )
    assert names(parsed) == [
        ("scans.zip", False, ""),
        ("scan 1.pdf", True, "archive"),
        ("letter.docx", True, "archive"),
    ]
    assert parsed.attachments[0].contents == "listed"
    assert parsed.attachments[2].sniffed_type.endswith("wordprocessingml.document")  # the OOXML refinement
    assert validate(parsed).state == "ok"


@pytest.mark.parametrize(
    ("archive", "refused"),
    [
        (zip_of(("invoice.pdf.exe", EXE)), "invoice.pdf.exe"),
        (zip_of(("Payment_Advice.js", b"var x = 1;\n")), "Payment_Advice.js"),
        (zip_of(("invoice.pdf", EXE)), "invoice.pdf"),
        (
            zip_of(
                (
                    "Q3.docx",
                    zip_of(
                        ("[Content_Types].xml", CONTENT_TYPES),
                        ("word/document.xml", b"<w/>"),
                        ("word/vbaProject.bin", b"x"),
                    ),
                )
            ),
            "Q3.docx",
        ),
        (zip_of(("outer/readme.txt", b"hello"), ("inner.zip", zip_of(("setup.exe", EXE)))), "setup.exe"),
        (seven_zip_of(("report.pdf", PDF), ("setup.exe", EXE)), "setup.exe"),
        (gzip.compress(tar_of(("logs/app.log", b"ok\n"), ("logs/run.sh", b"#!/bin/sh\nrm -rf /tmp/x\n"))), "run.sh"),
        (bz2.compress(tar_of(("bin/tool.exe", EXE))), "tool.exe"),
    ],
)
def test_an_archive_holding_an_executable_or_script_is_quarantined(archive, refused):
    verdict = validate(parsed_with(("files.bin", "application/octet-stream", archive)))
    assert (verdict.state, verdict.reason_code) == ("quarantined", "attachment_type")
    assert verdict.detail.startswith(f"{refused}:")


def test_a_zip_whose_central_directory_says_encrypted_goes_to_review_as_encrypted_archive(tmp_path):
    (tmp_path / "salaries.csv").write_text("team,budget\nsupport,1\n")
    subprocess.run(["zip", "-q", "-P", "secret", "locked.zip", "salaries.csv"], cwd=tmp_path, check=True)
    parsed = parsed_with(("locked.zip", "application/zip", (tmp_path / "locked.zip").read_bytes()))
    assert names(parsed) == [("locked.zip", False, ""), ("salaries.csv", True, "encrypted")]
    assert parsed.attachments[0].contents == "encrypted"
    verdict = validate(parsed)
    assert (verdict.state, verdict.reason_code) == ("awaiting_review", ReasonCode.ENCRYPTED_ARCHIVE)


@pytest.mark.parametrize("header_encryption", [False, True])
def test_an_encrypted_7z_goes_to_review_whether_its_names_show_or_not(header_encryption):
    data = seven_zip_of(("report.pdf", PDF), password="secret", header_encryption=header_encryption)
    parsed = parsed_with(("report.7z", "application/x-7z-compressed", data))
    assert [n for n, _, _ in names(parsed)] == (["report.7z"] if header_encryption else ["report.7z", "report.pdf"])
    verdict = validate(parsed)
    assert (verdict.state, verdict.reason_code) == ("awaiting_review", ReasonCode.ENCRYPTED_ARCHIVE)


def test_an_exe_beside_an_encrypted_member_still_quarantines():
    listing_with_exe = zip_of(("setup.exe", EXE))
    parsed = parsed_with(
        ("a.zip", "application/zip", listing_with_exe),
        ("b.7z", "application/x-7z-compressed", seven_zip_of(("x.pdf", PDF), password="p")),
    )
    verdict = validate(parsed)
    assert verdict.state == "quarantined"
    assert ReasonCode.ENCRYPTED_ARCHIVE in [finding.reason_code for finding in verdict.findings]


def test_a_tar_inside_gzip_or_bzip2_is_listed_and_a_plain_gzip_is_its_one_file():
    logs = tar_of(("logs/nginx-error.log", b"upstream timed out\n" * 50), ("logs/worker.log", b"queue depth\n"))
    for data in (gzip.compress(logs), bz2.compress(logs)):
        parsed = parsed_with(("logs.tar.gz", "application/gzip", data))
        assert [n for n, _, _ in names(parsed)] == ["logs.tar.gz", "nginx-error.log", "worker.log"]
        assert validate(parsed).state == "ok"
    parsed = parsed_with(("server.log.gz", "application/gzip", gzip.compress(b"GET / 200\n" * 5000)))
    assert [(a.filename, a.size, a.sniffed_type) for a in parsed.attachments[1:]] == [
        ("server.log", 50_000, "text/plain")
    ]


def test_macos_finder_metadata_is_not_listed_but_another_file_under_macosx_is():
    appledouble = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " + b"\0" * 40
    data = zip_of(("Scans/a.pdf", PDF), ("__MACOSX/Scans/._a.pdf", appledouble), ("__MACOSX/._run.exe", EXE))
    parsed = parsed_with(("Scans.zip", "application/zip", data))
    assert [n for n, _, _ in names(parsed)] == ["Scans.zip", "a.pdf", "_run.exe"]  # ends stripped, as in MIME
    assert validate(parsed).state == "quarantined"


def test_a_zip_bomb_is_listed_without_being_decompressed():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for n in range(2):  # together twice the decompression budget
            archive.writestr(f"zeros{n}.bin", b"\0" * archives.MAX_DECOMPRESSED_BYTES)
    bomb = buffer.getvalue()
    assert len(bomb) < 1_000_000
    started = time.monotonic()
    parsed = parsed_with(("bomb.zip", "application/zip", bomb))
    assert time.monotonic() - started < 1
    assert [a.size for a in parsed.attachments[1:]] == [archives.MAX_DECOMPRESSED_BYTES] * 2  # as declared
    assert all(a.sha256 == "" for a in parsed.attachments[1:])  # only their first bytes were read


def test_a_tar_gz_that_decompresses_past_the_budget_goes_to_a_person():
    huge = tar_of(("big.log", b"A" * (archives.MAX_DECOMPRESSED_BYTES + (1 << 20))))
    parsed = parsed_with(("big.tar.gz", "application/gzip", gzip.compress(huge, compresslevel=1)))
    assert parsed.too_complex and "ArchiveNotFullyListed" in parsed.defects
    assert parsed.attachments[0].contents == "unreadable"
    verdict = validate(parsed)
    assert verdict.state == "awaiting_review"
    # Its member is over the per-file limit, but a member is no file of its own: the reason is the listing.
    assert [f.reason_code for f in verdict.findings] == ["too_complex"]


@pytest.mark.parametrize("data", [b"PK\x03\x04" + b"\x00" * 300, b"7z\xbc\xaf\x27\x1c" + b"\x01" * 300])
def test_a_damaged_archive_goes_to_review(data):
    verdict = validate(parsed_with(("files.zip", "application/zip", data)))
    assert verdict.state == "awaiting_review"


def test_an_archive_with_more_members_than_the_limit_goes_to_review():
    data = zip_of(*((f"page{n}.txt", b"hello") for n in range(archives.MAX_MEMBERS + 5)))
    parsed = parsed_with(("pages.zip", "application/zip", data))
    assert len(parsed.attachments) == 1 + archives.MAX_MEMBERS
    assert parsed.too_complex
    assert validate(parsed).state == "awaiting_review"


def test_files_inside_an_archive_count_neither_toward_the_attachment_limit_nor_the_file_size_limit():
    pages = zip_of(*((f"scan {n:02d}.pdf", PDF) for n in range(60)))
    parsed = parsed_with(("scans.zip", "application/zip", pages))
    assert len(parsed.attachments) == 61
    assert validate(parsed).state == "ok"  # one file arrived, and it is what goes to the desk
    tight = AttachmentPolicy(max_attachments=1, max_bytes=len(pages))
    big_log = zip_of(("app.log", b"request ok\n" * 20000))
    logs = parsed_with(("logs.zip", "application/zip", big_log))
    assert logs.attachments[1].size > len(big_log)
    assert (
        validate(logs, MailboxPolicy(attachments=AttachmentPolicy(max_attachments=1, max_bytes=len(big_log)))).state
        == "ok"
    )
    assert (
        validate(
            parsed_with(("a.pdf", "application/pdf", PDF), ("b.pdf", "application/pdf", PDF)),
            MailboxPolicy(attachments=tight),
        ).reason_code
        == "too_many_attachments"
    )


# -- Outlook .msg: listed with the files inside it -----------------------------------------------------------------


def test_an_outlook_msg_is_listed_with_the_files_inside_it():
    msg = quote_msg(
        ("Quote 4471.pdf", "application/pdf", PDF), ("terms.zip", "application/zip", zip_of(("terms.pdf", PDF)))
    )
    parsed = parsed_with(("Quote 4471.msg", "application/vnd.ms-outlook", msg))
    assert names(parsed) == [
        ("Quote 4471.msg", False, ""),
        ("Quote 4471.pdf", True, "outlook"),
        ("terms.zip", True, "outlook"),
        ("terms.pdf", True, "archive"),
    ]
    assert parsed.attachments[0].sniffed_type == "application/vnd.ms-outlook"
    assert parsed.attachments[0].contents == "listed"
    assert validate(parsed).state == "ok"
    assert "the quote is attached" not in parsed.text  # the outer body stays the body
    payloads = {a.filename: data for a, data in iter_attachment_payloads(parsed)}
    assert payloads["Quote 4471.pdf"] == PDF and payloads["terms.pdf"] == PDF
    assert attachment_payload(parsed, 3) == PDF


def test_a_msg_holding_an_executable_is_quarantined():
    msg = quote_msg(("setup.exe", "application/x-msdownload", EXE))
    msg = quote_msg(("setup.exe", "application/x-msdownload", EXE))
    parsed = parsed_with(("fw.msg", "application/octet-stream", msg))
    verdict = validate(parsed)
    assert (verdict.state, verdict.reason_code) == ("quarantined", "attachment_type")
    assert verdict.detail.startswith("setup.exe:")


def test_a_msg_that_cannot_be_opened_goes_to_review_not_to_quarantine():
    broken = quote_msg(("Quote 4471.pdf", "application/pdf", PDF))[:4096]
    parsed = parsed_with(("Quote 4471.msg", "application/vnd.ms-outlook", broken))
    assert parsed.attachments[0].sniffed_type == "application/vnd.ms-outlook"
    assert parsed.attachments[0].contents == "unreadable" and "UnreadableOutlookMsg" in parsed.defects
    verdict = validate(parsed)
    assert (verdict.state, verdict.reason_code) == ("awaiting_review", "too_complex")


def test_the_body_of_a_msg_is_used_only_when_the_message_has_no_other():
    raw = email_message(body="", attachments=[("fw.msg", "application/vnd.ms-outlook", quote_msg())])
    assert "the quote is attached" in parse_message(raw).text


# -- downstream: scanned one by one, sent to desks once ---------------------------------------------------------------


def test_a_virus_inside_a_msg_or_an_archive_is_found_in_the_file_that_holds_it(clamd):
    msg = quote_msg(("readme.txt", "text/plain", b"padding " * 100 + EICAR))
    parsed = parsed_with(
        ("fw.msg", "application/vnd.ms-outlook", msg),
        ("docs.tar.gz", "application/gzip", gzip.compress(tar_of(("notes.txt", EICAR)))),
    )
    client = ClamdClient(clamd.tcp_address)
    found = {a.filename for a, data in iter_attachment_payloads(parsed) if not client.scan(data).clean}
    assert {"readme.txt", "notes.txt"} <= found


def test_members_of_archives_and_msgs_are_judged_but_never_sent_to_a_desk_twice(mailbox):
    raw = email_message(
        subject="files",
        attachments=[
            ("scans.zip", "application/zip", zip_of(("scan.pdf", PDF))),
            ("Quote.msg", "application/vnd.ms-outlook", quote_msg(("Quote.pdf", "application/pdf", PDF))),
        ],
    )
    event = make_event(mailbox, raw)
    parsed = parse_message(raw)
    files, held = select_files(event, parsed, Capabilities(files=FILES_AFTER_WRITE))
    assert [file.filename for file in files] == ["scans.zip", "Quote.msg"]
    assert held == ()
    assert [a.filename for a in parsed.attachments if a.nested] == ["scan.pdf", "Quote.pdf"]
    limits = AttachmentPolicy()
    assert all(attachment_type_problem(a, limits) is None for a in parsed.attachments)

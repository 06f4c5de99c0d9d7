"""The body page of a recovery item: header fields, each alternative as text, attachments with their
verdicts, a folded long body, and a sentence when there is no text.

Messages are written as real clients write them (Thunderbird, Outlook, Apple Mail), or taken from
tests/corpus (real S/MIME and PGP/MIME ciphertext); they go through `ingest` and the pipeline's own
`normalize`, so the verdicts shown are the ones normalization stored on the event.
"""

import re
from pathlib import Path

import pytest
from django.utils import timezone

from intake.keys import provider_message_id_for_raw
from intake.models import AuditEvent, InboxEvent
from intake.normalize import normalize
from intake.services import ingest
from reconciliation.admin.body import FOLD_CHARS, FOLD_LINES, fold
from reconciliation.services.bodies import attachment_rows
from tests.browser import browser, chromium_path  # noqa: F401  (fixtures)
from tests.support.queue import QUEUE_URL
from tests.support.users import PASSWORD, make_user

CORPUS = Path(__file__).parent / "corpus"
SCREENSHOT_DIR = Path(__file__).resolve().parents[1] / "var" / "screenshots"

THUNDERBIRD = b"""\
Message-ID: <8f3c2a1e-5b7d-4c9a-a1e2-3f4b5c6d7e8f@posteo.example>
Date: Tue, 1 Dec 2026 09:14:07 +0100
MIME-Version: 1.0
User-Agent: Mozilla Thunderbird
Content-Language: de-DE
To: support@acme.test
Cc: =?UTF-8?Q?J=C3=BCrgen_M=C3=BCller?= <juergen.mueller@posteo.example>,
 "Berger, Anna" <anna.berger@posteo.example>
From: Lukas Berger <lukas.berger@posteo.example>
Subject: VPN drops every 20 minutes
Content-Type: multipart/alternative;
 boundary="------------9Hm2QxT4cL7vB1nZ8kR3wY6p"

This is a multi-part message in MIME format.
--------------9Hm2QxT4cL7vB1nZ8kR3wY6p
Content-Type: text/plain; charset=UTF-8; format=flowed
Content-Transfer-Encoding: 8bit

Hello,

since Monday the VPN drops every 20 minutes on my laptop.
J\xc3\xbcrgen sees the same.

Lukas

--------------9Hm2QxT4cL7vB1nZ8kR3wY6p
Content-Type: text/html; charset=UTF-8
Content-Transfer-Encoding: 8bit

<!DOCTYPE html>
<html>
  <head><meta http-equiv="content-type" content="text/html; charset=UTF-8"></head>
  <body>
    <p>Hello,</p>
    <p>since Monday the <b>VPN drops</b> every 20 minutes on my laptop.<br>J\xc3\xbcrgen sees the same.</p>
    <p>Lukas</p>
  </body>
</html>

--------------9Hm2QxT4cL7vB1nZ8kR3wY6p--
"""

OUTLOOK = b"""\
From: "Dubois, Claire" <claire.dubois@example.fr>
To: "support@acme.test" <support@acme.test>
CC: Marc Lefevre <marc.lefevre@example.fr>; "IT Desk" <itdesk@example.fr>
Subject: Badge reader at entrance B
Thread-Topic: Badge reader at entrance B
Thread-Index: AdrEk2Lm3Qm0k1hYTe2m9Pz3x4yZ5w==
Date: Mon, 30 Nov 2026 16:02:11 +0000
Message-ID: <PR1P264MB3712A0B1C2D3E4F5@PR1P264MB3712.FRAP264.PROD.OUTLOOK.COM>
Accept-Language: fr-FR, en-US
Content-Language: en-US
X-MS-Has-Attach:
X-MS-TNEF-Correlator:
Content-Type: multipart/alternative;
\tboundary="_000_PR1P264MB3712A0B1C2D3E4F5PR1P264MB3712FRAP_"
MIME-Version: 1.0

--_000_PR1P264MB3712A0B1C2D3E4F5PR1P264MB3712FRAP_
Content-Type: text/plain; charset="iso-8859-1"
Content-Transfer-Encoding: quoted-printable

Bonjour,

the badge reader at entrance B refuses every badge since this morning. Can s=
omeone from facilities have a look?

Merci,
Claire

--_000_PR1P264MB3712A0B1C2D3E4F5PR1P264MB3712FRAP_
Content-Type: text/html; charset="iso-8859-1"
Content-Transfer-Encoding: quoted-printable

<html xmlns:o=3D"urn:schemas-microsoft-com:office:office">
<head><meta http-equiv=3D"Content-Type" content=3D"text/html; charset=3Diso-8859-1">
<style><!-- p.MsoNormal {margin:0cm;} --></style></head>
<body lang=3D"FR"><div class=3D"WordSection1">
<p class=3D"MsoNormal">Bonjour,</p>
<p class=3D"MsoNormal">the badge reader at entrance B refuses every badge since=
 this morning. Can someone from facilities have a look?</p>
<p class=3D"MsoNormal">Merci,<br>Claire</p>
</div></body></html>

--_000_PR1P264MB3712A0B1C2D3E4F5PR1P264MB3712FRAP_--
"""

APPLE_MAIL = b"""\
From: Ahmed Khan <ahmed.khan@me.com>
Content-Type: multipart/alternative;
\tboundary="Apple-Mail=_5F2A9C3E-7B1D-4E8F-A6C2-9D0E1F2A3B4C"
Mime-Version: 1.0 (Mac OS X Mail 16.0 \\(3774.600.62\\))
Subject: Printer on floor 2 prints blank pages
Message-Id: <7C1D9E2F-3A4B-4C5D-8E6F-0A1B2C3D4E5F@me.com>
Date: Sun, 29 Nov 2026 21:45:30 -0500
Cc: Sara Khan <sara.khan@me.com>
To: support@acme.test
X-Mailer: Apple Mail (2.3774.600.62)

--Apple-Mail=_5F2A9C3E-7B1D-4E8F-A6C2-9D0E1F2A3B4C
Content-Transfer-Encoding: 7bit
Content-Type: text/plain;
\tcharset=us-ascii

The printer on floor 2 prints blank pages since the toner was changed.

--Apple-Mail=_5F2A9C3E-7B1D-4E8F-A6C2-9D0E1F2A3B4C
Content-Transfer-Encoding: 7bit
Content-Type: text/html;
\tcharset=us-ascii

<html><head><meta http-equiv="Content-Type" content="text/html; charset=us-ascii"></head>
<body style="word-wrap: break-word; -webkit-nbsp-mode: space; line-break: after-white-space;" class="">
The printer on floor 2 prints blank pages since the toner was changed.<div class=""><br class=""></div></body></html>
--Apple-Mail=_5F2A9C3E-7B1D-4E8F-A6C2-9D0E1F2A3B4C--
"""

HOSTILE_HTML = b"""\
From: Mallory <mallory@customer.test>
To: support@acme.test
Subject: Your invoice
Date: Tue, 1 Dec 2026 10:00:00 +0000
Message-ID: <hostile-1@customer.test>
MIME-Version: 1.0
Content-Type: text/html; charset=utf-8

<html><body><script>document.title = "owned"; alert("xss")</script>
<p>Please pay <b>now</b>.</p>
<img src="x" onerror="document.title = 'owned-img'">
<p>Type &lt;script&gt;alert(2)&lt;/script&gt; into the form.</p>
</body></html>
"""


def store(mailbox, raw: bytes, *, judge=True) -> int:
    """Ingest as a webhook does, then let the pipeline's normalization judge it (verdicts on the event)."""
    event_id = ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id
    if judge:
        normalize(InboxEvent.objects.get(pk=event_id), "system:test")
    InboxEvent.objects.filter(pk=event_id, state="ready").update(state="awaiting_review", reason_code="empty")
    return event_id


def text_of(fragment: str) -> str:
    """The visible text of an HTML fragment (tags dropped, entities of the page undone)."""
    from html import unescape

    return " ".join(unescape(re.sub(r"<[^>]+>", " ", fragment)).split()).replace(" ,", ",")


def section(page: str, element_id: str) -> str:
    """The inner HTML of the element with `element_id` (a <dd>, <p> or <pre> of the body page)."""
    return re.search(rf'id="{element_id}"[^>]*>(.*?)</(?:dd|p|pre)>', page, re.S).group(1)


@pytest.fixture
def sec_client(client, tenant):
    client.force_login(make_user("sec", groups=["security"], tenants=[tenant]))
    return client


@pytest.fixture(autouse=True)
def _no_scanner(scanner_off):
    pass


def body_page(client, event_id) -> str:
    response = client.get(f"{QUEUE_URL}{event_id}/body/")
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    return response.content.decode()


def test_a_thunderbird_message_shows_from_to_cc_date_and_message_id(sec_client, mailbox):
    event_id = store(mailbox, THUNDERBIRD)
    page = body_page(sec_client, event_id)
    assert text_of(section(page, "body-from")) == "Lukas Berger <lukas.berger@posteo.example>"
    assert text_of(section(page, "body-to")) == "support@acme.test"
    assert text_of(section(page, "body-cc")) == (
        "Jürgen Müller <juergen.mueller@posteo.example>, Berger, Anna <anna.berger@posteo.example>"
    )
    # The Date in the console's one format (UTC here), with the header as sent beside it.
    assert text_of(section(page, "body-date")).startswith("2026-12-01 08:14 UTC (")
    assert "Tue, 1 Dec 2026 09:14:07 +0100" in section(page, "body-date")
    assert text_of(section(page, "body-message-id")) == "8f3c2a1e-5b7d-4c9a-a1e2-3f4b5c6d7e8f@posteo.example"
    assert [a.actor for a in AuditEvent.objects.filter(inbox_event_id=event_id, kind="body_viewed")] == ["user:sec"]


@pytest.mark.parametrize(
    "raw, cc, words",
    [
        (
            OUTLOOK,
            "Marc Lefevre <marc.lefevre@example.fr>, IT Desk <itdesk@example.fr>",
            "the badge reader at entrance B refuses every badge since this morning",
        ),
        (APPLE_MAIL, "Sara Khan <sara.khan@me.com>", "The printer on floor 2 prints blank pages"),
        (THUNDERBIRD, None, "since Monday the VPN drops every 20 minutes"),
    ],
    ids=["outlook", "apple-mail", "thunderbird"],
)
def test_each_alternative_of_a_real_clients_message_is_shown_as_text(sec_client, mailbox, raw, cc, words):
    page = body_page(sec_client, store(mailbox, raw))
    if cc:
        assert text_of(section(page, "body-cc")) == cc
    alternatives = page.split("Alternatives as sent", 1)[1]
    plain, html = alternatives.split("<h3>text/plain</h3>", 1)[1].split("<h3>text/html</h3>", 1)
    assert words in " ".join(plain.split()) and words in " ".join(html.split())
    # The HTML alternative is text: none of its markup or styles reaches the page.
    assert "MsoNormal" not in html and "word-wrap" not in html and "&lt;p" not in html


def test_html_with_a_script_is_shown_as_text_never_as_markup(sec_client, mailbox):
    page = body_page(sec_client, store(mailbox, HOSTILE_HTML))
    body = page.split('id="message-body"', 1)[1].split("</pre>", 1)[0]
    assert "Please pay now." in " ".join(body.split())
    assert "Converted from the HTML part to text" in page
    # Text that spells a tag is escaped; no tag, handler or script of the message is in the page.
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in body
    assert "<script>alert" not in page and "onerror" not in page and "owned" not in page
    assert "<b>now</b>" not in page


def test_a_long_body_is_folded_after_200_lines_and_shown_whole_behind_show_all(sec_client, mailbox):
    lines = [f"{n:05d} kernel: usb 1-1: device descriptor read/64, error -71 on port {n % 8}" for n in range(3900)]
    body = "\n".join(lines) + "\n"
    assert 260_000 < len(body) < 290_000  # the 273 KB body of the issue
    raw = (
        b"From: monitor@ops.example\r\nTo: support@acme.test\r\nSubject: dmesg\r\n"
        b"Message-ID: <dmesg-1@ops.example>\r\nDate: Tue, 1 Dec 2026 10:00:00 +0000\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: text/plain; charset=us-ascii\r\n\r\n" + body.replace("\n", "\r\n").encode()
    )
    page = body_page(sec_client, store(mailbox, raw))
    head = page.split('id="message-body"', 1)[1].split("</pre>", 1)[0]
    assert lines[0] in head and lines[199] in head and lines[200] not in head
    fold_html = page.split('<details class="body-fold">', 1)[1].split("</details>", 1)[0]
    assert "Show all: 3700 more lines (3900 lines," in " ".join(fold_html.split())
    rest = fold_html.split("</summary>", 1)[1]
    assert lines[200] in rest and lines[-1] in rest and lines[199] not in rest


def test_folding_cuts_a_text_of_few_long_lines_at_20_kb_at_a_line_end():
    text = "\n".join("x" * 999 for _ in range(60))  # 60 lines of 1,000 characters: 60 KB, under 200 lines
    folded = fold(text)
    assert len(folded.head) <= FOLD_CHARS and folded.head.endswith("x") and folded.head + "\n" + folded.rest == text
    assert folded.lines == 60 and folded.hidden_lines == 60 - folded.head.count("\n") - 1
    assert fold("short\ntext\n").rest == "" and fold("").lines == 0
    assert fold("\n".join(["line"] * FOLD_LINES)).rest == ""  # exactly 200 lines: nothing to fold


@pytest.mark.parametrize(
    "corpus_file, method", [("smime_encrypted.eml", "S/MIME"), ("pgp_mime_encrypted.eml", "PGP/MIME")]
)
def test_an_encrypted_message_says_why_its_text_is_empty(sec_client, mailbox, corpus_file, method):
    event_id = store(mailbox, (CORPUS / corpus_file).read_bytes())
    assert InboxEvent.objects.get(pk=event_id).reason_code == "encrypted"
    page = body_page(sec_client, event_id)
    note = text_of(section(page, "body-text-note"))
    assert note.startswith(f"The message is {method} encrypted: its text is inside the encrypted part")
    assert 'id="message-body"' not in page
    rows = text_of(page.split('id="body-attachments"', 1)[1].split("</table>", 1)[0])
    assert "encrypted content (not judged by the type policy)" in rows and "download" in rows


def test_attachments_show_the_verdicts_stored_on_the_event_and_download_links(sec_client, mailbox):
    from email.message import EmailMessage

    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = "eve@customer.test", "support@acme.test", "Run this"
    message["Message-ID"], message["Date"] = "<run-1@customer.test>", "Tue, 1 Dec 2026 10:00:00 +0000"
    message.set_content("Please run the attached tool.\n")
    message.add_attachment(
        b"MZ\x90\x00" + b"\x00" * 200, maintype="application", subtype="octet-stream", filename="run.exe"
    )
    message.add_attachment(b"col1,col2\n1,2\n", maintype="text", subtype="csv", filename="data.csv")
    event_id = store(mailbox, message.as_bytes())
    assert InboxEvent.objects.get(pk=event_id).state == "quarantined"
    page = body_page(sec_client, event_id)
    rows = page.split('id="body-attachments"', 1)[1].split("</table>", 1)[0].split("<tr>")[2:]
    exe, csv = (text_of(row) for row in rows)
    assert exe.startswith("0 run.exe") and "Refused by the type policy: " in exe
    assert csv.startswith("1 data.csv") and "No finding" in csv
    assert f'href="{QUEUE_URL}{event_id}/attachment/1/"' in page
    download = sec_client.get(f"{QUEUE_URL}{event_id}/attachment/1/")
    assert download.status_code == 200 and download.content == b"col1,col2\n1,2\n"


def test_a_malware_finding_is_shown_on_the_file_it_names(mailbox):
    from intake.mime import parse_message

    raw = (
        b"From: a@customer.test\r\nTo: support@acme.test\r\nSubject: s\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nhi\r\n"
        b'--b\r\nContent-Type: application/zip\r\nContent-Disposition: attachment; filename="a.zip"\r\n\r\nPK\r\n'
        b"--b\r\nContent-Type: application/pdf\r\n"
        b'Content-Disposition: attachment; filename="a.zip.pdf"\r\n\r\n%PDF\r\n'
        b"--b--\r\n"
    )
    details = {"findings": [{"state": "quarantined", "reason": "malware", "detail": "a.zip: Eicar-Test-Signature"}]}
    zip_row, pdf_row = attachment_rows(parse_message(raw).attachments, details)
    assert zip_row.verdicts == ["Malware signature found: Eicar-Test-Signature"]
    assert pdf_row.verdicts == [] and pdf_row.checked
    assert attachment_rows(parse_message(raw).attachments, {})[0].checked is False  # not judged yet


def test_a_message_with_only_attachments_or_nothing_says_so(sec_client, mailbox):
    only_files = (
        b"From: a@customer.test\r\nTo: support@acme.test\r\nSubject: scan\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: application/pdf\r\n"
        b'Content-Disposition: attachment; filename="scan.pdf"\r\n\r\n%PDF-1.4 scan\r\n--b--\r\n'
    )
    page = body_page(sec_client, store(mailbox, only_files))
    assert "The message has no body text, only the attachments listed below." in page
    empty = b"From: a@customer.test\r\nTo: support@acme.test\r\nSubject: (empty)\r\n\r\n"
    page = body_page(sec_client, store(mailbox, empty))
    assert "The message has no body text and no attachments." in page and "No attachments." in page


def test_a_message_the_parser_cannot_walk_says_it_could_not_be_read(sec_client, mailbox):
    raw = (
        b"From: a@customer.test\r\nTo: support@acme.test\r\nSubject: parts\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: multipart/mixed; boundary=b\r\n\r\n" + b"--b\r\n" * 20_001
    )
    page = body_page(sec_client, store(mailbox, raw))
    assert "Mailroom could not read every part of this message" in text_of(section(page, "body-text-note"))
    assert text_of(section(page, "body-from")) == "a@customer.test"  # the headers are still shown


def test_a_purged_body_says_retention_removed_it_and_still_audits_the_view(sec_client, mailbox):
    event_id = store(mailbox, THUNDERBIRD)
    InboxEvent.objects.filter(pk=event_id).update(raw=None, purged_at=timezone.now())
    page = body_page(sec_client, event_id)
    assert "purged by retention on " in page and "there is no text to show" in page
    assert 'id="body-headers"' not in page
    assert AuditEvent.objects.filter(inbox_event_id=event_id, kind="body_viewed").count() == 1


def test_an_operator_without_the_body_permission_gets_403_and_no_audit_row(client, tenant, mailbox):
    event_id = store(mailbox, THUNDERBIRD)
    client.force_login(make_user("oper", groups=["operator"], tenants=[tenant]))
    assert client.get(f"{QUEUE_URL}{event_id}/body/").status_code == 403
    assert not AuditEvent.objects.filter(inbox_event_id=event_id, kind="body_viewed").exists()


@pytest.mark.live
def test_in_a_browser_the_long_body_unfolds_and_the_messages_script_never_runs(live_server, browser, tenant, mailbox):
    from tests.support.pages import new_context_page, walk

    make_user("sec", groups=["security"], tenants=[tenant])
    hostile = store(mailbox, HOSTILE_HTML)
    long_body = "\n".join(f"{n:05d} kernel: usb 1-1: device descriptor read/64, error -71" for n in range(4000))
    long_raw = (
        b"From: monitor@ops.example\r\nTo: support@acme.test\r\nCc: Night Shift <night@ops.example>\r\n"
        b"Subject: dmesg\r\nMessage-ID: <dmesg-2@ops.example>\r\nDate: Tue, 1 Dec 2026 10:00:00 +0000\r\n"
        b"Content-Type: text/plain; charset=us-ascii\r\n\r\n" + long_body.encode()
    )
    folded = store(mailbox, long_raw)
    with_files = store(mailbox, (CORPUS / "outlook_exchange_related_pdf.eml").read_bytes())
    context, page = new_context_page(browser)
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    try:
        page.goto(f"{live_server.url}/admin/login/?next={QUEUE_URL}")
        page.fill("#id_username", "sec")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_url(f"**{QUEUE_URL}")
        problems = walk(page, f"{live_server.url}{QUEUE_URL}{hostile}/body/", "body-hostile-html")
        assert page.title() != "owned" and dialogs == []
        assert page.locator("#message-body script, #message-body b, #message-body img").count() == 0
        assert "<script>alert(2)</script>" in page.inner_text("#message-body")  # as text, escaped

        problems += walk(page, f"{live_server.url}{QUEUE_URL}{folded}/body/", "body-long-folded")
        page.set_viewport_size({"width": 800, "height": 900})
        folded_height = page.evaluate("document.documentElement.scrollHeight")
        assert folded_height < 8000 and not page.locator("details.body-fold pre").is_visible()
        page.click("details.body-fold summary")
        assert page.locator("details.body-fold pre").is_visible()
        assert "03999 kernel" in page.inner_text("details.body-fold pre")
        assert page.evaluate("document.documentElement.scrollHeight") > 5 * folded_height
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        page.screenshot(path=str(SCREENSHOT_DIR / "body-long-unfolded-800.png"))
        problems += walk(page, f"{live_server.url}{QUEUE_URL}{with_files}/body/", "body-attachments")
        assert page.locator("#body-attachments a", has_text="download").first.is_visible()
    finally:
        context.close()
    assert not problems, "\n".join(problems)

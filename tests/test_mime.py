"""MIME parsing: what ordinary mail gives, and that no mail whatsoever makes it raise.

The corpus test runs every file of the interpreter's own email test data (when
the folder exists) and at least 40 generated malformed messages through
`parse_message` and `validate`, and prints a tally of the verdicts.
"""

import hashlib
import time
from collections import Counter
from email.message import EmailMessage

from hypothesis import HealthCheck, given, settings, strategies as st

from intake.mime import (
    MAX_DESCRIPTION_CHARS,
    ParsedMessage,
    attachment_payload,
    decode_header_value,
    iter_attachment_payloads,
    parse_message,
)
from intake.mime.htmltext import html_to_text
from intake.validation import (
    AWAITING_REVIEW,
    OK,
    QUARANTINED,
    SUPPRESSED,
    MailboxPolicy,
    authentication_results,
    subject_ticket_token,
    thread_key,
    validate,
)
from tests.support.mime import PDF, generated_corpus, multipart_message, stdlib_corpus, typical_message

STATES = {OK, AWAITING_REVIEW, SUPPRESSED, QUARANTINED}
GIF = (
    b"GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00!\xf9\x04\x01\x00\x00\x00\x00,\x00\x00\x00\x00"
    b"\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
)


# -- ordinary mail --------------------------------------------------------------------------------


def test_headers_and_plain_body_of_an_ordinary_message():
    parsed = parse_message(typical_message())
    assert parsed.message_id == "abc.123@example.com"
    assert (parsed.sender, parsed.sender_name) == ("jane@example.com", "Jane Customer")
    assert parsed.recipients == ["support@acme.test", "o@example.com"]
    assert parsed.subject == "Printer on fire [#MR-1234] again"
    assert parsed.date == "Mon, 01 Jan 2024 10:00:00 +0000"
    assert parsed.in_reply_to == "prev@example.com"
    assert parsed.references == ["root@example.com", "prev@example.com"]
    assert parsed.text.startswith("Hello,\n\nthe printer is on fire") and parsed.text.endswith("Jane")
    assert parsed.body_source == "plain" and parsed.attachments == [] and parsed.defects == []
    assert parsed.return_path == "jane@example.com" and parsed.auto_submitted is None
    assert parsed.content_type == "text/plain" and not parsed.too_complex
    assert parsed.size == len(typical_message())
    assert parsed.raw_sha256 == hashlib.sha256(typical_message()).hexdigest()
    assert subject_ticket_token(parsed.subject) == "MR-1234"
    assert thread_key(parsed) == hashlib.sha256(b"root@example.com").hexdigest()
    assert validate(parsed, MailboxPolicy(allowed_recipients=("support@acme.test",))).state == OK


def test_encoded_words_and_raw_8bit_headers_are_decoded():
    raw = (
        "From: =?utf-8?q?J=C3=B6rg_M=C3=BCller?= <jm@example.com>\r\n"
        'To: =?iso-8859-1?q?Caf=E9?= <cafe@example.com>, "Bob, Jr." <bob@example.com>\r\n'
        "Subject: =?utf-8?b?w5xiZXIg?= =?utf-8?b?ZGllIEJyw7xja2U=?= and =?bogus-cs?q?raw?=\r\n"
        "X-Note: caf\xe9\r\n\r\nbody\r\n"
    ).encode("latin-1")
    raw = raw.replace(b"Subject:", "Comments: Gr\u00fc\u00dfe\r\nSubject:".encode("utf-8"))
    parsed = parse_message(raw)
    assert (parsed.sender_name, parsed.sender) == ("Jörg Müller", "jm@example.com")
    assert parsed.recipients == ["cafe@example.com", "bob@example.com"]
    assert parsed.subject == "Über die Brücke and raw"
    assert decode_header_value("Gr\udcc3\udcbc\udcc3\udc9fe") == "Grüße"  # raw UTF-8 bytes
    assert decode_header_value("caf\udce9") == "café"  # raw cp1252 byte
    assert decode_header_value("a\x00b\r\n c") == "a b c"  # controls and folding


def test_html_only_mail_becomes_readable_text():
    msg = EmailMessage()
    msg["From"], msg["To"] = "a@example.com", "support@acme.test"
    msg.set_content(
        "<html><head><title>T</title><style>p{color:red}</style></head><body>"
        "<h1>Hello&nbsp;there</h1><p>First &amp; second<br>line two</p><script>alert(1)</script>"
        "<ul><li>one</li><li>two</li></ul><p>See <a href='https://example.com/x'>the page</a></p>"
        "</body></html>",
        subtype="html",
    )
    parsed = parse_message(msg.as_bytes())
    assert parsed.body_source == "html"
    assert parsed.text == (
        "Hello there\n\nFirst & second\nline two\n\n- one\n- two\n\nSee the page <https://example.com/x>"
    )


def test_alternative_prefers_plain_text_and_falls_back_to_html_when_plain_is_blank():
    msg = EmailMessage()
    msg["From"] = "a@example.com"
    msg.set_content("plain version\n")
    msg.add_alternative("<p>html version</p>", subtype="html")
    assert parse_message(msg.as_bytes()).text == "plain version"
    blank = EmailMessage()
    blank["From"] = "a@example.com"
    blank.set_content("\n \n")
    blank.add_alternative("<p>html version</p>", subtype="html")
    parsed = parse_message(blank.as_bytes())
    assert (parsed.text, parsed.body_source) == ("html version", "html")


def test_attachments_inline_images_and_payloads_on_demand():
    msg = EmailMessage()
    msg["From"], msg["To"] = "a@example.com", "support@acme.test"
    msg.set_content("see attached\n")
    msg.add_alternative("<p>see <img src='cid:logo@x' alt='logo'></p>", subtype="html")
    html_part = msg.get_payload()[1]
    html_part.add_related(GIF, maintype="image", subtype="gif", cid="<logo@x>")
    msg.add_attachment(PDF, maintype="application", subtype="pdf", filename="C:\\Users\\x\\report.pdf")
    msg.add_attachment("Ünïcode notes\n".encode(), maintype="text", subtype="plain", filename="notes \u00fc.txt")
    parsed = parse_message(msg.as_bytes())
    assert parsed.text == "see attached"
    assert [(a.filename, a.declared_type, a.sniffed_type, a.is_inline, a.content_id) for a in parsed.attachments] == [
        ("", "image/gif", "image/gif", True, "logo@x"),
        ("report.pdf", "application/pdf", "application/pdf", False, ""),
        ("notes ü.txt", "text/plain", "text/plain", False, ""),
    ]
    payloads = list(iter_attachment_payloads(parsed))
    assert [data for _, data in payloads] == [GIF, PDF, "Ünïcode notes\n".encode()]
    for attachment, data in payloads:
        assert attachment.size == len(data) and attachment.sha256 == hashlib.sha256(data).hexdigest()
    assert attachment_payload(parsed, 1) == PDF


def test_attached_message_is_one_attachment_and_its_files_are_listed_as_nested():
    inner = EmailMessage()
    inner["From"], inner["Subject"] = "someone@example.org", "original"
    inner.set_content("original text")
    inner.add_attachment(PDF, maintype="application", subtype="pdf", filename="inner.pdf")
    outer = EmailMessage()
    outer["From"] = "jane@example.com"
    outer.set_content("forwarding")
    outer.add_attachment(inner)
    parsed = parse_message(outer.as_bytes())
    assert parsed.text == "forwarding"  # the forwarded body is in the attachment, not the description
    (eml, nested) = parsed.attachments
    assert (eml.declared_type, eml.nested, nested.filename, nested.nested) == (
        "message/rfc822",
        False,
        "inner.pdf",
        True,
    )
    eml_bytes = attachment_payload(parsed, 0)
    assert b"Subject: original" in eml_bytes and parse_message(eml_bytes).attachments[0].sha256 == nested.sha256


def test_inline_text_with_a_filename_is_the_body_only_when_there_is_no_other():
    part = '--b\r\nContent-Type: text/plain\r\nContent-Disposition: inline; filename="msg.txt"\r\n\r\n{}\r\n'
    only = multipart_message(part.format("the body, sent as a file") + "--b--\r\n")
    parsed = parse_message(only)
    assert parsed.text == "the body, sent as a file" and [a.filename for a in parsed.attachments] == ["msg.txt"]
    with_body = multipart_message(
        "--b\r\nContent-Type: text/plain\r\n\r\nreal body\r\n" + part.format("notes in a file") + "--b--\r\n"
    )
    parsed = parse_message(with_body)
    assert parsed.text == "real body" and [a.filename for a in parsed.attachments] == ["msg.txt"]


def test_loop_and_automation_headers():
    raw = (
        b"From: a@example.com\r\nReturn-Path: <>\r\nAuto-Submitted: Auto-Replied (vacation)\r\n"
        b"Precedence: Bulk\r\nX-Autoreply: yes\r\nX-Autorespond: \r\nX-Acme-Loop: one\r\nX-Acme-Loop: two\r\n"
        b"Authentication-Results: a.example; spf=pass\r\nAuthentication-Results: b.example;\r\n dkim=fail\r\n"
        b"\r\nbody\r\n"
    )
    parsed = parse_message(raw, loop_header="X-Acme-Loop")
    assert parsed.return_path == ""
    assert (parsed.auto_submitted, parsed.precedence) == ("auto-replied", "bulk")
    assert (parsed.x_autoreply, parsed.x_autorespond) == ("yes", "")
    assert parsed.loop_values == ["one", "two"]
    assert parsed.authentication_results == ["a.example; spf=pass", "b.example; dkim=fail"]
    assert parse_message(b"From: a@example.com\r\n\r\nx").return_path is None


def test_unknown_and_broken_charsets_degrade_to_readable_text():
    raw = (
        b"From: a@example.com\r\nContent-Type: text/plain; charset=x-no-such-charset\r\n\r\n"
        + "caf\u00e9 ok\r\n".encode("utf-8")
    )
    parsed = parse_message(raw)
    assert parsed.text == "café ok" and "UnknownCharset:x-no-such-charset" in parsed.defects
    latin = b"From: a@example.com\r\nContent-Type: text/plain; charset=iso-8859-1\r\n\r\ncaf\xe9\r\n"
    assert parse_message(latin).text == "café"
    undeclared = b"From: a@example.com\r\n\r\ncaf\xe9 \x80\r\n"  # 8-bit, no charset: cp1252
    assert parse_message(undeclared).text == "café €"
    refused = b"From: a@example.com\r\nContent-Type: text/plain; charset=punycode\r\n\r\nabc-\r\n"
    assert parse_message(refused).text == "abc-"  # not decoded with the punycode codec


def test_nul_bytes_never_reach_the_fields():
    raw = b"From: a\x00b <a@example.com>\r\nSubject: sub\x00ject\r\n\r\nte\x00xt\x01\r\n"
    parsed = parse_message(raw)
    assert "\x00" not in parsed.subject + parsed.sender_name + parsed.text
    assert parsed.subject == "sub ject" and parsed.text == "text"


def test_html_converter_is_linear_on_hostile_markup():
    # html.parser on this interpreter needs ~17 s for 40 KB of "<a <a <a ..."; this needs milliseconds.
    for hostile in ("<a " * 200_000, "<!--" * 100_000, "</" * 300_000, "<x" * 300_000, "<a href=x>y</a>" * 40_000):
        started = time.perf_counter()
        html_to_text(hostile)
        assert time.perf_counter() - started < 2.0
    assert html_to_text("<head><body>Visible") == "Visible"
    assert html_to_text("<p>unclosed <script>hidden") == "unclosed"
    assert html_to_text("a<!-- hidden") == "a"
    assert html_to_text("3 < 4 &amp; 5 > 2<pre>  kept\n  as is</pre>") == "3 < 4 & 5 > 2\n\n  kept\n  as is"
    assert html_to_text("<table><tr><td>a</td><td>b</td></tr><tr><td>c</td></tr></table>") == "a b\nc"


# -- the corpus ------------------------------------------------------------------------------------


def test_generated_malformed_corpus_is_large_enough_and_named_uniquely():
    names = [name for name, _ in generated_corpus()]
    assert len(names) >= 40 and len(set(names)) == len(names)


def test_corpus_never_raises_and_every_message_gets_a_defined_verdict():
    corpus = stdlib_corpus() + generated_corpus()
    policy = MailboxPolicy(allowed_recipients=("support@acme.test",), trusted_authserv_id="mx.acme.test")
    tally, with_defects, slowest = Counter(), 0, (0.0, "")
    results = {}
    for name, raw in corpus:
        started = time.perf_counter()
        parsed = parse_message(raw)
        verdict = validate(parsed, policy)
        authentication_results(parsed, "mx.acme.test")
        thread_key(parsed)
        elapsed = time.perf_counter() - started
        slowest = max(slowest, (elapsed, name))
        assert isinstance(parsed, ParsedMessage)
        assert verdict.state in STATES and (verdict.state == OK) == (verdict.reason_code == "")
        assert len(thread_key(parsed)) == 64
        assert "\x00" not in parsed.text + parsed.subject + parsed.sender + parsed.sender_name
        assert len(parsed.text) <= MAX_DESCRIPTION_CHARS
        for attachment, data in iter_attachment_payloads(parsed):
            assert len(data) == attachment.size
        tally[f"{verdict.state}/{verdict.reason_code or '-'}"] += 1
        with_defects += bool(parsed.defects)
        results[name] = (parsed, verdict)

    stdlib = sum(1 for name, _ in corpus if name.startswith("stdlib:"))
    print(
        f"\ncorpus: {len(corpus)} messages ({stdlib} from the stdlib email test data, "
        f"{len(corpus) - stdlib} generated); {with_defects} with defects; slowest {slowest[1]} "
        f"{slowest[0] * 1000:.0f} ms"
    )
    for key, count in sorted(tally.items()):
        print(f"  {count:4d}  {key}")

    # A few of the generated ones, checked for what they should give.
    def reason(name):
        return results[name][1].state, results[name][1].reason_code

    assert reason("zero_bytes") == (AWAITING_REVIEW, "missing_sender")
    assert reason("headers_only_with_blank_line") == (AWAITING_REVIEW, "empty")
    assert reason("multipart_nested_60_deep") == (AWAITING_REVIEW, "too_complex")
    assert reason("multipart_nested_1000_deep") == (AWAITING_REVIEW, "too_complex")
    assert reason("attachments_500") == (AWAITING_REVIEW, "too_many_attachments")
    assert len(results["attachments_500"][0].attachments) == 500
    # A report with nothing readable in it: review wins over suppression, the report is still noted.
    assert reason("delivery_status_garbage") == (AWAITING_REVIEW, "empty")
    assert [f.reason_code for f in results["delivery_status_garbage"][1].findings] == ["empty", "delivery_report"]
    assert reason("filename_traversal_and_bad_2231") == (QUARANTINED, "attachment_type")
    assert {a.filename for a in results["filename_traversal_and_bad_2231"][0].attachments} <= {
        "passwd",
        "x .exe",
        "x.exe",
    }
    assert "HeaderTooLong:subject" in results["header_line_5mb"][0].defects
    assert results["header_line_5mb"][0].sender == "a@example.com"
    assert results["unknown_charset"][0].text == "hello"
    assert results["punycode_charset"][0].text.startswith("aaaa")
    assert len(results["to_with_20000_addresses"][0].recipients) > 1000
    # "Sub\0ject:" is no header name: the parser starts the body there (and says so); NULs are dropped.
    nul = results["nul_bytes_in_headers_and_body"][0]
    assert nul.text == "Subject: xy\n\nbody" and "MissingHeaderBodySeparatorDefect" in nul.defects
    assert results["multipart_nested_60_deep"][0].sender == "a@example.com"
    assert reason("tiny_parts_50000") == (AWAITING_REVIEW, "too_complex")
    assert "TooManyBoundaryLines" in results["tiny_parts_50000"][0].defects
    assert "HeaderTooLong:content-type" in results["content_type_unclosed_quote"][0].defects
    assert results["content_type_20000_params"][0].text == "x"
    assert len(results["disposition_unclosed_quote_x300"][0].attachments) == 300
    assert "AddressHeadersTooLong" in results["to_header_x50_hostile"][0].defects
    assert slowest[0] < 3, slowest


# -- properties --------------------------------------------------------------------------------------

HEADER_NAMES = [
    "From",
    "To",
    "Cc",
    "Subject",
    "Message-ID",
    "References",
    "In-Reply-To",
    "Content-Type",
    "Content-Transfer-Encoding",
    "Content-Disposition",
    "Auto-Submitted",
    "Precedence",
    "Return-Path",
    "Authentication-Results",
    "X-Mailroom-Loop",
    "X-Autoreply",
    "Delivered-To",
    "MIME-Version",
]
FRAGMENTS = [
    "multipart/mixed; boundary=b",
    'multipart/alternative; boundary="c"',
    "text/html; charset=bogus",
    "message/rfc822",
    "base64",
    "quoted-printable",
    'attachment; filename="a.exe"',
    "<>",
    "no",
    "=?utf-8?b?w7w=?=",
    "=?x?q?=FF?=",
    "a@example.com",
    "<id@x> <id2@x>",
    "(((",
    "\x00",
    "\xff\xfe",
    "--b",
    "--b--",
    "--c",
    "MZ\x90\x00",
    "%PDF-1.4",
    "<p>hi</p>",
    "<a <a",
    "\r\n",
    "\r\n ",
    ";",
    '"',
    "é",
]


@st.composite
def messages(draw):
    """Structured junk: real header names with fragments of real values, boundaries and bodies."""
    lines = []
    for _ in range(draw(st.integers(0, 12))):
        name = draw(st.sampled_from(HEADER_NAMES))
        value = "".join(draw(st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=8), max_size=5)))
        lines.append(f"{name}: {value}")
    body = "\r\n".join(draw(st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=20), max_size=30)))
    return ("\r\n".join(lines) + "\r\n\r\n" + body).encode("utf-8", "surrogatepass")


def _exercise(raw: bytes) -> None:
    parsed = parse_message(raw)
    verdict = validate(parsed, MailboxPolicy(allowed_recipients=("support@acme.test",)))
    assert verdict.state in STATES
    authentication_results(parsed, "mx.acme.test")
    assert len(thread_key(parsed)) == 64
    subject_ticket_token(parsed.subject)
    for attachment, data in iter_attachment_payloads(parsed):
        assert len(data) == attachment.size


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True, database=None
)
@given(st.binary(max_size=4096))
def test_arbitrary_bytes_never_raise(raw):
    _exercise(raw)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True, database=None
)
@given(messages())
def test_structured_junk_never_raises(raw):
    _exercise(raw)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.text(max_size=2000))
def test_html_to_text_never_raises(markup):
    assert isinstance(html_to_text(markup), str)


def test_a_message_the_parser_gives_up_on_early_still_has_every_field():
    """normalize reads every field of ParsedMessage; one the parse never reached must be there, at its default
    (smime_certs_only was once set only at the end of a full parse: AttributeError for anything cut short)."""
    import dataclasses

    from intake.mime.message import ParsedMessage

    given_up = parse_message(object())  # not bytes: the parse stops before reading a header
    assert "NotBytes" in given_up.defects
    for name in ("smime_certs_only", "encrypted", "signatures", "alternatives", "text_truncated"):
        assert getattr(given_up, name) == getattr(ParsedMessage(), name)
    assert {f.name for f in dataclasses.fields(ParsedMessage)} >= {"smime_certs_only"}

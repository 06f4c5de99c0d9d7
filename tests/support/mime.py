"""Messages for the parser: a typical delivery, a PDF, and the malformed and standard-library corpora."""

import random
import sysconfig
from email.message import EmailMessage
from pathlib import Path

PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"


def typical_message() -> bytes:
    """About 2.4 KB: the headers a real delivery carries, and a plain text body."""
    msg = EmailMessage()
    msg["Return-Path"] = "<jane@example.com>"
    msg["Received"] = (
        "from mail.example.com (mail.example.com [192.0.2.1]) by mx.acme.test with ESMTPS id 4Xy;"
        " Mon, 01 Jan 2024 10:00:00 +0000"
    )
    msg["Authentication-Results"] = (
        "mx.acme.test; spf=pass smtp.mailfrom=example.com;"
        " dkim=pass header.d=example.com; dmarc=pass header.from=example.com"
    )
    msg["From"] = "Jane Customer <jane@example.com>"
    msg["To"] = "support@acme.test"
    msg["Cc"] = "Other <o@example.com>"
    msg["Subject"] = "Printer on fire [#MR-1234] again"
    msg["Message-ID"] = "<abc.123@example.com>"
    msg["In-Reply-To"] = "<prev@example.com>"
    msg["References"] = "<root@example.com> <prev@example.com>"
    msg["Date"] = "Mon, 01 Jan 2024 10:00:00 +0000"
    msg.set_content("Hello,\n\n" + "the printer is on fire again, please help. " * 40 + "\n\nJane\n")
    return msg.as_bytes()


def _deep(depth: int) -> bytes:
    head = "From: a@example.com\r\nTo: support@acme.test\r\nSubject: deep\r\n"
    head += 'Content-Type: multipart/mixed; boundary="b0"\r\n\r\n'
    parts = "".join(f'--b{i}\r\nContent-Type: multipart/mixed; boundary="b{i + 1}"\r\n\r\n' for i in range(depth))
    inner = f"--b{depth}\r\nContent-Type: text/plain\r\n\r\ninnermost\r\n--b{depth}--\r\n"
    return (head + parts + inner + "".join(f"--b{i}--\r\n" for i in reversed(range(depth)))).encode()


def _many_attachments(count: int) -> bytes:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "a@example.com", "support@acme.test", "many"
    msg.set_content("lots of files")
    for i in range(count):
        msg.add_attachment(b"file %d\n" % i, maintype="text", subtype="plain", filename=f"f{i}.txt")
    return msg.as_bytes()


def multipart_message(body: str, content_type: str = 'multipart/mixed; boundary="b"', extra: str = "") -> bytes:
    return (
        f"From: a@example.com\r\nTo: support@acme.test\r\nSubject: t\r\nContent-Type: {content_type}\r\n"
        f"{extra}\r\n{body}"
    ).encode("utf-8", "surrogateescape")


H = "From: a@example.com\r\nTo: support@acme.test\r\nSubject: t\r\n"


def _h(rest: str) -> bytes:
    """The usual From/To/Subject, then `rest` (more headers, blank line, body)."""
    return (H + rest).encode()


def generated_corpus() -> list[tuple[str, bytes]]:
    rng = random.Random(1234)
    corpus = [
        ("zero_bytes", b""),
        ("only_crlf", b"\r\n"),
        ("headers_only_no_blank_line", b"From: a@example.com\r\nSubject: x"),
        ("headers_only_with_blank_line", _h("\r\n")),
        ("body_without_headers", b"just some text\r\nand more\r\n"),
        ("multipart_without_boundary", multipart_message("--x\r\n\r\ntext\r\n--x--\r\n", "multipart/mixed")),
        ("multipart_empty_boundary", multipart_message("--\r\n\r\ntext\r\n", 'multipart/mixed; boundary=""')),
        ("boundary_never_appears", multipart_message("no parts here\r\n")),
        ("boundary_never_closed", multipart_message("--b\r\nContent-Type: text/plain\r\n\r\nopen part\r\n")),
        ("only_boundary_lines", multipart_message("--b\r\n--b\r\n--b--\r\n")),
        (
            "wrong_inner_boundary",
            multipart_message(
                '--b\r\nContent-Type: multipart/alternative; boundary="c"\r\n\r\n--d\r\n\r\nlost\r\n--b--\r\n'
            ),
        ),
        ("unknown_charset", _h("Content-Type: text/plain; charset=x-unknown-bogus\r\n\r\nhello\r\n")),
        ("invalid_charset_chars", _h('Content-Type: text/plain; charset="utf-8\x01\\";;=?"\r\n\r\nhi\r\n')),
        ("punycode_charset", _h("Content-Type: text/plain; charset=punycode\r\n\r\n" + "a" * 5000 + "-\r\n")),
        ("non_text_codec_charset", _h("Content-Type: text/plain; charset=zlib_codec\r\n\r\nxx\r\n")),
        ("utf16_odd_bytes", _h("Content-Type: text/plain; charset=utf-16\r\n\r\n") + b"\xff\xfea\x00b"),
        ("utf7_broken", _h("Content-Type: text/plain; charset=utf-7\r\n\r\n+AGEAYg-+ZZZ\r\n")),
        ("rfc2231_bogus_charset", _h("Content-Type: text/plain; charset*=bogus''%FF%FE\r\n\r\nhi\r\n")),
        ("raw_8bit_utf8_headers", ("From: Jörg <jörg@exämple.com>\r\nSubject: Grüße ☃\r\n\r\nbody\r\n").encode()),
        (
            "raw_8bit_latin1_headers",
            "From: J\xf6rg <j@example.com>\r\nSubject: caf\xe9\r\n\r\nbody\r\n".encode("latin-1"),
        ),
        (
            "broken_encoded_words",
            (
                H.replace("Subject: t", "Subject: =?utf-8?b?!!!?= =?bogus?q?a?= =?utf-8?q?=ZZ?= =?utf-8?q?")
                + "\r\nb\r\n"
            ).encode(),
        ),
        ("header_line_without_colon", b"From: a@example.com\r\nthis is not a header\r\nSubject: x\r\n\r\nbody\r\n"),
        ("continuation_first", b" folded: first\r\nFrom: a@example.com\r\n\r\nbody\r\n"),
        ("header_line_5mb", (H.replace("Subject: t", "Subject: " + "x" * (5 * 1024 * 1024)) + "\r\nb\r\n").encode()),
        (
            "to_with_20000_addresses",
            (
                "From: a@example.com\r\nTo: "
                + ", ".join(f"u{i}@example.com" for i in range(20000))
                + "\r\n\r\nbody\r\n"
            ).encode(),
        ),
        ("nested_comments_in_from", ("From: " + "(" * 5000 + "a@example.com\r\n\r\nbody\r\n").encode()),
        ("nul_bytes_in_headers_and_body", b"From: a\x00@example.com\r\nSub\x00ject: x\x00y\r\n\r\nbo\x00dy\x00\r\n"),
        ("nul_bytes_everywhere", bytes(rng.choice(b"\x00ab:\r\n -") for _ in range(20000))),
        ("multipart_nested_60_deep", _deep(60)),
        ("multipart_nested_1000_deep", _deep(1000)),
        ("attachments_500", _many_attachments(500)),
        (
            "base64_invalid",
            (
                H + "Content-Type: application/pdf\r\nContent-Disposition: attachment; filename=a.pdf\r\n"
                "Content-Transfer-Encoding: base64\r\n\r\n!!!not*base64===\r\nQUJD=\r\n"
            ).encode(),
        ),
        ("base64_text_bad_padding", _h("Content-Transfer-Encoding: base64\r\n\r\naGVsbG8gd29ybGQ\r\n")),
        ("quoted_printable_broken", _h("Content-Transfer-Encoding: quoted-printable\r\n\r\n=ZZ=\r\nab=\r\n=")),
        ("uuencode_garbage", _h("Content-Transfer-Encoding: x-uuencode\r\n\r\nbegin 644 f\r\n!!!!\r\nend\r\n")),
        ("unknown_cte", _h("Content-Transfer-Encoding: x-weird\r\n\r\nbody\r\n")),
        ("garbage_content_type", _h("Content-Type: ////;;;==\r\n\r\nbody\r\n")),
        ("content_type_no_subtype", _h("Content-Type: text\r\n\r\nbody\r\n")),
        (
            "duplicate_conflicting_content_types",
            (H + "Content-Type: text/html\r\nContent-Type: multipart/mixed; boundary=z\r\n\r\n<p>x</p>\r\n").encode(),
        ),
        (
            "rfc822_garbage_payload",
            multipart_message(
                "--b\r\nContent-Type: message/rfc822\r\n\r\n\x00\xff garbage".encode("latin-1").decode(
                    "utf-8", "surrogateescape"
                )
                + "\r\n--b--\r\n"
            ),
        ),
        ("rfc822_empty", multipart_message("--b\r\nContent-Type: message/rfc822\r\n\r\n--b--\r\n")),
        ("top_level_rfc822", _h("Content-Type: message/rfc822\r\n\r\nFrom: b@example.com\r\n\r\ninner\r\n")),
        (
            "delivery_status_garbage",
            multipart_message(
                "--b\r\nContent-Type: message/delivery-status\r\n\r\n:::\r\n\r\n--b--\r\n",
                'multipart/report; report-type=delivery-status; boundary="b"',
            ),
        ),
        ("hostile_html", _h("Content-Type: text/html\r\n\r\n" + "<a " * 40000 + "<!-- never closed")),
        (
            "filename_traversal_and_bad_2231",
            multipart_message(
                "--b\r\nContent-Type: application/octet-stream\r\nContent-Disposition: attachment;"
                " filename*=bogus''%FF%FE%2E%2E%2Fetc%2Fpasswd\r\n\r\nMZ\r\n--b\r\nContent-Disposition: attachment;"
                ' filename="../../x\x00\x07.exe"\r\n\r\nMZ\r\n--b--\r\n'
            ),
        ),
        ("cr_only_line_endings", H.replace("\r\n", "\r").encode() + b"\rbody\rmore\r"),
        ("mixed_line_endings", b"From: a@example.com\nTo: b@example.com\r\nSubject: x\r\r\n\nbody\r\n"),
        ("random_binary_64k", bytes(rng.getrandbits(8) for _ in range(65536))),
        ("mbox_from_line", b"From foo@bar Mon Jan  1 00:00:00 2024\r\n" + H.encode() + b"\r\nbody\r\n"),
        (
            "huge_preamble_and_epilogue",
            multipart_message("pre\r\n" * 50000 + "--b\r\n\r\npart\r\n--b--\r\n" + "epi\r\n" * 50000),
        ),
        ("auth_results_garbage", _h('Authentication-Results: (((;;;==="\r\nAuthentication-Results: ;;\r\n\r\nb\r\n')),
        ("references_10000", _h("References: " + " ".join(f"<id{i}@x>" for i in range(10000)) + "\r\n\r\nb\r\n")),
        ("header_name_8bit", "From: a@example.com\r\nX-Ünïcode: yes\r\n\r\nbody\r\n".encode()),
        ("html_bogus_charset_8bit", _h("Content-Type: text/html; charset=bogus\r\n\r\n") + b"<p>caf\xe9</p>"),
        ("one_line_1mb_body", _h("\r\n") + b"x" * (1024 * 1024)),
        (
            "base64_cte_on_multipart",
            multipart_message("--b\r\n\r\npart\r\n--b--\r\n", extra="Content-Transfer-Encoding: base64\r\n"),
        ),
        ("auto_submitted_garbage", _h("Auto-Submitted: \x00((((\r\nPrecedence:\r\nReturn-Path: <<>>\r\n\r\nb\r\n")),
        ("empty_header_values", b"From:\r\nTo:\r\nSubject:\r\nMessage-ID:\r\nReferences:\r\nIn-Reply-To:\r\n\r\n"),
        ("thousands_of_headers", _h("".join(f"X-H{i}: v\r\n" for i in range(20000)) + "\r\nbody\r\n")),
        # Quadratic corners of the email package: its parameter parser, its address parser, its per-part cost.
        (
            "content_type_unclosed_quote",
            multipart_message("--b\r\n\r\nx\r\n--b--\r\n", 'multipart/mixed; boundary=b; x="' + ";" * 60000),
        ),
        (
            "content_type_20000_params",
            multipart_message("--b\r\n\r\nx\r\n--b--\r\n", "multipart/mixed; boundary=b" + ";a=b" * 20000),
        ),
        (
            "disposition_unclosed_quote_x300",
            multipart_message(
                "".join(
                    '--b\r\nContent-Disposition: attachment; y="' + ";" * 8000 + "\r\n\r\nx\r\n" for _ in range(300)
                )
                + "--b--\r\n"
            ),
        ),
        ("to_header_x50_hostile", _h("".join("To: " + "@" * 65536 + "\r\n" for _ in range(50)) + "\r\nb\r\n")),
        ("tiny_parts_50000", multipart_message("--b\r\n\r\nx\r\n" * 50000 + "--b--\r\n")),
    ]
    return corpus


def stdlib_corpus() -> list[tuple[str, bytes]]:
    folder = Path(sysconfig.get_paths()["stdlib"]) / "test" / "test_email" / "data"
    if not folder.is_dir():
        return []
    return [(f"stdlib:{path.name}", path.read_bytes()) for path in sorted(folder.iterdir()) if path.is_file()]

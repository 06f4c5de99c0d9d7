"""The MIME part walk on mail as real clients write it: signed and encrypted mail, Outlook's
winmail.dat, attachment names, malformed body types, stub plain alternatives and long bodies.

Pure parse tests (no database). Signatures and ciphertext are made with `cryptography`
(a throwaway key and self-signed certificate), winmail.dat files with the small TNEF
encoder below (the format as MS-OXTNEF describes it and `tnefparse` reads it).
"""

import base64
import datetime
import functools
import hashlib
import struct
import time
import urllib.parse
import zlib

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs7
from cryptography.x509.oid import NameOID
from tnefparse.tnef import TNEF

from intake.mime import MAX_DESCRIPTION_CHARS, attachment_payload, cms, iter_attachment_payloads, parse_message, tnef
from intake.mime.texttrim import cut_at_boundary, trim_text
from intake.validation import QUARANTINED, MailboxPolicy, validate

PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"
HEAD = (
    "From: Jane Customer <jane@example.com>\r\nTo: support@acme.test\r\nSubject: Printer on fire\r\n"
    "Date: Mon, 01 Jan 2024 10:00:00 +0000\r\nMessage-ID: <m1@example.com>\r\nMIME-Version: 1.0\r\n"
)


def _png() -> bytes:
    """A real 1x1 PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00"))
        + chunk(b"IEND", b"")
    )


PNG = _png()


def _b64(data: bytes) -> str:
    return base64.encodebytes(data).decode().replace("\n", "\r\n")


def _mail(rest: str) -> bytes:
    return (HEAD + rest).encode("utf-8")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _ok(parsed) -> bool:
    return validate(parsed, MailboxPolicy()).state != QUARANTINED


# -- keys and CMS --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _identity():
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "Jane Customer"),
            x509.NameAttribute(NameOID.EMAIL_ADDRESS, "jane@example.com"),
        ]
    )
    start = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(7)
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=3650))
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _signed_data(content: bytes, *, detached: bool) -> bytes:
    key, cert = _identity()
    options = [pkcs7.PKCS7Options.Binary] + ([pkcs7.PKCS7Options.DetachedSignature] if detached else [])
    return (
        pkcs7.PKCS7SignatureBuilder()
        .set_data(content)
        .add_signer(cert, key, hashes.SHA256())
        .sign(serialization.Encoding.DER, options)
    )


def _enveloped_data(content: bytes) -> bytes:
    _, cert = _identity()
    return pkcs7.PKCS7EnvelopeBuilder().set_data(content).add_recipient(cert).encrypt(serialization.Encoding.DER, [])


# -- a TNEF encoder (MS-OXTNEF) --------------------------------------------------------------------


def _tnef_attribute(level: int, attribute: int, kind: int, data: bytes) -> bytes:
    return struct.pack("<BHHI", level, attribute, kind, len(data)) + data + struct.pack("<H", sum(data) & 0xFFFF)


def _mapi(properties: list[tuple[int, int, object]]) -> bytes:
    """A MAPI property list: (type, id, value); str values as PT_UNICODE (0x1F) or PT_STRING8 (0x1E)."""
    out = struct.pack("<I", len(properties))
    for kind, ident, value in properties:
        out += struct.pack("<HH", kind, ident)
        if kind in (0x001E, 0x001F, 0x0102):
            if kind == 0x001F:
                value = (value + "\0").encode("utf-16-le")
            elif kind == 0x001E:
                value = value.encode("cp1252") + b"\0"
            out += struct.pack("<II", 1, len(value)) + value + b"\0" * (-len(value) % 4)
        else:
            out += value
    return out


def _lzfu(rtf: bytes) -> bytes:
    """PR_RTF_COMPRESSED as LZFu with literals only, then the end marker (a reference to the write position)."""
    tokens = list(rtf) + [None]
    out = bytearray()
    end_marker = struct.pack(">H", ((207 + len(rtf)) % 4096) << 4)
    for start in range(0, len(tokens), 8):
        group = tokens[start : start + 8]
        out.append(sum(1 << bit for bit, token in enumerate(group) if token is None))
        for token in group:
            out += end_marker if token is None else bytes([token])
    return struct.pack("<IIII", len(out) + 12, len(rtf), 0x75465A4C, 0) + bytes(out)


def make_winmail(files: list[tuple[str, str, str, bytes]], *, rtf: bytes = b"", body: str = "") -> bytes:
    """A winmail.dat as Outlook writes it: files are (8.3 name, long name, MIME type, bytes)."""
    stream = struct.pack("<IH", 0x223E9F78, 0x1A2B)
    stream += _tnef_attribute(1, 0x9006, 0x0008, struct.pack("<I", 0x00010000))  # attTnefVersion
    stream += _tnef_attribute(1, 0x9007, 0x0006, struct.pack("<II", 1252, 0))  # attOemCodepage
    stream += _tnef_attribute(1, 0x8008, 0x0007, b"IPM.Microsoft Mail.Note\0")  # attMessageClass
    properties = [(0x0003, 0x3FDE, struct.pack("<I", 65001))]  # PR_INTERNET_CPID
    if rtf:
        properties.append((0x0102, 0x1009, _lzfu(rtf)))  # PR_RTF_COMPRESSED
    if body:
        properties.append((0x001F, 0x1000, body))  # PR_BODY
    stream += _tnef_attribute(1, 0x9003, 0x0006, _mapi(properties))  # attMsgProps
    for short_name, long_name, mime_type, data in files:
        stream += _tnef_attribute(2, 0x9002, 0x0006, struct.pack("<HIHHI", 1, 0xFFFFFFFF, 0, 0, 0))  # attAttachRendData
        stream += _tnef_attribute(2, 0x8010, 0x0001, short_name.encode("cp1252") + b"\0")  # attAttachTitle
        stream += _tnef_attribute(2, 0x800F, 0x0006, data)  # attAttachData
        stream += _tnef_attribute(
            2,
            0x9005,
            0x0006,
            _mapi(
                [  # attAttachment
                    (0x0003, 0x3705, struct.pack("<I", 1)),  # PR_ATTACH_METHOD: by value
                    (0x001F, 0x3707, long_name),  # PR_ATTACH_LONG_FILENAME
                    (0x001E, 0x370E, mime_type),  # PR_ATTACH_MIME_TAG
                ]
            ),
        )
    return stream


RTF = (
    rb"{\rtf1\ansi\ansicpg1252\deff0{\fonttbl{\f0\fswiss Calibri;}}{\colortbl;\red0\green0\blue0;}"
    rb"{\*\generator Microsoft Exchange Server;}\viewkind4\uc1\pard\f0\fs20 Hello support,\par\par "
    rb"the printer on floor 3 is on fire again. Gr\'fc\'dfe aus K\u246?ln.\par\par Jane\par}"
)


def _outlook_rtf_mail(winmail: bytes) -> bytes:
    return _mail(
        'Content-Type: multipart/mixed; boundary="----_=_NextPart_001"\r\n'
        "X-MS-Has-Attach: yes\r\nX-MS-TNEF-Correlator: <00000000ABCDEF@mail.example.com>\r\n\r\n"
        "------_=_NextPart_001\r\n"
        'Content-Type: application/ms-tnef; name="winmail.dat"\r\n'
        "Content-Transfer-Encoding: base64\r\n"
        'Content-Disposition: attachment; filename="winmail.dat"\r\n\r\n'
        + _b64(winmail)
        + "\r\n------_=_NextPart_001--\r\n"
    )


# -- signed mail ------------------------------------------------------------------------------------

SIGNATURE_ASC = (
    "-----BEGIN PGP SIGNATURE-----\r\n\r\n"
    "iQEzBAEBCAAdFiEEq6d8yFvC0j5sQ2wNOkf8m7W6f3cFAmWSmwAACgkQOkf8m7W6\r\n"
    "f3dXlAf/Y2NqZ3hVbm1lcmFibGUgc2lnbmF0dXJlIGJ5dGVzIGZvciB0ZXN0aW5n\r\n"
    "=q1Zt\r\n-----END PGP SIGNATURE-----\r\n"
)


def test_thunderbird_pgp_mime_signed_mail_reads_as_usual_and_records_the_signature():
    raw = _mail(
        'Content-Type: multipart/signed; micalg=pgp-sha256;\r\n protocol="application/pgp-signature";\r\n'
        ' boundary="------------enigABCDEF0123456789"\r\n\r\n'
        "This is an OpenPGP/MIME signed message (RFC 4880 and 3156)\r\n"
        "--------------enigABCDEF0123456789\r\n"
        'Content-Type: multipart/mixed; boundary="------------inner42";\r\n protected-headers="v1"\r\n'
        "From: Jane Customer <jane@example.com>\r\nSubject: Printer on fire\r\n\r\n"
        "--------------inner42\r\n"
        "Content-Type: text/plain; charset=utf-8\r\nContent-Language: en-US\r\n"
        "Content-Transfer-Encoding: quoted-printable\r\n\r\n"
        "Hello,\r\n\r\nthe printer is on fire again. Gr=C3=BC=C3=9Fe\r\n\r\n--------------inner42--\r\n\r\n"
        "--------------enigABCDEF0123456789\r\n"
        'Content-Type: application/pgp-signature; name="signature.asc"\r\n'
        "Content-Description: OpenPGP digital signature\r\n"
        'Content-Disposition: attachment; filename="signature.asc"\r\n\r\n'
        + SIGNATURE_ASC
        + "\r\n--------------enigABCDEF0123456789--\r\n"
    )
    parsed = parse_message(raw)
    assert parsed.text == "Hello,\n\nthe printer is on fire again. Grüße"
    assert parsed.attachments == []
    signature = SIGNATURE_ASC.encode()
    assert parsed.signatures == [
        {"protocol": "pgp", "type": "application/pgp-signature", "size": len(signature), "sha256": _sha(signature)}
    ]
    assert parsed.encrypted == "" and _ok(parsed)


def test_outlook_smime_signed_mail_with_alternatives_keeps_only_the_content():
    content = (
        'Content-Type: multipart/alternative;\r\n boundary="_000_alt_"\r\n\r\n'
        '--_000_alt_\r\nContent-Type: text/plain; charset="us-ascii"\r\n'
        "Content-Transfer-Encoding: quoted-printable\r\n\r\n"
        "Hi team,\r\n\r\nthe printer is on fire. Please send someone.\r\n\r\nJane\r\n\r\n"
        '--_000_alt_\r\nContent-Type: text/html; charset="us-ascii"\r\n'
        "Content-Transfer-Encoding: quoted-printable\r\n\r\n"
        '<html><head><style>p.MsoNormal{margin:0cm;font-size:11.0pt;font-family:"Calibri"}</style>'
        '</head><body><p class=3D"MsoNormal">Hi team,</p><p class=3D"MsoNormal">the printer is on '
        'fire. Please send someone.</p><p class=3D"MsoNormal">Jane</p></body></html>\r\n'
        "--_000_alt_--\r\n"
    )
    p7s = _signed_data(content.encode(), detached=True)
    raw = _mail(
        'Content-Type: multipart/signed; protocol="application/x-pkcs7-signature";\r\n'
        ' micalg=2.16.840.1.101.3.4.2.1; boundary="_002_sig_"\r\n\r\n'
        "--_002_sig_\r\n" + content + "\r\n--_002_sig_\r\n"
        'Content-Type: application/pkcs7-signature; name="smime.p7s"\r\n'
        "Content-Description: S/MIME Cryptographic Signature\r\n"
        'Content-Disposition: attachment; filename="smime.p7s"; size=' + str(len(p7s)) + "\r\n"
        "Content-Transfer-Encoding: base64\r\n\r\n" + _b64(p7s) + "\r\n--_002_sig_--\r\n"
    )
    parsed = parse_message(raw)
    assert parsed.text == "Hi team,\n\nthe printer is on fire. Please send someone.\n\nJane"
    assert parsed.attachments == [] and _ok(parsed)
    assert parsed.signatures == [
        {"protocol": "smime", "type": "application/pkcs7-signature", "size": len(p7s), "sha256": _sha(p7s)}
    ]
    assert [(a["type"], a["chosen"]) for a in parsed.alternatives] == [("text/plain", True), ("text/html", False)]


def test_netscape_style_signature_and_a_forwarded_signed_message():
    inner = (
        "From: Boss <boss@example.com>\r\nSubject: Budget approved\r\nMIME-Version: 1.0\r\n"
        'Content-Type: multipart/signed; protocol="application/x-pkcs7-signature"; micalg=sha1;'
        ' boundary="ns1"\r\n\r\n'
        "This is a cryptographically signed message in MIME format.\r\n\r\n--ns1\r\n"
        "Content-Type: text/plain; charset=us-ascii\r\n\r\nApproved.\r\n--ns1\r\n"
        'Content-Type: application/x-pkcs7-signature; name="smime.p7s"\r\n'
        "Content-Transfer-Encoding: base64\r\n"
        'Content-Disposition: attachment; filename="smime.p7s"\r\n'
        "Content-Description: S/MIME Cryptographic Signature\r\n\r\n"
        + _b64(_signed_data(b"Approved.\r\n", detached=True))
        + "\r\n--ns1--\r\n"
    )
    raw = _mail(
        'Content-Type: multipart/mixed; boundary="outer"\r\n\r\n--outer\r\n'
        "Content-Type: text/plain\r\n\r\nSee below.\r\n--outer\r\n"
        "Content-Type: message/rfc822\r\nContent-Disposition: attachment\r\n\r\n" + inner + "\r\n--outer--\r\n"
    )
    parsed = parse_message(raw)
    assert parsed.text == "See below."
    # The forwarded message is one file, named after its subject; its signature is neither a file nor ours.
    assert [(a.filename, a.declared_type, a.nested) for a in parsed.attachments] == [
        ("Budget approved.eml", "message/rfc822", False)
    ]
    assert parsed.signatures == [] and _ok(parsed)

    top_level = parse_message(HEAD.encode() + inner.split("MIME-Version: 1.0\r\n", 1)[1].encode())
    assert (top_level.text, top_level.attachments) == ("Approved.", [])
    assert [s["type"] for s in top_level.signatures] == ["application/x-pkcs7-signature"]


def test_outlook_opaque_signed_data_is_unwrapped_and_read():
    entity = (
        'Content-Type: multipart/mixed; boundary="in"\r\n\r\n--in\r\n'
        "Content-Type: text/plain; charset=utf-8\r\n\r\nThe report is attached.\r\n--in\r\n"
        'Content-Type: application/pdf; name="report.pdf"\r\n'
        'Content-Disposition: attachment; filename="report.pdf"\r\nContent-Transfer-Encoding: base64\r\n\r\n'
        + _b64(PDF)
        + "--in--\r\n"
    ).encode()
    p7m = _signed_data(entity, detached=False)
    raw = _mail(
        'Content-Type: application/pkcs7-mime; smime-type=signed-data;\r\n name="smime.p7m"\r\n'
        'Content-Disposition: attachment; filename="smime.p7m"\r\nContent-Transfer-Encoding: base64\r\n\r\n' + _b64(p7m)
    )
    parsed = parse_message(raw)
    assert parsed.text == "The report is attached."
    assert [(a.filename, a.sniffed_type, a.origin) for a in parsed.attachments] == [
        ("report.pdf", "application/pdf", "")
    ]
    assert attachment_payload(parsed, 0) == PDF
    assert parsed.signatures == [
        {"protocol": "smime", "type": "application/pkcs7-mime", "size": len(p7m), "sha256": _sha(p7m)}
    ]
    assert parsed.encrypted == "" and _ok(parsed)

    # No smime-type parameter: the content says it is signed data. Unreadable signed data: a person looks.
    untyped = parse_message(raw.replace(b"smime-type=signed-data;", b""))
    assert untyped.text == "The report is attached." and untyped.encrypted == ""
    broken = parse_message(
        _mail(
            "Content-Type: application/pkcs7-mime; smime-type=signed-data; name=smime.p7m\r\n"
            "Content-Transfer-Encoding: base64\r\n\r\n" + _b64(p7m[:200])
        )
    )
    assert broken.encrypted == "smime" and [a.origin for a in broken.attachments] == ["encrypted"]


def test_cms_reader_follows_ber_indefinite_lengths_and_chunked_content():
    signed_oid, data_oid = bytes.fromhex("06092a864886f70d010702"), bytes.fromhex("06092a864886f70d010701")
    chunks = b"\x04\x05Hello" + b"\x04\x07, world"
    ber = (
        b"\x30\x80"
        + signed_oid
        + b"\xa0\x80\x30\x80\x02\x01\x01\x31\x00\x30\x80"
        + data_oid
        + b"\xa0\x80\x24\x80"
        + chunks
        + b"\x00\x00"
        + b"\x00\x00"
        + b"\x00\x00"
        + b"\x31\x00"
        + b"\x00\x00\x00\x00\x00\x00"
    )
    assert cms.content_kind(ber) == "signed-data"
    assert cms.signed_content(ber) == b"Hello, world"
    assert cms.signed_content(ber[:30]) is None
    assert cms.content_kind(_enveloped_data(b"x")) == "enveloped-data"
    assert cms.signed_content(_signed_data(b"x", detached=True)) is None  # detached: nothing inside
    hostile = b"\x30\x80" * 100_000
    started = time.perf_counter()
    assert cms.signed_content(hostile) is None and cms.content_kind(hostile) == ""
    assert time.perf_counter() - started < 0.5


# -- encrypted mail ---------------------------------------------------------------------------------

PGP_MESSAGE = (
    "-----BEGIN PGP MESSAGE-----\r\n\r\n"
    "hQEMA8bJjG3tDl3yAQf/aW52YWxpZCBidXQgcGxhdXNpYmxlIGNpcGhlcnRleHQgZm9y\r\n"
    "IHRlc3Rpbmcgb25seQ==\r\n=ABCD\r\n-----END PGP MESSAGE-----\r\n"
)


def test_pgp_mime_encrypted_mail_is_marked_and_its_ciphertext_kept():
    raw = _mail(
        'Content-Type: multipart/encrypted;\r\n protocol="application/pgp-encrypted";\r\n'
        ' boundary="------------encABC"\r\n\r\n'
        "This is an OpenPGP/MIME encrypted message (RFC 4880 and 3156)\r\n--------------encABC\r\n"
        "Content-Type: application/pgp-encrypted\r\nContent-Description: PGP/MIME version identification\r\n"
        "\r\nVersion: 1\r\n\r\n--------------encABC\r\n"
        'Content-Type: application/octet-stream; name="encrypted.asc"\r\n'
        "Content-Description: OpenPGP encrypted message\r\n"
        'Content-Disposition: inline; filename="encrypted.asc"\r\n\r\n' + PGP_MESSAGE + "\r\n--------------encABC--\r\n"
    )
    parsed = parse_message(raw)
    assert parsed.encrypted == "pgp" and parsed.text == ""
    assert [(a.filename, a.sniffed_type, a.origin, a.size) for a in parsed.attachments] == [
        ("encrypted.asc", "application/pgp-encrypted", "encrypted", len(PGP_MESSAGE))
    ]
    assert _ok(parsed)  # ciphertext is for a person to look at, not a refused file type


def test_smime_encrypted_mail_is_marked_however_it_is_labelled():
    p7m = _enveloped_data(b"Content-Type: text/plain\r\n\r\nsecret\r\n")
    body = "Content-Transfer-Encoding: base64\r\n" + 'Content-Disposition: attachment; filename="smime.p7m"\r\n\r\n'
    for content_type in (
        'application/pkcs7-mime; smime-type=enveloped-data; name="smime.p7m"',
        'application/x-pkcs7-mime; name="smime.p7m"',  # no smime-type: the content says
        'application/octet-stream; name="smime.p7m"',
    ):  # as some gateways relabel it
        parsed = parse_message(_mail(f"Content-Type: {content_type}\r\n" + body + _b64(p7m)))
        assert parsed.encrypted == "smime", content_type
        assert [(a.filename, a.origin, a.sha256) for a in parsed.attachments] == [
            ("smime.p7m", "encrypted", _sha(p7m))
        ], content_type
        assert parsed.signatures == [] and _ok(parsed)


def test_inline_pgp_message_is_encrypted_but_inline_signed_text_stays_readable():
    encrypted = parse_message(_mail("Content-Type: text/plain; charset=us-ascii\r\n\r\n" + PGP_MESSAGE))
    assert encrypted.encrypted == "pgp" and encrypted.text.startswith("-----BEGIN PGP MESSAGE-----")
    signed = parse_message(
        _mail(
            "Content-Type: text/plain; charset=us-ascii\r\n\r\n"
            "-----BEGIN PGP SIGNED MESSAGE-----\r\nHash: SHA256\r\n\r\nThe printer is on fire.\r\n" + SIGNATURE_ASC
        )
    )
    assert signed.encrypted == "" and "The printer is on fire." in signed.text
    quoted = parse_message(_mail("\r\nYou wrote:\r\n> " + PGP_MESSAGE.replace("\r\n", "\r\n> ")))
    assert quoted.encrypted == ""


# -- winmail.dat ---------------------------------------------------------------------------------------


def test_encoder_output_is_what_tnefparse_reads():
    winmail = make_winmail([("REPORT~1.PDF", "Quarterly report.pdf", "application/pdf", PDF)], body="Hi")
    parsed = TNEF(winmail)
    assert [(a.name, a.long_filename(), a.data) for a in parsed.attachments] == [
        ("REPORT~1.PDF", "Quarterly report.pdf", PDF)
    ]
    assert parsed.body == "Hi"
    assert tnef.decompress_rtf(_lzfu(RTF)) == RTF
    # The example stream of MS-OXRTFCP 3.1.1 (with back references).
    example = bytes.fromhex(
        "2d0000002b0000004c5a4675f1c5c7a703000a007263706731323542320af32068656c090020627705b06c647d0a800fa0"
    )
    assert tnef.decompress_rtf(example) == b"{\\rtf1\\ansi\\ansicpg1252\\pard hello world}\r\n"


def test_outlook_rtf_mail_lists_the_files_inside_winmail_dat_and_reads_its_body():
    winmail = make_winmail(
        [
            ("REPORT~1.PDF", "Quarterly report.pdf", "application/pdf", PDF),
            ("SCREEN~1.PNG", "Screenshot 2024-01-01.png", "image/png", PNG),
        ],
        rtf=RTF,
    )
    parsed = parse_message(_outlook_rtf_mail(winmail))
    assert parsed.text == "Hello support,\n\nthe printer on floor 3 is on fire again. Grüße aus Köln.\n\nJane"
    assert parsed.body_source == "rtf"
    assert [(a.filename, a.declared_type, a.sniffed_type, a.size, a.sha256, a.origin) for a in parsed.attachments] == [
        ("Quarterly report.pdf", "application/pdf", "application/pdf", len(PDF), _sha(PDF), "tnef"),
        ("Screenshot 2024-01-01.png", "image/png", "image/png", len(PNG), _sha(PNG), "tnef"),
    ]
    assert [data for _, data in iter_attachment_payloads(parsed)] == [PDF, PNG]
    assert attachment_payload(parsed, 1) == PNG
    assert _ok(parsed)


def test_winmail_dat_with_a_plain_body_and_a_refused_file_inside():
    exe = b"MZ\x90\x00\x03\x00\x00\x00\x04\x00\x00\x00\xff\xff\x00\x00" + b"\x00" * 48 + b"PE\x00\x00"
    winmail = make_winmail(
        [("INVOICE.EXE", "invoice.exe", "application/octet-stream", exe)], body="Please see the invoice."
    )
    raw = _mail(
        'Content-Type: multipart/mixed; boundary="b"\r\n\r\n--b\r\n'
        'Content-Type: application/octet-stream; name="winmail.dat"\r\n'  # named only, as some relays do
        "Content-Transfer-Encoding: base64\r\n\r\n" + _b64(winmail) + "--b--\r\n"
    )
    parsed = parse_message(raw)
    assert (parsed.text, parsed.body_source) == ("Please see the invoice.", "plain")
    assert [(a.filename, a.origin, a.size) for a in parsed.attachments] == [("invoice.exe", "tnef", len(exe))]
    verdict = validate(parsed, MailboxPolicy())
    assert verdict.state == QUARANTINED and "invoice.exe" in verdict.detail


def test_corrupt_winmail_dat_stays_listed_for_a_person_and_never_raises():
    garbage = struct.pack("<IH", 0x223E9F78, 1) + b"\x02\x02\x90\x06\x00\xff\xff\xff\x7f" + b"\x00" * 40
    parsed = parse_message(_outlook_rtf_mail(garbage))
    assert [(a.filename, a.sniffed_type, a.origin) for a in parsed.attachments] == [
        ("winmail.dat", "application/vnd.ms-tnef", "")
    ]
    assert "UnreadableTnef" in parsed.defects
    assert validate(parsed, MailboxPolicy()).state == QUARANTINED
    assert [data for _, data in iter_attachment_payloads(parsed)] == [garbage]


def test_hostile_tnef_is_refused_quickly_instead_of_looping():
    header = struct.pack("<IH", 0x223E9F78, 1)
    huge_count = header + _tnef_attribute(1, 0x9003, 0x0006, b"\xff\xff\xff\xff" + b"\x00" * 8)
    multi_valued = header + _tnef_attribute(1, 0x9003, 0x0006, struct.pack("<IHHI", 1, 0x1003, 0x3001, 0xFFFFFFFF))
    many_attributes = header + _tnef_attribute(1, 0x9006, 0x0008, b"\x00\x00\x01\x00") * 20_000
    embedded = (
        header
        + _tnef_attribute(2, 0x9002, 0x0006, b"\x00" * 14)
        + _tnef_attribute(
            2,
            0x9005,
            0x0006,
            _mapi([(0x000D, 0x3701, b"\x07\x03\x02\x00\x00\x00\x00\x00\xc0\x00\x00\x00\x00\x00\x00\x46" + huge_count)]),
        )
    )
    for stream in (huge_count, multi_valued, many_attributes, embedded, b"", header, b"\x78\x9f\x3e\x22" + b"\xff" * 9):
        started = time.perf_counter()
        assert tnef.unpack(stream) is None
        assert time.perf_counter() - started < 0.5


# -- names ---------------------------------------------------------------------------------------------


def test_attachment_names_from_rfc2231_content_location_and_subjects_made_unique():
    chinese = urllib.parse.quote("报告 2024年第一季度.pdf".encode())
    cut = chinese.index("%20") + 3
    forwarded = (
        "From: =?utf-8?q?J=C3=B6rg?= <j@example.com>\r\n"
        "Subject: =?utf-8?q?Re=3A_Gr=C3=BC=C3=9Fe_aus_K=C3=B6ln?=\r\n\r\nHallo\r\n"
    )
    parts = [
        # Thunderbird: RFC 2231 continuations with a charset.
        (
            "Content-Type: application/pdf\r\nContent-Transfer-Encoding: base64\r\nContent-Disposition: attachment;\r\n"
            f" filename*0*=utf-8''{chinese[:cut]};\r\n filename*1*={chinese[cut:]}\r\n\r\n" + _b64(PDF)
        ),
        # A name only in Content-Type, RFC 2231 in ISO-8859-1.
        (
            "Content-Type: application/pdf;\r\n name*=iso-8859-1'de'Gr%FC%DFe%20M%FCller.pdf\r\n"
            "Content-Transfer-Encoding: base64\r\n\r\n" + _b64(PDF)
        ),
        # Only a Content-Location (as in saved web pages and some web mailers).
        (
            "Content-Type: image/png\r\nContent-Transfer-Encoding: base64\r\n"
            "Content-Location: https://intranet.example.com/files/Floor%203%20plan.png?download=1\r\n\r\n" + _b64(PNG)
        ),
        # An attached message without a name: named after its subject.
        "Content-Type: message/rfc822\r\n\r\n" + forwarded,
        # The same name three times, in different case.
        *(
            f'Content-Type: application/pdf; name="{name}"\r\nContent-Disposition: attachment; filename="{name}"\r\n'
            "Content-Transfer-Encoding: base64\r\n\r\n" + _b64(PDF)
            for name in ("report.pdf", "Report.pdf", "report.pdf")
        ),
        # No name at all: none is invented.
        "Content-Type: image/png\r\nContent-Transfer-Encoding: base64\r\n\r\n" + _b64(PNG),
    ]
    raw = _mail(
        'Content-Type: multipart/mixed; boundary="b"\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nFiles.\r\n'
        + "".join(f"--b\r\n{part}\r\n" for part in parts)
        + "--b--\r\n"
    )
    parsed = parse_message(raw)
    assert [a.filename for a in parsed.attachments] == [
        "报告 2024年第一季度.pdf",
        "Grüße Müller.pdf",
        "Floor 3 plan.png",
        "Re_ Grüße aus Köln.eml",
        "report.pdf",
        "Report (2).pdf",
        "report (3).pdf",
        "",
    ]
    assert parsed.text == "Files." and _ok(parsed)


# -- malformed body types ----------------------------------------------------------------------------


def test_malformed_content_types_that_say_text_html_or_plain_are_bodies_not_attachments():
    russian = "<p>Принтер горит</p>".encode("koi8-r")
    cases = {
        'text/html charset="koi8-r"': (russian, "Принтер горит"),  # the ";" missing; charset still read
        '"text/html"; charset=utf-8': ("<p>Grüße</p>".encode(), "Grüße"),
        "text/html/x; charset=utf-8": (b"<p>a <b>bold</b> claim</p>", "a bold claim"),
        "text/plain;; charset=us-ascii": (b"plain words", "plain words"),
        "TEXT/HTML; charset=": (b"<div>upper case</div>", "upper case"),
        "text/html, charset=utf-8": (b"<p>comma</p>", "comma"),
    }
    for content_type, (body, text) in cases.items():
        parsed = parse_message(HEAD.encode() + f"Content-Type: {content_type}\r\n\r\n".encode() + body)
        assert (parsed.text, parsed.attachments) == (text, []), content_type
        in_mixed = parse_message(
            _mail(f'Content-Type: multipart/mixed; boundary="b"\r\n\r\n--b\r\nContent-Type: {content_type}\r\n\r\n')
            + body
            + b"\r\n--b--\r\n"
        )
        assert (in_mixed.text, in_mixed.attachments) == (text, []), content_type


# -- choosing the body -----------------------------------------------------------------------------


def _alternative(plain: str, html: str, extra: str = "") -> bytes:
    return _mail(
        'Content-Type: multipart/alternative; boundary="alt"\r\n\r\n--alt\r\n'
        "Content-Type: text/plain; charset=utf-8\r\n\r\n"
        + plain
        + "\r\n--alt\r\n"
        + extra
        + "Content-Type: text/html; charset=utf-8\r\n\r\n"
        + html
        + "\r\n--alt--\r\n"
    )


NEWSLETTER = (
    "<html><head><style>.x{color:#333}</style></head><body><table><tr><td>"
    + "".join(
        f"<p>Item {i}: our spring offers include printers, toner and paper at lower prices.</p>" for i in range(12)
    )
    + "</td></tr></table></body></html>"
)


def test_stub_plain_alternatives_give_way_to_the_html():
    stubs = [
        "This message is in HTML format. Please use an HTML-capable mail program to read it.",
        "View this email in your browser: https://news.example.com/v/123",
        "Spring offers inside.",
    ]  # no stub words, but a small fraction of the HTML text
    for stub in stubs:
        parsed = parse_message(_alternative(stub, NEWSLETTER))
        assert parsed.body_source == "html", stub
        assert parsed.text.startswith("Item 0: our spring offers") and parsed.text.endswith("lower prices."), stub
        html_chars = len(parsed.text)
        assert parsed.alternatives == [
            {"type": "text/plain", "chars": len(stub), "chosen": False},
            {"type": "text/html", "chars": html_chars, "chosen": True},
        ], stub


def test_ordinary_plain_alternative_is_kept_and_the_html_not_converted():
    text = "Hello,\n\nthe printer is on fire again, please help.\n\nJane"
    outlook_html = (
        "<html><head><style>" + "p.MsoNormal{margin:0cm;font-family:Calibri} " * 60 + "</style></head>"
        "<body><p class=MsoNormal>Hello,</p><p class=MsoNormal>the printer is on fire again, please help."
        "</p><p class=MsoNormal>Jane</p></body></html>"
    )
    parsed = parse_message(_alternative(text.replace("\n", "\r\n"), outlook_html))
    assert parsed.text == text and parsed.body_source == "plain"
    # The markup is long but its text is not: the fast path never converted it.
    assert parsed.alternatives == [
        {"type": "text/plain", "chars": len(text), "chosen": True},
        {"type": "text/html", "chars": None, "chosen": False},
    ]
    short = parse_message(_alternative("Thanks, fixed.", "<p>Thanks, <b>fixed</b>.</p>"))
    assert short.text == "Thanks, fixed." and short.alternatives[0]["chosen"]


def test_stub_with_related_html_and_an_amp_alternative():
    raw = _mail(
        'Content-Type: multipart/alternative; boundary="alt"\r\n\r\n--alt\r\n'
        "Content-Type: text/plain; charset=utf-8\r\n\r\nView this email in your browser.\r\n--alt\r\n"
        "Content-Type: text/x-amp-html; charset=utf-8\r\n\r\n<!doctype html><html amp4email><body>AMP"
        "</body></html>\r\n--alt\r\n"
        'Content-Type: multipart/related; boundary="rel"\r\n\r\n--rel\r\n'
        "Content-Type: text/html; charset=utf-8\r\n\r\n"
        + NEWSLETTER.replace("<table>", "<img src='cid:logo'><table>")
        + "\r\n--rel\r\n"
        "Content-Type: image/png\r\nContent-ID: <logo>\r\nContent-Transfer-Encoding: base64\r\n\r\n"
        + _b64(PNG)
        + "--rel--\r\n\r\n--alt--\r\n"
    )
    parsed = parse_message(raw)
    assert parsed.body_source == "html" and parsed.text.startswith("Item 0")
    # The logo is listed once; the AMP rendering is neither body nor file.
    assert [(a.sniffed_type, a.content_id, a.is_inline) for a in parsed.attachments] == [("image/png", "logo", True)]
    assert [(a["type"], a["chosen"]) for a in parsed.alternatives] == [
        ("text/plain", False),
        ("text/x-amp-html", False),
        ("multipart/related", True),
    ]
    assert _ok(parsed)


# -- long text -------------------------------------------------------------------------------------------


def test_very_long_html_body_is_cut_at_a_paragraph_boundary():
    paragraph = "Paragraph {} begins here and, after a few more words to fill the line, ends here."
    count = MAX_DESCRIPTION_CHARS // len(paragraph) + 2000
    html = "<html><body>" + "".join(f"<p>{paragraph.format(i)}</p>" for i in range(count)) + "</body></html>"
    parsed = parse_message(_mail("Content-Type: text/html; charset=utf-8\r\n\r\n" + html))
    assert parsed.text_truncated
    assert MAX_DESCRIPTION_CHARS - 200 < len(parsed.text) <= MAX_DESCRIPTION_CHARS
    last = parsed.text.rsplit("\n\n", 1)[1]
    number = int(last.split()[1])
    assert last == paragraph.format(number)  # a whole paragraph, nothing after it
    assert parsed.text.startswith(paragraph.format(0))

    plain = "\r\n\r\n".join(paragraph.format(i) for i in range(count))
    parsed = parse_message(_mail("Content-Type: text/plain; charset=utf-8\r\n\r\n" + plain))
    assert parsed.text_truncated and parsed.text.endswith("ends here.") and len(parsed.text) <= MAX_DESCRIPTION_CHARS
    assert not parse_message(_mail("\r\nshort\r\n")).text_truncated


def test_trim_text_cuts_at_paragraphs_then_lines_then_sentences():
    text = "First paragraph, short.\n\nSecond paragraph has one line.\nAnd another line. With two sentences."
    assert trim_text(text, 1000, "[cut]") == (text, False)
    assert trim_text(text, 70, "\n[cut]") == ("First paragraph, short.\n\nSecond paragraph has one line.\n[cut]", True)
    assert cut_at_boundary(text, 75) == "First paragraph, short.\n\nSecond paragraph has one line."
    sentences = "Intro.\nOne sentence here. Another sentence follows. And a third one that is long."
    assert cut_at_boundary(sentences, len(sentences) - 5) == "Intro.\nOne sentence here. Another sentence follows."
    one_line = "word " * 50
    assert cut_at_boundary(one_line, 23) == "word word word word"
    assert len(trim_text("x" * 500, 100, " [truncated]")[0]) == 100
    assert trim_text("abc def", 3, "[truncated]") == ("[tr", True)

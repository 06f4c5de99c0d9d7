"""MIME parsing for intake: headers, a readable text body and the attachments.

    parse_message(raw, *, loop_header="X-Mailroom-Loop") -> ParsedMessage
    iter_attachment_payloads(parsed) -> Iterator[(Attachment, bytes)]
    attachment_payload(parsed, index) -> bytes

`parse_message` never raises. Hostile or broken mail degrades to best effort:
empty fields where nothing usable was found, the parser's defects kept in
`ParsedMessage.defects` (for review to show), and `ParsedMessage.too_complex`
set when a limit below stopped the walk (validation sends such mail to review,
because parts that were not looked at were not checked either).

Limits (module constants): multipart nesting examined `MAX_DEPTH` (32), MIME
parts examined `MAX_PARTS` (2,000; a message with more than
`MAX_BOUNDARY_LINES` lines starting with "--" gets its headers parsed only),
header value characters decoded `MAX_HEADER_CHARS` (64 Ki; Content-Type and
Content-Disposition are cut to 8 Ki and 64 parameters before the email package
reads them, because its parameter parser is quadratic), text body
`MAX_DESCRIPTION_CHARS` (1 Mi characters, from at most `MAX_TEXT_BYTES` of a
plain part and `MAX_HTML_BYTES` of an HTML one), attachment bytes sniffed
`SNIFF_BYTES` (8 KiB), a winmail.dat as `intake.tnef` allows.
Parsing cost is linear in the input: ~0.2 ms for a 2 KB message, ~1.2 s for a
25 MB message that is one base64 attachment (the stdlib parser reads line by
line), up to ~0.5 s a MB for input built to be slow (a million header lines).

How it stays fast: the standard `email` package with `policy.default`
semantics (EmailMessage objects, RFC 2231 parameters, 8-bit clean), except
that reading a header returns the raw unfolded string instead of building a
structured header object (`_LazyHeaderPolicy`). With header objects (the
previous version of this module) a 2.4 KB message took ~1.2 ms, mostly in
header classes we do not need; now ~0.15-0.25 ms. The few fields we use are
decoded here, leniently, as mail clients read them: the header block is first
repaired (`intake.headerblock`: junk before the headers, unindented
continuations, stray lines, `Subject : x`), addresses are read by
`intake.addresses` (never joined across spaces; sender = first valid From
address, else Sender, else Reply-To), and text by `intake.charsets` (RFC 2047
words joined as bytes, charset aliases such as gb2312 -> gb18030, raw 8-bit
headers as UTF-8, else the body's charset, a detector, cp1252).

Body text: text/plain and text/html parts without a filename and not marked
`attachment` (a Content-Type too malformed to parse that still begins with
text/plain or text/html counts as that type, its charset read from the raw
header); in multipart/alternative the plain part unless it is blank or a stub
of the HTML one ("view this email in your browser", or under 40 % of the HTML
text: `intake.alternatives`), then the HTML one (converted by
`intake.htmltext`). Every alternative is recorded in `alternatives` as
{"type", "chars", "chosen"}; "chars" is None for a part not read (an HTML part
is converted only when the plain one might be a stub). Several inline text
parts (as Apple Mail sends around inline images) are joined. If none is found,
an inline text part that has a filename ("inline; filename=msg.txt") is used,
and stays an attachment too; then the body inside a winmail.dat (`body_source`
"rtf" when it came from its RTF). Text longer than `MAX_DESCRIPTION_CHARS`, or
whose part was longer than what is read, is cut at a paragraph boundary
(`intake.texttrim`), never mid-sentence, and `text_truncated` is set.

Signed and encrypted mail: in multipart/signed the content is walked as usual
and the signature part (application/pgp-signature, application/pkcs7-signature,
application/x-pkcs7-signature) is recorded in `signatures` ({"protocol":
"pgp"|"smime", "type", "size", "sha256"}), not listed as an attachment;
nothing is verified. S/MIME opaque signed data (application/pkcs7-mime with
smime-type=signed-data, or whose content says so) is unwrapped (`intake.cms`)
and the MIME entity inside walked in its place, the blob recorded as a
signature; signed data that cannot be unwrapped is treated as encrypted, so a
person looks. Encrypted mail: multipart/encrypted (PGP/MIME), pkcs7-mime
enveloped-data or authEnveloped-data (or without smime-type and named
smime.p7m), or a body that is one inline "BEGIN PGP MESSAGE" block, sets
`encrypted` ("pgp" or "smime"), also when it is inside an attached message;
the ciphertext parts are attachments with `origin="encrypted"` (the PGP/MIME
"Version: 1" control part is not). Inline PGP signed text is ordinary text.

Attachments: every leaf part that is not body text (nor a signature) is an
`Attachment`, with its size, sha256, the declared Content-Type and the type
sniffed from its first bytes by libmagic (python-magic), refined for
containers: a ZIP that holds `[Content_Types].xml` and a Word/Excel/PowerPoint
main part is given the matching OOXML type, an OpenDocument ZIP its
`mimetype`, and any OOXML ZIP with a `vbaProject.bin`, or an OLE (legacy
Office) file with a VBA project, gets `MACRO_OFFICE_TYPE`. An attached message (`message/rfc822`) is one
attachment (its re-serialized bytes), and the attachments inside it are
listed too, with `nested=True`, so that the attachment policy sees every file
in the mail. Names: the Content-Disposition filename, else the Content-Type
name (RFC 2231 continuations and charsets, or RFC 2047 words), else the last
segment of Content-Location; an attached message without one is
"<subject>.eml"; a name used twice becomes "report (2).pdf". A winmail.dat
(application/ms-tnef, application/vnd.ms-tnef, or so named) is listed as the
files inside it (`intake.tnef`, `origin="tnef"`), sniffed, checked and scanned
like any other; one that cannot be unpacked stays listed as itself, a type the
default policy refuses, so a person looks at it. Payloads are not kept:
`iter_attachment_payloads` decodes them again, one at a time, from the parsed
message that `ParsedMessage` holds (a winmail.dat is unpacked again).
"""
from __future__ import annotations

import hashlib
import io
import os
import re
import weakref
import zipfile
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from email.generator import BytesGenerator
from email.parser import BytesParser
from email.policy import EmailPolicy, compat32
from typing import Any, Iterator
from urllib.parse import unquote

from . import alternatives, charsets, cms, tnef
from .addresses import Mailbox, is_valid_address, parse_address_list
from .headerblock import repair_header_block
from .htmltext import html_to_text
from .texttrim import cut_at_boundary

DEFAULT_LOOP_HEADER = "X-Mailroom-Loop"
MAX_DESCRIPTION_CHARS = 1 << 20   # characters; longer text is cut at a paragraph boundary
MAX_DEPTH = 32
MAX_PARTS = 2000
MAX_BOUNDARY_LINES = 20_000  # lines starting with "--" beyond which only the headers are parsed
MAX_HEADER_CHARS = 64 * 1024
# Thread ids are read from at most this much of the header block at ingest.
MAX_HEADER_BLOCK_FOR_IDS = 256 * 1024
MAX_HEADER_INSTANCES = 50   # per header name: Authentication-Results, Received, ...
MAX_REFERENCES = 200
MAX_DEFECTS = 100
MAX_HTML_BYTES = 4 * 1024 * 1024
SNIFF_BYTES = 8192
MACRO_OFFICE_TYPE = "application/vnd.ms-office.macroenabled"

OOXML_TYPES = {
    "word/document.xml": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "xl/workbook.xml": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "ppt/presentation.xml": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
}
_OLE_TYPES = frozenset({
    "application/msword", "application/vnd.ms-excel", "application/vnd.ms-powerpoint",
    "application/x-ole-storage", "application/cdfv2", "application/vnd.ms-office",
})
_VBA_OLE_MARKER = "_VBA_PROJECT".encode("utf-16-le")
# Report parts: data about a message, not content (DSNs, MDNs, abuse reports).
_REPORT_TYPES = frozenset({
    "message/delivery-status", "message/disposition-notification", "message/feedback-report",
    "text/rfc822-headers", "message/global-delivery-status", "message/global-disposition-notification",
    "message/global-headers",
})
# Codecs that are text encodings in Python's eyes but never a mail charset, and
# slow or surprising on hostile input (punycode decoding is quadratic).
_REFUSED_CODECS = frozenset({"punycode", "idna", "unicode-escape", "raw-unicode-escape", "undefined"})


@dataclass(frozen=True)
class Attachment:
    filename: str            # display name, path components and control characters removed; "" if none
    declared_type: str       # Content-Type as sent (lowercase), "text/plain" when missing or invalid
    sniffed_type: str        # what the bytes are (libmagic, refined for Office containers)
    size: int                # decoded bytes
    sha256: str
    content_id: str          # without angle brackets; "" if none
    is_inline: bool          # Content-Disposition inline, or a Content-ID and no disposition
    nested: bool = False     # inside an attached message/rfc822 (itself listed as an attachment)
    # Where the file came from: "" a MIME part; "tnef" unpacked from a winmail.dat (listed instead of
    # it); "encrypted" the payload of encrypted mail (kept, never judged by the type policy).
    origin: str = ""


@dataclass
class ParsedMessage:
    message_id: str = ""
    sender: str = ""                     # From address ("" if missing or unparsable)
    recipients: list[str] = field(default_factory=list)     # To + Cc addresses, de-duplicated
    subject: str = ""
    date: str = ""
    in_reply_to: str = ""
    references: list[str] = field(default_factory=list)     # first = thread root
    text: str = ""                       # readable body; HTML converted when there is no plain text
    defects: list[str] = field(default_factory=list)
    sender_name: str = ""
    reply_to: list[str] = field(default_factory=list)
    delivered_to: list[str] = field(default_factory=list)   # Delivered-To, X-Original-To, Envelope-To
    return_path: str | None = None       # None: no header; "": the null path "<>"
    auto_submitted: str | None = None    # first token, lowercase ("auto-replied", "no", ...)
    precedence: str | None = None        # lowercase ("bulk", "list", ...)
    x_autoreply: str | None = None
    x_autorespond: str | None = None
    content_type: str = "text/plain"     # top-level, lowercase ("multipart/report", ...)
    report_type: str = ""                # its report-type parameter, lowercase
    authentication_results: list[str] = field(default_factory=list)   # every instance, top first
    loop_header: str = DEFAULT_LOOP_HEADER
    loop_values: list[str] = field(default_factory=list)  # values of `loop_header`, if present
    body_source: str = ""                # "plain", "html", "plain+html" or "" (no body text)
    attachments: list[Attachment] = field(default_factory=list)
    size: int = 0                        # bytes of the raw message
    raw_sha256: str = ""
    too_complex: bool = False            # a nesting or part limit stopped the walk
    # Which header gave `sender`: "from", "sender" or "reply-to" ("" when none did).
    sender_source: str = ""
    # Lowercased text of From when it holds no usable address ("mailer-daemon" on some bounces).
    sender_hint: str = ""
    encrypted: str = ""                  # "pgp" or "smime" when the content is encrypted, else ""
    # Signature parts of signed mail (multipart/signed): metadata, not attachments.
    # Each: {"protocol", "type", "size", "sha256"}.
    signatures: list[dict] = field(default_factory=list)
    # The alternatives of the body (multipart/alternative): {"type", "chars", "chosen"}.
    alternatives: list[dict] = field(default_factory=list)
    text_truncated: bool = False         # `text` was cut (at a paragraph boundary) to its limit
    # The parsed message and the attachment parts, for decoding payloads on demand.
    _message: Any = field(default=None, repr=False, compare=False)
    _attachment_parts: list = field(default_factory=list, repr=False, compare=False)


# -- policy ---------------------------------------------------------------------------------

_LINESEP = re.compile(r"\r\n|\r|\n")
_PARAMETER_HEADERS = frozenset({"content-type", "content-disposition"})
MAX_PARAMETER_HEADER_CHARS = 8192
MAX_PARAMETERS = 64


class _LazyHeaderPolicy(EmailPolicy):
    """`policy.default`, except that reading a header returns its raw, unfolded string.

    Everything `Message` itself does with headers (content type, boundary,
    parameters, filename, charset) works on strings, which is what compat32
    hands it too; `EmailMessage` helpers that need header objects
    (`is_attachment`, `get_body`, `iter_attachments`, `get_content`) are not
    used here.
    """

    def header_fetch_parse(self, name, value):
        if hasattr(value, "name"):
            return value
        if name.lower() in _PARAMETER_HEADERS:
            # email.message._parseparam is quadratic in the length and in the number of ";",
            # and the parser itself calls it (get_boundary) on every multipart part.
            if len(value) > MAX_PARAMETER_HEADER_CHARS:
                value = value[:MAX_PARAMETER_HEADER_CHARS]
            if value.count(";") > MAX_PARAMETERS:
                value = ";".join(value.split(";", MAX_PARAMETERS + 1)[:MAX_PARAMETERS + 1])
        return _LINESEP.sub("", value)


_PARSE_POLICY = _LazyHeaderPolicy()
# Writing an attached message back out: never refold (refolding goes through the
# structured header classes, which are slow on huge headers and have raised on odd ones).
_GENERATE_POLICY = _PARSE_POLICY.clone(refold_source="none")


# -- text helpers ---------------------------------------------------------------------------

# C0 controls and DEL, as spaces: PostgreSQL refuses NUL, and nothing else here is useful.
_HEADER_CONTROL = dict.fromkeys([*range(0, 32), 127], " ")
_BODY_CONTROL = dict.fromkeys([*range(0, 9), 11, 12, *range(14, 32), 127], None)
_ENCODED_WORD = charsets.ENCODED_WORD   # RFC 2047 words; decoded by charsets.decode_encoded_words
_ANGLE_ID = re.compile(r"<([^<>\s]+)>")
_CRLF = re.compile(r"\r\n?")
# The message being parsed, set by _fill_headers: its body's charset is the hint for raw 8-bit
# header bytes, and _clean_filename (called from the part walk with the name alone) needs it too.
_MESSAGE_BEING_PARSED: ContextVar = ContextVar("intake_mime_message_being_parsed", default=None)
MAX_HINT_PARTS = 64


def _codec(charset: str | None) -> str | None:
    """The codec a mail charset label is read with (aliases as mail clients read them), else None."""
    return charsets.codec_for(charset) if isinstance(charset, str) else None


def decode_bytes(data: bytes, charset: str | None, defects: list | None = None, hint: str | None = None) -> str:
    """Text of `data` in `charset`, read as mail clients read it (see `intake.charsets`): aliases,
    isolated bad bytes as U+FFFD, a wrong label replaced by UTF-8, `hint`, a detector, then cp1252."""
    if charset and defects is not None and _codec(charset) is None:
        _add_defect(defects, f"UnknownCharset:{str(charset)[:40]}")
    try:
        return charsets.decode(data, charset if isinstance(charset, str) else None, hint)
    except Exception:  # a codec bug on hostile bytes: still text
        return data.decode("latin-1")


def _unescape_surrogates(value: str, hint: str | None = None) -> str:
    """Raw 8-bit bytes in a header (kept by the parser as surrogates) decoded as undeclared text:
    UTF-8, then `hint` (the body's charset), a detector, then cp1252."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return decode_bytes(value.encode("utf-8", "surrogateescape"), None, None, hint)


def decode_header_value(value: str, limit: int = MAX_HEADER_CHARS, hint: str | None = None) -> str:
    """A header value as readable text: 8-bit bytes and RFC 2047 words decoded, one line, no controls.

    `hint`: the charset the message's body declares, for raw 8-bit bytes that are not UTF-8.
    """
    value = _unescape_surrogates(value[:limit], hint)
    if "=?" in value:
        try:
            value = charsets.decode_encoded_words(value, hint)
        except Exception:
            pass
    return " ".join(value.translate(_HEADER_CONTROL).split())


def _body_charset(message) -> str | None:
    """The 8-bit charset the body declares (top level, else the first text part that has one).

    Clients that write raw 8-bit headers write them in that charset (Foxmail: GBK headers, gb2312 body).
    """
    stack, looked = [message], 0
    while stack and looked < MAX_HINT_PARTS:
        part = stack.pop()
        looked += 1
        try:
            if part.is_multipart():
                children = part.get_payload()
                if isinstance(children, list):
                    stack.extend(reversed(children[:MAX_HINT_PARTS]))
                continue
            if part.get_content_maintype() != "text":
                continue
            charset = part.get_content_charset()
        except Exception:
            continue
        if charset and _codec(charset) not in (None, "ascii", "utf-8"):
            return charset
    return None


def _charset_hint() -> str | None:
    """`_body_charset` of the message being parsed (computed on demand: only 8-bit headers need it)."""
    reference = _MESSAGE_BEING_PARSED.get()
    message = reference() if reference is not None else None
    return _body_charset(message) if message is not None else None


def _clean_id(value: str) -> str:
    match = _ANGLE_ID.search(value)
    if match:
        return match.group(1)[:998]
    return "".join(value.translate(_HEADER_CONTROL).split()).strip("<>")[:998]


def _mailboxes(values: list[str], defects: list, budget: int = MAX_HEADER_CHARS,
               hint: str | None = None) -> list[Mailbox]:
    """Every entry of the address headers `values` (`intake.addresses`), names decoded.

    At most `budget` characters are read over all `values`.
    """
    found = []
    for value in values:
        if budget <= 0:
            _add_defect(defects, "AddressHeadersTooLong")
            break
        value = _unescape_surrogates(value[:budget], hint).translate(_HEADER_CONTROL)
        budget -= len(value)
        for name, address in parse_address_list(value):
            found.append(Mailbox(decode_header_value(name, 1000, hint) if name else "", address[:320]))
    return found


def _addresses(values: list[str], defects: list, budget: int = MAX_HEADER_CHARS,
               hint: str | None = None) -> list[tuple[str, str]]:
    """(display name, address) pairs; entries without an address (an "@" inside, no whitespace) are dropped.

    Addresses are kept as written: `Test test@example.com` is the name "Test" and
    test@example.com, never "Testtest@example.com".
    """
    return [(name, address) for name, address in _mailboxes(values, defects, budget, hint)
            if "@" in address.strip("@") and len(address.split()) == 1]


def _first_valid(mailboxes: list[Mailbox]) -> Mailbox | None:
    return next((mailbox for mailbox in mailboxes if is_valid_address(mailbox.address)), None)


def _sender_hint(mailboxes: list[Mailbox]) -> str:
    """From's text when it holds no usable address: "mailer-daemon" for `From: MAILER-DAEMON`
    and for `From: Mail Delivery System <MAILER-DAEMON>`."""
    for name, address in mailboxes:
        text = " ".join((address or name).split()).strip("<>").lower()
        if text:
            return text[:200]
    return ""


def _unique(addresses: list[str]) -> list[str]:
    seen, out = set(), []
    for address in addresses:
        key = address.lower()
        if key not in seen:
            seen.add(key)
            out.append(address)
    return out


def _token(value: str | None) -> str | None:
    """First token of a header like Auto-Submitted or Precedence, lowercase; comments dropped."""
    if value is None:
        return None
    text = decode_header_value(value, 1000)
    text = re.sub(r"\([^()]*\)", " ", text)
    return text.split(";", 1)[0].strip().lower()


def _clean_filename(name) -> str:
    if not name:
        return ""
    if not isinstance(name, str):
        name = str(name)
    name = decode_header_value(name, 1000, None if name.isascii() else _charset_hint())
    name = name.replace("\\", "/").rsplit("/", 1)[-1].strip(" .")
    return name[:255]


def _add_defect(defects: list, name: str) -> None:
    if len(defects) < MAX_DEFECTS and name not in defects:
        defects.append(name)


# -- sniffing -------------------------------------------------------------------------------

def _libmagic(data: bytes) -> str:
    try:
        import magic  # python-magic over libmagic1

        return (magic.from_buffer(bytes(data[:SNIFF_BYTES]), mime=True) or "application/octet-stream").lower()
    except Exception:
        return "application/octet-stream"


def _zip_type(data: bytes, sniffed: str) -> str:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
            lowered = {name.lower() for name in names[:100_000]}
            if any(name.endswith("vbaproject.bin") for name in lowered):
                return MACRO_OFFICE_TYPE
            if "[content_types].xml" in lowered:
                for main_part, ooxml in OOXML_TYPES.items():
                    if main_part in lowered:
                        return ooxml
            if "mimetype" in lowered:
                member = next(name for name in names if name.lower() == "mimetype")
                with archive.open(member) as handle:
                    declared = handle.read(100).decode("ascii", "replace").strip()
                if re.fullmatch(r"application/vnd\.oasis\.opendocument\.[a-z.-]+", declared):
                    return declared
    except Exception:
        pass
    return sniffed


def sniff_type(data: bytes) -> str:
    """The content type of `data` from its bytes: libmagic on the first `SNIFF_BYTES`, refined for Office."""
    sniffed = _libmagic(data)
    if data[:4] == b"PK\x03\x04":
        return _zip_type(data, sniffed)
    if sniffed in _OLE_TYPES and data.find(_VBA_OLE_MARKER) >= 0:
        return MACRO_OFFICE_TYPE
    return sniffed


# -- walking the parts ----------------------------------------------------------------------

MAX_TEXT_BYTES = MAX_DESCRIPTION_CHARS * 4   # of one plain text part
MAX_SIGNATURES = 20
MAX_ALTERNATIVES = 20
MAX_EML_NAME_CHARS = 100
# A clean "type/subtype" of RFC 2045 tokens, as get_content_type() gives for a well-formed header.
_CLEAN_TYPE = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+/[a-z0-9!#$%&'*+.^_`|~-]+")
# The start of a malformed Content-Type that still names a body type ('text/html charset="utf-8"').
_TEXT_TYPE_START = re.compile(r"""\s*["']?\s*text\s*/\s*(plain|html)(?![a-z0-9!#$%&'*+.^_`|~-])""", re.IGNORECASE)
_CHARSET_PARAMETER = re.compile(r"""charset\s*=\s*["']?\s*([a-z0-9_.:+-]{1,40})""", re.IGNORECASE)
_SIGNATURE_TYPES = {"application/pgp-signature": "pgp", "application/pkcs7-signature": "smime",
                    "application/x-pkcs7-signature": "smime"}
_PKCS7_MIME_TYPES = frozenset({"application/pkcs7-mime", "application/x-pkcs7-mime"})
_ENCRYPTED_SMIME_KINDS = frozenset({"enveloped-data", "authenveloped-data"})
_TNEF_TYPES = frozenset({"application/vnd.ms-tnef", "application/ms-tnef"})
# Other renderings of the body in multipart/alternative (Gmail AMP, Apple Watch): neither body nor file.
_RENDERING_TYPES = frozenset({"text/x-amp-html", "text/watch-html", "text/enriched", "text/richtext"})
_INLINE_PGP_BEGIN, _INLINE_PGP_END = "-----BEGIN PGP MESSAGE-----", "-----END PGP MESSAGE-----"
_UNSAFE_IN_NAME = re.compile(r'[\\/:*?"<>|]+')


class _Walk:
    def __init__(self, defects: list):
        self.defects = defects
        self.text: list[str] = []
        self.text_sources: list[str] = []    # "plain", "html" or "rtf", one for each entry of `text`
        self.text_chars = 0
        self.truncated = False               # some body text was cut or left out
        self.attachments: list[tuple[tuple, Attachment, Any]] = []
        self.parts = 0
        self.too_complex = False
        # Inline text parts with a filename: attachments, and the body if there is no other.
        self.fallback_text: list[tuple[Any, str]] = []
        # Bodies found in winmail.dat parts, (text, source): the body if there is no other.
        self.tnef_bodies: list[tuple[str, str]] = []
        self.signatures: list[dict] = []
        self.encrypted = ""
        self.alternatives: list[dict] = []
        # id(part) -> (text, cut) of HTML parts converted so far: the alternative choice may convert one early.
        self.html_text: dict[int, tuple[str, bool]] = {}


class _TnefMember:
    """Stands for a file unpacked from a winmail.dat part: its bytes are unpacked again when asked for."""

    __slots__ = ("container", "index")

    def __init__(self, container, index: int):
        self.container = container
        self.index = index


def _tnef_member_bytes(unpacked, index: int) -> bytes:
    if unpacked is None or index >= len(unpacked.members):
        return b""
    return unpacked.members[index].data


def _part_bytes(part) -> bytes:
    """Decoded payload of a leaf part, the serialized message of an attached message, or a winmail.dat member."""
    if isinstance(part, _TnefMember):
        return _tnef_member_bytes(tnef.unpack(_part_bytes(part.container)), part.index)
    if part.is_multipart():
        inner = part.get_payload()
        target = inner[0] if part.get_content_maintype() == "message" and inner else part
        buffer = io.BytesIO()
        BytesGenerator(buffer, mangle_from_=False, policy=_GENERATE_POLICY).flatten(target)
        return buffer.getvalue()
    data = part.get_payload(decode=True)
    return data if isinstance(data, bytes) else b""


def _content_type(part) -> str:
    """The part's content type; a malformed Content-Type that still begins with text/plain or text/html
    ('text/html charset="utf-8"', '"text/html"', 'text/html/x') counts as that type."""
    ctype = part.get_content_type()
    if ctype != "text/plain" and _CLEAN_TYPE.fullmatch(ctype):
        return ctype
    # text/plain is also what the email package answers for a header it cannot read: look at the header.
    raw = part.get("Content-Type")
    if raw is None:
        return ctype
    match = _TEXT_TYPE_START.match(str(raw))
    return f"text/{match.group(1).lower()}" if match else ctype


def _text_charset(part) -> str | None:
    try:
        charset = part.get_content_charset()
    except Exception:
        charset = None
    if charset:
        return charset
    raw = str(part.get("Content-Type") or "")
    match = _CHARSET_PARAMETER.search(raw) if "=" in raw else None   # a parameter after a missing ";"
    return match.group(1) if match else None


def _location_name(value: str) -> str:
    """The last path segment of a Content-Location URL or path ("" if it ends in "/")."""
    value = decode_header_value(value, 2000).strip().strip("<>\"'")
    value = value.split("?", 1)[0].split("#", 1)[0]
    return _clean_filename(unquote(value.replace("\\", "/").rsplit("/", 1)[-1]))


def _message_file_name(part) -> str:
    """"<subject>.eml" for an attached message: what a mail program calls it when saving it."""
    inner = part.get_payload()
    if not isinstance(inner, list) or not inner:
        return ""
    subject = decode_header_value(str(inner[0].get("Subject") or ""), 2000)
    subject = " ".join(_UNSAFE_IN_NAME.sub("_", subject).split())[:MAX_EML_NAME_CHARS].strip(" ._")
    return f"{subject}.eml" if subject else ""


def _part_name(part, ctype: str, filename) -> str:
    """Display name: Content-Disposition filename, else Content-Type name (`filename`, from get_filename(),
    with RFC 2231 and 2047 decoded), else the end of Content-Location; an attached message is named after
    its subject. "" if none of these."""
    name = _clean_filename(filename)
    if not name:
        location = part.get("Content-Location")
        if location:
            name = _location_name(str(location))
    if not name and ctype in ("message/rfc822", "message/global"):
        name = _message_file_name(part)
    return name


def _unique_names(attachments: list[Attachment]) -> list[Attachment]:
    """The same attachments, a repeated name made unique: "report.pdf", "report (2).pdf" (case-insensitively)."""
    taken = {a.filename.casefold() for a in attachments if a.filename}
    if len(taken) == sum(1 for a in attachments if a.filename):
        return attachments
    seen: set[str] = set()
    counters: dict[str, int] = {}
    out = []
    for attachment in attachments:
        key = attachment.filename.casefold()
        if attachment.filename and key in seen:
            stem, extension = os.path.splitext(attachment.filename)
            number = counters.get(key, 1)
            while True:
                number += 1
                suffix = f" ({number}){extension}"
                name = stem[:255 - len(suffix)] + suffix
                if name.casefold() not in taken:
                    break
            counters[key] = number
            taken.add(name.casefold())
            attachment = replace(attachment, filename=name)
        seen.add(key)
        out.append(attachment)
    return out


def _add_attachment(walk: _Walk, part, path: tuple, ctype: str, disposition, name: str, nested: bool, *,
                    origin: str = "", data: bytes | None = None) -> None:
    """List a part as an attachment; `name` is its display name (from `_part_name`)."""
    if data is None:
        try:
            data = _part_bytes(part)
        except Exception as exc:
            _add_defect(walk.defects, f"UndecodablePart:{type(exc).__name__}")
            data = b""
    try:
        content_id = _clean_id(str(part.get("Content-ID") or ""))
    except Exception:
        content_id = ""
    attachment = Attachment(
        filename=name,
        declared_type=ctype,
        sniffed_type=sniff_type(data),
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        content_id=content_id,
        is_inline=disposition == "inline" or (disposition is None and bool(content_id)),
        nested=nested,
        origin=origin,
    )
    walk.attachments.append((path, attachment, part))


def _decoded(walk: _Walk, part, limit: int) -> tuple[str, bool]:
    """A text part's payload as text, at most `limit` bytes of it; and whether it was cut."""
    data = part.get_payload(decode=True)
    if not isinstance(data, bytes) or not data:
        return "", False
    cut = len(data) > limit
    if cut:
        end = limit
        while end > limit - 3 and data[end] & 0xC0 == 0x80:   # not inside a UTF-8 sequence
            end -= 1
        data = data[:end]
    return decode_bytes(data, _text_charset(part), walk.defects), cut


def _html_text(walk: _Walk, part, source: tuple[str, bool] | None = None) -> tuple[str, bool]:
    """Readable text of an HTML part, converted once; and whether it was cut."""
    key = id(part)
    if key not in walk.html_text:
        html, cut = source if source is not None else _decoded(walk, part, MAX_HTML_BYTES)
        # A little over the limit, so that a cut can be seen and made again at a paragraph boundary.
        text = html_to_text(html, max_chars=MAX_DESCRIPTION_CHARS + 1024, max_input_chars=MAX_HTML_BYTES)
        walk.html_text[key] = (text, cut or len(text) > MAX_DESCRIPTION_CHARS)
    return walk.html_text[key]


def _append_text(walk: _Walk, text: str, source: str, cut: bool = False) -> bool:
    if cut:   # the input ended mid-way: end at the last paragraph boundary instead
        text = cut_at_boundary(text, min(len(text), MAX_DESCRIPTION_CHARS))
        walk.truncated = True
    text = text.strip("\n")
    if not text.strip():
        return False
    walk.text.append(text)
    walk.text_sources.append(source)
    walk.text_chars += len(text)
    return True


def _add_text(walk: _Walk, part, ctype: str) -> bool:
    """Append the readable text of a body part; True if it had any."""
    if walk.text_chars >= MAX_DESCRIPTION_CHARS:
        walk.truncated = True   # the description is full: this part is left out
        return True
    try:
        if ctype == "text/html":
            text, cut = _html_text(walk, part)
            source = "html"
        else:
            text, cut = _decoded(walk, part, MAX_TEXT_BYTES)
            text = _CRLF.sub("\n", text).translate(_BODY_CONTROL)
            source = "plain"
    except Exception as exc:
        _add_defect(walk.defects, f"UndecodablePart:{type(exc).__name__}")
        return False
    return _append_text(walk, text, source, cut)


def _drop_text(walk: _Walk, start: int) -> None:
    walk.text_chars -= sum(len(text) for text in walk.text[start:])
    del walk.text[start:], walk.text_sources[start:]


def _alternative_rank(ctype: str) -> int:
    if ctype == "text/plain":
        return 0
    if ctype.startswith("multipart/"):
        return 1
    if ctype == "text/html":
        return 2
    return 3


def _html_leaf(part, depth: int = 0):
    """The HTML body part an alternative shows: itself, or the first inside it (multipart/related); or None."""
    if part.is_multipart():
        if depth >= 3 or part.get_content_maintype() == "message":
            return None
        for child in part.get_payload()[:10]:
            leaf = _html_leaf(child, depth + 1)
            if leaf is not None:
                return leaf
        return None
    if (_content_type(part) == "text/html" and part.get_content_disposition() != "attachment"
            and not part.get_filename()):
        return part
    return None


def _html_instead_of_stub(walk: _Walk, children: list, ranked: list, chosen: int, start: int,
                          chars: dict) -> int | None:
    """Index of the HTML alternative to read instead of the plain text just read, when that is a stub."""
    for index, rank in ranked:
        if index != chosen and rank in (1, 2):
            break
    else:
        return None
    leaf = _html_leaf(children[index])
    if leaf is None:
        return None
    plain = "\n\n".join(walk.text[start:])
    source = _decoded(walk, leaf, MAX_HTML_BYTES)
    # The fast path: most HTML holds no more text than its plain alternative, and converting costs.
    if not alternatives.worth_converting(plain, alternatives.html_text_estimate(source[0])):
        return None
    html_text, _ = _html_text(walk, leaf, source)
    chars[index] = len(html_text)
    return index if alternatives.is_stub(plain, html_text) else None


def _walk_alternative(walk: _Walk, children: list, depth: int, path: tuple) -> None:
    """multipart/alternative as the body: the first part with text in the order plain, multipart, HTML,
    except that a plain stub gives way to the HTML (`intake.alternatives`). Every alternative is recorded."""
    types = [_content_type(child) for child in children]
    # (index, rank) in the order tried, stable; other renderings (AMP, ...) are never read nor listed.
    ranked = sorted(((index, _alternative_rank(ctype)) for index, ctype in enumerate(types)
                     if ctype not in _RENDERING_TYPES or children[index].is_multipart()), key=lambda item: item[1])
    chars: dict[int, int] = {}   # readable characters of the alternatives that were read
    walked = {index for index, ctype in enumerate(types) if ctype in _RENDERING_TYPES}
    chosen, start = None, len(walk.text)
    for index, rank in ranked:
        start = len(walk.text)
        walked.add(index)
        _walk(walk, children[index], depth + 1, "body", path + (index,))
        chars[index] = sum(len(text) for text in walk.text[start:])
        if len(walk.text) > start:
            chosen = index
            break
    if chosen is not None and types[chosen] == "text/plain":
        html_index = _html_instead_of_stub(walk, children, ranked, chosen, start, chars)
        if html_index is not None:
            stub = (walk.text[start:], walk.text_sources[start:], walk.truncated)
            _drop_text(walk, start)
            walked.add(html_index)
            _walk(walk, children[html_index], depth + 1, "body", path + (html_index,))
            if len(walk.text) > start:
                chosen = html_index
                chars[html_index] = sum(len(text) for text in walk.text[start:])
            else:   # nothing came of it after all: keep the plain text
                walk.text[start:], walk.text_sources[start:], walk.truncated = stub
                walk.text_chars += sum(len(text) for text in stub[0])
    for index, child in enumerate(children):
        if index not in walked:
            _walk(walk, child, depth + 1, "alternate", path + (index,))
    for index, ctype in enumerate(types[:MAX_ALTERNATIVES]):
        walk.alternatives.append({"type": ctype, "chars": chars.get(index), "chosen": index == chosen})


def _record_signature(walk: _Walk, part, protocol: str, ctype: str, data: bytes | None = None) -> None:
    if len(walk.signatures) >= MAX_SIGNATURES:
        return
    if data is None:
        try:
            data = _part_bytes(part)
        except Exception:
            data = b""
    walk.signatures.append({"protocol": protocol, "type": ctype, "size": len(data),
                            "sha256": hashlib.sha256(data).hexdigest()})


def _walk_signed(walk: _Walk, children: list, depth: int, role: str, path: tuple) -> None:
    """multipart/signed: the content is walked as usual; the signature part is recorded, not listed
    (an attached message's signature is not recorded: it is about that message, listed as a whole)."""
    for index, child in enumerate(children):
        ctype = _content_type(child)
        protocol = _SIGNATURE_TYPES.get(ctype) if index and not child.is_multipart() else None
        if protocol is None:
            _walk(walk, child, depth + 1, role, path + (index,))
        elif _count_part(walk) and role != "nested":
            _record_signature(walk, child, protocol, ctype)


def _walk_encrypted(walk: _Walk, children: list, role: str, path: tuple) -> None:
    """multipart/encrypted (PGP/MIME): a control part ("Version: 1"), then the ciphertext, kept for a person."""
    walk.encrypted = walk.encrypted or "pgp"
    for index, child in enumerate(children):
        if not _count_part(walk):
            return
        ctype = _content_type(child)
        if ctype == "application/pgp-encrypted" and not child.is_multipart():
            continue
        _add_attachment(walk, child, path + (index,), ctype, child.get_content_disposition(),
                        _part_name(child, ctype, child.get_filename()), role == "nested", origin="encrypted")


def _smime_type(part) -> str:
    try:
        value = part.get_param("smime-type")
    except Exception:
        return ""
    if isinstance(value, tuple):
        value = value[2]
    return str(value or "").strip().lower()


def _is_smime_p7m(filename) -> bool:
    return bool(filename) and str(filename).strip().lower() == "smime.p7m"


def _unwrap_signed_data(walk: _Walk, data: bytes, depth: int):
    """The MIME entity inside opaque S/MIME signed data, parsed; None if it cannot be had."""
    if depth + 1 > MAX_DEPTH:
        _add_defect(walk.defects, "DepthLimitExceeded")
        walk.too_complex = True
        return None
    content = cms.signed_content(data)
    if content is None:
        _add_defect(walk.defects, "UnreadableSignedData")
        return None
    if content.count(b"\n--") > MAX_BOUNDARY_LINES:
        _add_defect(walk.defects, "TooManyBoundaryLines")
        walk.too_complex = True
        return None
    try:
        return BytesParser(policy=_PARSE_POLICY).parsebytes(content)
    except Exception as exc:
        _add_defect(walk.defects, f"Unparseable:{type(exc).__name__}")
        return None


def _walk_pkcs7(walk: _Walk, part, depth: int, role: str, path: tuple, ctype: str, disposition, filename) -> None:
    """S/MIME application/pkcs7-mime. Opaque signed data is unwrapped and its content walked in its place
    (the blob recorded as a signature); enveloped data, or signed data that cannot be unwrapped, is
    encrypted mail: the blob is listed with origin "encrypted" for a person. Other kinds (certs-only)
    are ordinary files."""
    try:
        data = _part_bytes(part)
    except Exception as exc:
        _add_defect(walk.defects, f"UndecodablePart:{type(exc).__name__}")
        data = b""
    kind = _smime_type(part) or cms.content_kind(data)
    name = _part_name(part, ctype, filename)
    if kind == "signed-data":
        if role != "nested":
            _record_signature(walk, part, "smime", ctype, data)
        inner = _unwrap_signed_data(walk, data, depth)
        if inner is not None:
            _walk(walk, inner, depth + 1, role, path + (0,))
            return
    elif kind not in _ENCRYPTED_SMIME_KINDS and not (not kind and _is_smime_p7m(filename)):
        _add_attachment(walk, part, path, ctype, disposition, name, role == "nested", data=data)
        return
    walk.encrypted = walk.encrypted or "smime"
    _add_attachment(walk, part, path, ctype, disposition, name, role == "nested", origin="encrypted", data=data)


def _add_tnef(walk: _Walk, part, role: str, path: tuple, ctype: str, disposition, filename) -> None:
    """A winmail.dat is listed as the files inside it (origin "tnef"), and its body kept in case there is
    no other. One that cannot be unpacked is listed as itself: the default policy refuses its type, so a
    person looks at it."""
    try:
        data = _part_bytes(part)
    except Exception as exc:
        _add_defect(walk.defects, f"UndecodablePart:{type(exc).__name__}")
        data = b""
    unpacked = tnef.unpack(data) if data else None
    if unpacked is None:
        _add_defect(walk.defects, "UnreadableTnef")
        _add_attachment(walk, part, path, ctype, disposition, _part_name(part, ctype, filename), role == "nested",
                        data=data)
        return
    for index, member in enumerate(unpacked.members):
        attachment = Attachment(
            filename=_clean_filename(member.name),
            declared_type=member.mime_type or "application/octet-stream",
            sniffed_type=sniff_type(member.data),
            size=len(member.data),
            sha256=hashlib.sha256(member.data).hexdigest(),
            content_id="",
            is_inline=False,
            nested=role == "nested",
            origin="tnef",
        )
        walk.attachments.append((path + (index,), attachment, _TnefMember(part, index)))
    if role == "body" and unpacked.body:
        walk.tnef_bodies.append((unpacked.body, unpacked.body_source))


def _count_part(walk: _Walk) -> bool:
    """Count one more part; False once `MAX_PARTS` is passed (the walk stops there)."""
    walk.parts += 1
    if walk.parts <= MAX_PARTS:
        return True
    if not walk.too_complex:
        _add_defect(walk.defects, "PartLimitExceeded")
    walk.too_complex = True
    return False


def _walk(walk: _Walk, part, depth: int, role: str, path: tuple) -> None:
    """Visit one part. `role`: "body" (text counts), "alternate" (a rejected alternative) or "nested"."""
    if not _count_part(walk):
        return
    if depth:
        for defect in getattr(part, "defects", ())[:10]:
            _add_defect(walk.defects, type(defect).__name__)
    ctype = _content_type(part)
    maintype = ctype.split("/", 1)[0]
    if part.is_multipart():
        children = part.get_payload()
        if maintype == "message":
            if ctype in ("message/rfc822", "message/global"):
                _add_attachment(walk, part, path, ctype, part.get_content_disposition(),
                                _part_name(part, ctype, part.get_filename()), role == "nested")
                role = "nested"
            else:
                return  # delivery-status and other report data
        if depth + 1 > MAX_DEPTH:
            if not walk.too_complex:
                _add_defect(walk.defects, "DepthLimitExceeded")
            walk.too_complex = True
            return
        if ctype == "multipart/signed":
            _walk_signed(walk, children, depth, role, path)
        elif ctype == "multipart/encrypted":
            _walk_encrypted(walk, children, role, path)
        elif ctype == "multipart/alternative" and role == "body":
            _walk_alternative(walk, children, depth, path)
        else:
            for index, child in enumerate(children):
                _walk(walk, child, depth + 1, role, path + (index,))
        return

    disposition = part.get_content_disposition()
    filename = part.get_filename()
    if ctype in _REPORT_TYPES:
        return
    if maintype == "multipart":
        # A multipart whose boundary never shows: its raw body is the best text there is.
        if role == "body":
            _add_text(walk, part, "text/plain")
        return
    if ctype in _PKCS7_MIME_TYPES or (ctype == "application/octet-stream" and _is_smime_p7m(filename)):
        _walk_pkcs7(walk, part, depth, role, path, ctype, disposition, filename)
        return
    if ctype in _TNEF_TYPES or (filename and str(filename).strip().lower() == "winmail.dat"):
        _add_tnef(walk, part, role, path, ctype, disposition, filename)
        return
    if ctype in ("text/plain", "text/html") and disposition != "attachment":
        if not filename:
            if role == "body":
                _add_text(walk, part, ctype)
            return
        if role == "body" and disposition == "inline" and len(walk.fallback_text) < 10:
            walk.fallback_text.append((part, ctype))
    _add_attachment(walk, part, path, ctype, disposition, _part_name(part, ctype, filename), role == "nested")


# -- headers ----------------------------------------------------------------------------------

def _header_map(message) -> dict[str, list[str]]:
    headers: dict[str, list[str]] = {}
    for name, value in message.raw_items():
        values = headers.setdefault(str(name).strip().lower(), [])
        if len(values) < MAX_HEADER_INSTANCES:
            values.append(value if isinstance(value, str) else str(value))
    return headers


def _reference_ids(value: str | None) -> list[str]:
    references = _unescape_surrogates((value or "")[:MAX_HEADER_CHARS])
    ids = _ANGLE_ID.findall(references)
    if not ids:
        ids = [r.strip("<>") for r in references.translate(_HEADER_CONTROL).split() if r.strip("<>")]
    return [i[:998] for i in ids[:MAX_REFERENCES]]


def thread_ids(raw: bytes) -> tuple[str, str, list[str]]:
    """(Message-ID, In-Reply-To, References) from the header block alone, cleaned exactly as
    `parse_message` cleans them: cheap enough for intake to key the thread at ingest."""
    try:
        raw = repair_header_block(raw)   # the header block exactly as parse_message reads it
    except Exception:
        pass
    end = -1
    for separator in (b"\r\n\r\n", b"\n\n"):
        end = raw.find(separator)
        if end != -1:
            break
    block = raw if end == -1 else raw[:end + 2]
    try:
        message = BytesParser(policy=compat32).parsebytes(block[:MAX_HEADER_BLOCK_FOR_IDS], headersonly=True)
        headers = _header_map(message)
    except Exception:
        return "", "", []

    def first(name):
        values = headers.get(name)
        return values[0] if values else None

    return (_clean_id(first("message-id") or ""), _clean_id(first("in-reply-to") or ""),
            _reference_ids(first("references")))


def _fill_headers(parsed: ParsedMessage, message, loop_header: str) -> None:
    _MESSAGE_BEING_PARSED.set(weakref.ref(message))
    headers = _header_map(message)
    defects = parsed.defects
    # Raw 8-bit header bytes that are not UTF-8 are read in the body's charset: look it up only then.
    hint = _charset_hint() if any(not v.isascii() for values in headers.values() for v in values) else None

    def first(name):
        values = headers.get(name)
        return values[0] if values else None

    for name, values in headers.items():
        limit = MAX_PARAMETER_HEADER_CHARS if name in _PARAMETER_HEADERS else MAX_HEADER_CHARS
        if any(len(v) > limit for v in values):
            _add_defect(defects, f"HeaderTooLong:{name[:40]}")

    parsed.message_id = _clean_id(first("message-id") or "")
    # The sender: the first valid address over every From header, else Sender's, else Reply-To's.
    from_mailboxes = _mailboxes(headers.get("from", []), defects, 4096, hint)
    sender, source = _first_valid(from_mailboxes), "from"
    for fallback in ("sender", "reply-to"):
        if sender is None:
            sender, source = _first_valid(_mailboxes(headers.get(fallback, []), defects, 4096, hint)), fallback
    if sender is not None:
        parsed.sender_name, parsed.sender, parsed.sender_source = sender.name, sender.address, source
    if source != "from":
        parsed.sender_hint = _sender_hint(from_mailboxes)
    parsed.recipients = _unique([a for _, a in _addresses(headers.get("to", []) + headers.get("cc", []), defects,
                                                          hint=hint)])
    parsed.reply_to = _unique([a for _, a in _addresses(headers.get("reply-to", [])[:1], defects, 4096, hint)])
    parsed.delivered_to = _unique([a for _, a in _addresses(
        headers.get("delivered-to", []) + headers.get("x-original-to", []) + headers.get("envelope-to", []),
        defects, 8192, hint)])
    parsed.subject = decode_header_value(first("subject") or "", hint=hint)
    parsed.date = decode_header_value(first("date") or "", 200)
    parsed.in_reply_to = _clean_id(first("in-reply-to") or "")
    parsed.references = _reference_ids(first("references"))

    return_path = first("return-path")
    if return_path is not None:
        match = _ANGLE_ID.search(return_path) or None
        stripped = "".join(decode_header_value(return_path, 1000).split())
        parsed.return_path = match.group(1) if match else ("" if stripped in ("", "<>") else stripped.strip("<>"))
    parsed.auto_submitted = _token(first("auto-submitted"))
    parsed.precedence = _token(first("precedence"))
    for attribute, name in (("x_autoreply", "x-autoreply"), ("x_autorespond", "x-autorespond")):
        value = first(name)
        setattr(parsed, attribute, None if value is None else decode_header_value(value, 1000))
    parsed.authentication_results = [decode_header_value(v) for v in headers.get("authentication-results", [])]
    parsed.loop_header = loop_header
    parsed.loop_values = [decode_header_value(v, 1000) for v in headers.get(loop_header.strip().lower(), [])]


# -- entry points -----------------------------------------------------------------------------

def _parse(raw: bytes, parsed: ParsedMessage):
    try:
        repaired = repair_header_block(raw)
    except Exception as exc:  # never expected; the unrepaired bytes still parse
        _add_defect(parsed.defects, f"HeaderRepairError:{type(exc).__name__}")
        repaired = raw
    if repaired is not raw:
        # Junk, stray or unindented lines in the header block (see intake.headerblock).
        _add_defect(parsed.defects, "HeaderBlockRepaired")
        raw = repaired
    if raw.count(b"\n--") > MAX_BOUNDARY_LINES:
        # The email parser spends ~12 us on every part, and 25 MB of tiny parts is two million
        # of them: parse the headers only (the message goes to review as too complex).
        _add_defect(parsed.defects, "TooManyBoundaryLines")
        parsed.too_complex = True
    else:
        try:
            return BytesParser(policy=_PARSE_POLICY).parsebytes(raw)
        except Exception as exc:  # e.g. RecursionError on absurd nesting: keep at least the headers
            _add_defect(parsed.defects, f"Unparseable:{type(exc).__name__}")
            parsed.too_complex = True
    try:
        return BytesParser(policy=_PARSE_POLICY).parsebytes(raw, headersonly=True)
    except Exception as exc:
        _add_defect(parsed.defects, f"HeadersUnparseable:{type(exc).__name__}")
        return None


def parse_message(raw: bytes, *, loop_header: str = DEFAULT_LOOP_HEADER) -> ParsedMessage:
    """Parse an RFC 5322 message. Never raises; see the module docstring for what is filled in."""
    parsed = ParsedMessage(loop_header=loop_header)
    try:
        if not isinstance(raw, bytes):
            raw = bytes(raw)
    except Exception:
        _add_defect(parsed.defects, "NotBytes")
        return parsed
    parsed.size = len(raw)
    parsed.raw_sha256 = hashlib.sha256(raw).hexdigest()
    message = _parse(raw, parsed)
    if message is None:
        return parsed
    parsed._message = message
    for defect in getattr(message, "defects", ())[:20]:
        _add_defect(parsed.defects, type(defect).__name__)
    try:
        _fill_headers(parsed, message, loop_header or DEFAULT_LOOP_HEADER)
    except Exception as exc:
        _add_defect(parsed.defects, f"HeaderError:{type(exc).__name__}")
    try:
        parsed.content_type = message.get_content_type()
        report_type = message.get_param("report-type") if parsed.content_type == "multipart/report" else None
        if isinstance(report_type, tuple):
            report_type = report_type[2]
        parsed.report_type = decode_header_value(str(report_type or ""), 100).lower()
    except Exception as exc:
        _add_defect(parsed.defects, f"ContentTypeError:{type(exc).__name__}")
    walk = _Walk(parsed.defects)
    try:
        _walk(walk, message, 0, "body", ())
    except Exception as exc:  # RecursionError, or a part the email package chokes on
        _add_defect(parsed.defects, f"WalkError:{type(exc).__name__}")
        walk.too_complex = True
    parsed.too_complex = parsed.too_complex or walk.too_complex
    if not walk.text:
        # Some clients send the body as "inline; filename=msg.txt": with nothing else, that is the body.
        for part, ctype in walk.fallback_text:
            try:
                if _add_text(walk, part, ctype):
                    break
            except Exception:
                pass
    if not walk.text:
        # Outlook's rich text mail can have its only body inside winmail.dat.
        for body, source in walk.tnef_bodies:
            if _append_text(walk, body, source):
                break
    text = "\n\n".join(walk.text)
    if len(text) > MAX_DESCRIPTION_CHARS:
        text = cut_at_boundary(text, MAX_DESCRIPTION_CHARS)
        walk.truncated = True
    parsed.text = text
    parsed.text_truncated = walk.truncated
    parsed.body_source = "+".join(dict.fromkeys(walk.text_sources))
    if _INLINE_PGP_BEGIN in text[:200] and text.strip().startswith(_INLINE_PGP_BEGIN) \
            and text.rstrip().endswith(_INLINE_PGP_END):
        walk.encrypted = walk.encrypted or "pgp"
    parsed.encrypted = walk.encrypted
    parsed.signatures = walk.signatures
    parsed.alternatives = walk.alternatives
    walk.attachments.sort(key=lambda item: item[0])
    attachments = [attachment for _, attachment, _ in walk.attachments]
    try:
        attachments = _unique_names(attachments)
    except Exception as exc:  # names stay as they were
        _add_defect(parsed.defects, f"NamingError:{type(exc).__name__}")
    parsed.attachments = attachments
    parsed._attachment_parts = [part for _, _, part in walk.attachments]
    return parsed


def attachment_payload(parsed: ParsedMessage, index: int) -> bytes:
    """Decoded bytes of `parsed.attachments[index]` (decoded again from the parsed message; a file from a
    winmail.dat is unpacked again)."""
    return _part_bytes(parsed._attachment_parts[index])


def iter_attachment_payloads(parsed: ParsedMessage) -> Iterator[tuple[Attachment, bytes]]:
    """Each attachment with its decoded bytes, one at a time (for scanning).

    Only one payload is alive at a time if the caller drops it before the next; the
    files of one winmail.dat come from one unpacking of it, dropped after the last.
    A part that could not be decoded at parse time yields b"" (its size is 0 too).
    """
    unpacked_from = unpacked = None
    for attachment, part in zip(parsed.attachments, parsed._attachment_parts):
        try:
            if isinstance(part, _TnefMember):
                if part.container is not unpacked_from:
                    unpacked_from, unpacked = part.container, None
                    unpacked = tnef.unpack(_part_bytes(part.container))
                data = _tnef_member_bytes(unpacked, part.index)
            else:
                unpacked_from = unpacked = None
                data = _part_bytes(part)
        except Exception:
            data = b""
        yield attachment, data

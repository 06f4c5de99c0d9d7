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
`MAX_DESCRIPTION_CHARS` (64 Ki), attachment bytes sniffed `SNIFF_BYTES` (8 KiB).
Parsing cost is linear in the input: ~0.2 ms for a 2 KB message, ~1.2 s for a
25 MB message that is one base64 attachment (the stdlib parser reads line by
line), up to ~0.5 s a MB for input built to be slow (a million header lines).

How it stays fast: the standard `email` package with `policy.default`
semantics (EmailMessage objects, RFC 2231 parameters, 8-bit clean), except
that reading a header returns the raw unfolded string instead of building a
structured header object (`_LazyHeaderPolicy`). With header objects (the
previous version of this module) a 2.4 KB message took ~1.2 ms, mostly in
header classes we do not need; now ~0.15-0.25 ms. The few fields we use are
decoded here (RFC 2047 encoded words, addresses with `email.utils.getaddresses`,
charsets with a safe fallback: unknown charset -> UTF-8 -> cp1252).

Body text: text/plain and text/html parts without a filename and not marked
`attachment`; in multipart/alternative the plain part unless it is blank, then
the HTML one (converted by `intake.htmltext`); several inline text parts (as
Apple Mail sends around inline images) are joined. If none is found, an
inline text part that has a filename ("inline; filename=msg.txt") is used,
and stays an attachment too.

Attachments: every leaf part that is not body text is an `Attachment`, with
its size, sha256, the declared Content-Type and the type sniffed from its
first bytes by libmagic (python-magic), refined for containers: a ZIP that
holds `[Content_Types].xml` and a Word/Excel/PowerPoint main part is given the
matching OOXML type, an OpenDocument ZIP its `mimetype`, and any OOXML ZIP
with a `vbaProject.bin`, or an OLE (legacy Office) file with a VBA project,
gets `MACRO_OFFICE_TYPE`. An attached message (`message/rfc822`) is one
attachment (its re-serialized bytes), and the attachments inside it are
listed too, with `nested=True`, so that the attachment policy sees every file
in the mail. Payloads are not kept: `iter_attachment_payloads` decodes them
again, one at a time, from the parsed message that `ParsedMessage` holds.
"""
from __future__ import annotations

import binascii
import codecs
import hashlib
import io
import re
import zipfile
from dataclasses import dataclass, field
from email import quoprimime
from email.generator import BytesGenerator
from email.parser import BytesParser
from email.policy import EmailPolicy, compat32
from email.utils import getaddresses
from typing import Any, Iterator

from .htmltext import html_to_text

DEFAULT_LOOP_HEADER = "X-Mailroom-Loop"
MAX_DESCRIPTION_CHARS = 64 * 1024
MAX_DEPTH = 32
MAX_PARTS = 2000
MAX_BOUNDARY_LINES = 20_000  # lines starting with "--" beyond which only the headers are parsed
MAX_HEADER_CHARS = 64 * 1024
# Thread ids are read from at most this much of the header block at ingest.
MAX_HEADER_BLOCK_FOR_IDS = 256 * 1024
MAX_HEADER_INSTANCES = 50   # per header name: Authentication-Results, Received, ...
MAX_REFERENCES = 200
MAX_DEFECTS = 100
MAX_HTML_BYTES = 2 * 1024 * 1024
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
_ENCODED_WORD = re.compile(r"=\?([^?\s*]+)(?:\*[^?\s]*)?\?([qQbB])\?([^?\s]*)\?=")
_BETWEEN_WORDS = re.compile(r"(?<=\?=)[ \t\r\n]+(?==\?)")
_ANGLE_ID = re.compile(r"<([^<>\s]+)>")
_CRLF = re.compile(r"\r\n?")


def _codec(charset: str | None) -> str | None:
    if not charset:
        return None
    name = charset.strip().strip('"\'').lower()
    if not name or len(name) > 40:
        return None
    try:
        info = codecs.lookup(name)
    except (LookupError, ValueError, TypeError):
        return None
    if info.name in _REFUSED_CODECS or not getattr(info, "_is_text_encoding", True):
        return None
    return info.name


def decode_bytes(data: bytes, charset: str | None, defects: list | None = None) -> str:
    """Text of `data` in `charset`; an unknown or broken charset falls back to UTF-8, then cp1252."""
    codec = _codec(charset)
    if codec is None and charset and defects is not None:
        _add_defect(defects, f"UnknownCharset:{str(charset)[:40]}")
    if codec is not None and codec not in ("ascii", "utf-8"):
        try:
            return data.decode(codec, "replace")
        except Exception:
            pass
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    try:
        return data.decode("cp1252", "replace")
    except Exception:
        return data.decode("latin-1")


def _unescape_surrogates(value: str) -> str:
    """Raw 8-bit bytes in a header (kept by the parser as surrogates) read as UTF-8, else cp1252."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        raw = value.encode("utf-8", "surrogateescape")
        return decode_bytes(raw, None)


def _decode_word(match: re.Match) -> str:
    charset, encoding, payload = match.group(1), match.group(2), match.group(3)
    try:
        if encoding in "bB":
            data = binascii.a2b_base64(payload + "=" * (-len(payload) % 4))
        else:
            data = quoprimime.header_decode(payload).encode("latin-1")
    except Exception:
        return match.group(0)
    return decode_bytes(data, charset)


def decode_header_value(value: str, limit: int = MAX_HEADER_CHARS) -> str:
    """A header value as readable text: 8-bit bytes and RFC 2047 words decoded, one line, no controls."""
    value = _unescape_surrogates(value[:limit])
    if "=?" in value:
        try:
            value = _ENCODED_WORD.sub(_decode_word, _BETWEEN_WORDS.sub("", value))
        except Exception:
            pass
    return " ".join(value.translate(_HEADER_CONTROL).split())


def _clean_id(value: str) -> str:
    match = _ANGLE_ID.search(value)
    if match:
        return match.group(1)[:998]
    return "".join(value.translate(_HEADER_CONTROL).split()).strip("<>")[:998]


def _addresses(values: list[str], defects: list, budget: int = MAX_HEADER_CHARS) -> list[tuple[str, str]]:
    """(display name, address) pairs; addresses without an @ are dropped.

    At most `budget` characters are read over all `values`: address parsing costs
    up to ~3 us a character on hostile input.
    """
    found = []
    for value in values:
        if budget <= 0:
            _add_defect(defects, "AddressHeadersTooLong")
            break
        value = _unescape_surrogates(value[:budget]).translate(_HEADER_CONTROL)
        budget -= len(value)
        try:
            pairs = getaddresses([value])
        except Exception as exc:  # deeply nested comments reach the recursion limit
            _add_defect(defects, f"UnparsableAddress:{type(exc).__name__}")
            continue
        for name, address in pairs:
            address = "".join(address.split())
            if "@" in address.strip("@"):
                found.append((decode_header_value(name) if name else "", address[:320]))
    return found


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
    name = decode_header_value(name, 1000)
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

class _Walk:
    def __init__(self, defects: list):
        self.defects = defects
        self.text: list[str] = []
        self.text_chars = 0
        self.sources: list[str] = []
        self.attachments: list[tuple[tuple, Attachment, Any]] = []
        self.parts = 0
        self.too_complex = False
        # Inline text parts with a filename: attachments, and the body if there is no other.
        self.fallback_text: list[tuple[Any, str]] = []


def _part_bytes(part) -> bytes:
    """Decoded payload of a leaf part, or the serialized message of an attached message."""
    if part.is_multipart():
        inner = part.get_payload()
        target = inner[0] if part.get_content_maintype() == "message" and inner else part
        buffer = io.BytesIO()
        BytesGenerator(buffer, mangle_from_=False, policy=_GENERATE_POLICY).flatten(target)
        return buffer.getvalue()
    data = part.get_payload(decode=True)
    return data if isinstance(data, bytes) else b""


def _add_attachment(walk: _Walk, part, path: tuple, ctype: str, disposition, filename, nested: bool) -> None:
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
        filename=_clean_filename(filename),
        declared_type=ctype,
        sniffed_type=sniff_type(data),
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        content_id=content_id,
        is_inline=disposition == "inline" or (disposition is None and bool(content_id)),
        nested=nested,
    )
    walk.attachments.append((path, attachment, part))


def _add_text(walk: _Walk, part, ctype: str) -> bool:
    """Append the readable text of a body part; True if it had any."""
    if walk.text_chars >= MAX_DESCRIPTION_CHARS:
        return True
    try:
        data = part.get_payload(decode=True)
    except Exception as exc:
        _add_defect(walk.defects, f"UndecodablePart:{type(exc).__name__}")
        return False
    if not isinstance(data, bytes) or not data:
        return False
    try:
        charset = part.get_content_charset()
    except Exception:
        charset = None
    if ctype == "text/html":
        text = html_to_text(decode_bytes(data[:MAX_HTML_BYTES], charset, walk.defects))
        source = "html"
    else:
        text = decode_bytes(data[:MAX_DESCRIPTION_CHARS * 4], charset, walk.defects)
        text = _CRLF.sub("\n", text).translate(_BODY_CONTROL)
        source = "plain"
    if not text.strip():
        return False
    walk.text.append(text.strip("\n"))
    walk.text_chars += len(text)
    if source not in walk.sources:
        walk.sources.append(source)
    return True


def _alternative_rank(part) -> int:
    try:
        ctype = part.get_content_type()
    except Exception:
        return 9
    if ctype == "text/plain":
        return 0
    if ctype.startswith("multipart/"):
        return 1
    if ctype == "text/html":
        return 2
    return 3


def _walk(walk: _Walk, part, depth: int, role: str, path: tuple) -> None:
    """Visit one part. `role`: "body" (text counts), "alternate" (a rejected alternative) or "nested"."""
    walk.parts += 1
    if walk.parts > MAX_PARTS:
        if not walk.too_complex:
            _add_defect(walk.defects, "PartLimitExceeded")
        walk.too_complex = True
        return
    if depth:
        for defect in getattr(part, "defects", ())[:10]:
            _add_defect(walk.defects, type(defect).__name__)
    ctype = part.get_content_type()
    maintype = ctype.split("/", 1)[0]
    if part.is_multipart():
        children = part.get_payload()
        if maintype == "message":
            if ctype in ("message/rfc822", "message/global"):
                _add_attachment(walk, part, path, ctype, part.get_content_disposition(), part.get_filename(),
                                role == "nested")
                role = "nested"
            else:
                return  # delivery-status and other report data
        if depth + 1 > MAX_DEPTH:
            if not walk.too_complex:
                _add_defect(walk.defects, "DepthLimitExceeded")
            walk.too_complex = True
            return
        indexed = list(enumerate(children))
        if ctype == "multipart/alternative" and role == "body":
            indexed.sort(key=lambda item: _alternative_rank(item[1]))
            chosen = False
            for index, child in indexed:
                if chosen:
                    _walk(walk, child, depth + 1, "alternate", path + (index,))
                else:
                    before = len(walk.text)
                    _walk(walk, child, depth + 1, "body", path + (index,))
                    chosen = len(walk.text) > before
            return
        for index, child in indexed:
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
    if ctype in ("text/plain", "text/html") and disposition != "attachment":
        if not filename:
            if role == "body":
                _add_text(walk, part, ctype)
            return
        if role == "body" and disposition == "inline" and len(walk.fallback_text) < 10:
            walk.fallback_text.append((part, ctype))
    _add_attachment(walk, part, path, ctype, disposition, filename, role == "nested")


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
    headers = _header_map(message)
    defects = parsed.defects

    def first(name):
        values = headers.get(name)
        return values[0] if values else None

    for name, values in headers.items():
        limit = MAX_PARAMETER_HEADER_CHARS if name in _PARAMETER_HEADERS else MAX_HEADER_CHARS
        if any(len(v) > limit for v in values):
            _add_defect(defects, f"HeaderTooLong:{name[:40]}")

    parsed.message_id = _clean_id(first("message-id") or "")
    senders = _addresses(headers.get("from", [])[:1], defects, 4096)
    if senders:
        parsed.sender_name, parsed.sender = senders[0]
    parsed.recipients = _unique([a for _, a in _addresses(headers.get("to", []) + headers.get("cc", []), defects)])
    parsed.reply_to = _unique([a for _, a in _addresses(headers.get("reply-to", [])[:1], defects, 4096)])
    parsed.delivered_to = _unique([a for _, a in _addresses(
        headers.get("delivered-to", []) + headers.get("x-original-to", []) + headers.get("envelope-to", []),
        defects, 8192)])
    parsed.subject = decode_header_value(first("subject") or "")
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
    text = "\n\n".join(walk.text)
    parsed.text = text[:MAX_DESCRIPTION_CHARS]
    parsed.body_source = "+".join(walk.sources)
    walk.attachments.sort(key=lambda item: item[0])
    parsed.attachments = [attachment for _, attachment, _ in walk.attachments]
    parsed._attachment_parts = [part for _, _, part in walk.attachments]
    return parsed


def attachment_payload(parsed: ParsedMessage, index: int) -> bytes:
    """Decoded bytes of `parsed.attachments[index]` (decoded again from the parsed message)."""
    return _part_bytes(parsed._attachment_parts[index])


def iter_attachment_payloads(parsed: ParsedMessage) -> Iterator[tuple[Attachment, bytes]]:
    """Each attachment with its decoded bytes, one at a time (for scanning).

    Only one payload is alive at a time if the caller drops it before the next.
    A part that could not be decoded at parse time yields b"" (its size is 0 too).
    """
    for attachment, part in zip(parsed.attachments, parsed._attachment_parts):
        try:
            data = _part_bytes(part)
        except Exception:
            data = b""
        yield attachment, data

"""Header reading: text decoding, ids, addresses, the header fields of `ParsedMessage`, `thread_ids`.

Header text is read leniently, as mail clients read it: 8-bit bytes and RFC 2047
words (`intake.mime.charsets`), address lists (`intake.mime.addresses`); the
header block is repaired first (`intake.mime.headerblock`).
"""

from __future__ import annotations

import re
import weakref
from contextvars import ContextVar
from email.parser import BytesParser
from email.policy import compat32
from email.utils import collapse_rfc2231_value
from typing import TYPE_CHECKING, cast

from . import charsets
from .addresses import Mailbox, is_dotless_address, is_valid_address, parse_address_list
from .headerblock import repair_header_block
from .message import ParsedMessage, add_defect
from .policy import MAX_PARAMETER_HEADER_CHARS, PARAMETER_HEADERS

if TYPE_CHECKING:
    from email.message import Message

MAX_HEADER_CHARS = 64 * 1024
# Thread ids are read from at most this much of the header block at ingest.
MAX_HEADER_BLOCK_FOR_IDS = 256 * 1024
MAX_HEADER_INSTANCES = 50  # per header name: Authentication-Results, Received, ...
MAX_REFERENCES = 200

# C0 controls and DEL, as spaces: PostgreSQL refuses NUL, and nothing else here is useful.
_HEADER_CONTROL = dict.fromkeys([*range(0, 32), 127], " ")
_ANGLE_ID = re.compile(r"<([^<>\s]+)>")
# In a filename: folding is undone and control characters dropped, other whitespace kept as sent.
_FOLDING = re.compile(r"\r?\n(?=[ \t])")
_FILENAME_CONTROL = dict.fromkeys([*range(0, 9), *range(10, 32), 127], None)
# The message being parsed, set by fill_headers: its body's charset is the hint for raw 8-bit
# header bytes, and clean_filename (called from the part walk with the name alone) needs it too.
_MESSAGE_BEING_PARSED: ContextVar[weakref.ref[Message] | None] = ContextVar(
    "intake_mime_message_being_parsed", default=None
)
MAX_HINT_PARTS = 64


def _codec(charset: str | None) -> str | None:
    """The codec a mail charset label is read with (aliases as mail clients read them), else None."""
    return charsets.codec_for(charset) if isinstance(charset, str) else None


def decode_bytes(data: bytes, charset: str | None, defects: list[str] | None = None, hint: str | None = None) -> str:
    """Text of `data` in `charset`, read as mail clients read it (see `intake.mime.charsets`): aliases,
    isolated bad bytes as U+FFFD, a wrong label replaced by UTF-8, `hint`, a detector, then cp1252."""
    if charset and defects is not None and _codec(charset) is None:
        add_defect(defects, f"UnknownCharset:{str(charset)[:40]}")
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


def _body_charset(message: Message) -> str | None:
    """The 8-bit charset the body declares (top level, else the first text part that has one).

    Clients that write raw 8-bit headers write them in that charset (Foxmail: GBK headers, gb2312 body).
    A 7-bit charset (us-ascii, iso-2022-jp, utf-7) never reads 8-bit bytes: such a part says nothing.
    """
    stack, looked = [message], 0
    while stack and looked < MAX_HINT_PARTS:
        part = stack.pop()
        looked += 1
        try:
            if part.is_multipart():
                children = part.get_payload()
                if isinstance(children, list):  # of messages: a multipart's parts
                    stack.extend(reversed(cast("list[Message]", children)[:MAX_HINT_PARTS]))
                continue
            if part.get_content_maintype() != "text":
                continue
            charset = part.get_content_charset()
        except Exception:
            continue
        if charset and _codec(charset) not in (None, "ascii", "utf-8") and charsets.reads_8bit(charset):
            return charset
    return None


def _charset_hint() -> str | None:
    """`_body_charset` of the message being parsed (computed on demand: only 8-bit headers need it)."""
    reference = _MESSAGE_BEING_PARSED.get()
    message = reference() if reference is not None else None
    return _body_charset(message) if message is not None else None


def clean_id(value: str) -> str:
    value = _unescape_surrogates(value)  # RFC 6532 ids hold raw UTF-8 (<id@exämple.es>)
    match = _ANGLE_ID.search(value)
    if match:
        return match.group(1)[:998]
    return "".join(value.translate(_HEADER_CONTROL).split()).strip("<>")[:998]


def _mailboxes(
    values: list[str], defects: list[str], budget: int = MAX_HEADER_CHARS, hint: str | None = None
) -> list[Mailbox]:
    """Every entry of the address headers `values` (`intake.mime.addresses`), names decoded.

    At most `budget` characters are read over all `values`.
    """
    found = []
    for value in values:
        if budget <= 0:
            add_defect(defects, "AddressHeadersTooLong")
            break
        value = _unescape_surrogates(value[:budget], hint).translate(_HEADER_CONTROL)
        budget -= len(value)
        for name, address in parse_address_list(value):
            found.append(Mailbox(decode_header_value(name, 1000, hint) if name else "", address[:320]))
    return found


def _addresses(
    values: list[str], defects: list[str], budget: int = MAX_HEADER_CHARS, hint: str | None = None
) -> list[tuple[str, str]]:
    """(display name, address) pairs; entries without an address (an "@" inside, no whitespace) are dropped.

    Addresses are kept as written: `Test test@example.com` is the name "Test" and
    test@example.com, never "Testtest@example.com".
    """
    return [
        (name, address)
        for name, address in _mailboxes(values, defects, budget, hint)
        if "@" in address.strip("@") and (len(address.split()) == 1 or address.startswith('"'))
    ]


def _first_valid(mailboxes: list[Mailbox]) -> Mailbox | None:
    """The first usable address; an intranet one without a dot in its domain (root@localhost) counts,
    as mail clients deliver to it: the caller flags it."""
    return next((mailbox for mailbox in mailboxes if is_valid_address(mailbox.address, allow_dotless=True)), None)


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


def clean_filename(name: object) -> str:
    """A display name from a filename parameter: words and 8-bit bytes decoded, folding undone, path and
    controls removed, and only the ends stripped: "Q3  report.pdf" keeps its two spaces, as the sender's
    file system has them."""
    if not name:
        return ""
    if not isinstance(name, str):
        name = str(name)
    name = _unescape_surrogates(name[:1000], None if name.isascii() else _charset_hint())
    name = _FOLDING.sub("", name)
    if "=?" in name:
        try:
            name = charsets.decode_encoded_words(name)
        except Exception:
            pass
    name = name.translate(_FILENAME_CONTROL).replace("\\", "/").rsplit("/", 1)[-1].strip(" .\t")
    return name[:255]


def content_type_param(part: Message, name: str) -> str:
    """A Content-Type parameter's value as sent (RFC 2231 values collapsed to their text), stripped; "" when
    missing or unreadable. The caller bounds and decodes it as the parameter needs."""
    try:
        value = part.get_param(name)
    except Exception:
        return ""
    if isinstance(value, tuple):  # RFC 2231: (charset, language, value)
        value = value[2]
    return str(value or "").strip()


def part_filename(part: Message) -> str | None:
    """A part's filename (Content-Disposition filename, else Content-Type name), as `get_filename` gives it,
    except that an RFC 2231 name is decoded from its bytes as `intake.mime.charsets` decodes text: a name
    declared iso-8859-1 that is UTF-8, or declared utf-8 that is windows-1252, comes out as written,
    not as mojibake or U+FFFD."""
    missing = object()
    value = part.get_param("filename", missing, "content-disposition")
    if value is missing:
        value = part.get_param("name", missing, "content-type")
        if value is missing:
            return None
    value = cast("str | tuple[str | None, str | None, str]", value)  # a parameter: `missing` is ruled out
    if not isinstance(value, tuple):
        return collapse_rfc2231_value(value).strip()
    charset, _language, text = value
    try:
        data = text.encode("raw-unicode-escape")
    except Exception:
        return collapse_rfc2231_value(value).strip()
    if data.isascii():
        return collapse_rfc2231_value(value).strip()
    try:  # valid multibyte UTF-8 is no accident in Latin text: what the sender's system wrote
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return charsets.decode(data, charset or None, _charset_hint())


def _header_map(message: Message) -> dict[str, list[str]]:
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
        raw = repair_header_block(raw)  # the header block exactly as parse_message reads it
    except Exception:
        pass
    end = -1
    for separator in (b"\r\n\r\n", b"\n\n"):
        end = raw.find(separator)
        if end != -1:
            break
    block = raw if end == -1 else raw[: end + 2]
    try:
        message = BytesParser(policy=compat32).parsebytes(block[:MAX_HEADER_BLOCK_FOR_IDS], headersonly=True)
        headers = _header_map(message)
    except Exception:
        return "", "", []

    def first(name: str) -> str | None:
        values = headers.get(name)
        return values[0] if values else None

    return (
        clean_id(first("message-id") or ""),
        clean_id(first("in-reply-to") or ""),
        _reference_ids(first("references")),
    )


def fill_headers(parsed: ParsedMessage, message: Message, loop_header: str) -> None:
    _MESSAGE_BEING_PARSED.set(weakref.ref(message))
    headers = _header_map(message)
    defects = parsed.defects
    # Raw 8-bit header bytes that are not UTF-8 are read in the body's charset: look it up only then.
    hint = _charset_hint() if any(not v.isascii() for values in headers.values() for v in values) else None

    def first(name: str) -> str | None:
        values = headers.get(name)
        return values[0] if values else None

    for name, values in headers.items():
        limit = MAX_PARAMETER_HEADER_CHARS if name in PARAMETER_HEADERS else MAX_HEADER_CHARS
        if any(len(v) > limit for v in values):
            add_defect(defects, f"HeaderTooLong:{name[:40]}")

    parsed.message_id = clean_id(first("message-id") or "")
    # The sender: the first valid address over every From header, else Sender's, else Reply-To's.
    from_mailboxes = _mailboxes(headers.get("from", []), defects, 4096, hint)
    sender, source = _first_valid(from_mailboxes), "from"
    for fallback in ("sender", "reply-to"):
        if sender is None:
            sender, source = _first_valid(_mailboxes(headers.get(fallback, []), defects, 4096, hint)), fallback
    if sender is not None:
        parsed.sender_name, parsed.sender, parsed.sender_source = sender.name, sender.address, source
        if is_dotless_address(sender.address):
            add_defect(defects, "DotlessSenderDomain")
    if source != "from":
        parsed.sender_hint = _sender_hint(from_mailboxes)
    parsed.recipients = _unique(
        [a for _, a in _addresses(headers.get("to", []) + headers.get("cc", []), defects, hint=hint)]
    )
    parsed.reply_to = _unique([a for _, a in _addresses(headers.get("reply-to", [])[:1], defects, 4096, hint)])
    parsed.delivered_to = _unique(
        [
            a
            for _, a in _addresses(
                headers.get("delivered-to", []) + headers.get("x-original-to", []) + headers.get("envelope-to", []),
                defects,
                8192,
                hint,
            )
        ]
    )
    parsed.subject = decode_header_value(first("subject") or "", hint=hint)
    parsed.date = decode_header_value(first("date") or "", 200)
    parsed.in_reply_to = clean_id(first("in-reply-to") or "")
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

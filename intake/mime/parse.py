"""The entry point: `parse_message`, which never raises (see the `intake.mime` docstring)."""

from __future__ import annotations

import hashlib
from email.parser import BytesParser
from typing import TYPE_CHECKING, cast

from . import calendar, spool
from .body import MAX_DESCRIPTION_CHARS, add_text, append_text
from .headerblock import repair_header_block
from .headers import decode_header_value, fill_headers
from .limits import MAX_BOUNDARY_LINES
from .message import DEFAULT_LOOP_HEADER, ParsedMessage, add_defect
from .parts import part_content_type, unique_names
from .policy import PARSE_POLICY
from .texttrim import cut_at_boundary
from .walk import WalkState, walk_message

if TYPE_CHECKING:
    from email.message import Message

_INLINE_PGP_BEGIN, _INLINE_PGP_END = "-----BEGIN PGP MESSAGE-----", "-----END PGP MESSAGE-----"


# Leaf types that some reader takes the payload of directly, not through `parts.decoded_part_bytes`: never spooled
# (text only when it is a file: disposition "attachment", not a calendar, which `calendar` reads).
_READ_DIRECTLY = ("text/", "multipart/", "message/", "application/plain")


def _read_directly(part: Message) -> bool:
    if not (part.get_content_type().startswith(_READ_DIRECTLY) or part_content_type(part).startswith(_READ_DIRECTLY)):
        return calendar.is_calendar_part(part)
    return not (
        part.get_content_maintype() == "text"
        and part_content_type(part).startswith("text/")
        and part.get_content_disposition() == "attachment"
        and not calendar.is_calendar_part(part)
    )


class _ShortcutRefused(Exception):
    """The spooling shortcut (`intake.mime.spool`) does not fit this message: it is parsed the ordinary way."""


def _bind_runs(message: Message, runs: dict[str, spool.Run]) -> list[Message]:
    """Give each part whose payload is a token its `spool.Run` (`parts.spooled_run`); raises
    `_ShortcutRefused` unless every token is the payload of one base64 leaf outside any attached message."""
    bound: dict[str, Message] = {}
    stack = [(message, False)]
    while stack:
        part, in_message = stack.pop()
        if part.is_multipart():
            inside = in_message or part.get_content_maintype() == "message"
            stack.extend((child, inside) for child in cast("list[Message]", part.get_payload()))  # its parts
            continue
        payload = part.get_payload()
        if not isinstance(payload, str) or spool.TOKEN_PREFIX not in payload:
            continue
        token = payload.rstrip("\r\n")
        if (
            token not in runs
            or token in bound
            or in_message
            or str(part.get("content-transfer-encoding", "")).lower() != "base64"
            or _read_directly(part)
        ):
            raise _ShortcutRefused
        bound[token] = part
    if len(bound) != len(runs):
        raise _ShortcutRefused
    for token, part in bound.items():
        part.mailroom_run = runs[token]  # type: ignore[attr-defined]  # our own attribute, read by spooled_run
    return list(bound.values())


def _parse(raw: bytes, parsed: ParsedMessage, shortcut: bool) -> tuple[Message | None, list[Message]]:
    try:
        repaired = repair_header_block(raw)
    except Exception as exc:  # never expected; the unrepaired bytes still parse
        add_defect(parsed.defects, f"HeaderRepairError:{type(exc).__name__}")
        repaired = raw
    if repaired is not raw:
        # Junk, stray or unindented lines in the header block (see intake.mime.headerblock).
        add_defect(parsed.defects, "HeaderBlockRepaired")
        raw = repaired
    if raw.count(b"\n--") > MAX_BOUNDARY_LINES:
        # The email parser spends ~12 us on every part, and 25 MB of tiny parts is two million
        # of them: parse the headers only (the message goes to review as too complex).
        add_defect(parsed.defects, "TooManyBoundaryLines")
        parsed.too_complex = True
    else:
        # Large base64 bodies stay in `raw`, not copied into the parsed message (`intake.mime.spool`).
        text, runs = spool.elide(raw) if shortcut else (raw, {})
        try:
            message = BytesParser(policy=PARSE_POLICY).parsebytes(text)
            return message, _bind_runs(message, runs) if runs else []
        except _ShortcutRefused:
            raise
        except Exception as exc:  # e.g. RecursionError on absurd nesting: keep at least the headers
            if runs:
                raise _ShortcutRefused from exc
            add_defect(parsed.defects, f"Unparseable:{type(exc).__name__}")
            parsed.too_complex = True
    try:
        return BytesParser(policy=PARSE_POLICY).parsebytes(raw, headersonly=True), []
    except Exception as exc:
        add_defect(parsed.defects, f"HeadersUnparseable:{type(exc).__name__}")
        return None, []


def _message_text(walk: WalkState, inner: Message) -> bool:
    """The body text of an attached message, appended to the walk's text; True if it had any."""
    sub = WalkState([])
    try:
        walk_message(sub, inner, 1, "body", ())
    except Exception:
        return False
    for text, source in zip(sub.text, sub.text_sources, strict=True):
        append_text(walk, text, source)
    walk.truncated = walk.truncated or sub.truncated
    return bool(sub.text)


def parse_message(raw: bytes, *, loop_header: str = DEFAULT_LOOP_HEADER) -> ParsedMessage:
    """Parse an RFC 5322 message. Never raises; see the module docstring for what is filled in."""
    parsed = ParsedMessage(loop_header=loop_header)
    try:
        if not isinstance(raw, bytes):
            raw = bytes(raw)
    except Exception:
        add_defect(parsed.defects, "NotBytes")
        return parsed
    try:
        return _parse_message(raw, parsed, shortcut=True)
    except _ShortcutRefused:
        return _parse_message(raw, ParsedMessage(loop_header=loop_header), shortcut=False)


def _parse_message(raw: bytes, parsed: ParsedMessage, *, shortcut: bool) -> ParsedMessage:
    loop_header = parsed.loop_header
    parsed.size = len(raw)
    parsed.raw_sha256 = hashlib.sha256(raw).hexdigest()
    message, spooled = _parse(raw, parsed, shortcut)
    if message is None:
        return parsed
    parsed._message = message
    for defect in getattr(message, "defects", ())[:20]:
        add_defect(parsed.defects, type(defect).__name__)
    try:
        fill_headers(parsed, message, loop_header or DEFAULT_LOOP_HEADER)
    except Exception as exc:
        add_defect(parsed.defects, f"HeaderError:{type(exc).__name__}")
    try:
        parsed.content_type = message.get_content_type()
        report_type = message.get_param("report-type") if parsed.content_type == "multipart/report" else None
        if isinstance(report_type, tuple):
            report_type = report_type[2]
        parsed.report_type = decode_header_value(str(report_type or ""), 100).lower()
    except Exception as exc:
        add_defect(parsed.defects, f"ContentTypeError:{type(exc).__name__}")
    walk = WalkState(parsed.defects)
    walk.root = message
    walk.reparse = not parsed.too_complex
    try:
        walk_message(walk, message, 0, "body", ())
    except Exception as exc:  # RecursionError, or a part the email package chokes on
        add_defect(parsed.defects, f"WalkError:{type(exc).__name__}")
        walk.too_complex = True
    if spooled:
        listed = {id(part) for _, _, part in walk.attachments}
        if any(id(part) not in listed for part in spooled):
            raise _ShortcutRefused  # a spooled part the walk read some other way than as a file
    parsed.too_complex = parsed.too_complex or walk.too_complex
    if not walk.text:
        # Some clients send the body as "inline; filename=msg.txt": with nothing else, that is the body.
        for part, ctype in walk.fallback_text:
            try:
                if add_text(walk, part, ctype):
                    break
            except Exception:
                pass
    if not walk.text:
        # A forwarded news article (message/news) or a reassembled message/partial as the only content.
        for inner in walk.message_bodies[:10]:
            if _message_text(walk, inner):
                break
    if not walk.text:
        # Outlook's rich text mail can have its only body inside winmail.dat.
        for body, source in walk.tnef_bodies:
            if append_text(walk, body, source):
                break
    text = "\n\n".join(walk.text)
    if len(text) > MAX_DESCRIPTION_CHARS:
        text = cut_at_boundary(text, MAX_DESCRIPTION_CHARS)
        walk.truncated = True
    parsed.text = text
    parsed.text_truncated = walk.truncated
    parsed.body_source = "+".join(dict.fromkeys(walk.text_sources))
    if (
        _INLINE_PGP_BEGIN in text[:200]
        and text.strip().startswith(_INLINE_PGP_BEGIN)
        and text.rstrip().endswith(_INLINE_PGP_END)
    ):
        walk.encrypted = walk.encrypted or "pgp"
    parsed.encrypted = walk.encrypted
    parsed.signatures = walk.signatures
    # Not a ParsedMessage field: a message that returns before this line has no such attribute at all.
    parsed.smime_certs_only = walk.smime_certs_only
    parsed.alternatives = walk.alternatives
    walk.attachments.sort(key=lambda item: item[0])
    attachments = [attachment for _, attachment, _ in walk.attachments]
    try:
        attachments = unique_names(attachments)
    except Exception as exc:  # names stay as they were
        add_defect(parsed.defects, f"NamingError:{type(exc).__name__}")
    parsed.attachments = attachments
    parsed._attachment_parts = [part for _, _, part in walk.attachments]
    return parsed

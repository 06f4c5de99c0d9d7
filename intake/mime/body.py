"""The body text: text parts decoded or converted, cut at a paragraph boundary, and which
alternative of multipart/alternative is read (`intake.mime.alternatives`)."""

from __future__ import annotations

import re
from itertools import islice
from typing import TYPE_CHECKING, cast

from . import alternatives
from .headers import decode_bytes
from .htmltext import html_to_text
from .limits import MAX_PARTS
from .message import add_defect
from .messageparts import without_delimiter_lines
from .parts import part_content_type, text_charset
from .richtext import enriched_to_text, richtext_to_text
from .texttrim import cut_at_boundary

if TYPE_CHECKING:
    from email.message import Message

    from .message import ParsedMessage
    from .walk import WalkState

MAX_DESCRIPTION_CHARS = 1 << 20  # characters; longer text is cut at a paragraph boundary
MAX_HTML_BYTES = 4 * 1024 * 1024
MAX_TEXT_BYTES = MAX_DESCRIPTION_CHARS * 4  # of one plain text part
# C0 controls and DEL, dropped (tab, newline and carriage return kept): PostgreSQL refuses NUL.
_BODY_CONTROL = dict.fromkeys([*range(0, 9), 11, 12, *range(14, 32), 127], None)
_CRLF = re.compile(r"\r\n?")
# The old rich text body types, converted to plain text (NeXTMail, Eudora, old Mac clients).
_RICH_TEXT = {"text/enriched": enriched_to_text, "text/richtext": richtext_to_text}


def _decoded(walk: WalkState, part: Message, limit: int) -> tuple[str, bool]:
    """A text part's payload as text, at most `limit` bytes of it; and whether it was cut."""
    data = part.get_payload(decode=True)
    if not isinstance(data, bytes) or not data:
        return "", False
    cut = len(data) > limit
    if cut:
        end = limit
        while end > limit - 3 and data[end] & 0xC0 == 0x80:  # not inside a UTF-8 sequence
            end -= 1
        data = data[:end]
    return decode_bytes(data, text_charset(part), walk.defects), cut


def _html_text(walk: WalkState, part: Message, source: tuple[str, bool] | None = None) -> tuple[str, bool]:
    """Readable text of an HTML part, converted once; and whether it was cut."""
    key = id(part)
    if key not in walk.html_text:
        html, cut = source if source is not None else _decoded(walk, part, MAX_HTML_BYTES)
        # A little over the limit, so that a cut can be seen and made again at a paragraph boundary.
        text = html_to_text(html, max_chars=MAX_DESCRIPTION_CHARS + 1024, max_input_chars=MAX_HTML_BYTES)
        walk.html_text[key] = (text, cut or len(text) > MAX_DESCRIPTION_CHARS)
    return walk.html_text[key]


def append_text(walk: WalkState, text: str, source: str, cut: bool = False) -> bool:
    if cut:  # the input ended mid-way: end at the last paragraph boundary instead
        text = cut_at_boundary(text, min(len(text), MAX_DESCRIPTION_CHARS))
        walk.truncated = True
    text = text.strip("\n")
    if not text.strip():
        return False
    walk.text.append(text)
    walk.text_sources.append(source)
    walk.text_chars += len(text)
    return True


def add_text(walk: WalkState, part: Message, ctype: str) -> bool:
    """Append the readable text of a body part; True if it had any."""
    if walk.text_chars >= MAX_DESCRIPTION_CHARS:
        walk.truncated = True  # the description is full: this part is left out
        return True
    try:
        if ctype == "text/html":
            text, cut = _html_text(walk, part)
            source = "html"
        else:
            text, cut = _decoded(walk, part, MAX_TEXT_BYTES)
            text = _CRLF.sub("\n", text).translate(_BODY_CONTROL)
            if ctype in _RICH_TEXT:
                text = _RICH_TEXT[ctype](text)
            source = "plain"
        if walk.multiparts and "--" in text:  # delimiter lines a malformed multipart left in the text
            text = without_delimiter_lines(text, [b for b in (m.get_boundary() for m in walk.multiparts) if b])
    except Exception as exc:
        add_defect(walk.defects, f"UndecodablePart:{type(exc).__name__}")
        return False
    return append_text(walk, text, source, cut)


def drop_text(walk: WalkState, start: int) -> None:
    walk.text_chars -= sum(len(text) for text in walk.text[start:])
    del walk.text[start:], walk.text_sources[start:]


def alternative_rank(ctype: str) -> int:
    if ctype == "text/plain":
        return 0
    if ctype.startswith("multipart/"):
        return 1
    if ctype == "text/html":
        return 2
    if ctype in _RICH_TEXT:
        return 3
    return 4


def _html_leaf(part: Message, depth: int = 0) -> Message | None:
    """The HTML body part an alternative shows: itself, or the first inside it (multipart/related); or None."""
    if part.is_multipart():
        if depth >= 3 or part.get_content_maintype() == "message":
            return None
        for child in cast("list[Message]", part.get_payload())[:10]:  # a multipart's parts
            leaf = _html_leaf(child, depth + 1)
            if leaf is not None:
                return leaf
        return None
    if (
        part_content_type(part) == "text/html"
        and part.get_content_disposition() != "attachment"
        and not part.get_filename()
    ):
        return part
    return None


def html_instead_of_stub(
    walk: WalkState,
    children: list[Message],
    ranked: list[tuple[int, int]],
    chosen: int,
    start: int,
    chars: dict[int, int],
) -> int | None:
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


def alternative_texts(parsed: ParsedMessage, max_chars: int = 200_000) -> list[tuple[str, str]]:
    """(content type, readable text) of each text alternative of the message's first
    multipart/alternative: for operators, who may need what the sender wrote in the one the
    ticket did not get (a plain part that lost to the HTML as a stub, or the reverse)."""
    message = getattr(parsed, "_message", None)
    if message is None:
        return []
    try:
        for part in islice(message.walk(), MAX_PARTS):
            if part.get_content_type() != "multipart/alternative":
                continue
            texts = []
            for child in part.get_payload()[:10]:
                leaf = _html_leaf(child) if child.is_multipart() else child
                ctype = part_content_type(leaf) if leaf is not None else ""
                if ctype not in ("text/plain", "text/html"):
                    continue
                leaf = cast("Message", leaf)  # not None: its type was read just above
                if leaf.get_content_disposition() == "attachment":
                    continue
                data = leaf.get_payload(decode=True)
                if not isinstance(data, bytes):
                    continue
                text = decode_bytes(data[:MAX_HTML_BYTES], text_charset(leaf), [])
                if ctype == "text/html":
                    text = html_to_text(text, max_chars=max_chars)
                texts.append((ctype, _CRLF.sub("\n", text).translate(_BODY_CONTROL)[:max_chars]))
            return texts
    except Exception:  # an operator's view: a part we cannot read is left out, never an error page
        return []
    return []

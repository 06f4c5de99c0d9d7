"""The rarer message/* parts and broken multipart delimiters.

- message/partial (RFC 2046 5.2.2): a message split into numbered pieces. When every piece is in
  the mail, `reassembled` gives the original entity back (the first piece's enclosed header and
  body, then the bodies of the others, in order); otherwise each piece is listed as a file.
- Delimiter lines: when a multipart's delimiters are malformed ("--b-", junk after "--b") the
  email package leaves them in a part's text; `without_delimiter_lines` takes them out again, and
  `found_boundary` finds the boundary a multipart really uses when the declared one never shows.
"""

from __future__ import annotations

import io
import re
from email.generator import BytesGenerator
from itertools import islice
from typing import TYPE_CHECKING, cast

from .headers import content_type_param
from .policy import GENERATE_POLICY

if TYPE_CHECKING:
    from email.message import Message

MAX_PARTIAL_PIECES = 100
MAX_BOUNDARY_CHARS = 70
_DELIMITER = re.compile(rb"^--([^\s]{1,70}?)(?:--)?[ \t]*\r?$", re.M)
_HEADER_LINE = re.compile(rb"[!-9;-~]+[ \t]*:")


def partial_info(part: Message) -> tuple[str, int, int]:
    """(id, number, total) of a message/partial part; number or total 0 when missing or not a number."""

    def parameter(name: str) -> str:
        return content_type_param(part, name)[:998]

    def number(name: str) -> int:
        text = parameter(name)
        return int(text) if text.isdigit() and len(text) <= 4 else 0

    return parameter("id"), number("number"), number("total")


def partial_groups(root: Message, max_parts: int) -> dict[str, dict[int, Message]]:
    """Every message/partial piece in the message, by id and then number."""
    groups: dict[str, dict[int, Message]] = {}
    for part in islice(root.walk(), max_parts):
        if part.get_content_type() != "message/partial":
            continue
        pid, number, _total = partial_info(part)
        if pid and number:
            groups.setdefault(pid, {}).setdefault(number, part)
    return groups


def is_complete(pieces: dict[int, Message], total: int) -> bool:
    return 0 < total <= MAX_PARTIAL_PIECES and all(number in pieces for number in range(1, total + 1))


def _fragment(part: Message, first: bool) -> bytes:
    inner = part.get_payload()
    if not isinstance(inner, list) or not inner:
        data = part.get_payload(decode=True)
        return data if isinstance(data, bytes) else b""
    message = cast("Message", inner[0])  # a piece's payload: the message it encloses
    if not first and not message.keys():  # a piece of body: no header of its own
        payload = message.get_payload()
        if isinstance(payload, str):
            return payload.encode("utf-8", "surrogateescape")
    buffer = io.BytesIO()
    BytesGenerator(buffer, mangle_from_=False, policy=GENERATE_POLICY).flatten(message)
    return buffer.getvalue()


def reassembled(pieces: dict[int, Message], total: int) -> bytes:
    """The entity the pieces 1..`total` were cut from (its header is the first piece's enclosed one)."""
    return b"".join(_fragment(pieces[number], number == 1) for number in range(1, total + 1))


def without_delimiter_lines(text: str, boundaries: list[str]) -> str:
    """`text` without lines that are a delimiter of an enclosing multipart (malformed ones included)."""
    for boundary in boundaries:
        marker = "--" + boundary
        if marker not in text:
            continue
        kept = []
        for line in text.split("\n"):
            stripped = line.strip()
            rest = stripped[len(marker) :] if stripped.startswith(marker) else None
            # A long boundary is never text; a short one only with nothing but dashes after it.
            if rest is not None and (len(boundary) >= 8 or not rest.strip("-")):
                continue
            kept.append(line)
        text = "\n".join(kept)
    return text


def found_boundary(body: bytes) -> str | None:
    """The boundary a multipart body really uses: the first "--x" line followed by a header line."""
    for match in islice(_DELIMITER.finditer(body), 20):
        rest = body[match.end() :].lstrip(b"\r\n")
        if _HEADER_LINE.match(rest):
            try:
                return match.group(1).decode("ascii")
            except UnicodeDecodeError:
                return None
    return None

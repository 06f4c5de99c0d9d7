"""Lenient reading of a message's header block, as mail clients read it.

    repair_header_block(raw: bytes) -> bytes

The email package ends the header block at the first line that is neither a
header nor an indented continuation: every header after a stray line lands in
the body, and a From or Subject written there is lost. Real mail has such
lines: junk before the first header (an mbox "From " line, a client's
preamble), a To/Cc list or a Subject that wraps without indentation, an
encoded word alone on a line, a stray line in the middle, obsolete
`Subject : x` with whitespace before the colon. This module rewrites the
header block so that the parser reads it as the clients do:

- a UTF-8 byte-order mark and whitespace before the first header are dropped
  (a BOM glued to "From:" would otherwise make that line junk, and the sender lost);
- lines before the first header are dropped;
- `Name<whitespace>:` becomes `Name:`;
- a "loose" line (neither header nor indented) is a continuation of the
  previous header, and is indented so that the parser joins it, when
    * it begins with an encoded word ("=?"), or
    * the previous header is Subject (text wraps anywhere), or
    * the previous header holds addresses (From, To, Cc, Bcc, Reply-To, Sender,
      Resent-*, ...) and the line holds an "@" or that header's last line ended
      with "," or ";", or
    * the previous header is References/In-Reply-To and the line holds "<" or "@", or
    * the previous header is Content-Type/Content-Disposition and the line holds
      "=" or that header's last line ended with ";";
  any other loose line is a stray line and is dropped (the headers after it still count);
- all of that only where headers follow the loose lines (at most
  `MAX_LOOSE_LINES` of them in a row, not counting lines of an address list,
  "x@y.z,"). Loose lines that end the block (no header
  after them before the blank line) are the start of a body whose blank line is
  missing, as the parser reads them today, except for continuations that cannot
  be body text: an encoded word, or the next line of an address or parameter list
  whose last line ended with "," or ";".

Bounded: only the first `MAX_HEADER_BLOCK` bytes are examined; the rest of the
message is kept as it is. A clean header block (the hot path) is recognised by
one regular-expression match, and then `raw` itself is returned, not a copy.
"""

from __future__ import annotations

import re
from typing import cast

MAX_HEADER_BLOCK = 256 * 1024
MAX_LOOSE_LINES = 16

# Headers, folded continuations, an optional mbox "From " line first (the parser handles that one),
# up to a blank line or the end: what the email package reads exactly as written.
_CLEAN_BLOCK = re.compile(
    rb"(?:From [^\r\n]*(?:\r\n|\r|\n))?"
    rb"(?:[!-9;-~]+:[^\r\n]*(?:\r\n|\r|\n|\Z)(?:[ \t][^\r\n]*(?:\r\n|\r|\n|\Z))*)*"
)
_LINE = re.compile(rb"([^\r\n]*)(\r\n|\r|\n|\Z)")
_HEADER_NAME = re.compile(rb"([!-9;-~]+)([ \t]*):")

_ADDRESS_HEADERS = frozenset(
    {
        b"from",
        b"to",
        b"cc",
        b"bcc",
        b"reply-to",
        b"sender",
        b"resent-from",
        b"resent-to",
        b"resent-cc",
        b"resent-bcc",
        b"resent-sender",
        b"resent-reply-to",
        b"mail-followup-to",
        b"mail-reply-to",
        b"disposition-notification-to",
        b"return-receipt-to",
        b"errors-to",
        b"delivered-to",
        b"x-original-to",
        b"envelope-to",
        b"apparently-to",
    }
)
_ID_HEADERS = frozenset({b"references", b"in-reply-to"})
PARAMETER_HEADERS = frozenset({b"content-type", b"content-disposition"})
_LIST_ENDINGS = (b",", b";")

_HEADER, _FOLD, _LOOSE, _ENVELOPE = range(4)
_BOM = b"\xef\xbb\xbf"
_JUNK_START = frozenset((b"\xef", b" ", b"\t", b"\r", b"\n"))
_LEADING_JUNK = re.compile(rb"(?:\xef\xbb\xbf|[ \t\r\n])*")


def repair_header_block(raw: bytes) -> bytes:
    """`raw` with its header block rewritten as mail clients read it; `raw` itself when it is clean."""
    if raw[:1] in _JUNK_START:
        raw = _without_leading_junk(raw)
    clean = cast("re.Match[bytes]", _CLEAN_BLOCK.match(raw, 0, MAX_HEADER_BLOCK))  # matches "" too: never None
    end = clean.end()
    if end >= len(raw) or end >= MAX_HEADER_BLOCK or raw[end] in b"\r\n":
        return raw
    return _repair(raw)


def _without_leading_junk(raw: bytes) -> bytes:
    """`raw` without the byte-order marks and whitespace before its first header (Windows scripts and
    PowerShell write a UTF-8 BOM first); as it is when no header follows them."""
    junk = cast("re.Match[bytes]", _LEADING_JUNK.match(raw, 0, MAX_HEADER_BLOCK))  # matches "" too: never None
    rest = junk.end()
    if rest and _HEADER_NAME.match(raw, rest) and (raw[rest - 1] in b"\r\n" or raw[:3] == _BOM):
        return raw[rest:]
    return raw


def _continues(previous: bytes, content: bytes, last: bytes, inside: bool) -> bool:
    """Whether a loose line continues the header `previous` (whose last line was `last`)."""
    if content.startswith(b"=?"):
        return True
    list_goes_on = last.rstrip().endswith(_LIST_ENDINGS)
    if previous in _ADDRESS_HEADERS:
        return list_goes_on or (inside and b"@" in content)
    if previous in PARAMETER_HEADERS:
        return list_goes_on or (inside and b"=" in content)
    if not inside:
        return False
    if previous == b"subject":
        return True
    if previous in _ID_HEADERS:
        return b"<" in content or b"@" in content
    return False


def _lines(raw: bytes) -> tuple[list[tuple[int, bytes, bytes, int, int]], int]:
    """The header block's lines (kind, name, content, start, end) and where the block ends.

    Stops at the blank line, at `MAX_HEADER_BLOCK`, or after more than
    `MAX_LOOSE_LINES` loose lines in a row (a body whose blank line is missing).
    """
    lines = []
    limit = min(len(raw), MAX_HEADER_BLOCK)
    end = 0
    loose = 0
    for match in _LINE.finditer(raw, 0, limit):
        content, ending = match.group(1), match.group(2)
        if not content:
            break  # the blank line, or the end
        if not ending and match.end() < len(raw):
            break  # cut by the limit: left as it is
        if ending == b"\r" and match.end() == limit < len(raw) and raw[limit] == 0x0A:
            break  # a CRLF cut in two by the limit
        header = _HEADER_NAME.match(content)
        if content[0] in b" \t":
            kind, name = _FOLD, b""
        elif header:
            kind, name = _HEADER, header.group(1).lower()
        elif content.startswith(b"From "):
            kind, name = _ENVELOPE, b""
        else:
            kind, name = _LOOSE, b""
        if kind not in (_LOOSE, _ENVELOPE):
            loose = 0
        elif not (b"@" in content and content.rstrip().endswith(_LIST_ENDINGS)):
            loose += 1  # an address list's line ("x@y.z,") is no body text
        if loose > MAX_LOOSE_LINES:
            break
        lines.append((kind, name, content, match.start(), match.end()))
        end = match.end()
    return lines, end


def _repair(raw: bytes) -> bytes:
    lines, block_end = _lines(raw)
    first = next((index for index, line in enumerate(lines) if line[0] == _HEADER), None)
    if first is None:
        return raw  # no header at all: a body, as the parser reads it
    out: list[bytes] = []
    changed = first > 0  # junk before the first header is dropped
    previous, last = b"", b""
    body_start = None
    index = first
    while index < len(lines) and body_start is None:
        kind, name, content, start, end = lines[index]
        if kind == _HEADER:
            header = cast("re.Match[bytes]", _HEADER_NAME.match(content))  # `_lines` made it a header by this match
            if header.group(2):  # obsolete "Subject : x"
                out.append(header.group(1) + b":" + raw[start + header.end() : end])
                changed = True
            else:
                out.append(raw[start:end])
            previous, last = name, content
            index += 1
            continue
        if kind == _FOLD:
            out.append(raw[start:end])
            last = content
            index += 1
            continue
        run_end = index
        while run_end < len(lines) and lines[run_end][0] in (_LOOSE, _ENVELOPE):
            run_end += 1
        inside = run_end < len(lines)  # a header or a fold follows: still the header block
        for kind, _, content, start, end in lines[index:run_end]:
            if kind == _LOOSE and _continues(previous, content, last, inside):
                out.append(b" " + raw[start:end])
                last = content
                changed = True
            elif inside:
                changed = True  # a stray line (or a misplaced "From "): dropped
            else:
                body_start = start  # the body, its blank line missing
                break
        index = run_end
    if not changed:
        return raw
    out.append(raw[block_end if body_start is None else body_start :])
    return b"".join(out)

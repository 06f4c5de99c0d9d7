"""Large base64 parts without copies: their encoded lines stay in the raw message, decoded on demand.

The email package would hold every part's payload as a str (as large as the encoded part), and decoding
it makes two more copies. So before parsing, `elide` replaces each long run of well-formed base64 lines
that follows a blank line (a part's body, in the usual case) with one token line, and parses that much
smaller text; the part whose payload is then exactly a token gets a `Run` (its place in the raw bytes).
`parse_message` keeps the shortcut only when every token ended up as the payload of a base64 leaf
that the walk listed as an attachment (not text, not inside an attached message); anything else is
parsed again the ordinary way, so results never depend on it.

A run decodes exactly as the email package decodes it: every line a whole number of base64 quads and
padding only at the very end, so dropping the line breaks and decoding is all there is to it. Decoding
reads memoryview slices of the raw bytes, a block of lines at a time (`blocks`), into a
`tempfile.SpooledTemporaryFile` (`spooled`: in memory up to a threshold, then a file in tempfile's
directory, gone once closed), or into one bytes object when a caller needs the whole (`whole`).
"""

from __future__ import annotations

import binascii
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

MIN_RUN_BYTES = 64 * 1024  # shorter bodies are parsed as usual: too small to matter
DEFAULT_SPOOL_THRESHOLD = 1 << 20
BLOCK_BYTES = 256 * 1024  # encoded bytes decoded at a time
TOKEN_PREFIX = "mailroom-spooled-part-"  # with a random nonce: no sender can guess a token
# A blank line, then lines of whole base64 quads; the last line may end in padding.
_BLANK = re.compile(rb"\n\r?\n")
# (Matched a few hundred lines at a time: one match over a whole run keeps state for every line.)
_LINES = re.compile(rb"(?:(?:[A-Za-z0-9+/]{4}){1,250}\r?\n){1,512}")
_PADDED_LINE = re.compile(rb"(?:[A-Za-z0-9+/]{4}){0,249}[A-Za-z0-9+/]{2}(?:==|[A-Za-z0-9+/]=)\r?\n")


@dataclass(frozen=True)
class Run:
    """Encoded lines `raw[start:end]` of one part."""

    raw: bytes
    start: int
    end: int

    @property
    def encoded_size(self) -> int:
        return self.end - self.start


def _run_end(raw: bytes, start: int) -> int:
    """Where the base64 lines from `start` end (`start` if there are none)."""
    end = start
    while found := _LINES.match(raw, end):
        end = found.end()
    found = _PADDED_LINE.match(raw, end)
    return found.end() if found else end


def elide(raw: bytes) -> tuple[bytes, dict[str, Run]]:
    """(`raw` with each long base64 run replaced by a token line, {token: run}); (`raw`, {}) when there is none."""
    runs: dict[str, Run] = {}
    pieces = []
    kept = 0
    nonce = os.urandom(8).hex().encode()
    position = 0
    while True:
        blank = _BLANK.search(raw, position)
        if blank is None:
            break
        start = blank.end()
        end = _run_end(raw, start)
        if end - start < MIN_RUN_BYTES:
            position = max(end - 1, start - 1)
            continue
        newline = b"\r\n" if raw[end - 2 : end] == b"\r\n" else b"\n"
        token = TOKEN_PREFIX.encode() + nonce + b"-" + str(len(runs)).encode()
        pieces += [raw[kept:start], token, newline]
        runs[token.decode()] = Run(raw, start, end)
        kept = position = end
    if not runs:
        return raw, {}
    pieces.append(raw[kept:])
    return b"".join(pieces), runs


def _spans(run: Run) -> Iterator[tuple[int, int]]:
    """Line-aligned slices of about `BLOCK_BYTES` (every line is whole quads, so each decodes on its own)."""
    position = run.start
    while position < run.end:
        cut = run.raw.find(b"\n", min(position + BLOCK_BYTES, run.end) - 1, run.end)
        cut = run.end if cut < 0 else cut + 1
        yield position, cut
        position = cut


def blocks(run: Run) -> Iterator[bytes]:
    """The decoded bytes, a block at a time."""
    view = memoryview(run.raw)
    try:
        for start, end in _spans(run):
            yield binascii.a2b_base64(view[start:end])
    finally:
        view.release()


def whole(run: Run) -> bytes:
    """The decoded bytes in one object (a2b_base64 skips the line breaks): the only copy made."""
    with memoryview(run.raw) as view:
        return binascii.a2b_base64(view[run.start : run.end])


@dataclass
class Digest:
    size: int
    sha256: str
    head: bytes


def digest(run: Run, head_bytes: int) -> Digest:
    """Size, sha256 and the first `head_bytes` of the decoded bytes, decoded a block at a time."""
    hasher, size, head = hashlib.sha256(), 0, bytearray()
    for block in blocks(run):
        hasher.update(block)
        size += len(block)
        if len(head) < head_bytes:
            head += block[: head_bytes - len(head)]
    return Digest(size, hasher.hexdigest(), bytes(head))


def spooled(run: Run, threshold: int = DEFAULT_SPOOL_THRESHOLD) -> tempfile.SpooledTemporaryFile[bytes]:
    """The decoded bytes in a spooled temporary file, rewound; the caller closes it (which deletes it)."""
    spool = tempfile.SpooledTemporaryFile(max_size=threshold, prefix="mailroom-part-")
    try:
        for block in blocks(run):
            spool.write(block)
        spool.seek(0)
    except BaseException:
        spool.close()
        raise
    return spool

"""Outlook's TNEF container (winmail.dat): the files and the body inside it.

    unpack(data) -> Unpacked | None      # None: not TNEF that can be read safely, or nothing in it

Outlook wraps a message's attachments (and an RTF or HTML copy of its body)
in one `application/ms-tnef` part when it sends "rich text" mail; other mail
programs show only a useless winmail.dat. `intake.mime` lists the files inside
instead (each goes through the attachment policy and the scanner), and uses
the body inside when the message has no other body text.

The format is read by `tnefparse`, after a structural check of our own,
because that library was not written for hostile input: a property count of
2^32 in a MAPI block makes it loop 2^32 times, and it copies the rest of the
stream for every attribute it reads (quadratic in the number of attributes).
`_Check` walks the same structure first and refuses a stream with more than
`MAX_ATTRIBUTES` attributes, more than `MAX_MEMBERS` attachments, counts that
cannot fit in the bytes present, embedded messages nested deeper than
`MAX_EMBEDDING`, or more than `MAX_COPY_BYTES` of that copying. Whatever
`tnefparse` still raises on means "could not be unpacked"; never an exception.

Body: the plain body, else the HTML body (`intake.mime.htmltext`), else the RTF
body, decompressed here (MS-OXRTFCP, "LZFu") and stripped of RTF markup
crudely: control words, font/colour/style tables and `{\\*...}` destinations
dropped, `\\par` as a line break, `\\'hh` and `\\uN` decoded.
"""

from __future__ import annotations

import logging
import re
import struct
from dataclasses import dataclass, field
from typing import Any

from .htmltext import html_to_text

# tnefparse logs an INFO line for every stream it reads and ERROR lines for broken MAPI blocks: input that
# this module judges itself (a winmail.dat that cannot be unpacked is listed for a person), not our errors.
logging.getLogger("tnefparse").setLevel(logging.CRITICAL)

MAX_ATTRIBUTES = 5000
MAX_MEMBERS = 200
MAX_EMBEDDING = 4
MAX_COPY_BYTES = 1 << 30
MAX_BODY_CHARS = 1 << 20
MAX_RTF_BYTES = 8 << 20

TNEF_SIGNATURE = 0x223E9F78
_IMESSAGE_SIG = b"\x07\x03\x02\x00\x00\x00\x00\x00\xc0\x00\x00\x00\x00\x00\x00\x46"
_ATT_RENDDATA, _ATT_MAPIPROPS, _ATT_RECIPTABLE, _ATT_ATTACHMENT = 0x9002, 0x9003, 0x9004, 0x9005
_PR_ATTACH_DATA_OBJ, _PR_ATTACH_MIME_TAG = 0x3701, 0x370E
_FIXED_SIZES = {
    0x0002: 2,
    0x0003: 4,
    0x0004: 4,
    0x000A: 4,
    0x000B: 2,
    0x0005: 8,
    0x0006: 8,
    0x0007: 8,
    0x0014: 8,
    0x0040: 8,
    0x0048: 16,
}
_VARIABLE_TYPES = frozenset({0x0000, 0x000D, 0x001E, 0x001F, 0x0102})
_uint16 = struct.Struct("<H").unpack_from
_uint32 = struct.Struct("<I").unpack_from


@dataclass
class Member:
    name: str  # long file name, else the 8.3 name; "" if none
    mime_type: str  # what Outlook recorded (PR_ATTACH_MIME_TAG), lowercase; "" if none
    data: bytes


@dataclass
class Unpacked:
    members: list[Member] = field(default_factory=list)
    body: str = ""  # readable text of the body inside, "" if none
    body_source: str = ""  # "plain", "html" or "rtf"


class _Refused(Exception):
    pass


class _Check:
    """Walks a TNEF stream the way tnefparse will, refusing what would make it slow or huge."""

    def __init__(self) -> None:
        self.attributes = 0
        self.copied = 0

    def stream(self, data: bytes, depth: int = 0) -> int:
        """Number of attachments in the stream."""
        if depth > MAX_EMBEDDING or len(data) < 6 or _uint32(data, 0)[0] != TNEF_SIGNATURE:
            raise _Refused
        members, offset, size = 0, 6, len(data)
        while offset + 12 < size:  # tnefparse's loop condition
            name = _uint16(data, offset + 1)[0]
            length = min(size - offset, _uint32(data, offset + 5)[0] + 11)
            self.attributes += 1
            self.copied += size - offset  # tnefparse slices the rest of the stream for each attribute
            if self.attributes > MAX_ATTRIBUTES or self.copied > MAX_COPY_BYTES:
                raise _Refused
            block = data[offset + 9 : offset + length - 2]
            if name == _ATT_RENDDATA:
                members += 1
                if members > MAX_MEMBERS:
                    raise _Refused
            elif name in (_ATT_MAPIPROPS, _ATT_ATTACHMENT):
                self.properties(block, 0, depth)
            elif name == _ATT_RECIPTABLE and len(block) >= 4:
                rows, position = _uint32(block, 0)[0], 4
                if rows > len(block) // 4:
                    raise _Refused
                for _ in range(rows):
                    position = self.properties(block, position, depth)
            offset += length
        return members

    def properties(self, block: bytes, offset: int, depth: int) -> int:
        """Check one MAPI property list at `offset`; where it ends."""
        size = len(block)
        if offset + 4 > size:
            return size  # tnefparse fails on it, which is a refusal too
        count = _uint32(block, offset)[0]
        offset += 4
        if count > (size - offset) // 4 + 1:
            raise _Refused
        try:
            for _ in range(count):
                if offset >= size:
                    break
                kind, name = _uint16(block, offset)[0], _uint16(block, offset + 2)[0]
                offset += 4
                if name >= 0x8000:  # a named property: GUID, kind, then an id or a name
                    offset += 16
                    named = _uint32(block, offset)[0]
                    offset += 4
                    offset += 4 if named == 0 else 4 + _padded(_uint32(block, offset)[0])
                values = None
                if kind & 0x1000:
                    kind ^= 0x1000
                    values = _uint32(block, offset)[0]
                    offset += 4
                if kind in _FIXED_SIZES:
                    if values and values * _FIXED_SIZES[kind] > size - offset:
                        raise _Refused
                    offset += _FIXED_SIZES[kind] * (values or 1)
                    if (values or 1) % 2 and kind in (0x0002, 0x000B):
                        offset += 2
                elif kind in _VARIABLE_TYPES:
                    for _ in range(values or 1):
                        items = 1
                        if not values:  # single-valued: a count of items first
                            items = _uint32(block, offset)[0]
                            offset += 4
                        for _ in range(items):
                            length = _uint32(block, offset)[0]
                            offset += 4
                            if name == _PR_ATTACH_DATA_OBJ and block[offset : offset + 16] == _IMESSAGE_SIG:
                                embedded = block[offset : offset + _padded(length)].rstrip(b"\x00")
                                self.stream(embedded[16:], depth + 1)
                            offset += _padded(length)
                else:
                    return size  # tnefparse stops at an unknown type
        except struct.error:
            return size  # ran past the end: tnefparse stops there too
        return offset


def _padded(length: int) -> int:
    return length + (-length % 4)


def _text(value: object, codepage: str | None) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, (bytes, bytearray)):
        return ""
    for encoding in (codepage, "utf-8", "cp1252"):
        if encoding:
            try:
                return bytes(value).decode(encoding)
            except (LookupError, UnicodeDecodeError):
                continue
    return bytes(value).decode("latin-1")


def _member(attachment: Any, codepage: str | None) -> Member:  # a tnefparse TNEFAttachment (untyped)
    try:
        name = _text(attachment.long_filename(), codepage)
    except Exception:  # the 8.3 name is decoded as UTF-8 by tnefparse, and Outlook writes it in the codepage
        name = _text(getattr(attachment, "_name", b""), codepage)
    mime_type = ""
    for prop in getattr(attachment, "mapi_attrs", ()):
        if prop.name == _PR_ATTACH_MIME_TAG:
            try:
                mime_type = _text(prop.data, codepage).strip("\x00 ").lower()[:200]
            except Exception:
                pass
    data = attachment.data
    return Member(name=name.strip("\x00"), mime_type=mime_type, data=bytes(data) if data else b"")


def unpack(data: bytes) -> Unpacked | None:
    """The attachments and body of a TNEF stream; None if it is not one, or not one that can be read safely."""
    try:
        _Check().stream(data)
        from tnefparse.tnef import TNEF

        tnef = TNEF(bytes(data), do_checksum=False)
        codepage = tnef.codepage
        members = [_member(attachment, codepage) for attachment in tnef.attachments]
    except Exception:  # _Refused, or anything tnefparse raises on a broken stream
        return None
    # tnefparse reads leniently: a stray attachment attribute gives a member with neither name nor bytes.
    unpacked = Unpacked(members=[member for member in members if member.name or member.data])
    try:
        _fill_body(unpacked, tnef, codepage)
    except Exception:  # a body that cannot be read leaves the files
        pass
    if not unpacked.members and not unpacked.body:
        return None  # nothing usable came out of it: what it holds is unknown
    return unpacked


def _fill_body(unpacked: Unpacked, tnef: Any, codepage: str | None) -> None:  # a tnefparse TNEF (untyped)
    plain = _text(tnef.body, codepage).replace("\r\n", "\n").strip("\x00").strip()
    if plain:
        unpacked.body, unpacked.body_source = plain[:MAX_BODY_CHARS], "plain"
        return
    html = _text(tnef.htmlbody, codepage)
    if html.strip():
        text = html_to_text(html, max_chars=MAX_BODY_CHARS)
        if text:
            unpacked.body, unpacked.body_source = text, "html"
            return
    # tnefparse only decompresses RTF with the optional compressed_rtf package; it keeps the raw bytes here.
    compressed = getattr(tnef, "_rtfbody", None)
    if compressed:
        text = rtf_to_text(decompress_rtf(bytes(compressed)))
        if text:
            unpacked.body, unpacked.body_source = text[:MAX_BODY_CHARS], "rtf"


# -- compressed RTF (MS-OXRTFCP) ---------------------------------------------------------------------

_RTF_DICTIONARY = (
    b"{\\rtf1\\ansi\\mac\\deff0\\deftab720{\\fonttbl;}{\\f0\\fnil \\froman \\fswiss \\fmodern "
    b"\\fscript \\fdecor MS Sans SerifSymbolArialTimes New RomanCourier{\\colortbl\\red0\\green0"
    b"\\blue0\r\n\\par \\pard\\plain\\f0\\fs20\\b\\i\\u\\tab\\tx"
)
_LZFU, _MELA = 0x75465A4C, 0x414C454D


def decompress_rtf(data: bytes, limit: int = MAX_RTF_BYTES) -> bytes:
    """RTF from PR_RTF_COMPRESSED ("LZFu" compressed or "MELA" stored); b"" if it is neither."""
    if len(data) < 16:
        return b""
    raw_size, kind = _uint32(data, 4)[0], _uint32(data, 8)[0]
    if kind == _MELA:
        return data[16 : 16 + min(raw_size, limit)]
    if kind != _LZFU:
        return b""
    window = bytearray(4096)
    window[: len(_RTF_DICTIONARY)] = _RTF_DICTIONARY
    write = len(_RTF_DICTIONARY)
    out = bytearray()
    position, end, cap = 16, len(data), min(raw_size, limit)
    while position < end and len(out) < cap:
        control = data[position]
        position += 1
        for bit in range(8):
            if position >= end or len(out) >= cap:
                break
            if not control & (1 << bit):
                byte = data[position]
                position += 1
                out.append(byte)
                window[write] = byte
                write = (write + 1) & 0xFFF
                continue
            if position + 1 >= end:
                return bytes(out)
            reference = (data[position] << 8) | data[position + 1]
            position += 2
            offset, length = reference >> 4, (reference & 0xF) + 2
            if offset == write:  # the end marker
                return bytes(out)
            for step in range(length):
                byte = window[(offset + step) & 0xFFF]
                out.append(byte)
                window[write] = byte
                write = (write + 1) & 0xFFF
    return bytes(out[:cap])


# -- RTF to text, crudely ---------------------------------------------------------------------------

_RTF_TOKEN = re.compile(
    rb"\\([a-zA-Z]{1,32})(-?\d{1,10})? ?|\\'([0-9a-fA-F]{2})|\\(.)|([{}])|[\r\n]+|([^\\{}\r\n]+)", re.DOTALL
)
# Groups that are not text: tables, metadata, pictures, objects, page furniture.
_RTF_SKIPPED = frozenset(
    {
        b"fonttbl",
        b"colortbl",
        b"stylesheet",
        b"info",
        b"pict",
        b"object",
        b"header",
        b"footer",
        b"headerl",
        b"headerr",
        b"footerl",
        b"footerr",
        b"themedata",
        b"colorschememapping",
        b"latentstyles",
        b"datastore",
        b"xmlnstbl",
        b"listtable",
        b"listoverridetable",
        b"rsidtbl",
        b"generator",
        b"filetbl",
        b"revtbl",
        b"pgdsctbl",
        b"fldinst",
        b"mmathPr",
        b"listtext",
        b"pntext",
    }
)
_RTF_BREAKS = {
    b"par": "\n",
    b"line": "\n",
    b"sect": "\n\n",
    b"page": "\n\n",
    b"row": "\n",
    b"tab": "\t",
    b"cell": " ",
    b"emdash": "\u2014",
    b"endash": "\u2013",
    b"bullet": "\u2022",
    b"lquote": "\u2018",
    b"rquote": "\u2019",
    b"ldblquote": "\u201c",
    b"rdblquote": "\u201d",
}


def rtf_to_text(rtf: bytes, max_chars: int = MAX_BODY_CHARS) -> str:
    """Readable text of an RTF document, crudely (see the module docstring); never raises."""
    try:
        return _rtf_to_text(rtf, max_chars)
    except Exception:
        return ""


def _rtf_to_text(rtf: bytes, max_chars: int) -> str:
    out: list[str] = []
    pending = bytearray()  # \'hh bytes, decoded together (multi-byte code pages)
    codepage = "cp1252"
    depth, skip_from = 0, None  # inside a skipped group while depth >= skip_from
    group_start = False
    html_rtf = False  # \htmlrtf ... \htmlrtf0: RTF-only copies in HTML-derived RTF
    unicode_skip, to_skip = 1, 0
    length = 0

    def flush() -> None:
        nonlocal length
        if pending:
            text = bytes(pending).decode(codepage, "replace")
            out.append(text)
            length += len(text)
            pending.clear()

    for match in _RTF_TOKEN.finditer(rtf):
        if length >= max_chars:
            break
        word, argument, hex_byte, symbol, brace, text = match.groups()
        starts_group, group_start = group_start, False
        if brace is not None:
            flush()
            if brace == b"{":
                depth += 1
                group_start = True
            else:
                if skip_from is not None and depth <= skip_from:
                    skip_from = None
                depth -= 1
            to_skip = 0
            continue
        if skip_from is not None:
            continue
        if to_skip and (text is not None or hex_byte is not None):
            if text is not None and len(text) > to_skip:
                text, to_skip = text[to_skip:], 0
            else:
                to_skip -= 1 if hex_byte is not None else len(text)
                continue
        if symbol == b"*" and starts_group:
            skip_from = depth
            group_start = False
            continue
        if word is not None:
            if starts_group and word in _RTF_SKIPPED:
                skip_from = depth
                continue
            if word == b"htmlrtf":
                html_rtf = argument != b"0"
            elif word == b"ansicpg" and argument:
                codepage = f"cp{int(argument)}" if _known_codec(f"cp{int(argument)}") else codepage
            elif word == b"uc" and argument:
                unicode_skip = max(0, min(int(argument), 8))
            elif html_rtf:
                pass
            elif word == b"u" and argument:
                flush()
                out.append(chr(int(argument) % 65536 if int(argument) < 0 else min(int(argument), 0x10FFFF)))
                length += 1
                to_skip = unicode_skip
            elif word in _RTF_BREAKS:
                flush()
                out.append(_RTF_BREAKS[word])
                length += 1
            continue
        if html_rtf:
            continue
        if hex_byte is not None:
            pending.append(int(hex_byte, 16))
            continue
        flush()
        if symbol is not None:
            piece = {b"~": "\u00a0", b"_": "-", b"\\": "\\", b"{": "{", b"}": "}", b"\n": "\n", b"\r": "\n"}.get(symbol)
            if piece:
                out.append(piece)
                length += 1
        elif text is not None:
            piece = text.decode(codepage, "replace")
            out.append(piece)
            length += len(piece)
    flush()
    result = "".join(out).replace("\x00", "")
    result = re.sub(r"[ \t]+\n", "\n", result)
    return re.sub(r"\n{3,}", "\n\n", result).strip()[:max_chars]


def _known_codec(name: str) -> bool:
    try:
        b"".decode(name)
        return True
    except LookupError:
        return False

"""Outlook .msg files for tests: a minimal compound file (MS-CFB v3) holding the MAPI streams Outlook
writes for a message (MS-OXMSG): the message class, subject, sender, body, a recipient and attachments
by value. No installed tool writes .msg files (extract-msg only reads them), so the corpus's .msg was
built with `build_msg` too; extract-msg, olefile and libmagic read it as they read Outlook's.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime

SECTOR = 512
MINI = 64
CUTOFF = 4096
FREE, END, FATSECT, NOSTREAM = 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFFFD, 0xFFFFFFFF
# The CLSID Outlook gives a .msg root storage (CLSID_MailMessage).
MSG_CLSID = bytes.fromhex("0b0d020000000000c000000000000046")
PT_LONG, PT_TIME, PT_UNICODE, PT_BINARY = 0x0003, 0x0040, 0x001F, 0x0102


class _Entry:
    def __init__(self, name: str, kind: int, data: bytes = b"", children=None, clsid: bytes = b"\0" * 16):
        self.name, self.kind, self.data, self.clsid = name, kind, data, clsid
        self.children = children or []
        self.left = self.right = self.child = NOSTREAM
        self.start, self.size = END, len(data)


def _key(entry: _Entry):
    return (len(entry.name), entry.name.upper())


def _tree(entries: list[_Entry]) -> int:
    """The root of a balanced binary search tree of siblings (CFB order: length, then upper-case name)."""
    if not entries:
        return NOSTREAM
    middle = len(entries) // 2
    root = entries[middle]
    root.left = _tree(entries[:middle])
    root.right = _tree(entries[middle + 1 :])
    return root.index


def _flatten(entry: _Entry, out: list[_Entry]) -> None:
    entry.index = len(out)
    out.append(entry)
    for child in entry.children:
        _flatten(child, out)


def _chain(fat: list[int], first: int, count: int) -> None:
    for offset in range(count):
        fat[first + offset] = first + offset + 1 if offset + 1 < count else END


def compound_file(root_children: list[_Entry], clsid: bytes = MSG_CLSID) -> bytes:
    root = _Entry("Root Entry", 5, children=root_children, clsid=clsid)
    entries: list[_Entry] = []
    _flatten(root, entries)
    for entry in entries:
        if entry.kind in (1, 5):
            entry.child = _tree(sorted(entry.children, key=_key))
    mini_stream, big = bytearray(), []
    mini_fat: list[int] = []
    for entry in entries:
        if entry.kind != 2 or not entry.data:
            continue
        if len(entry.data) < CUTOFF:
            first = len(mini_stream) // MINI
            count = -(-len(entry.data) // MINI)
            mini_fat.extend([0] * count)
            _chain(mini_fat, first, count)
            entry.start = first
            mini_stream += entry.data + b"\0" * (count * MINI - len(entry.data))
        else:
            big.append(entry)
    directory_sectors = -(-len(entries) * 128 // SECTOR)
    mini_fat_sectors = -(-len(mini_fat) * 4 // SECTOR)
    mini_stream_sectors = -(-len(mini_stream) // SECTOR)
    big_sectors = sum(-(-len(e.data) // SECTOR) for e in big)
    data_sectors = directory_sectors + mini_fat_sectors + mini_stream_sectors + big_sectors
    fat_sectors = 1
    while fat_sectors * (SECTOR // 4) < fat_sectors + data_sectors:
        fat_sectors += 1
    fat = [FREE] * (fat_sectors * (SECTOR // 4))
    for index in range(fat_sectors):
        fat[index] = FATSECT
    position = fat_sectors
    directory_start = position
    _chain(fat, position, directory_sectors)
    position += directory_sectors
    mini_fat_start = position if mini_fat_sectors else END
    _chain(fat, position, mini_fat_sectors)
    position += mini_fat_sectors
    root.start = position if mini_stream_sectors else END
    root.size = len(mini_stream)
    _chain(fat, position, mini_stream_sectors)
    position += mini_stream_sectors
    body = bytearray()
    for entry in big:
        count = -(-len(entry.data) // SECTOR)
        entry.start = position
        _chain(fat, position, count)
        position += count
        body += entry.data + b"\0" * (count * SECTOR - len(entry.data))

    header = bytearray(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 16)
    header += struct.pack("<HHHHH", 0x003E, 0x0003, 0xFFFE, 9, 6) + b"\0" * 6
    header += struct.pack(
        "<IIIIIIIII", 0, fat_sectors, directory_start, 0, CUTOFF, mini_fat_start, mini_fat_sectors, END, 0
    )
    difat = list(range(fat_sectors)) + [FREE] * (109 - fat_sectors)
    header += struct.pack("<109I", *difat)
    directory = bytearray()
    for entry in entries:
        name = entry.name.encode("utf-16-le") + b"\0\0"
        directory += name.ljust(64, b"\0") + struct.pack("<HBB", len(name), entry.kind, 1)
        directory += struct.pack("<III", entry.left, entry.right, entry.child) + entry.clsid
        directory += b"\0" * 20 + struct.pack("<IQ", entry.start if entry.kind != 1 else 0, entry.size)
    directory += (
        b"\0" * 64
        + struct.pack("<HBB", 0, 0, 0)
        + struct.pack("<III", NOSTREAM, NOSTREAM, NOSTREAM)
        + b"\0" * 36
        + struct.pack("<IQ", 0, 0)
    ) * (directory_sectors * 4 - len(entries))
    out = bytes(header) + struct.pack(f"<{len(fat)}I", *fat) + bytes(directory)
    out += struct.pack(f"<{len(mini_fat)}I", *mini_fat) + struct.pack("<I", FREE) * (
        mini_fat_sectors * (SECTOR // 4) - len(mini_fat)
    )
    out += bytes(mini_stream) + b"\0" * (mini_stream_sectors * SECTOR - len(mini_stream))
    return out + bytes(body)


def _stream_name(prop: int, kind: int) -> str:
    return f"__substg1.0_{prop:04X}{kind:04X}"


def _properties(header: bytes, values: list[tuple[int, int, bytes | int]]) -> _Entry:
    """The __properties_version1.0 stream: fixed values inline, variable ones by size."""
    rows = bytearray(header)
    for prop, kind, value in values:
        tag = (prop << 16) | kind
        if isinstance(value, int):
            rows += struct.pack("<IIQ", tag, 0x6, value)
        else:
            rows += struct.pack("<IIII", tag, 0x6, len(value) + (2 if kind == PT_UNICODE else 0), 0)
    return _Entry("__properties_version1.0", 2, bytes(rows))


def _storage(
    name: str,
    header: bytes,
    strings: dict[int, str],
    binaries: dict[int, bytes],
    fixed: dict[int, tuple[int, int]],
    extra=(),
) -> _Entry:
    children, values = [], []
    for prop, text in strings.items():
        data = text.encode("utf-16-le")
        children.append(_Entry(_stream_name(prop, PT_UNICODE), 2, data))
        values.append((prop, PT_UNICODE, data))
    for prop, data in binaries.items():
        children.append(_Entry(_stream_name(prop, PT_BINARY), 2, data))
        values.append((prop, PT_BINARY, data))
    for prop, (kind, value) in fixed.items():
        values.append((prop, kind, value))
    children.append(_properties(header, values))
    return _Entry(name, 1, children=[*children, *extra])


def _filetime(moment: datetime) -> int:
    return int((moment - datetime(1601, 1, 1, tzinfo=UTC)).total_seconds() * 10_000_000)


def build_msg(
    *,
    subject: str,
    sender_name: str,
    sender: str,
    to: str,
    body: str,
    sent: datetime,
    attachments: list[tuple[str, str, bytes]] = (),
) -> bytes:
    """An IPM.Note .msg with `attachments` as (long filename, MIME type, bytes), attached by value."""
    attachment_storages = []
    for index, (name, mime_type, data) in enumerate(attachments):
        short = name if len(name) <= 12 else name[:6].upper() + "~1" + name[name.rfind(".") :][:4]
        attachment_storages.append(
            _storage(
                f"__attach_version1.0_#{index:08X}",
                b"\0" * 8,
                {0x3707: name, 0x3704: short, 0x3001: name, 0x370E: mime_type, 0x3703: name[name.rfind(".") :]},
                {0x3701: data},
                {0x3705: (PT_LONG, 1), 0x0E21: (PT_LONG, index), 0x0E20: (PT_LONG, len(data))},
            )
        )
    recipient = _storage(
        "__recip_version1.0_#00000000",
        b"\0" * 8,
        {0x3001: to, 0x3003: to, 0x3002: "SMTP", 0x39FE: to},
        {},
        {0x0C15: (PT_LONG, 1), 0x3000: (PT_LONG, 0)},
    )
    nameid = _Entry(
        "__nameid_version1.0",
        1,
        children=[
            _Entry(_stream_name(0x0002, PT_BINARY), 2),
            _Entry(_stream_name(0x0003, PT_BINARY), 2),
            _Entry(_stream_name(0x0004, PT_BINARY), 2),
        ],
    )
    header = struct.pack("<8xIIII8x", 1, len(attachments), 1, len(attachments))
    stamp = _filetime(sent)
    top = _storage(
        "",
        header,
        {
            0x001A: "IPM.Note",
            0x0037: subject,
            0x0E1D: subject,
            0x0C1A: sender_name,
            0x0C1F: sender,
            0x0C1E: "SMTP",
            0x5D01: sender,
            0x0042: sender_name,
            0x0065: sender,
            0x0E04: to,
            0x1000: body,
        },
        {},
        {
            0x0039: (PT_TIME, stamp),
            0x0E06: (PT_TIME, stamp),
            0x0E07: (PT_LONG, 0x1 | (0x10 if attachments else 0)),
            0x3FDE: (PT_LONG, 65001),
        },
        extra=[recipient, *attachment_storages, nameid],
    )
    return compound_file(top.children)

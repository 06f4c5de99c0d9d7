"""What is inside an attached archive: zip, 7z, gzip, bzip2 and tar (also inside gzip or bzip2).

    list_archive(data, sniffed_type=...) -> Listing | None     # None: not an archive this module lists
    read_members(data, sniffed_type=..., paths=[...]) -> {path: bytes}   # those within the limits

An archive is allowed only as the files it holds: `intake.mime` lists each
member as an attachment (`nested=True`, `origin="archive"`) so that the type
policy judges it by its own bytes and name, as if it had been attached alone.
Listing decompresses only the first `SNIFF_BYTES` of a member, except a member
that is itself a container (a ZIP: OOXML, OpenDocument, or another archive; an
OLE file: legacy Office with a possible VBA project), which is read whole, up
to `MAX_CONTAINER_BYTES`, so that the same refinements apply; an archive inside
an archive is listed too, `MAX_DEPTH` levels deep.

Zip-bomb safety: at most `MAX_MEMBERS` members are listed and at most
`MAX_DECOMPRESSED_BYTES` are decompressed for one archive, in bounded steps
(zlib and bz2 with `max_length`, py7zr with `max_extract_size` and a writer
that counts); ZIP members compressed with anything but deflate or stored
(bzip2, lzma, deflate64) are not read, because the standard library
decompresses those in unbounded steps. Whatever a limit stopped, or could not be
read, makes `Listing.complete` False: the caller sends the message to a person.
Encrypted members (ZIP's encryption flag, 7z's encrypted streams) are listed
by name with `encrypted=True` and no bytes; a 7z with encrypted headers shows
no names at all. The AppleDouble files macOS adds under `__MACOSX/` (Finder
metadata, recognised by their magic number) are not listed. Nothing here raises.
"""

from __future__ import annotations

import bz2
import io
import tarfile
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Protocol, cast

from .sniff import SNIFF_BYTES, sniff_type

if TYPE_CHECKING:
    from typing_extensions import Buffer

MAX_MEMBERS = 200
MAX_DECOMPRESSED_BYTES = 64 << 20
MAX_CONTAINER_BYTES = 16 << 20
MAX_DEPTH = 3
CHUNK = 64 << 10

ZIP_TYPES = frozenset({"application/zip", "application/x-zip-compressed"})
SEVEN_ZIP_TYPES = frozenset({"application/x-7z-compressed"})
GZIP_TYPES = frozenset({"application/gzip", "application/x-gzip"})
BZIP2_TYPES = frozenset({"application/x-bzip2"})
TAR_TYPES = frozenset({"application/x-tar", "application/x-gtar"})
ARCHIVE_TYPES = ZIP_TYPES | SEVEN_ZIP_TYPES | GZIP_TYPES | BZIP2_TYPES | TAR_TYPES
# macOS "Compress" adds an AppleDouble file (Finder metadata, magic 0x00051607) under __MACOSX/ for each file.
_APPLEDOUBLE_MAGIC = b"\x00\x05\x16\x07"
# First bytes of a member that must be read whole to be typed (ZIP containers, OLE, nested archives).
_CONTAINER_MAGIC = (b"PK\x03\x04", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", b"7z\xbc\xaf\x27\x1c", b"\x1f\x8b", b"BZh")


@dataclass
class Member:
    name: str  # path inside the archive as written there ("" for a bare .gz without a name)
    size: int  # uncompressed bytes (as the archive declares them for members not read whole)
    sniffed_type: str  # "" for an encrypted member
    encrypted: bool = False
    data: bytes | None = None  # the whole member when it was read whole, else None
    path: tuple[int, ...] = ()  # where it is: indexes, one per archive level (for `read_members`)


@dataclass
class Listing:
    members: list[Member] = field(default_factory=list)
    encrypted: bool = False  # some member, or the header, is encrypted
    complete: bool = True  # False: a limit stopped the listing or part of it could not be read


class _Budget:
    def __init__(self, limit: int = MAX_DECOMPRESSED_BYTES) -> None:
        self.left = limit

    def take(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise _OverBudget


class _OverBudget(Exception):
    pass


class _Inflater(Protocol):
    """What `zlib.decompressobj()` gives, as used here (the zlib module does not expose its class)."""

    @property
    def eof(self) -> bool: ...
    @property
    def unconsumed_tail(self) -> bytes: ...
    def decompress(self, data: Buffer, /, max_length: int = 0) -> bytes: ...
    def flush(self, length: int = 16384, /) -> bytes: ...


class _Decompressing(io.RawIOBase):
    """A readable stream of a zlib/bz2 stream's output, decompressed in bounded steps and counted."""

    def __init__(self, data: bytes, kind: str, budget: _Budget) -> None:
        self.source = memoryview(data)
        self.position = 0
        self.decompressor: _Inflater | bz2.BZ2Decompressor = (
            zlib.decompressobj(wbits=47) if kind == "gzip" else bz2.BZ2Decompressor()
        )
        self.kind = kind
        self.pending = b""
        self.budget = budget

    def readable(self) -> bool:
        return True

    def _more(self, want: int) -> bytes:
        d = self.decompressor
        if self.kind == "gzip":
            d = cast(_Inflater, d)  # `kind` says which decompressor it is
            if d.eof:
                return b""
            feed = d.unconsumed_tail or bytes(self.source[self.position : self.position + CHUNK])
            if not d.unconsumed_tail:
                self.position += len(feed)
            out = d.decompress(feed, want) if feed else d.flush()
            if not feed and not out:
                raise EOFError
        else:
            d = cast(bz2.BZ2Decompressor, d)
            if d.eof:
                return b""
            feed = b""
            if d.needs_input:
                feed = bytes(self.source[self.position : self.position + CHUNK])
                self.position += len(feed)
                if not feed:
                    raise EOFError
            out = d.decompress(feed, want)
        self.budget.take(len(out))
        return out

    def readinto(self, buffer: Buffer) -> int:
        # What io.BufferedReader (a memoryview) or RawIOBase.read (a bytearray) passes: sized and writable.
        buffer = cast("memoryview | bytearray", buffer)
        want = len(buffer)
        out = self.pending or self._more(min(want, CHUNK))
        while not out and not self.decompressor.eof:
            out = self._more(min(want, CHUNK))
        self.pending = out[want:]
        out = out[:want]
        buffer[: len(out)] = out
        return len(out)


def _read_up_to(stream: IO[bytes], limit: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while total < limit:
        chunk = stream.read(min(CHUNK, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _read_head(stream: IO[bytes], budget: _Budget, declared_size: int | None = None) -> tuple[bytes, bool]:
    """The first bytes of a member, or all of it when it is a container; (bytes, whole)."""
    head = _read_up_to(stream, SNIFF_BYTES)
    budget.take(len(head))
    if len(head) < SNIFF_BYTES:
        return head, True
    if not head.startswith(_CONTAINER_MAGIC):
        return head, False
    if declared_size is not None and declared_size > MAX_CONTAINER_BYTES:
        raise _OverBudget
    rest = _read_up_to(stream, MAX_CONTAINER_BYTES + 1 - len(head))
    budget.take(len(rest))
    if len(head) + len(rest) > MAX_CONTAINER_BYTES:
        raise _OverBudget
    return head + rest, True


def _member(name: str, size: int, data: bytes, whole: bool, path: tuple[int, ...]) -> Member:
    return Member(
        name=name,
        size=size if not whole else len(data),
        sniffed_type=sniff_type(data, filename=name),
        data=data if whole else None,
        path=path,
    )


def _zip(data: bytes, listing: Listing, budget: _Budget, path: tuple[int, ...]) -> None:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for index, info in enumerate(archive.infolist()):
            if info.is_dir():
                continue
            if len(listing.members) >= MAX_MEMBERS:
                listing.complete = False
                return
            if info.flag_bits & 0x1:
                listing.encrypted = True
                listing.members.append(
                    Member(
                        name=info.filename, size=info.file_size, sniffed_type="", encrypted=True, path=path + (index,)
                    )
                )
                continue
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                listing.complete = False
                listing.members.append(
                    Member(
                        name=info.filename,
                        size=info.file_size,
                        sniffed_type="application/octet-stream",
                        path=path + (index,),
                    )
                )
                continue
            try:
                with archive.open(info) as handle:
                    head, whole = _read_head(handle, budget, info.file_size)
            except _OverBudget:
                raise
            except Exception:
                listing.complete = False
                continue
            if _finder_metadata(info.filename, head):
                continue
            listing.members.append(_member(info.filename, info.file_size, head, whole, path + (index,)))


def _finder_metadata(name: str, head: bytes) -> bool:
    """An AppleDouble file under __MACOSX/ (metadata of the file beside it, not a file anybody opens)."""
    return (
        name.startswith("__MACOSX/")
        and name.rsplit("/", 1)[-1].startswith("._")
        and head.startswith(_APPLEDOUBLE_MAGIC)
    )


def _seven_zip(data: bytes, listing: Listing, budget: _Budget, path: tuple[int, ...], keep: int = 0) -> None:
    """`keep`: keep every member whole up to that many bytes (for reading them), else only heads."""
    import py7zr
    from py7zr.io import Py7zIO, WriterFactory

    class Head(Py7zIO):
        def __init__(self) -> None:
            self.kept = bytearray()
            self.total = 0

        def write(self, s: bytes | bytearray) -> int:
            written = len(s)
            budget.take(written)
            self.total += len(s)
            room = max(SNIFF_BYTES, keep) - len(self.kept)
            if room > 0:
                self.kept += bytes(s[:room])
                s = s[room:]
            if len(s) and self.kept.startswith(_CONTAINER_MAGIC) and len(self.kept) <= MAX_CONTAINER_BYTES:
                self.kept += bytes(s[: MAX_CONTAINER_BYTES + 1 - len(self.kept)])
            return written

        def read(self, size: int | None = None) -> bytes:
            return b""

        def seek(self, offset: int, whence: int = 0) -> int:
            return 0

        def flush(self) -> None:
            return None

        def size(self) -> int:
            return self.total

    class Heads(WriterFactory):
        def __init__(self) -> None:
            self.made: dict[str, Head] = {}

        def create(self, filename: str) -> Py7zIO:
            return self.made.setdefault(filename, Head())

    try:
        archive = py7zr.SevenZipFile(io.BytesIO(data), mode="r", max_extract_size=MAX_DECOMPRESSED_BYTES)
    except Exception as exc:
        if type(exc).__name__ == "PasswordRequired":  # encrypted headers: not even the names show
            listing.encrypted = True
            return
        raise
    with archive:
        infos = [info for info in archive.list() if not info.is_directory]
        if len(infos) > MAX_MEMBERS:
            listing.complete, infos = False, infos[:MAX_MEMBERS]
        if archive.needs_password():
            listing.encrypted = True
            for index, info in enumerate(infos):
                listing.members.append(
                    Member(
                        name=info.filename,
                        size=info.uncompressed or 0,
                        sniffed_type="",
                        encrypted=True,
                        path=path + (index,),
                    )
                )
            return
        if sum(info.uncompressed or 0 for info in infos) > budget.left:
            raise _OverBudget
        heads = Heads()
        archive.extractall(factory=heads)
    for index, info in enumerate(infos):
        head = heads.made.get(info.filename)
        kept = bytes(head.kept) if head is not None else b""
        whole = head is not None and len(kept) == head.total
        if head is not None and not whole and kept.startswith(_CONTAINER_MAGIC) and not keep:
            raise _OverBudget  # a container too large to read whole
        listing.members.append(_member(info.filename, head.total if head else 0, kept, whole, path + (index,)))


def _tar(stream: IO[bytes], listing: Listing, budget: _Budget, path: tuple[int, ...]) -> None:
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for index, info in enumerate(archive):
            if not info.isfile():
                continue
            if len(listing.members) >= MAX_MEMBERS:
                listing.complete = False
                return
            handle = archive.extractfile(info)
            head, whole = _read_head(handle, budget, info.size) if handle is not None else (b"", True)
            listing.members.append(_member(info.name, info.size, head, whole, path + (index,)))


def _gzip_name(data: bytes) -> str:
    """The original file name a gzip header carries (FNAME), else ""."""
    if len(data) < 10 or not data[3] & 0x08:
        return ""
    position = 10
    if data[3] & 0x04:  # FEXTRA
        position += 2 + int.from_bytes(data[10:12], "little")
    end = data.find(b"\x00", position, position + 1024)
    return data[position:end].decode("latin-1") if end > position else ""


def _compressed(data: bytes, kind: str, listing: Listing, budget: _Budget, path: tuple[int, ...], depth: int) -> None:
    """A gzip or bzip2 stream: a tar inside it is listed; anything else is one member."""
    if _is_tar(data, kind, budget):
        _tar(io.BufferedReader(_Decompressing(data, kind, budget), CHUNK), listing, budget, path)
        return
    stream = io.BufferedReader(_Decompressing(data, kind, budget), CHUNK)
    first, whole = _read_head(stream, budget)
    size = len(first)
    if not whole and kind == "gzip":
        size = int.from_bytes(data[-4:], "little")  # ISIZE: the uncompressed size modulo 2^32
    elif not whole:  # bzip2 says nothing of its size: decompress the rest, counted, without keeping it
        while chunk := stream.read(CHUNK):
            size += len(chunk)
    name = _gzip_name(data) if kind == "gzip" else ""
    member = _member(name, size, first, whole, path + (0,))
    listing.members.append(member)
    if whole and member.sniffed_type in ARCHIVE_TYPES and depth < MAX_DEPTH:
        _nested(member, listing, budget, depth)


def _nested(member: Member, listing: Listing, budget: _Budget, depth: int) -> None:
    inner = _list(member.data or b"", member.sniffed_type, budget, member.path, depth + 1)
    listing.encrypted = listing.encrypted or inner.encrypted
    listing.complete = listing.complete and inner.complete
    for entry in inner.members:
        entry.name = f"{member.name}/{entry.name}" if member.name else entry.name
        listing.members.append(entry)


def _list(data: bytes, sniffed_type: str, budget: _Budget, path: tuple[int, ...], depth: int) -> Listing:
    listing = Listing()
    try:
        if sniffed_type in ZIP_TYPES:
            _zip(data, listing, budget, path)
        elif sniffed_type in SEVEN_ZIP_TYPES:
            _seven_zip(data, listing, budget, path)
        elif sniffed_type in GZIP_TYPES:
            _compressed(data, "gzip", listing, budget, path, depth)
            return listing
        elif sniffed_type in BZIP2_TYPES:
            _compressed(data, "bzip2", listing, budget, path, depth)
            return listing
        else:
            _tar(io.BytesIO(data), listing, budget, path)
    except Exception:  # _OverBudget, a broken archive, a library's own refusal: a person looks
        listing.complete = False
        return listing
    for member in list(listing.members):
        if member.data is not None and member.sniffed_type in ARCHIVE_TYPES:
            if depth >= MAX_DEPTH:
                listing.complete = False
            else:
                _nested(member, listing, budget, depth)
    return listing


def list_archive(data: bytes, *, sniffed_type: str) -> Listing | None:
    """The members of an archive whose sniffed type is in `ARCHIVE_TYPES`, else None; never raises."""
    if sniffed_type not in ARCHIVE_TYPES:
        return None
    listing = _list(data, sniffed_type, _Budget(), (), 0)
    listing.members.sort(key=lambda member: member.path)
    return listing


def _is_tar(data: bytes, kind: str, budget: _Budget) -> bool:
    peek = _read_up_to(io.BufferedReader(_Decompressing(data, kind, budget), CHUNK), 512) if kind else data[:512]
    return len(peek) >= 262 and peek[257:262] == b"ustar"


def _read_level(data: bytes, sniffed_type: str, wanted: set[int], budget: _Budget, limit: int) -> dict[int, bytes]:
    """{index: bytes} of the members at `wanted` indexes of one archive level, in one pass."""
    out: dict[int, bytes] = {}
    if sniffed_type in ZIP_TYPES:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            for index in sorted(wanted):
                info = infos[index] if index < len(infos) else None
                if (
                    info is None
                    or info.flag_bits & 0x1
                    or info.file_size > limit
                    or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
                ):
                    continue
                with archive.open(info) as handle:
                    member = _read_up_to(handle, limit + 1)
                budget.take(len(member))
                if len(member) <= limit:
                    out[index] = member
        return out
    if sniffed_type in SEVEN_ZIP_TYPES:
        listing = Listing()
        _seven_zip(data, listing, budget, (), keep=limit)
        return {
            index: member.data
            for index, member in enumerate(listing.members)
            if index in wanted and member.data is not None
        }
    kind = "gzip" if sniffed_type in GZIP_TYPES else "bzip2" if sniffed_type in BZIP2_TYPES else ""
    stream = io.BufferedReader(_Decompressing(data, kind, budget), CHUNK) if kind else io.BytesIO(data)
    if kind and not _is_tar(data, kind, budget):
        member = _read_up_to(stream, limit + 1)
        return {0: member} if len(member) <= limit and 0 in wanted else {}
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for index, entry in enumerate(tar):
            if index > max(wanted):
                break
            if index in wanted and entry.isfile() and entry.size <= limit:
                extracted = tar.extractfile(entry)
                if extracted is not None:
                    out[index] = _read_up_to(extracted, limit)
    return out


def _read_paths(
    data: bytes,
    sniffed_type: str,
    paths: list[tuple[int, ...]],
    budget: _Budget,
    limit: int,
    out: dict[tuple[int, ...], bytes],
    prefix: tuple[int, ...] = (),
) -> None:
    wanted = {path[0] for path in paths}
    level = _read_level(data, sniffed_type, wanted, budget, max(limit, MAX_CONTAINER_BYTES))
    for index in sorted(wanted):
        member = level.get(index)
        if member is None:
            continue
        deeper = [path[1:] for path in paths if path[0] == index and len(path) > 1]
        if any(path == (index,) for path in paths) and len(member) <= limit:
            out[prefix + (index,)] = member
        if deeper:
            _read_paths(member, sniff_type(member), deeper, budget, limit, out, prefix + (index,))


def read_members(
    data: bytes, *, sniffed_type: str, paths: list[tuple[int, ...]], limit: int = MAX_CONTAINER_BYTES
) -> dict[tuple[int, ...], bytes]:
    """{path: bytes} for the members at `paths` (from `Member.path`), read in one pass per archive level
    within `MAX_DECOMPRESSED_BYTES`; a member that cannot be had (encrypted, over `limit`, past the
    budget) is missing from the answer. Never raises."""
    out: dict[tuple[int, ...], bytes] = {}
    if not paths:
        return out
    try:
        _read_paths(data, sniffed_type, list(paths), _Budget(), limit, out)
    except Exception:
        pass
    return out

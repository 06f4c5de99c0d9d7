"""Files inside files: the members of an archive (`intake.mime.archives`) or of an Outlook .msg
(`intake.mime.outlookmsg`), listed right after the file that holds them.

The holder stays listed as itself (it is the one file a desk receives, whole); its members follow with
`nested=True` (desks never get them separately: `ticketing.ticket_files` skips nested files) and
`origin="archive"` or `"outlook"` (`"encrypted"` for an archive member that cannot be read), so that the
type policy judges each by its own bytes and name and the scanner scans each. `Attachment.contents` on
the holder says what came of it: "listed", "encrypted" (validation sends the message to review as
`encrypted_archive`), or "unreadable" (a limit stopped the listing, or the file could not be opened: the
walk is marked too complex, which sends the message to review, since files went unexamined).
"""

from __future__ import annotations

import hashlib
import mimetypes
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from . import archives, outlookmsg
from .message import MAX_DEFECTS, Attachment
from .sniff import sniff_type

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeAlias

    from .parts import AttachmentPart
    from .walk import WalkState

    # A member of its holder: an archive's by its path (`archives.Member.path`), a .msg's by its index.
    _MemberKey: TypeAlias = "tuple[int, ...] | int"

MAX_LISTED = 2000  # attachments in one message past which members are no longer listed
MAX_NESTING = 3  # archives and .msg files inside each other that are opened
_CONTROL = {code: None for code in [*range(32), 127]}


class ArchiveMember:
    """Stands for a file inside an archive part: its bytes are decompressed again when asked for."""

    __slots__ = ("container", "archive_type", "path")

    def __init__(self, container: AttachmentPart, archive_type: str, path: tuple[int, ...]) -> None:
        self.container = container
        self.archive_type = archive_type
        self.path = path


class MsgMember:
    """Stands for a file inside a .msg part: it is unpacked again when asked for."""

    __slots__ = ("container", "index")

    def __init__(self, container: AttachmentPart, index: int) -> None:
        self.container = container
        self.index = index


def _defect(walk: WalkState, name: str) -> None:
    if len(walk.defects) < MAX_DEFECTS and name not in walk.defects:
        walk.defects.append(name)


def _display_name(name: str) -> str:
    return (name or "").translate(_CONTROL).replace("\\", "/").rsplit("/", 1)[-1].strip(" .\t")[:255]


def _guessed_type(name: str) -> str:
    return (mimetypes.guess_type(name, strict=False)[0] or "application/octet-stream").lower()


def _unreadable(walk: WalkState, attachment: Attachment, defect: str) -> Attachment:
    _defect(walk, defect)
    walk.too_complex = True
    return replace(attachment, contents="unreadable")


def expand(
    walk: WalkState, *, part: AttachmentPart, path: tuple[int, ...], attachment: Attachment, data: bytes, depth: int = 0
) -> Attachment:
    """List the members of `attachment` (the file `part`, its bytes `data`) after it, when it is an archive
    or a .msg; `attachment` with `contents` set (unchanged for any other file)."""
    if attachment.origin == "encrypted" or not data:
        return attachment
    try:
        if attachment.sniffed_type in archives.ARCHIVE_TYPES:
            return _archive(walk, part, path, attachment, data, depth)
        if attachment.sniffed_type in outlookmsg.MSG_TYPES:
            return _outlook(walk, part, path, attachment, data, depth)
    except Exception as exc:  # never the walk's failure: this file goes to a person instead
        return _unreadable(walk, attachment, f"ContainerError:{type(exc).__name__}")
    return attachment


def _add(
    walk: WalkState,
    path: tuple[int, ...],
    attachment: Attachment,
    stand_in: ArchiveMember | MsgMember,
    data: bytes | None,
    depth: int,
) -> bool:
    """Append one member (and what is inside it, when it is a .msg or an archive not listed yet)."""
    if len(walk.attachments) >= MAX_LISTED:
        _defect(walk, "MemberLimitExceeded")
        walk.too_complex = True
        return False
    position = len(walk.attachments)
    walk.attachments.append((path, attachment, stand_in))
    if data is None:
        return True
    if depth + 1 < MAX_NESTING:
        expanded = expand(walk, part=stand_in, path=path, attachment=attachment, data=data, depth=depth + 1)
    elif attachment.sniffed_type in outlookmsg.MSG_TYPES:
        expanded = _unreadable(walk, attachment, "NestingLimitExceeded")
    else:
        expanded = attachment
    walk.attachments[position] = (path, expanded, stand_in)
    return True


def _archive(
    walk: WalkState, part: AttachmentPart, path: tuple[int, ...], attachment: Attachment, data: bytes, depth: int
) -> Attachment:
    listing = archives.list_archive(data, sniffed_type=attachment.sniffed_type)
    if listing is None:
        return attachment
    for member in listing.members:
        name = _display_name(member.name)
        if not name and member.path == (0,) and attachment.filename.lower().endswith((".gz", ".bz2", ".gzip")):
            name = attachment.filename.rsplit(".", 1)[0]  # a bare gzip/bzip2 file: its own name, less .gz
        listed = Attachment(
            filename=name,
            declared_type=_guessed_type(name),
            sniffed_type=member.sniffed_type or "application/octet-stream",
            size=member.size,
            # Only a member read whole has a digest: the others were decompressed only as far as sniffing needs.
            sha256=hashlib.sha256(member.data).hexdigest() if member.data is not None else "",
            content_id="",
            is_inline=False,
            nested=True,
            origin="encrypted" if member.encrypted else "archive",
        )
        stand_in = ArchiveMember(part, attachment.sniffed_type, member.path)
        # An archive inside is listed by `archives` already; a .msg inside is opened here.
        inner = member.data if member.sniffed_type not in archives.ARCHIVE_TYPES else None
        if not _add(walk, path + member.path, listed, stand_in, inner, depth):
            break
    if listing.encrypted:
        return replace(attachment, contents="encrypted")
    if not listing.complete:
        return _unreadable(walk, attachment, "ArchiveNotFullyListed")
    return replace(attachment, contents="listed")


def _outlook(
    walk: WalkState, part: AttachmentPart, path: tuple[int, ...], attachment: Attachment, data: bytes, depth: int
) -> Attachment:
    unpacked = outlookmsg.unpack(data)
    if unpacked is None:
        return _unreadable(walk, attachment, "UnreadableOutlookMsg")
    for index, member in enumerate(unpacked.members):
        name = _display_name(member.name)
        declared = member.mime_type or _guessed_type(name)
        listed = Attachment(
            filename=name,
            declared_type=declared,
            sniffed_type=sniff_type(member.data, declared_type=declared, filename=name),
            size=len(member.data),
            sha256=hashlib.sha256(member.data).hexdigest(),
            content_id="",
            is_inline=False,
            nested=True,
            origin="outlook",
        )
        if not _add(walk, path + (index,), listed, MsgMember(part, index), member.data, depth):
            break
    if unpacked.body and not attachment.nested and depth == 0:
        walk.tnef_bodies.append((unpacked.body, unpacked.body_source))
    return replace(attachment, contents="listed")


class Payloads:
    """Members' bytes for `iter_attachment_payloads`: the members of one holder are read in one pass
    (`archives.read_members`: at most `archives.MAX_DECOMPRESSED_BYTES` alive), then dropped for the next."""

    def __init__(self, parts: list[AttachmentPart], part_bytes: Callable[[AttachmentPart], bytes]) -> None:
        self.parts = parts
        self.part_bytes = part_bytes
        self.container: AttachmentPart | None = None
        self.found: dict[_MemberKey, bytes] = {}

    def get(self, stand_in: ArchiveMember | MsgMember) -> bytes:
        if stand_in.container is not self.container:
            self.container, self.found = stand_in.container, {}
            self.found = _read_all(stand_in, self.part_bytes(stand_in.container), self.parts)
        return self.found.get(stand_in.path if isinstance(stand_in, ArchiveMember) else stand_in.index, b"")


def _read_all(stand_in: ArchiveMember | MsgMember, data: bytes, parts: list[AttachmentPart]) -> dict[_MemberKey, bytes]:
    if isinstance(stand_in, ArchiveMember):
        paths = [p.path for p in parts if isinstance(p, ArchiveMember) and p.container is stand_in.container]
        # Keyed by path only: a dict of the wider key type (dict keys are invariant, hence the cast).
        return cast(
            "dict[_MemberKey, bytes]", archives.read_members(data, sniffed_type=stand_in.archive_type, paths=paths)
        )
    unpacked = outlookmsg.unpack(data) if data else None
    return {index: member.data for index, member in enumerate(unpacked.members)} if unpacked else {}


def member_bytes(stand_in: ArchiveMember | MsgMember, *, container_data: bytes) -> bytes:
    """The bytes of one member, from its holder's bytes (b"" when they cannot be had)."""
    return _read_all(stand_in, container_data, [stand_in]).get(
        stand_in.path if isinstance(stand_in, ArchiveMember) else stand_in.index, b""
    )

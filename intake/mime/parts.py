"""One part at a time: its bytes, type, charset and display name; attachments listed and their payloads."""

from __future__ import annotations

import hashlib
import io
import os
import re
from collections.abc import Iterator
from dataclasses import replace
from email.generator import BytesGenerator
from typing import TYPE_CHECKING, BinaryIO, cast
from urllib.parse import unquote

from . import archives, containers, outlookmsg, spool, tnef
from .headers import clean_filename, clean_id, decode_header_value
from .message import Attachment, ParsedMessage, add_defect
from .policy import GENERATE_POLICY
from .sniff import sniff_type, whole_file_needed

if TYPE_CHECKING:
    from email.message import Message
    from typing import TypeAlias

    from .walk import WalkState

    # What an attachment's bytes are read from: its MIME part, or a stand-in for a file inside one.
    AttachmentPart: TypeAlias = "Message | TnefMember | containers.ArchiveMember | containers.MsgMember"

MAX_EML_NAME_CHARS = 100
# Decoded bytes of a spooled part that its sniffing reads (`sniff_type` reads at most a MiB but of a ZIP or OLE file).
_HEAD_BYTES = 1 << 20
# A clean "type/subtype" of RFC 2045 tokens, as get_content_type() gives for a well-formed header.
_CLEAN_TYPE = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+/[a-z0-9!#$%&'*+.^_`|~-]+")
# The start of a malformed Content-Type that still names a body type ('text/html charset="utf-8"').
_TEXT_TYPE_START = re.compile(r"""\s*["']?\s*text\s*/\s*(plain|html)(?![a-z0-9!#$%&'*+.^_`|~-])""", re.IGNORECASE)
_CHARSET_PARAMETER = re.compile(r"""charset\s*=\s*["']?\s*([a-z0-9_.:+-]{1,40})""", re.IGNORECASE)
_UNSAFE_IN_NAME = re.compile(r'[\\/:*?"<>|]+')


class TnefMember:
    """Stands for a file unpacked from a winmail.dat part: its bytes are unpacked again when asked for."""

    __slots__ = ("container", "index")

    def __init__(self, container: Message, index: int) -> None:
        self.container = container
        self.index = index


def _tnef_member_bytes(unpacked: tnef.Unpacked | None, index: int) -> bytes:
    if unpacked is None or index >= len(unpacked.members):
        return b""
    return unpacked.members[index].data


def spooled_run(part: object) -> spool.Run | None:
    """Where a large base64 part's encoded lines are in the raw message (`intake.mime.spool`), or None."""
    return getattr(part, "mailroom_run", None)


def decoded_part_bytes(part: AttachmentPart) -> bytes:
    """Decoded payload of a leaf part, the serialized message of an attached message, or a winmail.dat member."""
    run = spooled_run(part)
    if run is not None:
        return spool.whole(run)
    if isinstance(part, TnefMember):
        return _tnef_member_bytes(tnef.unpack(decoded_part_bytes(part.container)), part.index)
    if isinstance(part, (containers.ArchiveMember, containers.MsgMember)):
        return containers.member_bytes(part, container_data=decoded_part_bytes(part.container))
    if part.is_multipart():
        inner = cast("list[Message]", part.get_payload())  # a multipart's payload: its parts
        target = inner[0] if part.get_content_maintype() == "message" and inner else part
        buffer = io.BytesIO()
        BytesGenerator(buffer, mangle_from_=False, policy=GENERATE_POLICY).flatten(target)
        return buffer.getvalue()
    data = part.get_payload(decode=True)
    return data if isinstance(data, bytes) else b""


def part_content_type(part: Message) -> str:
    """The part's content type; a malformed Content-Type that still begins with text/plain or text/html
    ('text/html charset="utf-8"', '"text/html"', 'text/html/x') counts as that type."""
    ctype = part.get_content_type()
    if ctype != "text/plain" and _CLEAN_TYPE.fullmatch(ctype):
        return ctype
    # text/plain is also what the email package answers for a header it cannot read: look at the header.
    raw = part.get("Content-Type")
    if raw is None:
        return ctype
    match = _TEXT_TYPE_START.match(str(raw))
    return f"text/{match.group(1).lower()}" if match else ctype


def text_charset(part: Message) -> str | None:
    try:
        charset = part.get_content_charset()
    except Exception:
        charset = None
    if charset:
        return charset
    raw = str(part.get("Content-Type") or "")
    match = _CHARSET_PARAMETER.search(raw) if "=" in raw else None  # a parameter after a missing ";"
    return match.group(1) if match else None


def _location_name(value: str) -> str:
    """The last path segment of a Content-Location URL or path ("" if it ends in "/")."""
    value = decode_header_value(value, 2000).strip().strip("<>\"'")
    value = value.split("?", 1)[0].split("#", 1)[0]
    return clean_filename(unquote(value.replace("\\", "/").rsplit("/", 1)[-1]))


def message_file_name(part: Message) -> str:
    """ "<subject>.eml" for an attached message: what a mail program calls it when saving it."""
    inner = part.get_payload()
    if not isinstance(inner, list) or not inner:
        return ""
    attached = cast("Message", inner[0])  # the payload of an attached message: that message
    subject = decode_header_value(str(attached.get("Subject") or ""), 2000)
    subject = " ".join(_UNSAFE_IN_NAME.sub("_", subject).split())[:MAX_EML_NAME_CHARS].strip(" ._")
    return f"{subject}.eml" if subject else ""


def part_name(part: Message, ctype: str, filename: str | None) -> str:
    """Display name: Content-Disposition filename, else Content-Type name (`filename`, from get_filename(),
    with RFC 2231 and 2047 decoded), else the end of Content-Location; an attached message is named after
    its subject. "" if none of these."""
    name = clean_filename(filename)
    if not name:
        location = part.get("Content-Location")
        if location:
            name = _location_name(str(location))
    if not name and ctype in ("message/rfc822", "message/global"):
        name = message_file_name(part)
    return name


def unique_names(attachments: list[Attachment]) -> list[Attachment]:
    """The same attachments, a repeated name made unique: "report.pdf", "report (2).pdf" (case-insensitively)."""
    taken = {a.filename.casefold() for a in attachments if a.filename}
    if len(taken) == sum(1 for a in attachments if a.filename):
        return attachments
    seen: set[str] = set()
    counters: dict[str, int] = {}
    out = []
    for attachment in attachments:
        key = attachment.filename.casefold()
        if attachment.filename and key in seen:
            stem, extension = os.path.splitext(attachment.filename)
            number = counters.get(key, 1)
            while True:
                number += 1
                suffix = f" ({number}){extension}"
                name = stem[: 255 - len(suffix)] + suffix
                if name.casefold() not in taken:
                    break
            counters[key] = number
            taken.add(name.casefold())
            attachment = replace(attachment, filename=name)
        seen.add(key)
        out.append(attachment)
    return out


def record_attachment(
    walk: WalkState,
    part: Message,
    path: tuple[int, ...],
    ctype: str,
    disposition: str | None,
    name: str,
    nested: bool,
    *,
    origin: str = "",
    data: bytes | None = None,
) -> None:
    """List a part as an attachment; `name` is its display name (from `part_name`)."""
    run = spooled_run(part) if data is None else None
    if run is not None:
        # Hashed and sniffed a block at a time; decoded whole only for a file sniffing or listing looks inside.
        digest = spool.digest(run, _HEAD_BYTES)
        sniffed = sniff_type(digest.head, declared_type=ctype, filename=name)
        if whole_file_needed(digest.head) or sniffed in archives.ARCHIVE_TYPES or sniffed in outlookmsg.MSG_TYPES:
            run = None
            data = spool.whole(cast(spool.Run, spooled_run(part)))  # not None: the run just digested
        else:
            data = b""
    if data is None:
        try:
            data = decoded_part_bytes(part)
        except Exception as exc:
            add_defect(walk.defects, f"UndecodablePart:{type(exc).__name__}")
            data = b""
    try:
        content_id = clean_id(str(part.get("Content-ID") or ""))
    except Exception:
        content_id = ""
    attachment = Attachment(
        filename=name,
        declared_type=ctype,
        sniffed_type=sniffed if run is not None else sniff_type(data, declared_type=ctype, filename=name),
        size=digest.size if run is not None else len(data),
        sha256=digest.sha256 if run is not None else hashlib.sha256(data).hexdigest(),
        content_id=content_id,
        is_inline=disposition == "inline" or (disposition is None and bool(content_id)),
        nested=nested,
        origin=origin,
    )
    position = len(walk.attachments)
    walk.attachments.append((path, attachment, part))
    # An archive or a .msg: its files are listed after it (intake.mime.containers).
    expanded = containers.expand(walk, part=part, path=path, attachment=attachment, data=data)
    if expanded is not attachment:
        walk.attachments[position] = (path, expanded, part)


def attachment_payload(parsed: ParsedMessage, index: int) -> bytes:
    """Decoded bytes of `parsed.attachments[index]` (decoded again from the parsed message; a file from a
    winmail.dat, an archive or a .msg is unpacked again; b"" for an archive member that cannot be had
    within `intake.mime.archives`' limits)."""
    return decoded_part_bytes(parsed._attachment_parts[index])


def _readable(data: bytes | spool.Run, spool_threshold: int) -> BinaryIO:
    if isinstance(data, bytes):
        return io.BytesIO(data)  # shares the bytes: no copy
    try:
        # A SpooledTemporaryFile in binary mode is a binary file (typeshed types it IO[bytes] only).
        return cast(BinaryIO, spool.spooled(data, spool_threshold))
    except OSError:  # no room in the temporary directory: in memory, as before spooling
        return io.BytesIO(spool.whole(data))


def attachment_file(
    parsed: ParsedMessage, index: int, *, spool_threshold: int = spool.DEFAULT_SPOOL_THRESHOLD
) -> BinaryIO:
    """`attachment_payload` as a readable binary file, rewound; the caller closes it. A large base64 part is
    decoded a block at a time into a spooled temporary file (on disk above `spool_threshold` bytes,
    deleted when closed), never held whole."""
    part = parsed._attachment_parts[index]
    run = spooled_run(part)
    return _readable(run if run is not None else decoded_part_bytes(part), spool_threshold)


def iter_attachment_files(
    parsed: ParsedMessage, *, spool_threshold: int = spool.DEFAULT_SPOOL_THRESHOLD
) -> Iterator[tuple[Attachment, BinaryIO]]:
    """`iter_attachment_payloads` with each payload as a readable file (as `attachment_file` makes it),
    closed when the next one is asked for or the loop ends: one spool file at a time."""
    for attachment, data in _payloads(parsed):
        file = _readable(data, spool_threshold)
        try:
            yield attachment, file
        finally:
            file.close()


def iter_attachment_payloads(parsed: ParsedMessage) -> Iterator[tuple[Attachment, bytes]]:
    """Each attachment with its decoded bytes, one at a time (for scanning).

    Only one payload is alive at a time if the caller drops it before the next; the
    files of one winmail.dat come from one unpacking of it, dropped after the last;
    the members of one archive or .msg likewise (`intake.mime.containers.Payloads`:
    an archive's are read in one pass, at most `archives.MAX_DECOMPRESSED_BYTES`).
    A part that could not be decoded at parse time yields b"" (its size is 0 too),
    and so does an archive member past those limits (the archive itself is scanned
    whole: clamd looks inside archives with its own limits).
    """
    for attachment, data in _payloads(parsed):
        yield attachment, data if isinstance(data, bytes) else spool.whole(data)


def _payloads(parsed: ParsedMessage) -> Iterator[tuple[Attachment, bytes | spool.Run]]:
    """What `iter_attachment_payloads` yields, a spooled part as its `spool.Run`, not decoded yet."""
    unpacked_from: Message | None = None
    unpacked: tnef.Unpacked | None = None
    members = containers.Payloads(parsed._attachment_parts, decoded_part_bytes)
    for attachment, part in zip(parsed.attachments, parsed._attachment_parts, strict=True):
        try:
            data: bytes | spool.Run
            if isinstance(part, (containers.ArchiveMember, containers.MsgMember)):
                data = members.get(part)
            elif isinstance(part, TnefMember):
                if part.container is not unpacked_from:
                    unpacked_from, unpacked = part.container, None
                    unpacked = tnef.unpack(decoded_part_bytes(part.container))
                data = _tnef_member_bytes(unpacked, part.index)
            else:
                unpacked_from = unpacked = None
                data = spooled_run(part) or decoded_part_bytes(part)
        except Exception:
            data = b""
        yield attachment, data

"""Outlook's saved messages (.msg, an OLE compound file): the files and the body inside one.

    unpack(data) -> Unpacked | None      # None: not a .msg that can be opened within the limits

Outlook attaches a message dragged onto another as a `.msg` file (libmagic:
application/vnd.ms-outlook). Like a winmail.dat (`intake.mime.tnef`), its
files are what matters: `intake.mime` keeps the .msg itself listed (it is the
file a desk receives) and lists the files inside after it, `nested=True`,
`origin="outlook"`, so that the type policy judges each and the scanner scans
each. Its body is kept as a body of last resort, like a winmail.dat's.

The file is read by `extract-msg` (over olefile). A .msg larger than
`MAX_MSG_BYTES`, with more than `MAX_MEMBERS` attachments or `MAX_MEMBER_BYTES`
of them, one that is not a message extract-msg knows, or one it fails on
gives None: the caller sends the message to a person, since its files were not
examined. A message attached inside the .msg is listed as one more `.msg`
(its bytes as extract-msg writes them), not opened further. Never raises.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .htmltext import html_to_text

if TYPE_CHECKING:
    from extract_msg.attachments import AttachmentBase, SignedAttachment

# extract-msg logs warnings for every oddity of a file it reads: input this module judges, not our errors.
logging.getLogger("extract_msg").setLevel(logging.CRITICAL)
logging.getLogger("olefile").setLevel(logging.CRITICAL)

MAX_MSG_BYTES = 25 << 20
MAX_MEMBERS = 200
MAX_MEMBER_BYTES = 64 << 20
MAX_BODY_CHARS = 1 << 20
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
MSG_TYPES = frozenset({"application/vnd.ms-outlook"})


@dataclass
class Member:
    name: str  # long file name, else the short one; "" if none
    mime_type: str  # what Outlook recorded (PR_ATTACH_MIME_TAG), lowercase; "" if none
    data: bytes


@dataclass
class Unpacked:
    members: list[Member] = field(default_factory=list)
    body: str = ""  # readable text of the body, "" if none
    body_source: str = ""  # "plain" or "html"
    subject: str = ""


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


def _member(attachment: AttachmentBase | SignedAttachment) -> Member | None:
    name = _text(getattr(attachment, "longFilename", None)) or _text(getattr(attachment, "shortFilename", None))
    mime_type = _text(getattr(attachment, "mimetype", None)).strip().lower()
    data = attachment.data
    if isinstance(data, (bytes, bytearray)):
        return Member(name=name, mime_type=mime_type, data=bytes(data))
    if hasattr(data, "exportBytes"):  # an attached message: listed as its own .msg
        subject = _text(getattr(data, "subject", None)).strip()
        name = name or f"{subject or 'message'}.msg"
        if not name.lower().endswith(".msg"):
            name += ".msg"
        return Member(name=name, mime_type="application/vnd.ms-outlook", data=bytes(data.exportBytes()))
    return None  # by reference, OLE objects: nothing readable inside the file


def unpack(data: bytes) -> Unpacked | None:
    """The files and body of a .msg; None when it cannot be read within the limits (see the module)."""
    if not data.startswith(OLE_MAGIC) or len(data) > MAX_MSG_BYTES:
        return None
    try:
        import extract_msg

        message = extract_msg.openMsg(data, delayAttachments=True)
    except Exception:
        return None
    try:
        attachments: list[AttachmentBase | SignedAttachment] = list(message.attachments)
        if len(attachments) > MAX_MEMBERS:
            return None
        out = Unpacked(subject=_text(getattr(message, "subject", None)))
        total = 0
        for attachment in attachments:
            member = _member(attachment)
            if member is None:
                continue
            total += len(member.data)
            if total > MAX_MEMBER_BYTES:
                return None
            out.members.append(member)
        # A bare MSGFile (class "IPM", which openMsg gives as is) has no body: the AttributeError gives None.
        body = _text(message.body).replace("\r\n", "\n").strip()  # type: ignore[attr-defined]
        if body:
            out.body, out.body_source = body[:MAX_BODY_CHARS], "plain"
        else:
            html = message.htmlBody  # type: ignore[attr-defined]  # a message's, as `body` was
            html = html.decode("utf-8", "replace") if isinstance(html, bytes) else _text(html)
            text = html_to_text(html) if html else ""
            if text.strip():
                out.body, out.body_source = text.strip()[:MAX_BODY_CHARS], "html"
        return out
    except Exception:
        return None
    finally:
        try:
            message.close()
        except Exception:
            pass

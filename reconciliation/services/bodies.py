"""Message bodies and attachments (the security role): every view and download leaves an audit row."""
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import quote

from intake.mime import attachment_payload, parse_message
from intake.mime.body import alternative_texts
from intake.models import InboxEvent
from intake.services import record_audit
from intake.vocabulary import AuditKind

from .access import ActionRefused, actor_name, require, visible_event
from .roles import PERM_VIEW_BODY


@dataclass
class BodyView:
    available: bool
    subject: str = ""
    sender: str = ""
    text: str = ""
    attachments: list = field(default_factory=list)
    # Every text alternative as sent, (type, text): the ticket got one; a person may need the other.
    alternatives: list = field(default_factory=list)
    purged_at: datetime | None = None  # when retention purged the body (available is then False)


def do_view_message_body(user, event_id: int) -> BodyView:
    """The message text and its attachment list; every view leaves an audit row."""
    require(user, PERM_VIEW_BODY)
    event = visible_event(user, event_id)
    raw, purged_at = InboxEvent.objects.filter(pk=event.pk).values_list("raw", "purged_at").first()
    record_audit(event.pk, AuditKind.BODY_VIEWED, actor=actor_name(user), detail={"purged": raw is None})
    if raw is None:
        return BodyView(available=False, purged_at=purged_at)
    parsed = parse_message(bytes(raw))
    return BodyView(available=True, subject=parsed.subject, sender=parsed.sender, text=parsed.text,
                    attachments=list(parsed.attachments), alternatives=alternative_texts(parsed))


def do_download_attachment(user, event_id: int, index: int):
    """(attachment, bytes) of one attachment; audited like a body view."""
    require(user, PERM_VIEW_BODY)
    event = visible_event(user, event_id)
    raw = InboxEvent.objects.filter(pk=event.pk).values_list("raw", flat=True).first()
    if raw is None:
        raise ActionRefused("the message was purged by retention")
    parsed = parse_message(bytes(raw))
    if not 0 <= index < len(parsed.attachments):
        raise ActionRefused("no such attachment")
    attachment = parsed.attachments[index]
    record_audit(event.pk, AuditKind.ATTACHMENT_DOWNLOADED, actor=actor_name(user), detail={
        "index": index, "sha256": attachment.sha256, "sniffed_type": attachment.sniffed_type})
    return attachment, attachment_payload(parsed, index)


# What a quoted-string filename may hold: printable ASCII but `"` and `\\` (which some clients mishandle escaped).
_QUOTABLE = frozenset(chr(c) for c in range(0x20, 0x7f)) - {'"', "\\"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


def _ascii_form(text: str) -> str:
    """é -> e, ü -> u; every run of what has no ASCII form (Cyrillic, CJK, quotes) -> "_"."""
    out = []
    for char in unicodedata.normalize("NFKD", text):
        if unicodedata.combining(char):
            continue
        char = char if char in _QUOTABLE else "_"
        if not (char == "_" and out and out[-1] == "_"):
            out.append(char)
    return "".join(out).strip()


def attachment_content_disposition(filename: str, *, index: int) -> str:
    """`Content-Disposition` for downloading attachment `index` named `filename` (RFC 6266).

    `filename="<ASCII>"` for every client, and for any other name also
    `filename*=UTF-8''<percent-encoded>` (RFC 8187), which clients prefer. Control characters
    (CR/LF included) are dropped; a name without letters or digits of its own falls back to
    `attachment-<index>` (with its extension).
    """
    name = _CONTROL.sub("", filename or "").strip()
    if not any(char.isalnum() for char in name):
        name = ""
    stem, dot, extension = name.rpartition(".")
    if not dot or not stem:
        stem, extension = name, ""
    ascii_stem, ascii_extension = _ascii_form(stem), _ascii_form(extension)[:20]
    if not any(char.isalnum() for char in ascii_stem):
        ascii_stem = f"attachment-{index}"
    ascii_name = ascii_stem + (f".{ascii_extension}" if any(c.isalnum() for c in ascii_extension) else "")
    disposition = f'attachment; filename="{ascii_name}"'
    if name and name != ascii_name:
        disposition += "; filename*=UTF-8''" + quote(name, safe="!#$&+-.^_`|~")
    return disposition

"""Message bodies and attachments (the security role): every view and download leaves an audit row."""
from dataclasses import dataclass, field
from datetime import datetime

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

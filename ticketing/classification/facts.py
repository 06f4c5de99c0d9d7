"""What rules (and the AI proposer) may look at: `MessageFacts`, built once per event. Pure, no I/O."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MessageFacts:
    recipients: tuple[str, ...] = ()       # To, Cc and Delivered-To (X-Original-To, Envelope-To), lowercase
    sender: str = ""                       # the From address, lowercase
    subject: str = ""
    body: str = ""                         # the readable body text as parsed
    attachment_types: tuple[str, ...] = ()  # sniffed types (what the bytes are), lowercase
    # Results recorded by our own MTA (the mailbox's trusted authserv-id) only: {"dmarc": "pass", ...}.
    auth: dict = field(default_factory=dict)
    is_reply: bool = False

    @classmethod
    def from_event(cls, event, parsed) -> MessageFacts:
        recipients = []
        for address in [*(parsed.recipients or []), *(parsed.delivered_to or [])]:
            address = (address or "").strip().lower()
            if address and address not in recipients:
                recipients.append(address)
        auth = {str(k).lower(): str(v).lower() for k, v in (getattr(event, "auth_results", None) or {}).items()}
        return cls(
            recipients=tuple(recipients),
            sender=(parsed.sender or "").strip().lower(),
            subject=parsed.subject or "",
            body=parsed.text or "",
            attachment_types=tuple((a.sniffed_type or "").lower() for a in parsed.attachments or ()),
            auth=auth,
            is_reply=bool(parsed.in_reply_to or parsed.references),
        )

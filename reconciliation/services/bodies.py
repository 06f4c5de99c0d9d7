"""Message bodies and attachments (the security role): every view and download leaves an audit row.

`do_view_message_body` reads the stored raw message with `intake.mime` and returns what a person reviewing
it needs: the header fields (From, To, Cc, Date, Message-ID), the text the ticket got and each alternative
as sent, every attachment with the verdicts normalization stored on the event, and, when there is no text,
a sentence saying why (encrypted, unreadable, attachments only, purged by retention).
"""

import re
import unicodedata
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.parser import BytesParser
from email.policy import compat32
from email.utils import parsedate_to_datetime
from urllib.parse import quote

from intake.mime import Attachment, attachment_payload, decode_header_value, parse_message
from intake.mime.addresses import parse_address_list
from intake.mime.body import alternative_texts
from intake.mime.headerblock import repair_header_block
from intake.models import InboxEvent
from intake.services import record_audit
from intake.vocabulary import AuditKind, ReasonCode

from .access import ActionRefused, actor_name, require, visible_event
from .roles import PERM_VIEW_BODY

# Defects of `parse_message` that mean the structure itself could not be read (intake.mime.parse).
_UNREADABLE_DEFECTS = ("Unparseable:", "HeadersUnparseable:", "WalkError:", "TooManyBoundaryLines", "NotBytes")
# The findings of normalization (`InboxEvent.details["findings"]`) that name one attachment, and how
# each reads on the body page; the finding's detail starts with the file's name.
_ATTACHMENT_FINDINGS = {
    ReasonCode.MALWARE: "Malware signature found",
    ReasonCode.ATTACHMENT_TYPE: "Refused by the type policy",
    ReasonCode.TOO_LARGE: "Over the size limit",
}
_ENCRYPTION = {"smime": "S/MIME", "pgp": "PGP/MIME"}


@dataclass
class AttachmentRow:
    """One attachment as the body page lists it: the file, its download index and its verdicts in words."""

    index: int
    attachment: Attachment
    verdicts: list[str]
    checked: bool  # normalization judged this message (else: not checked yet)
    note: str = ""  # where the file came from, when that matters


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
    from_: list[str] = field(default_factory=list)  # "Name <address>" as written, names decoded
    to: list[str] = field(default_factory=list)
    cc: list[str] = field(default_factory=list)
    date: datetime | None = None  # the Date header, when it parses
    date_header: str = ""  # the Date header as sent
    message_id: str = ""
    text_source: str = ""  # "plain", "html", "plain+html" or ""
    text_truncated: bool = False
    encrypted: str = ""  # "pgp", "smime" or ""
    attachment_rows: list[AttachmentRow] = field(default_factory=list)
    # Why `text` is empty (or is not the message's words), as a sentence; "" when there is nothing to explain.
    text_note: str = ""


def do_view_message_body(user, event_id: int) -> BodyView:
    """The message's header fields, text, alternatives and attachments; every view leaves an audit row."""
    require(user, PERM_VIEW_BODY)
    event = visible_event(user, event_id)
    raw, purged_at, details = InboxEvent.objects.filter(pk=event.pk).values_list("raw", "purged_at", "details").first()
    record_audit(event.pk, kind=AuditKind.BODY_VIEWED, actor=actor_name(user), detail={"purged": raw is None})
    if raw is None:
        return BodyView(
            available=False,
            purged_at=purged_at,
            text_note="The stored message was purged by retention: there is no text to show.",
        )
    raw = bytes(raw)
    parsed = parse_message(raw)
    headers = header_fields(raw)
    date = message_date(parsed.date)
    rows = attachment_rows(parsed.attachments, details or {}, event.reason_code, event.reason_detail)
    return BodyView(
        available=True,
        subject=parsed.subject,
        sender=parsed.sender,
        text=parsed.text,
        attachments=list(parsed.attachments),
        alternatives=alternative_texts(parsed),
        from_=headers["from"],
        to=headers["to"],
        cc=headers["cc"],
        date=date,
        date_header=parsed.date,
        message_id=parsed.message_id,
        text_source=parsed.body_source,
        text_truncated=parsed.text_truncated,
        encrypted=parsed.encrypted,
        attachment_rows=rows,
        text_note=text_note(parsed),
    )


def header_fields(raw: bytes) -> dict[str, list[str]]:
    """From, To and Cc as lists of "Name <address>", read as `intake.mime` reads them (repaired header
    block, lenient address lists, RFC 2047 names); a header that cannot be read is an empty list."""
    fields = {"from": [], "to": [], "cc": []}
    try:
        block = BytesParser(policy=compat32).parsebytes(repair_header_block(raw)[: 256 * 1024], headersonly=True)
        for name in fields:
            for value in (block.get_all(name) or [])[:5]:
                text = value if isinstance(value, str) else str(value)
                for display, address in parse_address_list(" ".join(text[:8192].split()))[:200]:
                    display = decode_header_value(display, 300) if display else ""
                    if display.strip("'\" ").lower() == address.lower():  # "a@x.test" <a@x.test>: once is enough
                        display = ""
                    shown = f"{display} <{address}>" if display and address else (address or display)
                    if shown:
                        fields[name].append(shown)
    except Exception:  # an operator's view: what cannot be read is left out, never an error page
        pass
    return fields


def message_date(value: str) -> datetime | None:
    """The Date header as an aware datetime (no zone given: UTC), or None when it does not parse."""
    if not value:
        return None
    try:
        date = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return date if date.tzinfo else date.replace(tzinfo=UTC)


def text_note(parsed) -> str:
    """Why the text is empty or is not the sender's words, in a sentence; "" when it needs no word."""
    method = _ENCRYPTION.get(parsed.encrypted, "")
    if method and parsed.text.strip():
        return (
            f"The text is a {'PGP' if parsed.encrypted == 'pgp' else method}-encrypted block: Mailroom holds "
            "no key to read it."
        )
    if method:
        return (
            f"The message is {method} encrypted: its text is inside the encrypted part listed under "
            "Attachments, and Mailroom holds no key to read it."
        )
    unreadable = parsed.too_complex or any(defect.startswith(_UNREADABLE_DEFECTS) for defect in parsed.defects)
    if parsed.text.strip():
        if unreadable:
            return (
                "Mailroom could not read every part of this message (its structure is beyond the parser's "
                "limits): the text below may be incomplete, or raw MIME."
            )
        if parsed.text_truncated:
            return "The text was longer than Mailroom keeps (1 MiB): it is cut at a paragraph boundary."
        return ""
    if unreadable:
        return (
            "Mailroom could not read this message's structure, so no text was found; the raw message is kept unchanged."
        )
    if parsed.attachments:
        return "The message has no body text, only the attachments listed below."
    return "The message has no body text and no attachments."


def attachment_rows(attachments, details: dict, reason_code: str = "", reason_detail: str = "") -> list[AttachmentRow]:
    """Each attachment with the findings normalization stored on the event that name it."""
    findings = [f for f in details.get("findings") or [] if isinstance(f, dict)]
    if reason_code:  # the event's own reason (also when it was set without a findings list)
        findings.append({"reason": reason_code, "detail": reason_detail or ""})
    checked = "findings" in details or bool(reason_code)
    rows = []
    for index, attachment in enumerate(attachments):
        label = attachment.filename or "(unnamed)"
        verdicts = []
        for finding in findings:
            heading = _ATTACHMENT_FINDINGS.get(finding.get("reason"))
            detail = str(finding.get("detail") or "")
            if heading is None or not detail.startswith((f"{label}: ", f"{label} is ")):
                continue
            verdict = f"{heading}: {detail.removeprefix(f'{label}: ')}"
            if verdict not in verdicts:
                verdicts.append(verdict)
        rows.append(
            AttachmentRow(
                index=index, attachment=attachment, verdicts=verdicts, checked=checked, note=_origin_note(attachment)
            )
        )
    return rows


def _origin_note(attachment: Attachment) -> str:
    if attachment.origin == "encrypted":
        return "encrypted content (not judged by the type policy)"
    if attachment.origin == "tnef":
        return "unpacked from a winmail.dat"
    if attachment.nested:
        return "inside an attached message"
    if attachment.is_inline:
        return "inline"
    return ""


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
    record_audit(
        event.pk,
        kind=AuditKind.ATTACHMENT_DOWNLOADED,
        actor=actor_name(user),
        detail={"index": index, "sha256": attachment.sha256, "sniffed_type": attachment.sniffed_type},
    )
    return attachment, attachment_payload(parsed, index)


# What a quoted-string filename may hold: printable ASCII but `"` and `\\` (which some clients mishandle escaped).
_QUOTABLE = frozenset(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\"}
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

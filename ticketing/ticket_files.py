"""Which of a message's files go to its desk, and the list of them the ticket's description ends with.

A file goes when it passed the mailbox's type policy and the scanner (a message released from
quarantine still keeps its refused files in Mailroom), is not empty, is not encrypted payload, is not
inside an attached message (the attached message goes whole), and fits the kind's declared limits
(`Capabilities.max_file_bytes`, `max_files`). Every other file is held: listed on the ticket with why and
a link to it in the console. Inline images the HTML shows travel as inline files where the desk takes
HTML. Everything here is computed from the stored message alone: every attempt sends the same thing.
"""

import hashlib
import mimetypes
from dataclasses import replace
from functools import partial

from django.conf import settings

from intake.mime import attachment_payload
from intake.normalize import policy_for
from intake.validation import attachment_type_problem

from .destinations.base import HeldFile, OutgoingFile
from .destinations.capabilities import FILES_NONE, Capabilities
from .rich_body import content_ids

MALWARE = "malware"


def _name(attachment, index: int) -> str:
    if attachment.filename:
        return attachment.filename
    extension = mimetypes.guess_extension(attachment.sniffed_type or attachment.declared_type or "") or ".bin"
    return f"attachment-{index + 1}{extension}"


def _infected(event) -> set[str]:
    """Names of files the scanner flagged (normalization keeps its findings on the event)."""
    names = set()
    for finding in (event.details or {}).get("findings") or []:
        if finding.get("reason") == MALWARE:
            names.add(str(finding.get("detail", "")).split(":", 1)[0])
    return names


def _size_words(size: int) -> str:
    if size >= 1024 * 1024:
        return f"{size / (1024 * 1024):.1f} MB"
    if size >= 1024:
        return f"{size / 1024:.0f} KB"
    return f"{size} bytes"


def console_url(event, index: int) -> str:
    base = settings.MAILROOM_PUBLIC_URL.rstrip("/")
    return f"{base}/admin/reconciliation/recoveryitem/{event.pk}/attachment/{index}/"


def effective_capabilities(adapter) -> Capabilities:
    """The kind's capabilities with the destination's own `max_file_bytes` (a plan's lower limit) applied."""
    capabilities = adapter.capabilities
    limit = (getattr(adapter.destination, "settings", None) or {}).get("max_file_bytes")
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < capabilities.max_file_bytes:
        capabilities = replace(capabilities, max_file_bytes=limit)
    return capabilities


def select_files(
    event, parsed, capabilities: Capabilities, *, html: str = ""
) -> tuple[tuple[OutgoingFile, ...], tuple[HeldFile, ...]]:
    """(the files to send, the files held back) for `event`'s ticket on a desk with `capabilities`."""
    try:
        limits = policy_for(event.mailbox).attachments
    except ValueError:
        limits = None  # a broken policy sent the message to review; whoever released it decided
    infected = _infected(event)
    shown_inline = content_ids(html) if capabilities.html else set()
    sending, held = [], []
    for index, attachment in enumerate(parsed.attachments):
        if attachment.nested or attachment.size == 0:
            continue  # the attached message goes whole; an empty part is nothing to send
        name = _name(attachment, index)
        reason = None
        if capabilities.files == FILES_NONE:
            reason = "this destination takes no files"
        elif attachment.origin == "encrypted":
            reason = "encrypted content"
        elif attachment.filename in infected or (not attachment.filename and "(unnamed)" in infected):
            reason = "flagged by the malware scanner"
        elif limits is not None and (problem := attachment_type_problem(attachment, limits)):
            reason = f"not allowed: {problem}"
        elif attachment.size > capabilities.max_file_bytes:
            reason = f"over this help desk's {_size_words(capabilities.max_file_bytes)} limit per file"
        elif len(sending) >= capabilities.max_files:
            reason = f"over this help desk's limit of {capabilities.max_files} files"
        if reason:
            held.append(HeldFile(filename=name, size=attachment.size, reason=reason, index=index))
            continue
        inline = bool(attachment.content_id) and attachment.content_id in shown_inline
        sending.append(
            OutgoingFile(
                index=index,
                filename=name,
                content_type=attachment.sniffed_type or attachment.declared_type,
                size=attachment.size,
                sha256=attachment.sha256,
                content_id=attachment.content_id,
                inline=inline,
                payload=partial(_payload, parsed, index, attachment.sha256),
            )
        )
    return tuple(sending), tuple(held)


def _payload(parsed, index: int, sha256: str) -> bytes:
    data = attachment_payload(parsed, index)
    if hashlib.sha256(data).hexdigest() != sha256:
        # Never a file other than the one judged: the stored message must decode the same way.
        raise ValueError(f"attachment {index} decodes differently from when it was checked")
    return data


def file_list(event, files, held) -> str:
    """The lines the description ends with: every file by name and size, the held ones with why and where."""
    if not files and not held:
        return ""
    lines = ["", "", "Attachments:"]
    for file in files:
        lines.append(f"- {file.filename} ({_size_words(file.size)}{', shown inline' if file.inline else ''})")
    for file in held:
        lines.append(
            f"- {file.filename} ({_size_words(file.size)}) not attached here, {file.reason}; "
            f"kept in Mailroom: {console_url(event, file.index)}"
        )
    return "\n".join(lines)

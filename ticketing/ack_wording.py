"""The words of one acknowledgment: the tenant's template for the requester's language, or the built-in text.

Read from the stored message only (its headers and text), so every attempt writes the same email; the
"we will answer by" time is counted from when the acknowledgment was planned (`intent.created_at`).
`wording` raises TemplateProblem when the template cannot be rendered within its limits
(`ticketing.ack_templates`); the caller then sends nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from django.db.models import BinaryField
from django.db.models.functions import Substr

from intake.mime.parse import parse_message
from intake.models import InboxEvent
from intake.validation.authresults import header_fields

from . import ack_language, ack_selectors, ack_templates

MESSAGE_HEAD_BYTES = 512 * 1024


@dataclass(frozen=True)
class Wording:
    subject: str  # without the [#MR-n] in front
    body: str
    detail: dict = field(default_factory=dict)  # for the audit row: template, language and how it was found


def _builtin(*, token: str, subject: str, sla_hours, kept: ack_templates.Promise, mailbox: str) -> Wording:
    if kept.answer_by:
        promise = f"We will answer by {kept.answer_by}.\n\n"
    elif sla_hours:
        promise = f"We aim to answer within {int(sla_hours)} hours.\n\n"
    else:
        promise = ""
    body = (
        f"Hello,\n\nwe have received your request and opened ticket {token}.\n\n{promise}"
        f"Reply to this email to add to it; keep [#{token}] in the subject.\n\n-- \n{mailbox}\n"
    )
    return Wording(
        subject=("Re: " + subject) if subject else "We have received your request",
        body=body,
        detail={"template": "builtin"},
    )


def _message(event: InboxEvent) -> tuple[str, str, str]:
    """(Content-Language, the body text, the sender's display name) of the stored message, read from its
    start only: the headers and first paragraphs say all this, and a 25 MB attachment is not parsed for it."""
    raw = bytes(
        InboxEvent.objects.filter(pk=event.pk)
        .annotate(head=Substr("raw", 1, MESSAGE_HEAD_BYTES, output_field=BinaryField()))
        .values_list("head", flat=True)
        .first()
        or b""
    )
    if not raw:
        return "", "", ""  # purged: the subject alone is left to judge by
    header = next((value for name, value in header_fields(raw) if name == "content-language"), "")
    parsed = parse_message(raw)
    return header, parsed.text[: ack_language.MAX_DETECT_CHARS], parsed.sender_name


def wording(*, event: InboxEvent, token: str, echo_subject: bool, sla_hours, planned_at) -> Wording:
    """The subject and body for `event`'s acknowledgment. `echo_subject`: the sender is authenticated, so
    their own subject may be written back to them."""
    subject = " ".join((event.subject or "").split())[:200] if echo_subject else ""
    kept = ack_templates.promise(
        ack_selectors.hours_for(tenant_id=event.tenant_id, mailbox_id=event.mailbox_id), start=planned_at
    )
    languages = ack_selectors.candidate_languages(tenant_id=event.tenant_id)
    if not languages and not ack_selectors.template_for(
        tenant_id=event.tenant_id, mailbox_id=event.mailbox_id, language=""
    ):
        return _builtin(token=token, subject=subject, sla_hours=sla_hours, kept=kept, mailbox=event.mailbox.address)
    header, text, name = _message(event)
    started = time.perf_counter()
    language, found_by = ack_language.language_of(header=header, text=text or event.subject or "", languages=languages)
    detect_ms = round((time.perf_counter() - started) * 1000, 2)
    template = ack_selectors.template_for(tenant_id=event.tenant_id, mailbox_id=event.mailbox_id, language=language)
    if template is None:
        built = _builtin(token=token, subject=subject, sla_hours=sla_hours, kept=kept, mailbox=event.mailbox.address)
        return Wording(built.subject, built.body, {**built.detail, "language": language, "found_by": found_by})
    # Like the subject, the display name is the sender's own words: echoed only to an authenticated sender (a
    # forged From's name, "Claim your refund at evil.example", must not go out from the tenant's address).
    values = ack_templates.values(
        requester_name=name if echo_subject else "",
        ticket_number=token,
        subject=subject,
        mailbox=event.mailbox.address,
        kept=kept,
    )
    rendered_subject, body = ack_templates.render(subject=template.subject, body=template.body, values=values)
    return Wording(
        subject=rendered_subject or "We have received your request",
        body=body,
        detail={"template": template.pk, "language": language, "found_by": found_by, "detect_ms": detect_ms},
    )

"""Saving acknowledgment templates and business hours, and previewing what a template sends.

The permission lives here, not only in the admin's form: an actor saves a row only for a tenant they are a
member of (a superuser for any), and only with a mailbox of that same tenant. Every save runs the model's
checks (`full_clean`: the template sandbox's rules, the hours' settings).
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from intake.selectors import visible_tenants

from . import ack_selectors, ack_templates
from .ack_models import AcknowledgmentTemplate, BusinessHours


def _check_scope(*, actor, row) -> None:
    if not visible_tenants(actor).filter(pk=row.tenant_id).exists():
        raise PermissionDenied("You may only change your own tenant's acknowledgments.")
    if row.mailbox_id is not None and row.mailbox.tenant_id != row.tenant_id:
        raise PermissionDenied("This mailbox belongs to another tenant.")


def _save(*, actor, row):
    _check_scope(actor=actor, row=row)
    row.full_clean()
    row.updated_by = actor.get_username()
    with transaction.atomic():
        row.save()
    return row


def save_template(*, actor, template: AcknowledgmentTemplate) -> AcknowledgmentTemplate:
    """Check and store `template` as `actor` wrote it. Raises PermissionDenied or ValidationError."""
    return _save(actor=actor, row=template)


def save_business_hours(*, actor, hours: BusinessHours) -> BusinessHours:
    """Check and store `hours` as `actor` set them. Raises PermissionDenied or ValidationError."""
    return _save(actor=actor, row=hours)


def preview(*, template: AcknowledgmentTemplate, now=None) -> dict:
    """What `template` sends for a sample request received `now`, with its mailbox's (or the tenant's) hours:
    {"subject", "body", "answer_by", "problem"} (problem: why nothing would be sent)."""
    now = now or timezone.now()
    mailbox = template.mailbox
    kept = ack_templates.promise(
        ack_selectors.hours_for(tenant_id=template.tenant_id, mailbox_id=mailbox.pk if mailbox else None), start=now
    )
    sample = {**ack_templates.SAMPLE_VALUES, "business_hours": kept.business_hours, "answer_by": kept.answer_by}
    if mailbox is not None:
        sample["mailbox"] = mailbox.address
    try:
        subject, body = ack_templates.render(subject=template.subject, body=template.body, values=sample)
    except ack_templates.TemplateProblem as exc:
        return {"subject": "", "body": "", "answer_by": kept.answer_by, "problem": str(exc)}
    return {
        "subject": f"[#{sample['ticket_number']}] {subject}",
        "body": body,
        "answer_by": kept.answer_by,
        "problem": "",
    }

"""Which acknowledgment template and which business hours answer a message (reads only)."""

from __future__ import annotations

from django.db.models import Q

from .ack_models import AcknowledgmentTemplate, BusinessHours


def candidate_languages(*, tenant_id: int) -> frozenset[str]:
    """The languages the tenant has templates for (what the detector tells apart)."""
    return frozenset(
        AcknowledgmentTemplate.objects.filter(tenant_id=tenant_id)
        .exclude(language="")
        .values_list("language", flat=True)
    )


def template_for(*, tenant_id: int, mailbox_id: int, language: str) -> AcknowledgmentTemplate | None:
    """The mailbox's template for `language`, the tenant's, the mailbox's fallback, the tenant's; or None."""
    rank = {(mailbox_id, language): 0, (None, language): 1, (mailbox_id, ""): 2, (None, ""): 3}
    rows = AcknowledgmentTemplate.objects.filter(
        Q(mailbox_id=mailbox_id) | Q(mailbox__isnull=True), tenant_id=tenant_id, language__in={language, ""}
    )
    return min(rows, key=lambda row: rank[(row.mailbox_id, row.language)], default=None)


def hours_for(*, tenant_id: int, mailbox_id: int) -> BusinessHours | None:
    """The mailbox's business hours, else the tenant's."""
    rows = BusinessHours.objects.filter(Q(mailbox_id=mailbox_id) | Q(mailbox__isnull=True), tenant_id=tenant_id)
    return min(rows, key=lambda row: row.mailbox_id is None, default=None)

"""A flood of items in the recovery queue, and what bulk jobs wrote for them (reconciliation.services.bulk_jobs)."""

from collections import Counter

from intake.models import AuditEvent, InboxEvent
from intake.services import transition_event
from intake.vocabulary import AuditKind
from tests.support.queue import new_event

FLOOD_SENDER = "promo@flood.test"
FLOOD_REASON = "sender_rate_limited"
CLOSE_REASON = "spam wave from flood.test"


def flood(mailbox, n, *, reason=FLOOD_REASON, sender=FLOOD_SENDER, subject="WIN a cruise") -> list[int]:
    """`n` items in the queue (awaiting_review with `reason`), as normalization leaves them."""
    ids = []
    for i in range(n):
        event_id = new_event(mailbox, subject=f"{subject} {i}", sender=sender, to=mailbox.address)
        InboxEvent.objects.filter(pk=event_id).update(sender=sender, subject=f"{subject} {i}")
        assert transition_event(
            event_id,
            InboxEvent.OPEN_STATES,
            InboxEvent.State.AWAITING_REVIEW,
            actor="system:test",
            kind=AuditKind.AWAITING_REVIEW,
            reason_code=reason,
        )
        ids.append(event_id)
    return ids


def kinds_of(ids) -> Counter:
    return Counter(AuditEvent.objects.filter(inbox_event_id__in=list(ids)).values_list("kind", flat=True))


def applied_per_item(job_id) -> Counter:
    return Counter(
        AuditEvent.objects.filter(kind=AuditKind.BULK_JOB_APPLIED, detail__bulk_job=job_id).values_list(
            "inbox_event_id", flat=True
        )
    )

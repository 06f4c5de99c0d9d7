"""Outbox rows unpublished longer than MAILROOM_OUTBOX_STUCK_SECONDS (300): `outbox_stuck`.

Read through the partial index of unpublished rows (`outbox_unpublished`), oldest first, at most
MAILROOM_RECONCILE_LIMIT: its size is the unpublished head, never the table. Not repaired here:
the relay (and its beat backstop) publishes; a stuck row says the relay is down or failing, and
the finding is resolved "published" once the row was published (or purged).
"""

from datetime import timedelta

from intake.models import OutboxMessage
from intake.selectors import drill_outbox

from ..models import Finding
from .base import ALL, limit, open_findings, recording, resolve, setting

KIND = "outbox"


def reconcile_outbox(summaries: list, now) -> None:
    with recording(KIND, ALL, summaries, now) as current:
        budget = limit()
        open_rows = list(open_findings(Finding.Kind.OUTBOX_STUCK).values_list("pk", "object")[:budget])
        ids = {int(obj.split(":", 1)[1]): pk for pk, obj in open_rows}
        still = set(
            OutboxMessage.objects.filter(pk__in=list(ids), published_at__isnull=True).values_list("pk", flat=True)
        )
        for outbox_id, finding_id in ids.items():
            if outbox_id not in still:
                resolve(finding_id, "published", current.now)
        cutoff = current.now - timedelta(seconds=float(setting("MAILROOM_OUTBOX_STUCK_SECONDS", 300)))
        rows = list(
            OutboxMessage.objects.filter(published_at__isnull=True, created_at__lt=cutoff)
            .exclude(drill_outbox())
            .order_by("pk")  # a drill's rows go with it (reconciliation.drills)
            .values_list("pk", "topic", "payload", "created_at", "attempts")[:budget]
        )
        current.run.scanned = len(rows)
        for pk, topic, payload, created_at, attempts in rows:
            event_id = payload.get("inbox_event_id") if isinstance(payload, dict) else None
            current.found(
                Finding.Kind.OUTBOX_STUCK,
                f"outbox:{pk}",
                inbox_event_id=event_id,
                detail={
                    "topic": topic,
                    "attempts": attempts,
                    "created_at": created_at.isoformat(),
                    "age_seconds": int((current.now - created_at).total_seconds()),
                },
            )
        current.run.cursor = {}

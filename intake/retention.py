"""Retention of raw messages (docs/design.md §2, "Retention"): the body goes, the evidence stays.

An event's `raw` (the MIME, and with it every attachment) is set to NULL and `purged_at` stamped once it
was received more than `MAILROOM_RAW_RETENTION_DAYS` ago (default 90; per tenant
`Tenant.settings["raw_retention_days"]`). Everything else is kept: the metadata (sender, subject,
Message-ID, size, `details` with the attachment names, types and sha256), state and reason, route,
intents, mappings and the audit trail.

Never purged:
- an event under legal hold (`InboxEvent.legal_hold`, set by `set_legal_hold`);
- an open event (received, ready, write_pending): a worker still needs the message;
- an event in the recovery queue (a recovery state, or any held intent): a person may need the body to
  decide. It is purged by the first run after it left the queue.
Suppressed and completed events are purged: a replay after that finds no body (normalize sees an empty
message and sends the event to review).

The same run deletes ticketing's expired bounce marks (`ticketing.bounces`, reached by their reverse name
`Tenant.undeliverable_addresses`): once expired they skip no acknowledgment, and they hold an address.

Each run is audited: every purged event gets an `AuditEvent` `purged` (actor `retention`, detail
`{"run": <uuid of the run>, "retention_days": N}`), written in bulk in the transaction that purges its
batch, so an event's timeline says when and by which run; the run's totals are logged and returned.
Runs are bounded: batches of `MAILROOM_RETENTION_BATCH` rows, at most `MAILROOM_RETENTION_MAX_BATCHES` per
tenant per run (beat runs it hourly, a backlog drains over several runs). Rows are taken
`FOR UPDATE SKIP LOCKED`: a row a worker holds waits for the next run, and while a row is locked here no
state change can slip between the checks and the purge.
"""

import logging
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .models import AuditEvent, InboxEvent, Tenant
from .services import record_audit
from .vocabulary import AuditKind

logger = logging.getLogger(__name__)

ACTOR = "retention"
# ticketing's Intent, by its reverse name (intake imports nothing of ticketing): a held intent puts its
# event in the recovery queue whatever the event's state.
HELD_INTENT_LOOKUP = {"intents__state": "held"}
BOUNCE_MARKS = "undeliverable_addresses"  # ticketing's UndeliverableAddress, by its reverse name on Tenant


def retention_days(tenant: Tenant) -> int:
    return tenant.int_setting("raw_retention_days", settings.MAILROOM_RAW_RETENTION_DAYS)


def purgeable(tenant: Tenant, now=None):
    """The tenant's events whose body may be purged now, oldest first."""
    cutoff = (now or timezone.now()) - timedelta(days=retention_days(tenant))
    return (
        InboxEvent.objects.filter(tenant_id=tenant.pk, purged_at__isnull=True, received_at__lt=cutoff, legal_hold=False)
        .exclude(state__in=[*InboxEvent.OPEN_STATES, *InboxEvent.RECOVERY_STATES])
        .exclude(**HELD_INTENT_LOOKUP)
        .order_by("received_at", "pk")
    )


def purge_expired_bodies(now=None, batch_size: int | None = None, max_batches: int | None = None) -> dict:
    """One retention run over every tenant; returns {"run", "purged", "batches", "tenants"}."""
    now = now or timezone.now()
    batch_size = batch_size or settings.MAILROOM_RETENTION_BATCH
    max_batches = max_batches or settings.MAILROOM_RETENTION_MAX_BATCHES
    run = str(uuid.uuid4())
    purged = batches = 0
    tenants = {}
    # Not a drill tenant's (reconciliation.drills): its rows are evidence kept on purpose (`drill --keep`).
    for tenant in Tenant.objects.filter(is_drill=False).only("pk", "slug", "settings").order_by("pk"):
        days = retention_days(tenant)
        for _ in range(max_batches):
            count = _purge_batch(purgeable(tenant, now), batch_size, now, {"run": run, "retention_days": days})
            if count:
                batches += 1
                purged += count
                tenants[tenant.slug] = tenants.get(tenant.slug, 0) + count
            if count < batch_size:
                break
    marks = purge_expired_marks(now)
    logger.info("retention run %s purged %d bodies in %d batches, %d expired bounce marks", run, purged, batches, marks)
    return {"run": run, "purged": purged, "batches": batches, "tenants": tenants, "marks": marks}


def purge_expired_marks(now=None) -> int:
    """Delete the bounce marks whose time is up (ticketing.bounces); returns how many."""
    marks = Tenant._meta.get_field(BOUNCE_MARKS).related_model
    deleted, _ = marks.objects.filter(expires_at__lte=now or timezone.now()).delete()
    return deleted


def _purge_batch(candidates, batch_size: int, now, detail: dict) -> int:
    with transaction.atomic():
        ids = list(
            candidates.select_for_update(skip_locked=True, of=("self",)).values_list("pk", flat=True)[:batch_size]
        )
        if not ids:
            return 0
        InboxEvent.objects.filter(pk__in=ids).update(raw=None, purged_at=now)
        AuditEvent.objects.bulk_create(
            [AuditEvent(inbox_event_id=pk, kind=AuditKind.PURGED, actor=ACTOR, detail=detail, at=now) for pk in ids]
        )
    return len(ids)


def set_legal_hold(event_id: int, on: bool, actor: str, note: str = "") -> bool:
    """Place (on=True) or release a legal hold; audited. False when the event was already so."""
    with transaction.atomic():
        changed = InboxEvent.objects.filter(pk=event_id, legal_hold=not on).update(legal_hold=on)
        if changed:
            record_audit(
                event_id,
                kind=AuditKind.LEGAL_HOLD_SET if on else AuditKind.LEGAL_HOLD_RELEASED,
                actor=actor,
                detail={"note": note} if note else {},
            )
    return bool(changed)

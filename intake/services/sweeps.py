"""What the beat runs over stored events: requeue the ones that made no progress (past the take cap they
become `failed/poison`), and purge old webhook nonces."""

import logging
import operator
from datetime import datetime, timedelta
from functools import reduce

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Least
from django.utils import timezone

from .. import selectors
from ..models import MAX_REQUEUE_DOUBLINGS, InboxEvent, WebhookNonce
from ..vocabulary import AuditKind, ReasonCode, SystemActor
from .events import STALE_CANDIDATE_STATES, record_audit, transition_event
from .outbox import PROCESS_TOPIC, enqueue_outbox

logger = logging.getLogger(__name__)


# A requeue that no worker took yet doubles the wait before the next one, up to 2**4 = 16 windows
# (80 minutes at the default 300 s): a lost task is still found, and a backlog longer than the window
# is not multiplied by copies of itself, each of which a worker would have to take.
MAX_BACKOFF_DOUBLINGS = MAX_REQUEUE_DOUBLINGS


# ticketing's Intent states whose own sweeps (expire_claims, enqueue_due) bring the event back: requeuing
# the event as well would hand the same call to the pool again each window while it waits in a backlog.
INTENT_STATES_WATCHED_BY_THE_INTENT = ("pending", "in_flight", "retry_wait")


def stale_for_requeue(now: datetime, stale_after: float) -> Q:
    """Events whose last take or requeue is older than the window, doubled once per requeue since taken."""
    windows = [
        Q(requeues=n, updated_at__lt=now - timedelta(seconds=stale_after * 2**n)) for n in range(MAX_BACKOFF_DOUBLINGS)
    ]
    windows.append(
        Q(
            requeues__gte=MAX_BACKOFF_DOUBLINGS,
            updated_at__lt=now - timedelta(seconds=stale_after * 2**MAX_BACKOFF_DOUBLINGS),
        )
    )
    return reduce(operator.or_, windows)


def requeue_stale_events(older_than_seconds: int | None = None, limit: int = 1000) -> dict[str, int]:
    """Find events that made no progress and hand them to the broker again.

    Whatever was lost between the database and the broker (a relay that died
    after publishing, a message dropped by a broker, a worker killed while it
    held the task) is found here. An event that workers took
    `MAILROOM_MAX_DISPATCHES` times (`record_taken`) without progress is a
    poison message and goes to the recovery queue instead; one that only waited
    in a busy broker was never taken, so a backlog, however long, poisons
    nothing, and each requeue no worker took doubles the wait before the next
    (`stale_for_requeue`), so a backlog is not filled with copies of itself.
    An event that waits on purpose (`retry_at`: a pause, an unreachable scanner) is requeued when its wait is over.
    """
    if selectors.global_pause_on():
        return {"requeued": 0, "poisoned": 0, "paused": True}
    stale_after = older_than_seconds if older_than_seconds is not None else settings.MAILROOM_STALE_EVENT_SECONDS
    now = timezone.now()
    cutoff = now - timedelta(seconds=stale_after)
    requeued = poisoned = 0
    stale = stale_for_requeue(now, stale_after)
    candidates = list(
        InboxEvent.objects.filter(state__in=STALE_CANDIDATE_STATES, mailbox__paused=False)
        .exclude(tenant_id__in=selectors.paused_tenant_ids())  # a tenant's pause parks like a mailbox's
        .exclude(tenant_id__in=selectors.drill_tenants())  # a drill drives its own events (reconciliation.drills)
        # write_pending events belong to their intent, whose own sweeps watch them; so does a ready event
        # whose intent is waiting or running (a call in the destination pool's queue, a claim, a retry),
        # unless the event itself was parked to try again (`retry_at`: over a destination's cap inline).
        .filter(
            (Q(retry_at__isnull=True) & stale & ~Q(intents__state__in=INTENT_STATES_WATCHED_BY_THE_INTENT))
            | Q(retry_at__lte=now)
        )
        .order_by("updated_at")
        .values_list("pk", "state", "dispatch_count", "retry_at")[:limit]
    )
    for event_id, state, dispatches, retry_at in candidates:
        if retry_at is None and dispatches >= settings.MAILROOM_MAX_DISPATCHES:
            if transition_event(
                event_id,
                [state],
                InboxEvent.State.FAILED,
                actor=SystemActor.SWEEP,
                kind=AuditKind.POISON,
                reason_code=ReasonCode.POISON,
                reason_detail=f"dispatched {dispatches} times without progress",
                audit_detail={"dispatches": dispatches},
                now=now,
                only_if={"retry_at__isnull": True, "updated_at__lt": cutoff},
            ):
                poisoned += 1
            continue
        with transaction.atomic():
            if retry_at is not None:
                if InboxEvent.objects.filter(pk=event_id, state=state, retry_at=retry_at).update(
                    retry_at=None, updated_at=now
                ):
                    enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": event_id}, now=now)
                    requeued += 1
                continue
            still_stale = InboxEvent.objects.filter(stale, pk=event_id, state=state, retry_at__isnull=True)
            if still_stale.update(updated_at=now, requeues=Least(F("requeues") + 1, MAX_BACKOFF_DOUBLINGS)):
                enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": event_id}, now=now)
                record_audit(
                    event_id, kind=AuditKind.REQUEUED, actor=SystemActor.SWEEP, detail={"state": state}, at=now
                )
                requeued += 1
    if requeued or poisoned:
        logger.warning("stale-event sweep: requeued %d, poisoned %d", requeued, poisoned)
    return {"requeued": requeued, "poisoned": poisoned}


def purge_webhook_nonces(older_than_seconds: int | None = None) -> int:
    """One-time tokens outlive their use only as long as a replay could still be fresh."""
    keep = older_than_seconds if older_than_seconds is not None else 2 * settings.MAILROOM_SIGNATURE_TOLERANCE_SECONDS
    deleted, _ = WebhookNonce.objects.filter(seen_at__lt=timezone.now() - timedelta(seconds=keep)).delete()
    return deleted

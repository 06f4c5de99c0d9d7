"""Bulkheads for slow destinations: external calls in a pool sized for I/O, capped per destination.

A destination call is I/O. On the per-event path a call that stalls holds a prefork slot for the whole
read timeout, so one tenant's slow desk starves every other tenant. Instead:

- The per-event task (`ticketing.tasks.process_inbox_events`, prefork: parsing, routing, the built-in
  store) creates the intent, the durable record, and hands the call over: `hand_over` publishes
  `ticketing.tasks.call_destination(intent_id)` after the commit, on `MAILROOM_DESTINATION_QUEUE`,
  which a worker with `--pool threads` consumes (`run_stack`). The call task rebuilds the request
  from the stored event (`call`), so it carries only the intent id, and it is safe to run twice: the
  claim decides who calls.
- `claim` caps the calls in flight per destination (`Destination.settings["max_concurrency"]`, else
  `MAILROOM_DESTINATION_MAX_CONCURRENCY`; 0 = no cap) across every worker: in the claim's own
  transaction it counts the destination's live `in_flight` intents, under a transaction-level
  advisory lock per destination so two claimers cannot both see room (SQLite: the IMMEDIATE
  transaction already serialises writers). Over the cap nothing is claimed: the call task is
  published again with a short jittered countdown, and the per-event path parks the event
  (`wait_event`), so the call waits and is never lost. Behind both stand the database sweeps: an event
  still `ready` with a pending intent is re-dispatched by the stale-event sweep.

What stays on the per-event path, inline: thread work (a reply, a ticket token), whose lease must span
the plan, the claim and the call; anything run outside a Celery worker (tests, commands), eagerly, or
with `MAILROOM_DESTINATION_QUEUE=""` (the embedded SQLite default). The cap holds there too.
"""

import logging
import random
import threading
from datetime import datetime
from typing import TYPE_CHECKING, cast

from celery import current_app, current_task
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from . import intents
from .models import Destination, Intent
from .outcomes import Outcome
from .workers import worker_identity as process_identity

if TYPE_CHECKING:
    from .leases import Lease

logger = logging.getLogger(__name__)

CALL_TASK = "ticketing.tasks.call_destination"
LOCK_NAMESPACE = 0x4D524248  # "MRBH": this module's advisory locks, keyed by destination id


def max_concurrency(destination: Destination) -> int:
    value = (destination.settings or {}).get("max_concurrency", settings.MAILROOM_DESTINATION_MAX_CONCURRENCY)
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return cast(int, settings.MAILROOM_DESTINATION_MAX_CONCURRENCY)  # an env.int setting


def in_flight(destination_id: int, now: datetime | None = None) -> int:
    """Calls to the destination in flight now: live claims (an expired one is the sweep's, not a call)."""
    return (
        Intent.objects.filter(
            destination_id=destination_id, state=Intent.State.IN_FLIGHT, claimed_until__gt=now or timezone.now()
        )
        .exclude(action=Intent.Action.NOTIFY_REQUESTER)
        .count()
    )


def claim(intent: Intent, worker: str, lease: "Lease | None" = None) -> str:
    """`intents.claim` under the destination's cap: Outcome.CLAIMED, BUSY (someone else has it, or not due)
    or OVER_CAP (nothing written; try again shortly)."""
    cap = max_concurrency(intent.destination)
    with transaction.atomic():
        if cap:
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_NAMESPACE, intent.destination_id])
            if in_flight(intent.destination_id) >= cap:
                return Outcome.OVER_CAP
        return Outcome.CLAIMED if intents.claim(intent.pk, worker=worker, lease=lease) else Outcome.BUSY


def cap_wait_seconds() -> float:
    # Jittered, so the calls waiting on one destination do not all come back at once.
    return cast(float, settings.MAILROOM_DESTINATION_CAP_WAIT_SECONDS) * random.uniform(0.5, 1.5)  # an env.float


def pooled(lease: "Lease | None" = None) -> bool:
    """Whether the call goes to the destination pool: on when a queue is configured, for work without
    a thread lease, from inside a real (not eager, not direct) Celery task."""
    if not settings.MAILROOM_DESTINATION_QUEUE or lease is not None or not current_task:
        return False
    request = current_task.request
    return not (request.is_eager or getattr(request, "called_directly", True)) and current_task.name != CALL_TASK


def hand_over(intent_id: int, countdown: float | None = None) -> None:
    """Publish the call task after the commit. A failed publish is only logged: the intent stays
    pending and its event `ready`; the intent's sweep (`intents.enqueue_due`) hands it over again."""

    def publish() -> None:
        try:
            current_app.send_task(CALL_TASK, args=[intent_id], countdown=countdown)
        except Exception:
            logger.exception("intent %s: hand-over to the destination pool failed; the sweep brings it back", intent_id)

    transaction.on_commit(publish)


def worker_identity() -> str:
    """host:pid/thread: threads of one pool process must not pass for each other's claims
    (`still_claimed` and the outcomes match on `claimed_by`)."""
    return f"{process_identity()}/{threading.get_native_id()}"

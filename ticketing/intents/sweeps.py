"""The machine's own transitions outside an attempt: expiry, requeue, and resolving `unknown`.

Beat runs the sweeps; each is safe to run from two processes at once (rows
locked with SKIP LOCKED, conditional UPDATEs).
"""

import logging
from datetime import datetime, timedelta
from typing import cast

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from intake.selectors import drill_events
from intake.services import (
    PROCESS_TOPIC,
    enqueue_outbox,
    record_audit,
)
from intake.vocabulary import AuditKind, ReasonCode, SystemActor

from ..destinations import adapter_for
from ..destinations.base import AmbiguousOutcome, DestinationAdapter, PermanentError, TransientError
from ..models import Intent
from .core import (
    CLAIM_EXPIRED_ERROR,
    EventState,
    IntentState,
    expecting,
    move,
    move_event,
    record_success,
)
from .creation import ATTACH_TOPIC, NOTIFY_TOPIC
from .lookup import awaits_lookup, last_unknown_at, settle_known_failure

logger = logging.getLogger(__name__)


def _enqueue(intent: Intent, now: datetime) -> None:
    """Hand an intent to the task that carries out its action."""
    if intent.action == Intent.Action.NOTIFY_REQUESTER:
        enqueue_outbox(NOTIFY_TOPIC, {"intent_id": intent.pk}, now=now)
    elif intent.action == Intent.Action.ATTACH_FILES:
        enqueue_outbox(ATTACH_TOPIC, {"intent_id": intent.pk}, now=now)
    else:
        enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": intent.inbox_event_id}, now=now)


def _live(queryset: QuerySet[Intent]) -> QuerySet[Intent]:
    """Without a drill's intents: the drill runs these transitions itself, for its own events only."""
    return queryset.exclude(inbox_event_id__in=drill_events())


def _locked_batch(queryset: QuerySet[Intent], limit: int) -> list[Intent]:
    return list(queryset.select_for_update(skip_locked=True).order_by("pk")[:limit])


def expire_claims(limit: int = 500) -> int:
    """in_flight intents whose claim ran out (a worker died or hung) -> unknown."""
    now = timezone.now()
    expired = 0
    with transaction.atomic():
        for intent in _locked_batch(
            _live(Intent.objects.filter(state=IntentState.IN_FLIGHT, claimed_until__lt=now)), limit
        ):
            expired += expire(intent, now)
    return expired


def expire(intent: Intent, now: datetime) -> bool:
    """in_flight -> unknown, the event unknown/claim_expired. Call with the intent's row locked."""
    with transaction.atomic(savepoint=False):
        if not move(
            expecting(intent.pk, IntentState.IN_FLIGHT),
            IntentState.UNKNOWN,
            now,
            last_error_kind=CLAIM_EXPIRED_ERROR,
            last_error=f"claim of {intent.claimed_by} expired",
        ):
            return False
        move_event(
            intent.inbox_event_id,
            EventState.UNKNOWN,
            now,
            SystemActor.SWEEP,
            ReasonCode.CLAIM_EXPIRED,
            f"the worker holding attempt {intent.attempts} stopped answering",
        )
        record_audit(
            intent.inbox_event_id,
            kind=AuditKind.INTENT_UNKNOWN,
            actor=SystemActor.SWEEP,
            at=now,
            detail={"intent": intent.pk, "reason": ReasonCode.CLAIM_EXPIRED, "worker": intent.claimed_by},
        )
    return True


def enqueue_due(limit: int = 500, lost_after_seconds: float | None = None) -> int:
    """Hand due retries to the broker (through the outbox): retry_wait -> pending.

    A retry_wait intent is due at its next_attempt_at. A pending one that was
    handed over but never claimed (its message lost) is due again after the
    stale-event window. Enqueuing twice is harmless: only one claim wins.
    """
    now = timezone.now()
    lost_after = lost_after_seconds if lost_after_seconds is not None else settings.MAILROOM_STALE_EVENT_SECONDS
    due = Q(state=IntentState.RETRY_WAIT, next_attempt_at__lte=now) | Q(
        state=IntentState.PENDING, next_attempt_at__lte=now - timedelta(seconds=lost_after)
    )
    with transaction.atomic():
        intents = _locked_batch(_live(Intent.objects.filter(due)), limit)
        for intent in intents:
            requeue(intent, now)
    return len(intents)


def requeue(intent: Intent, now: datetime) -> bool:
    """retry_wait -> pending (or pending -> pending, a lost hand-over), with its outbox row. Not audited.

    Call with the intent's row locked. retry_wait waits for time, pending for a
    worker; next_attempt_at now says when it was handed over, so a lost hand-over is seen.
    """
    with transaction.atomic(savepoint=False):
        if not move(expecting(intent.pk, intent.state), IntentState.PENDING, now):
            return False
        _enqueue(intent, now)
    return True


def resolve_unknown(intent_id: int, actor: str = SystemActor.RECONCILE) -> str:
    """Settle an `unknown` intent exactly as docs/design.md §6 allows; never a blind second write.

    Returns the new state, or '' when the intent was not unknown (or the lookup failed for now).
    """
    intent = Intent.objects.select_related("destination").filter(pk=intent_id, state=IntentState.UNKNOWN).first()
    if intent is None:
        return ""
    now = timezone.now()
    if intent.action == Intent.Action.NOTIFY_REQUESTER:
        # Mail servers keep no key and offer no lookup: whether it went out is unknowable.
        return hold(intent, now, actor, event_reason=None)
    if intent.action == Intent.Action.ATTACH_FILES:
        # Each file sent without a known answer is looked up on the record before it is sent again.
        return reopen(intent, now, actor, ReasonCode.FILES_LOOKED_UP_FIRST)
    if awaits_lookup(intent):
        # A failure for good after an unknown outcome, waiting for its lookup: asked, never sent again.
        return settle_known_failure(intent, actor=actor)
    adapter = adapter_for(intent.destination)
    window = adapter.idempotency_window_seconds
    key_still_kept = (
        adapter.honours_idempotency_key
        and window is not None
        and intent.created_at + timedelta(seconds=window) > now
        and not intent.last_error_kind.endswith(ReasonCode.IDEMPOTENT_REQUEST_ERROR)
    )
    if key_still_kept and not adapter.transactional:
        # A retry with the same key is answered with the original record, if there is one.
        return reopen(intent, now, actor, ReasonCode.IDEMPOTENCY_KEY_RETAINED)
    creating = intent.action == Intent.Action.CREATE_TICKET
    if adapter.upsert and creating and not adapter.transactional:
        # The create inserts or updates on our key: sending it again cannot make a second record.
        return reopen(intent, now, actor, ReasonCode.UPSERT_RETRY_SAFE)
    # A lookup by external_ref finds tickets, not comments: it can settle only a create.
    if adapter.consistent_lookup and creating:
        try:
            found = adapter.find_by_external_ref(intent.external_ref)
        except (TransientError, AmbiguousOutcome, PermanentError) as exc:
            logger.warning("intent %s: lookup failed (%s); staying unknown", intent.pk, exc.reason)
            return ""
        if found is not None:
            done = record_success(intent, result=found, actor=actor, from_states=(IntentState.UNKNOWN,))
            return IntentState.SUCCEEDED if done else ""
        return reopen(intent, now, actor, ReasonCode.LOOKUP_FOUND_NOTHING)
    if adapter.lookup_settle_seconds is not None and creating:
        return _settle_by_lagging_search(intent, adapter, now, actor)
    return hold(intent, now, actor, event_reason=ReasonCode.OUTCOME_UNKNOWN)


def unknown_since(intent: Intent) -> datetime:
    """When the intent last became unknown (its audit row), else when it was created."""
    return last_unknown_at(intent) or intent.created_at


def _settle_by_lagging_search(intent: Intent, adapter: DestinationAdapter, now: datetime, actor: str) -> str:
    """A search that lags behind writes: ask once the settle delay has passed. A record found settles the
    intent; none found is doubt, and doubt is held for a person (never a second create)."""
    # `lookup_settle_seconds` is not None: `resolve_unknown` checked it before calling.
    if now < unknown_since(intent) + timedelta(seconds=cast(float, adapter.lookup_settle_seconds)):
        return ""  # too early: the search may not see it yet; a later sweep asks
    try:
        found = adapter.find_by_external_ref(intent.external_ref)
    except (TransientError, AmbiguousOutcome, PermanentError) as exc:
        logger.warning("intent %s: search failed (%s); staying unknown", intent.pk, exc.reason)
        return ""
    if found is not None:
        done = record_success(intent, result=found, actor=actor, from_states=(IntentState.UNKNOWN,))
        return IntentState.SUCCEEDED if done else ""
    return hold(intent, now, actor, event_reason=ReasonCode.SEARCH_FOUND_NOTHING)


def hold(intent: Intent, now: datetime, actor: str, event_reason: str | None) -> str:
    """unknown -> held: no safe way to know, so a person investigates; no second write."""
    with transaction.atomic():
        if not move(expecting(intent.pk, IntentState.UNKNOWN), IntentState.HELD, now):
            return ""
        if event_reason:
            move_event(
                intent.inbox_event_id, EventState.UNKNOWN, now, actor, event_reason, ReasonCode(event_reason).label
            )
        record_audit(
            intent.inbox_event_id,
            kind=AuditKind.INTENT_HELD,
            actor=actor,
            at=now,
            detail={"intent": intent.pk, "action": intent.action},
        )
    return IntentState.HELD


def reopen(intent: Intent, now: datetime, actor: str, why: str) -> str:
    """unknown -> pending, enqueued at once, the event back on the path (write_pending)."""
    with transaction.atomic():
        if not move(expecting(intent.pk, IntentState.UNKNOWN), IntentState.PENDING, now):
            return ""
        move_event(intent.inbox_event_id, EventState.WRITE_PENDING, now, actor)
        _enqueue(intent, now)
        record_audit(
            intent.inbox_event_id,
            kind=AuditKind.INTENT_PENDING,
            actor=actor,
            at=now,
            detail={"intent": intent.pk, "reason": why},
        )
    return IntentState.PENDING


def resolve_unknown_intents(limit: int = 200) -> dict[str, int]:
    tally: dict[str, int] = {}
    unknown = _live(Intent.objects.filter(state=IntentState.UNKNOWN)).order_by("pk").values_list("pk", flat=True)
    for intent_id in unknown[:limit]:
        outcome = resolve_unknown(intent_id) or "unchanged"
        tally[outcome] = tally.get(outcome, 0) + 1
    return tally

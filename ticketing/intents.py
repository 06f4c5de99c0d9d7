"""The Intent state machine (DESIGN.md §5).

Every transition is a conditional UPDATE on the expected state; zero rows means
someone else moved the intent and the caller stops. Each transition writes the
event's new state and its audit row in the same transaction.

    pending/retry_wait --claim--> in_flight --success--> succeeded
                                  in_flight --transient--> retry_wait (backoff) | failed (cap)
                                  in_flight --permanent--> failed
                                  in_flight --ambiguous / claim expired--> unknown
    unknown --resolve--> succeeded | pending | held
"""
import logging
import random
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from intake.keys import stable_key
from intake.models import InboxEvent
from intake.services import PROCESS_TOPIC, enqueue_outbox, record_audit

from .destinations import adapter_for
from .destinations.base import AmbiguousOutcome, PermanentError, TicketResult, TransientError
from .models import Destination, Intent, TicketMapping

logger = logging.getLogger(__name__)

EventState = InboxEvent.State
IntentState = Intent.State

AUDIT_KIND = {Intent.Action.CREATE_TICKET: "ticket_created", Intent.Action.ADD_COMMENT: "comment_added"}
NOTIFY_TOPIC = "intent.notify"

DEFAULT_MAX_ATTEMPTS = 8
DEFAULT_RETRY_BASE_SECONDS = 2.0
DEFAULT_RETRY_CAP_SECONDS = 600.0


def intent_key(event: InboxEvent, action: str, action_version: int) -> str:
    return stable_key(event.tenant_id, event.mailbox_id, event.provider_message_id, action, action_version)


def ensure_intent(event: InboxEvent, action: str, destination: Destination, action_version: int = 1) -> Intent:
    """The intent for this event, action and version: created once, whoever asks first."""
    key = create_if_missing(event, action, destination, action_version)
    return Intent.objects.select_related("destination").get(idempotency_key=key)


def create_intent(event: InboxEvent, action: str, destination: Destination, action_version: int = 1) -> Intent:
    """A plain INSERT, for callers whose own unique write already proves it is the first."""
    key = intent_key(event, action, action_version)
    return Intent.objects.create(
        idempotency_key=key, inbox_event=event, action=action, action_version=action_version,
        destination=destination, external_ref=f"mailroom-{key[:40]}", created_at=timezone.now())


def create_if_missing(event: InboxEvent, action: str, destination: Destination, action_version: int = 1) -> str:
    """INSERT ... ON CONFLICT DO NOTHING: no savepoint, and the unique key decides who created it."""
    key = intent_key(event, action, action_version)
    Intent.objects.bulk_create([Intent(
        idempotency_key=key, inbox_event=event, action=action, action_version=action_version,
        destination=destination, external_ref=f"mailroom-{key[:40]}", created_at=timezone.now(),
    )], ignore_conflicts=True)
    return key


def current_intent(event_id: int, action: str) -> Intent | None:
    """The version of an action a worker carries out: the highest (a reviewer may have added one)."""
    return (Intent.objects.select_related("destination").filter(inbox_event_id=event_id, action=action)
            .order_by("-action_version", "-pk").first())


# --- claiming -------------------------------------------------------------

def claim(intent_id: int, worker: str, lease=None) -> bool:
    """pending/retry_wait (and due) -> in_flight, owned by `worker` until the claim expires.

    With a thread lease, the lease is checked (and its row locked) in the same
    transaction: a worker that lost its lease claims nothing.
    """
    from . import leases

    now = timezone.now()
    with transaction.atomic(savepoint=False):
        if lease is not None and not leases.holds(lease, lock=True):
            logger.warning("intent %s: thread lease lost; not claiming", intent_id)
            return False
        return bool(
            Intent.objects.filter(pk=intent_id, state__in=[IntentState.PENDING, IntentState.RETRY_WAIT])
            .exclude(next_attempt_at__gt=now)
            .update(state=IntentState.IN_FLIGHT, claimed_by=worker, attempts=F("attempts") + 1,
                    claimed_until=now + timedelta(seconds=settings.MAILROOM_CLAIM_SECONDS))
        )


def still_claimed(intent_id: int, worker: str, margin_seconds: float = 0) -> bool:
    """True while `worker` holds a live claim: checked right before a side effect."""
    deadline = timezone.now() + timedelta(seconds=margin_seconds)
    return Intent.objects.filter(pk=intent_id, state=IntentState.IN_FLIGHT, claimed_by=worker,
                                 claimed_until__gt=deadline).exists()


# --- outcomes -------------------------------------------------------------

def _move_event(event_id: int, to_state: str, now, reason_code: str = "", reason_detail: str = "") -> None:
    # A completed event stays completed: its mapping is the proof, whatever happens later.
    InboxEvent.objects.filter(pk=event_id).exclude(state=EventState.COMPLETED).update(
        state=to_state, reason_code=reason_code, reason_detail=reason_detail[:2000], updated_at=now)


def record_success(intent: Intent, result: TicketResult, actor: str,
                   from_states=(IntentState.IN_FLIGHT,), event: InboxEvent | None = None) -> bool:
    """-> succeeded, with the mapping, the event's `completed` state and the audit row, atomically."""
    now = timezone.now()
    # savepoint=False: inside the built-in store's transaction this is one unit with the create.
    with transaction.atomic(savepoint=False):
        moved = Intent.objects.filter(pk=intent.pk, state__in=list(from_states)).update(
            state=IntentState.SUCCEEDED, result_ref=result.ticket_id, completed_at=now, claimed_until=None,
            next_attempt_at=None, last_error_kind="", last_error="")
        if not moved:
            return False
        TicketMapping.objects.create(
            inbox_event_id=intent.inbox_event_id, action=intent.action, destination_id=intent.destination_id,
            ticket_id=result.ticket_id, ticket_url=result.url, created_at=now)
        _move_event(intent.inbox_event_id, EventState.COMPLETED, now)
        record_audit(intent.inbox_event_id, AUDIT_KIND.get(intent.action, intent.action), actor=actor, at=now,
                     detail={"intent": intent.pk, "action": intent.action, "destination": intent.destination_id,
                             "ticket_id": result.ticket_id})
        if intent.action == Intent.Action.CREATE_TICKET:
            from . import acknowledgments  # it builds on this module

            if event is None:
                event = InboxEvent.objects.select_related("mailbox").get(pk=intent.inbox_event_id)
            acknowledgments.plan(event, intent.destination)
    return True


def _retry_delay(intent: Intent, attempts: int, retry_after: float | None) -> float:
    """Exponential backoff with full jitter; never sooner than the destination's Retry-After."""
    conf = intent.destination.settings or {}
    base = float(conf.get("retry_base_seconds", DEFAULT_RETRY_BASE_SECONDS))
    cap = float(conf.get("retry_cap_seconds", DEFAULT_RETRY_CAP_SECONDS))
    delay = random.uniform(0, min(cap, base * 2 ** max(attempts - 1, 0)))
    return max(delay, retry_after or 0.0)


def max_attempts(intent: Intent) -> int:
    return int((intent.destination.settings or {}).get("max_attempts", DEFAULT_MAX_ATTEMPTS))


def record_failure(intent: Intent, exc, worker: str) -> str:
    """Map a failure kind to the next state. Returns the state the intent is now in (or '' if lost)."""
    now = timezone.now()
    attempts = Intent.objects.filter(pk=intent.pk).values_list("attempts", flat=True).first() or 0
    common = {"last_error_kind": f"{exc.kind}:{exc.reason}", "last_error": str(exc)[:2000], "claimed_until": None}
    event_state, reason, detail = None, exc.reason, exc.detail
    if isinstance(exc, TransientError) and attempts < max_attempts(intent):
        to_state = IntentState.RETRY_WAIT
        common["next_attempt_at"] = now + timedelta(seconds=_retry_delay(intent, attempts, exc.retry_after))
    elif isinstance(exc, TransientError):
        to_state, event_state, reason = IntentState.FAILED, EventState.FAILED, "retries_exhausted"
        detail = f"{attempts} attempts; last: {exc}"
        common["completed_at"] = now
    elif isinstance(exc, PermanentError):
        to_state, event_state = IntentState.FAILED, EventState.FAILED
        common["completed_at"] = now
    else:
        to_state, event_state = IntentState.UNKNOWN, EventState.UNKNOWN
    with transaction.atomic():
        moved = Intent.objects.filter(pk=intent.pk, state=IntentState.IN_FLIGHT, claimed_by=worker).update(
            state=to_state, **common)
        if not moved:
            return ""
        if event_state:
            _move_event(intent.inbox_event_id, event_state, now, reason, detail)
        record_audit(intent.inbox_event_id, f"intent_{to_state}", actor=f"worker:{worker}", at=now, detail={
            "intent": intent.pk, "attempt": attempts, "error_kind": exc.kind, "reason": exc.reason,
            "retry_at": common["next_attempt_at"].isoformat() if "next_attempt_at" in common else None})
    logger.info("intent %s: %s (%s/%s)", intent.pk, to_state, exc.kind, exc.reason)
    return to_state


# --- sweeps (beat; safe to run from two processes at once) -----------------

def _enqueue(intent: Intent, now) -> None:
    """Hand an intent to the task that carries out its action."""
    if intent.action == Intent.Action.NOTIFY_REQUESTER:
        enqueue_outbox(NOTIFY_TOPIC, {"intent_id": intent.pk}, now=now)
    else:
        enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": intent.inbox_event_id}, now=now)


def _locked_batch(queryset, limit: int):
    return list(queryset.select_for_update(skip_locked=True).order_by("pk")[:limit])


def expire_claims(limit: int = 500) -> int:
    """in_flight intents whose claim ran out (a worker died or hung) -> unknown."""
    now = timezone.now()
    expired = 0
    with transaction.atomic():
        for intent in _locked_batch(Intent.objects.filter(state=IntentState.IN_FLIGHT, claimed_until__lt=now), limit):
            Intent.objects.filter(pk=intent.pk, state=IntentState.IN_FLIGHT).update(
                state=IntentState.UNKNOWN, claimed_until=None, last_error_kind="ambiguous:claim_expired",
                last_error=f"claim of {intent.claimed_by} expired")
            _move_event(intent.inbox_event_id, EventState.UNKNOWN, now, "claim_expired",
                        f"the worker holding attempt {intent.attempts} stopped answering")
            record_audit(intent.inbox_event_id, "intent_unknown", actor="system:sweep", at=now,
                         detail={"intent": intent.pk, "reason": "claim_expired", "worker": intent.claimed_by})
            expired += 1
    return expired


def enqueue_due(limit: int = 500, lost_after_seconds: float | None = None) -> int:
    """Hand due retries to the broker (through the outbox): retry_wait -> pending.

    A retry_wait intent is due at its next_attempt_at. A pending one that was
    handed over but never claimed (its message lost) is due again after the
    stale-event window. Enqueuing twice is harmless: only one claim wins.
    """
    now = timezone.now()
    lost_after = lost_after_seconds if lost_after_seconds is not None else settings.MAILROOM_STALE_EVENT_SECONDS
    due = Q(state=IntentState.RETRY_WAIT, next_attempt_at__lte=now) | Q(
        state=IntentState.PENDING, next_attempt_at__lte=now - timedelta(seconds=lost_after))
    with transaction.atomic():
        intents = _locked_batch(Intent.objects.filter(due), limit)
        for intent in intents:
            # retry_wait waits for time, pending for a worker; next_attempt_at
            # now says when it was handed over, so a lost hand-over is seen.
            Intent.objects.filter(pk=intent.pk, state=intent.state).update(
                state=IntentState.PENDING, next_attempt_at=now)
            _enqueue(intent, now)
    return len(intents)


def resolve_unknown(intent_id: int, actor: str = "system:reconciliation") -> str:
    """Settle an `unknown` intent exactly as DESIGN.md §5 allows; never a blind second write.

    Returns the new state, or '' when the intent was not unknown (or the lookup failed for now).
    """
    intent = Intent.objects.select_related("destination").filter(pk=intent_id, state=IntentState.UNKNOWN).first()
    if intent is None:
        return ""
    now = timezone.now()
    if intent.action == Intent.Action.NOTIFY_REQUESTER:
        # Mail servers keep no key and offer no lookup: whether it went out is unknowable.
        return _hold(intent, now, actor, event_reason=None)
    adapter = adapter_for(intent.destination)
    window = adapter.idempotency_window_seconds
    key_still_kept = (
        adapter.honours_idempotency_key and window is not None
        and intent.created_at + timedelta(seconds=window) > now
        and not intent.last_error_kind.endswith("idempotent_request_error")
    )
    if key_still_kept and not adapter.transactional:
        # A retry with the same key is answered with the original record, if there is one.
        return _reopen(intent, now, actor, "idempotency_key_retained")
    # A lookup by external_ref finds tickets, not comments: it can settle only a create.
    if adapter.consistent_lookup and intent.action == Intent.Action.CREATE_TICKET:
        try:
            found = adapter.find_by_external_ref(intent.external_ref)
        except (TransientError, AmbiguousOutcome, PermanentError) as exc:
            logger.warning("intent %s: lookup failed (%s); staying unknown", intent.pk, exc.reason)
            return ""
        if found is not None:
            return IntentState.SUCCEEDED if record_success(intent, found, actor, (IntentState.UNKNOWN,)) else ""
        return _reopen(intent, now, actor, "lookup_found_nothing")
    return _hold(intent, now, actor, event_reason="outcome_unknown")


def _hold(intent: Intent, now, actor: str, event_reason: str | None) -> str:
    """unknown -> held: no safe way to know, so a person investigates; no second write."""
    with transaction.atomic():
        if not Intent.objects.filter(pk=intent.pk, state=IntentState.UNKNOWN).update(state=IntentState.HELD):
            return ""
        if event_reason:
            _move_event(intent.inbox_event_id, EventState.UNKNOWN, now, event_reason,
                        "the destination offers neither idempotency nor a lookup: investigate before replaying")
        record_audit(intent.inbox_event_id, "intent_held", actor=actor, at=now,
                     detail={"intent": intent.pk, "action": intent.action})
    return IntentState.HELD


def _reopen(intent: Intent, now, actor: str, why: str) -> str:
    """unknown -> pending, enqueued at once, the event back on the path."""
    with transaction.atomic():
        if not Intent.objects.filter(pk=intent.pk, state=IntentState.UNKNOWN).update(
                state=IntentState.PENDING, next_attempt_at=now):
            return ""
        _move_event(intent.inbox_event_id, EventState.WRITE_PENDING, now)
        _enqueue(intent, now)
        record_audit(intent.inbox_event_id, "intent_pending", actor=actor, at=now,
                     detail={"intent": intent.pk, "reason": why})
    return IntentState.PENDING


def resolve_unknown_intents(limit: int = 200) -> dict:
    tally: dict = {}
    for intent_id in Intent.objects.filter(state=IntentState.UNKNOWN).order_by("pk").values_list("pk", flat=True)[:limit]:
        outcome = resolve_unknown(intent_id) or "unchanged"
        tally[outcome] = tally.get(outcome, 0) + 1
    return tally

"""Creating intents, the one UPDATE every transition makes, and the transitions of an attempt.

A failure for good after an unknown outcome is decided in `lookup` (it asks the destination first),
written by the transitions here. See the package docstring for the diagram and the fields each state sets."""

import logging
import random
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeAlias

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from intake.models import InboxEvent
from intake.services import (
    NOT_COMPLETED_STATES,
    PROCESS_TOPIC,
    enqueue_outbox,
    record_audit,
    transition_event,
)
from intake.vocabulary import AuditKind, ReasonCode

from ..destinations.base import AmbiguousOutcome, PermanentError, TicketResult, TransientError
from ..models import Intent, TicketMapping
from ..outcomes import Outcome
from . import followups
from .creation import insert_intent

if TYPE_CHECKING:
    from ..leases import Lease

logger = logging.getLogger(__name__)

EventState = InboxEvent.State
IntentState = Intent.State

# What an attempt's call raises (`intake.failures`), the failure its outcome records.
AttemptError: TypeAlias = TransientError | PermanentError | AmbiguousOutcome

# The audit row of a success, by action.
AUDIT_KIND: dict[str, AuditKind] = {
    Intent.Action.CREATE_TICKET: AuditKind.TICKET_CREATED,
    Intent.Action.ADD_COMMENT: AuditKind.COMMENT_ADDED,
    Intent.Action.NOTIFY_REQUESTER: AuditKind.ACKNOWLEDGED,
    Intent.Action.ATTACH_FILES: AuditKind.FILES_ATTACHED,
}
# The audit row of an attempt that did not succeed, by the state it left the intent in.
ATTEMPT_AUDIT_KIND: dict[str, AuditKind] = {
    IntentState.RETRY_WAIT: AuditKind.INTENT_RETRY_WAIT,
    IntentState.FAILED: AuditKind.INTENT_FAILED,
    IntentState.UNKNOWN: AuditKind.INTENT_UNKNOWN,
    IntentState.HELD: AuditKind.INTENT_HELD,
}
# The intent actions that are not a ticket-making action of their own: they follow one (after its mapping).
FOLLOWING_ACTIONS = (Intent.Action.NOTIFY_REQUESTER, Intent.Action.ATTACH_FILES)
OPERATOR_RESULT_REF = "handled-by-operator"
# The last error of an intent whose claim ran out (`sweeps.expire`).
CLAIM_EXPIRED_ERROR = f"{AmbiguousOutcome.kind}:{ReasonCode.CLAIM_EXPIRED}"

# The states each operator transition starts from.
REPLAYABLE_STATES = (IntentState.FAILED, IntentState.HELD)
SUPERSEDABLE_STATES = (IntentState.FAILED, IntentState.HELD, IntentState.UNKNOWN)
CONFIRMABLE_STATES = (IntentState.FAILED, IntentState.UNKNOWN, IntentState.HELD)
OPEN_STATES = (IntentState.PENDING, IntentState.RETRY_WAIT, IntentState.UNKNOWN)  # what closing an event holds

DEFAULT_MAX_ATTEMPTS = 8
DEFAULT_RETRY_BASE_SECONDS = 2.0
DEFAULT_RETRY_CAP_SECONDS = 600.0


# --- the one UPDATE every transition makes ----------------------------------


def _claim_until(now: datetime) -> datetime:
    return now + timedelta(seconds=settings.MAILROOM_CLAIM_SECONDS)


# What entering each state sets (the table in the module docstring).
_ENTRY: dict[str, Callable[[datetime], dict[str, Any]]] = {
    IntentState.IN_FLIGHT: lambda now: {"attempts": F("attempts") + 1, "claimed_until": _claim_until(now)},
    IntentState.RETRY_WAIT: lambda now: {"claimed_until": None},
    IntentState.FAILED: lambda now: {"next_attempt_at": None, "claimed_until": None, "completed_at": now},
    IntentState.UNKNOWN: lambda now: {"next_attempt_at": None, "claimed_until": None},
    IntentState.SUCCEEDED: lambda now: {
        "next_attempt_at": None,
        "claimed_until": None,
        "completed_at": now,
        "last_error_kind": "",
        "last_error": "",
    },
    IntentState.HELD: lambda now: {"next_attempt_at": None, "claimed_until": None},
    IntentState.PENDING: lambda now: {
        "next_attempt_at": now,
        "claimed_by": "",
        "claimed_until": None,
        "completed_at": None,
    },
}


def move(rows: QuerySet[Intent], to_state: str, now: datetime, **fields: Any) -> int:
    """UPDATE `rows` (already filtered on the expected states) into `to_state`. Returns the row count."""
    return rows.update(state=to_state, **{**_ENTRY[to_state](now), **fields})


def expecting(intent_id: int, *states: str, **lookups: Any) -> QuerySet[Intent]:
    return Intent.objects.filter(pk=intent_id, state__in=list(states), **lookups)


def move_event(
    event_id: int, to_state: str, now: datetime, actor: str, reason_code: str = "", reason_detail: str = ""
) -> None:
    """The event's side of an intent transition, through intake's door; the intent's audit row records it."""
    transition_event(
        event_id,
        NOT_COMPLETED_STATES,
        to_state,
        actor=actor,
        kind=None,
        reason_code=reason_code,
        reason_detail=reason_detail,
        now=now,
    )


# --- claiming -------------------------------------------------------------


def claim(intent_id: int, *, worker: str, lease: "Lease | None" = None) -> bool:
    """pending/retry_wait (and due) -> in_flight, owned by `worker` until the claim expires.

    With a thread lease, the lease is checked (and its row locked) in the same
    transaction: a worker that lost its lease claims nothing.
    """
    from .. import leases

    now = timezone.now()
    with transaction.atomic(savepoint=False):
        if lease is not None and not leases.holds(lease, lock=True):
            logger.warning("intent %s: thread lease lost; not claiming", intent_id)
            return False
        due = expecting(intent_id, IntentState.PENDING, IntentState.RETRY_WAIT).exclude(next_attempt_at__gt=now)
        return bool(move(due, IntentState.IN_FLIGHT, now, claimed_by=worker))


def still_claimed(intent_id: int, worker: str, margin_seconds: float = 0) -> bool:
    """True while `worker` holds a live claim: checked right before a side effect."""
    deadline = timezone.now() + timedelta(seconds=margin_seconds)
    return Intent.objects.filter(
        pk=intent_id, state=IntentState.IN_FLIGHT, claimed_by=worker, claimed_until__gt=deadline
    ).exists()


# --- outcomes of an attempt -------------------------------------------------


def record_success(
    intent: Intent,
    *,
    result: TicketResult,
    actor: str,
    from_states: Iterable[str] = (IntentState.IN_FLIGHT,),
    event: InboxEvent | None = None,
    audit_detail: dict[str, Any] | None = None,
    claimed_by: str | None = None,
) -> bool:
    """-> succeeded, with the mapping, the event's `completed` state and the audit row, atomically.

    `audit_detail`: more for the audit row (how the ticket was found, when no create answered).
    `claimed_by`: only that worker's attempt settles it: in_flight under its claim, or unknown because
    that claim ran out meanwhile (`expire` keeps `claimed_by`), never an intent another worker claimed since."""
    now = timezone.now()
    rows = expecting(intent.pk, *from_states)
    if claimed_by is not None:
        rows = rows.filter(
            Q(state=IntentState.IN_FLIGHT) | Q(state=IntentState.UNKNOWN, last_error_kind=CLAIM_EXPIRED_ERROR),
            claimed_by=claimed_by,
        )
    # savepoint=False: inside the built-in store's transaction this is one unit with the create.
    with transaction.atomic(savepoint=False):
        if not move(rows, IntentState.SUCCEEDED, now, result_ref=result.ticket_id):
            return False
        TicketMapping.objects.create(
            inbox_event_id=intent.inbox_event_id,
            action=intent.action,
            destination_id=intent.destination_id,
            ticket_id=result.ticket_id,
            ticket_url=result.url,
            created_at=now,
        )
        move_event(intent.inbox_event_id, EventState.COMPLETED, now, actor)
        record_audit(
            intent.inbox_event_id,
            kind=AUDIT_KIND[intent.action],
            actor=actor,
            at=now,
            detail={
                "intent": intent.pk,
                "action": intent.action,
                "destination": intent.destination_id,
                "ticket_id": result.ticket_id,
                **(audit_detail or {}),
            },
        )
        if event is None:
            event = InboxEvent.objects.select_related("mailbox").get(pk=intent.inbox_event_id)
        followups.plan_file_delivery(event, intent.destination)
        if intent.action == Intent.Action.CREATE_TICKET:
            followups.plan_acknowledgment(event, intent.destination)
    return True


def record_files_attached(intent: Intent, worker: str, detail: dict[str, Any]) -> bool:
    """An `attach_files` intent's in_flight -> succeeded (its result: how many files the desk holds), with its
    audit row. The event stays `completed`: its mapping is the ticket-making action's."""
    now = timezone.now()
    with transaction.atomic():
        if not move(
            expecting(intent.pk, IntentState.IN_FLIGHT, claimed_by=worker),
            IntentState.SUCCEEDED,
            now,
            result_ref=f"{detail.get('attached', 0)} files",
        ):
            return False
        record_audit(
            intent.inbox_event_id,
            kind=AuditKind.FILES_ATTACHED,
            actor=f"worker:{worker}",
            at=now,
            detail={"intent": intent.pk, **detail},
        )
    return True


def follow_up_instead(intent: Intent, *, worker: str, closed_ticket_id: str) -> str:
    """A comment the desk refused because its ticket is closed, under the `follow_up` policy: the comment
    intent in_flight -> failed, and a create_ticket intent for the same event that follows up the
    closed ticket (`Intent.progress["follow_up_of"]`), with the audit row, in one transaction. The comment
    intent ends failed (its reason ticket_closed: replaced, nothing for a person to do); the event stays
    write_pending and goes back to a worker. Returns Outcome.FOLLOW_UP ("" when the attempt was no longer ours)."""
    now = timezone.now()
    with transaction.atomic():
        if not move(
            expecting(intent.pk, IntentState.IN_FLIGHT, claimed_by=worker),
            IntentState.FAILED,
            now,
            last_error_kind=f"{PermanentError.kind}:{ReasonCode.TICKET_CLOSED}",
            last_error="the ticket is closed: a follow-up ticket replaces this comment",
        ):
            return ""
        event = InboxEvent.objects.get(pk=intent.inbox_event_id)
        follow_up = insert_intent(
            event, Intent.Action.CREATE_TICKET, intent.destination, 1, IntentState.PENDING, now, if_missing=True
        )
        Intent.objects.filter(idempotency_key=follow_up.idempotency_key).update(
            progress={"follow_up_of": str(closed_ticket_id)}, next_attempt_at=now
        )
        record_audit(
            intent.inbox_event_id,
            kind=AuditKind.FOLLOW_UP_PLANNED,
            actor=f"worker:{worker}",
            at=now,
            detail={
                "intent": intent.pk,
                "closed_ticket_id": str(closed_ticket_id),
                "destination": intent.destination_id,
            },
        )
        enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": intent.inbox_event_id}, now=now)
    logger.info("intent %s: ticket %s is closed; a follow-up ticket is planned", intent.pk, closed_ticket_id)
    return Outcome.FOLLOW_UP


NOT_SENT_REF = "not-sent"  # the result_ref prefix of an acknowledgment that ended without an email


def record_acknowledgment_not_sent(
    intent: Intent, *, worker: str, reason: str, detail: dict[str, Any] | None = None
) -> bool:
    """An acknowledgment's in_flight (still `worker`'s) -> succeeded without an email: the address cannot be
    written to as it is (an internationalised local part, a relay without SMTPUTF8), and never will be by this
    intent, so it is skipped rather than failed (a person could do nothing with it). Its audit row is the
    `acknowledgment_skipped` one a skip at planning writes, with `reason`; the event stays `completed`."""
    now = timezone.now()
    with transaction.atomic():
        if not move(
            expecting(intent.pk, IntentState.IN_FLIGHT, claimed_by=worker),
            IntentState.SUCCEEDED,
            now,
            result_ref=f"{NOT_SENT_REF}:{reason}"[:200],
        ):
            return False
        record_audit(
            intent.inbox_event_id,
            kind=AuditKind.ACKNOWLEDGMENT_SKIPPED,
            actor=f"worker:{worker}",
            at=now,
            detail={"intent": intent.pk, "reason": reason, **(detail or {})},
        )
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


def retry_later(intent: Intent, exc: AttemptError, worker: str, attempts: int, delay: float | None = None) -> str:
    """in_flight -> retry_wait: a transient failure under the cap, due again after the backoff (or `delay`:
    a failure on a destination the circuit breaker paused)."""
    now = timezone.now()
    if delay is None:
        delay = _retry_delay(intent, attempts, getattr(exc, "retry_after", None))
    due = now + timedelta(seconds=delay)
    return end_attempt(
        intent, exc=exc, worker=worker, attempts=attempts, to_state=IntentState.RETRY_WAIT, now=now, next_attempt_at=due
    )


def fail(
    intent: Intent,
    exc: TransientError | PermanentError,
    worker: str,
    attempts: int,
    audit: dict[str, Any] | None = None,
) -> str:
    """in_flight -> failed, the event failed/<reason>: a permanent failure, or a transient one at the cap."""
    reason, detail = failure_reason(exc.kind, reason=exc.reason, text=str(exc), attempts=attempts)
    return end_attempt(
        intent,
        exc=exc,
        worker=worker,
        attempts=attempts,
        to_state=IntentState.FAILED,
        now=timezone.now(),
        event_state=EventState.FAILED,
        reason=reason,
        detail=detail,
        audit=audit,
    )


def failure_reason(kind: str, *, reason: str, text: str, attempts: int) -> tuple[str, str]:
    """The event's reason for a failure for good: a transient one at the cap is `retries_exhausted`."""
    if kind == TransientError.kind:
        return ReasonCode.RETRIES_EXHAUSTED, f"{attempts} attempts; last: {text}"
    return reason, text.partition(": ")[2]


def outcome_unknown(intent: Intent, exc: AmbiguousOutcome, worker: str, attempts: int) -> str:
    """in_flight -> unknown, the event unknown/<reason>: the request may or may not have taken effect."""
    return end_attempt(
        intent,
        exc=exc,
        worker=worker,
        attempts=attempts,
        to_state=IntentState.UNKNOWN,
        now=timezone.now(),
        event_state=EventState.UNKNOWN,
        reason=exc.reason,
        detail=exc.detail,
    )


def end_attempt(
    intent: Intent,
    *,
    exc: AttemptError,
    worker: str,
    attempts: int,
    to_state: str,
    now: datetime,
    event_state: str | None = None,
    reason: str = "",
    detail: str = "",
    audit: dict[str, Any] | None = None,
    **fields: Any,
) -> str:
    """in_flight (still `worker`'s) -> `to_state`: the outcome of an attempt, the event moved to `event_state`
    (None: it stays) and the audit row. Returns `to_state`, or '' when the intent is no longer that worker's."""
    with transaction.atomic():
        rows = expecting(intent.pk, IntentState.IN_FLIGHT, claimed_by=worker)
        if not move(
            rows, to_state, now, last_error_kind=f"{exc.kind}:{exc.reason}", last_error=str(exc)[:2000], **fields
        ):
            return ""
        if event_state:
            move_event(intent.inbox_event_id, event_state, now, f"worker:{worker}", reason, detail)
        due = fields.get("next_attempt_at")
        record_audit(
            intent.inbox_event_id,
            kind=ATTEMPT_AUDIT_KIND[to_state],
            actor=f"worker:{worker}",
            at=now,
            detail={
                "intent": intent.pk,
                "attempt": attempts,
                "error_kind": exc.kind,
                "reason": exc.reason,
                "retry_at": due.isoformat() if due else None,
                **(audit or {}),
            },
        )
    logger.info("intent %s: %s (%s/%s)", intent.pk, to_state, exc.kind, exc.reason)
    return to_state


def settle_unknown(
    intent: Intent, *, to_state: str, actor: str, event_state: str, reason: str, detail: str, audit: dict[str, Any]
) -> bool:
    """unknown -> failed / held, the event to `event_state` (`reason`, `detail`), and the audit row: a parked
    known failure settled by its lookup (`lookup.settle_known_failure`). False: someone else moved it."""
    now = timezone.now()
    with transaction.atomic():
        if not move(expecting(intent.pk, IntentState.UNKNOWN), to_state, now):
            return False
        move_event(intent.inbox_event_id, event_state, now, actor, reason, detail)
        record_audit(
            intent.inbox_event_id,
            kind=ATTEMPT_AUDIT_KIND[to_state],
            actor=actor,
            at=now,
            detail={"intent": intent.pk, **audit},
        )
    return True

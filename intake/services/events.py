"""The one door for `InboxEvent.state` (`transition_event`; `transition_events` for a group on the set-based
path), the audit row every change writes in the same transaction, and the marks on an event that are not
states: a worker's take (the poison count), progress, a wait (docs/design.md §6 for the table of moves)."""

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from .. import escalation, selectors
from ..models import AuditEvent, InboxEvent
from ..vocabulary import AuditKind
from .outbox import PROCESS_TOPIC, enqueue_outbox

STALE_CANDIDATE_STATES = (InboxEvent.State.RECEIVED, InboxEvent.State.READY)


# Every state but `completed`: a completed event stays completed (its mapping is the proof,
# whatever happens later), so intent outcomes move the event from any of these.
NOT_COMPLETED_STATES = tuple(s for s in InboxEvent.State if s != InboxEvent.State.COMPLETED)


def record_audit(
    inbox_event_id: int,
    *,
    kind: AuditKind,
    actor: str,
    detail: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> AuditEvent:
    """One audit row of an event: who (`actor`) did what (`kind`, an AuditKind) when; in the caller's transaction."""
    return AuditEvent.objects.create(
        inbox_event_id=inbox_event_id, kind=kind, actor=actor, detail=detail or {}, at=at or timezone.now()
    )


def record_taken(event_ids: list[int], *, now: datetime | None = None) -> int:
    """A worker took these events (its task started): each open one counts one take and its stale clock
    restarts, and so does the sweep's backoff (`requeues`). One statement per task.
    The stale-event sweep poisons an event taken too often without
    progress; counting takes, not requeues, keeps mail that only waited in a backlog out of that count."""
    now = now or timezone.now()
    return InboxEvent.objects.filter(pk__in=event_ids, state__in=STALE_CANDIDATE_STATES, retry_at__isnull=True).update(
        dispatch_count=F("dispatch_count") + 1, requeues=0, updated_at=now
    )


def record_progress(event_id: int) -> None:
    """A worker got the event somewhere without finishing it (its call was handed to the destination pool):
    the count of takes starts again."""
    InboxEvent.objects.filter(pk=event_id, state__in=STALE_CANDIDATE_STATES).update(dispatch_count=0)


def wait_event(event_id: int, seconds: float) -> None:
    """Park an open event on purpose (a pause, an unreachable scanner) until `seconds` from now. A worker
    decided to wait, which is progress: the count of takes starts again."""
    now = timezone.now()
    InboxEvent.objects.filter(pk=event_id, state__in=InboxEvent.OPEN_STATES).update(
        retry_at=now + timedelta(seconds=seconds), updated_at=now, dispatch_count=0
    )


def release_waiting_events(mailbox_id: int | None = None) -> int:
    """End every deliberate wait now (after a resume) and enqueue those events: the backlog drains."""
    now = timezone.now()
    waiting = InboxEvent.objects.filter(state__in=InboxEvent.OPEN_STATES, retry_at__isnull=False)
    if mailbox_id is not None:
        waiting = waiting.filter(mailbox_id=mailbox_id)
    else:  # every mailbox but a drill's, which releases its own
        waiting = waiting.exclude(tenant_id__in=selectors.drill_tenants())
    released = 0
    for event_id, retry_at in waiting.values_list("pk", "retry_at").iterator():
        with transaction.atomic():
            if InboxEvent.objects.filter(pk=event_id, retry_at=retry_at).update(retry_at=None, updated_at=now):
                enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": event_id}, now=now)
                released += 1
    return released


def transition_event(
    event_id: int,
    from_states: Iterable[str],
    to_state: str,
    *,
    actor: str,
    kind: AuditKind | None,
    reason_code: str = "",
    reason_detail: str = "",
    detail: dict[str, Any] | None = None,
    audit_detail: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    only_if: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> bool:
    """The one door for `InboxEvent.state`: a conditional UPDATE and its audit row, atomically.

    The UPDATE matches only while the event is in one of `from_states` (and
    meets `only_if`, further lookups such as `{"retry_at__isnull": True}`). It
    sets `state`, `reason_code` and `reason_detail` (the reason given, or none:
    a reason belongs to the move that gave it), `updated_at` and the fields in
    `extra` (`retry_at`, `dispatch_count`, `route_override`, `details`, ...).
    A move into a recovery state from outside one also sets `escalate_at`
    (`intake.escalation`: the default per reason, overridable per tenant).
    Returns False, writing nothing, when no row matched: someone else moved
    the event, and the caller stops.

    The audit row has `kind` and the detail `{"state", "reason", **detail}`, or
    exactly `audit_detail` when that is given. `kind=None` writes no row here,
    and is meant for two cases only:
    - the plain steps of the happy path, received -> ready (normalization) and
      ready -> write_pending (before a destination call), which were never
      audited: the `received` row and the outcome's row bracket them, and
      normalization stays one UPDATE;
    - a move that is part of an intent transition (`ticketing.intents`), whose
      own audit row, written in the same transaction, records both.
    Without a row to write, the UPDATE is the whole transition (no transaction
    of its own: it joins the caller's, if any).
    """
    now = now or timezone.now()
    changes = {
        "state": to_state,
        "reason_code": reason_code,
        "reason_detail": reason_detail[:2000],
        "updated_at": now,
        **(extra or {}),
    }
    if to_state in InboxEvent.RECOVERY_STATES and "escalate_at" not in changes:
        # Entering the recovery queue: when it escalates, unless it was already in it (intake.escalation).
        changes["escalate_at"] = escalation.entering_recovery(event_id, to_state, reason_code, now)
    rows = InboxEvent.objects.filter(pk=event_id, state__in=list(from_states), **(only_if or {}))
    if kind is None:
        return bool(rows.update(**changes))
    with transaction.atomic():
        moved = rows.update(**changes)
        if moved:
            if audit_detail is None:
                audit_detail = {"state": to_state, "reason": reason_code, **(detail or {})}
            record_audit(event_id, kind=kind, actor=actor, detail=audit_detail, at=now)
    return bool(moved)


def transition_events(
    event_ids: Iterable[int], from_states: Iterable[str], to_state: str, *, now: datetime | None = None
) -> int:
    """`transition_event` for many events in one UPDATE, for the moves without an audit row of their own
    (`kind=None`: part of an intent transition whose rows the caller writes in the same transaction).

    Returns how many moved; the caller compares that with `len(event_ids)` and rolls back on a miss.
    """
    if to_state in InboxEvent.RECOVERY_STATES:
        raise ValueError("a move into the recovery queue sets escalate_at per event: use transition_event")
    now = now or timezone.now()
    return InboxEvent.objects.filter(pk__in=list(event_ids), state__in=list(from_states)).update(
        state=to_state, reason_code="", reason_detail="", updated_at=now
    )

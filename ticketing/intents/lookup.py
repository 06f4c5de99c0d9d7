"""A failure for good after an unknown outcome: asked of the destination before it is recorded.

Known failure, known success and unknown outcome stay apart: an intent that was ever `unknown` (an
intent_unknown audit row) fails for good only when the destination, asked by external_ref, says no
record exists. Its lost answer may have been a ticket the destination committed. `failures.record_failure`
sends such a failure here; the writes are `core`'s transitions.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from django.utils import timezone

from intake.models import AuditEvent
from intake.vocabulary import AuditKind, ReasonCode

from ..destinations import adapter_for
from ..destinations.base import AmbiguousOutcome, PermanentError, TicketResult, TransientError
from ..models import Intent
from .core import (
    EventState,
    IntentState,
    end_attempt,
    fail,
    failure_reason,
    record_success,
    settle_unknown,
)

logger = logging.getLogger(__name__)

FOUND, NOTHING, DOUBT, LATER, CANNOT = "found", "nothing", "doubt", "later", "cannot"
# The detail key of the intent_unknown row that parks a known failure to be asked later: not an unknown
# outcome of its own, so the settle delay is not measured from it.
PARKED = "parked"


@dataclass(frozen=True)
class Answer:
    """What the destination says about an intent's external reference (`ask_destination`).

    `says`: FOUND (`ticket`), NOTHING (a consistent lookup found no record), DOUBT (a search that lags
    behind writes found none), LATER (a lagging search not due yet, or the lookup failed for now),
    CANNOT (no lookup: a comment, an acknowledgment, a kind without one, or a lookup refused)."""

    says: str
    detail: str = ""
    ticket: TicketResult | None = None


def last_unknown_at(intent: Intent) -> datetime | None:
    """When an attempt of the intent last had an unknown outcome (its latest intent_unknown row that is
    not a park); None: it never did."""
    return (
        AuditEvent.objects.filter(
            inbox_event_id=intent.inbox_event_id, kind=AuditKind.INTENT_UNKNOWN, detail__intent=intent.pk
        )
        .exclude(detail__has_key=PARKED)
        .order_by("-at")
        .values_list("at", flat=True)
        .first()
    )


def ask_destination(intent: Intent, *, now: datetime | None = None) -> Answer:
    """Ask the intent's destination for the record carrying its external_ref. A read; the caller holds no
    transaction (it is an HTTP call). A lookup finds tickets, so only a create is settled this way."""
    slug = intent.destination.slug
    if intent.action != Intent.Action.CREATE_TICKET:
        return Answer(CANNOT, f"a lookup by external reference finds tickets, not a {intent.action}")
    adapter = adapter_for(intent.destination)
    settle = None if adapter.consistent_lookup else adapter.lookup_settle_seconds
    if not adapter.consistent_lookup and settle is None:
        return Answer(CANNOT, f"{slug} offers no lookup by external reference")
    if settle is not None and (now or timezone.now()) < (
        (last_unknown_at(intent) or intent.created_at) + timedelta(seconds=settle)
    ):
        return Answer(
            LATER, f"{slug}'s search lags behind its writes: it is asked {settle:g} s after the unknown outcome"
        )
    try:
        found = adapter.find_by_external_ref(intent.external_ref)
    except NotImplementedError:
        return Answer(CANNOT, f"{slug} offers no lookup by external reference")
    except PermanentError as exc:
        return Answer(CANNOT, f"{slug} refused the lookup ({exc.kind}:{exc.reason})")
    except (TransientError, AmbiguousOutcome) as exc:
        return Answer(LATER, f"the lookup failed for now ({exc.kind}:{exc.reason})")
    if found is not None:
        return Answer(FOUND, f"{slug} has ticket {found.ticket_id} with our reference", found)
    if settle is None:
        return Answer(NOTHING, f"{slug} has no record with our reference (a consistent lookup)")
    return Answer(DOUBT, f"{slug}'s search, which lags behind its writes, found no record with our reference")


def awaits_lookup(intent: Intent) -> bool:
    """An unknown intent parked by `fail_after_unknown`: its last error is the known failure, not the doubt."""
    return intent.last_error_kind.partition(":")[0] in (TransientError.kind, PermanentError.kind)


def _held_reason(answer: Answer) -> str:
    return ReasonCode.SEARCH_FOUND_NOTHING if answer.says == DOUBT else ReasonCode.FAILED_AFTER_UNKNOWN


def fail_after_unknown(intent: Intent, *, exc: TransientError | PermanentError, worker: str, attempts: int) -> str:
    """in_flight -> succeeded / failed / held / unknown: a failure for good of an intent that was ever unknown.

    Found -> succeeded with the mapping; a consistent lookup finding nothing -> failed (the failure is
    known now); a lagging search finding nothing, or no lookup -> held, the event unknown (a person
    checks the desk); a lagging search not due yet or a lookup that failed -> unknown (parked), where
    `resolve_unknown` asks again (`settle_known_failure`), never sending the write again.
    Returns the new state, or '' when the intent is no longer this worker's.
    """
    answer = ask_destination(intent)  # after the attempt's call, before any transaction
    reason, _ = failure_reason(exc.kind, reason=exc.reason, text=str(exc), attempts=attempts)
    asked = {"lookup": answer.says, "lookup_detail": answer.detail}
    if answer.says == FOUND:
        # Still this attempt's: in flight, or unknown because its claim ran out while we asked; not an
        # intent reopened and claimed by another worker meanwhile (that worker's outcome settles it).
        # FOUND always carries its ticket (`ask_destination`).
        done = record_success(
            intent,
            result=cast(TicketResult, answer.ticket),
            actor=f"worker:{worker}",
            from_states=(IntentState.IN_FLIGHT, IntentState.UNKNOWN),
            audit_detail={"settled_by": "lookup", "instead_of": reason},
            claimed_by=worker,
        )
        return IntentState.SUCCEEDED if done else ""
    now = timezone.now()
    if answer.says == NOTHING:
        return fail(intent, exc, worker, attempts, audit=asked)
    if answer.says == LATER:
        return end_attempt(
            intent,
            exc=exc,
            worker=worker,
            attempts=attempts,
            to_state=IntentState.UNKNOWN,
            now=now,
            event_state=EventState.UNKNOWN,
            reason=ReasonCode.ASKING_AFTER_UNKNOWN,
            detail=f"{reason}; {answer.detail}",
            audit={**asked, PARKED: True},
        )
    # An acknowledgment's event stays completed: its ticket exists, only the email is in doubt.
    event_state = EventState.UNKNOWN if intent.action != Intent.Action.NOTIFY_REQUESTER else None
    return end_attempt(
        intent,
        exc=exc,
        worker=worker,
        attempts=attempts,
        to_state=IntentState.HELD,
        now=now,
        event_state=event_state,
        reason=_held_reason(answer),
        detail=f"{reason}; {answer.detail}",
        audit=asked,
    )


def settle_known_failure(intent: Intent, *, actor: str) -> str:
    """unknown (parked by `fail_after_unknown`) -> succeeded / failed / held, by asking again.

    Returns the new state, or '' (not due yet, the lookup failed again, or someone else moved it)."""
    answer = ask_destination(intent)
    if answer.says == LATER:
        return ""
    kind, _, error_reason = intent.last_error_kind.partition(":")
    reason, detail = failure_reason(kind, reason=error_reason, text=intent.last_error, attempts=intent.attempts)
    if answer.says == FOUND:
        # FOUND always carries its ticket (`ask_destination`).
        done = record_success(
            intent,
            result=cast(TicketResult, answer.ticket),
            actor=actor,
            from_states=(IntentState.UNKNOWN,),
            audit_detail={"settled_by": "lookup", "instead_of": reason},
        )
        return IntentState.SUCCEEDED if done else ""
    if answer.says == NOTHING:
        to_state, event_state, event_reason = IntentState.FAILED, EventState.FAILED, reason
    else:
        to_state, event_state, event_reason = IntentState.HELD, EventState.UNKNOWN, _held_reason(answer)
        detail = f"{reason}; {answer.detail}"
    if not settle_unknown(
        intent,
        to_state=to_state,
        actor=actor,
        event_state=event_state,
        reason=event_reason,
        detail=detail,
        audit={
            "attempt": intent.attempts,
            "error_kind": kind,
            "reason": error_reason,
            "lookup": answer.says,
            "lookup_detail": answer.detail,
        },
    ):
        return ""
    logger.info("intent %s: %s after its lookup (%s)", intent.pk, to_state, answer.says)
    return to_state

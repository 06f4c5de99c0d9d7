"""Operators' transitions, called by `ticketing.replay` inside its transaction.

They write no audit row and move no event: the operator's action does both,
in the same transaction, with its own row (`replayed`, `replayed_as_new_action`,
`ticket_confirmed`, `acknowledgment_handled`, `closed_not_a_request`).
"""

from datetime import datetime

from intake.models import InboxEvent
from intake.vocabulary import ReasonCode

from ..models import Destination, Intent
from .core import OPEN_STATES, OPERATOR_RESULT_REF, REPLAYABLE_STATES, IntentState, expecting, move
from .creation import insert_intent


def replay(intent: Intent, now: datetime, destination_id: int | None = None) -> bool:
    """failed/held -> pending under the same key, with a fresh retry budget and optionally a corrected destination."""
    changes = {"destination_id": destination_id} if destination_id is not None else {}
    return bool(move(expecting(intent.pk, *REPLAYABLE_STATES), IntentState.PENDING, now, attempts=0, **changes))


def settle(intent: Intent, now: datetime) -> bool:
    """failed/held -> succeeded without a call: a person says this (acknowledgment) needs nothing more."""
    return bool(
        move(expecting(intent.pk, *REPLAYABLE_STATES), IntentState.SUCCEEDED, now, result_ref=OPERATOR_RESULT_REF)
    )


def supersede(intent: Intent, now: datetime) -> bool:
    """unknown -> held: a new action_version replaces it, so no sweep acts on this one."""
    return bool(
        move(expecting(intent.pk, IntentState.UNKNOWN), IntentState.HELD, now, last_error_kind=ReasonCode.SUPERSEDED)
    )


def hold_open(event_id: int, now: datetime) -> int:
    """pending/retry_wait/unknown -> held for every intent of an event being closed. Returns how many."""
    return move(Intent.objects.filter(inbox_event_id=event_id, state__in=list(OPEN_STATES)), IntentState.HELD, now)


def create_held(event: InboxEvent, action: str, destination: Destination, now: datetime) -> Intent:
    """(insert) -> held, for an event never attempted whose ticket a reviewer found; settled by record_success."""
    key = insert_intent(event, action, destination, 1, IntentState.HELD, now, if_missing=True).idempotency_key
    return Intent.objects.select_related("destination").get(idempotency_key=key)

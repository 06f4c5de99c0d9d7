"""The Intent state machine (docs/design.md §6). Every write of `Intent.state` is a function here.

Each transition is one conditional UPDATE on the states it expects (zero rows:
someone else moved the intent, nothing is written and the caller stops), moves
the event through `intake.services.transition_event` and writes its audit row,
all in one transaction.

    (insert) ------------------------------------------------------------> pending
    pending/retry_wait (due) ----------------- claim ----------------> in_flight
    in_flight (+ unknown: a late success) ---- record_success --------> succeeded  event completed
    pending/retry_wait (due), a group -------- batch.claim_acknowledgments -> in_flight  (notify_requester)
    in_flight (notify_requester; + unknown: -- batch.record_acknowledgments_sent -> succeeded  the Message-ID
      a late success), a group                                                      its result
    in_flight (notify_requester) ------------- record_acknowledgment_not_sent -> succeeded  "not-sent:<reason>"
                                                                                    (the address cannot be written
                                                                                    to: acknowledgment_skipped)
    in_flight -------------------------------- retry_later -----------> retry_wait  transient, under the cap
    in_flight -------------------------------- retry_later -----------> retry_wait  destination paused (breaker)
    in_flight -------------------------------- fail ------------------> failed      event failed/<reason>
    in_flight (add_comment) ------------------ follow_up_instead -----> failed      ticket closed: a create_ticket
                                                                                    intent follows it up (event
                                                                                    stays write_pending)
    in_flight (attach_files) ----------------- record_files_attached -> succeeded   (event stays completed)
    in_flight -------------------------------- outcome_unknown -------> unknown     event unknown/<reason>
    in_flight (claim ran out) ---------------- expire ----------------> unknown     event unknown/claim_expired
    retry_wait (due) / pending (hand-over lost) requeue --------------> pending
    unknown ---------------------------------- reopen ----------------> pending     event write_pending
    unknown ---------------------------------- hold ------------------> held        (event unknown/outcome_unknown)
    unknown ---------------------------------- record_success --------> succeeded   found by external_ref
  a failure for good (PermanentError, or TransientError at the cap) of an intent that was ever unknown
  (it has an intent_unknown row) is known only once its destination, asked by external_ref, says so
  (`lookup`; found: only while the attempt is still this worker's, or its claim ran out as it asked):
    in_flight -------------------------------- record_failure --------> succeeded   found: mapping, no write
    in_flight -------------------------------- record_failure --------> failed      a consistent lookup: none
    in_flight -------------------------------- record_failure --------> held        event unknown/search_found_nothing
                                                                                    (lagging search: none) or
                                                                                    unknown/failed_after_unknown (no
                                                                                    lookup; an acknowledgment's event
                                                                                    stays completed)
    in_flight -------------------------------- record_failure --------> unknown     event unknown/asking_after_unknown
                                                                                    (lookup failed, or not due yet:
                                                                                    parked, its row `parked`)
    unknown (`awaits_lookup`) ---------------- settle_known_failure --> succeeded/failed/held  by resolve_unknown,
                                                                                    asked again; never reopened
  operators (ticketing.replay; their action's own audit row records the move):
    failed/held ------------------------------ replay ----------------> pending     same key, fresh retry budget
    failed/held/unknown ---------------------- record_success --------> succeeded   a reviewer found the ticket
    failed/held (notify_requester) ----------- settle ----------------> succeeded   "handled-by-operator"
    unknown ---------------------------------- supersede -------------> held        a new action_version replaces it
    pending/retry_wait/unknown --------------- hold_open -------------> held        the event is closed
    (insert, never attempted) ---------------- create_held -----------> held        then settled by record_success

What entering a state does to the other fields, decided once (`_ENTRY`; "-" = unchanged):

    entering     attempts  next_attempt_at  claimed_by  claimed_until  completed_at  last_error_kind/last_error
    in_flight    +1        -                worker      now + claim    -             -
    retry_wait   -         now + backoff    -           NULL           -             this failure
    failed       -         NULL             -           NULL           now           this failure
    unknown      -         NULL             -           NULL           -             this failure (or claim_expired)
    succeeded    -         NULL             -           NULL           now           cleared
    held         -         NULL             -           NULL           -             - (from in_flight: this failure;
                                                                        supersede: "superseded")
    pending      -         now              ""          NULL           NULL          -
    pending by an operator's `replay`: attempts = 0 as well (a fresh retry budget; the
    machine's requeue and reopen keep counting, so the retry cap still holds).

`next_attempt_at` is set only while the intent waits for a worker (pending: when
it was handed over, so a lost hand-over is seen; retry_wait: when it is due) and
while that worker holds it; `claimed_by` says who made the latest attempt until
the intent is pending again. `claim` and `requeue` write no audit row (the
attempt's outcome does); operator transitions are recorded by the operator
action's own row (`replayed`, `replayed_as_new_action`, `ticket_confirmed`,
`acknowledgment_handled`, `closed_not_a_request`), written by `ticketing.replay`
in the same transaction.
"""

from .core import (
    ATTEMPT_AUDIT_KIND,
    AUDIT_KIND,
    CONFIRMABLE_STATES,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_BASE_SECONDS,
    DEFAULT_RETRY_CAP_SECONDS,
    FOLLOWING_ACTIONS,
    NOT_SENT_REF,
    OPEN_STATES,
    OPERATOR_RESULT_REF,
    REPLAYABLE_STATES,
    SUPERSEDABLE_STATES,
    EventState,
    IntentState,
    claim,
    fail,
    follow_up_instead,
    max_attempts,
    outcome_unknown,
    record_acknowledgment_not_sent,
    record_files_attached,
    record_success,
    retry_later,
    still_claimed,
)
from .creation import (
    ATTACH_TOPIC,
    NOTIFY_TOPIC,
    create_if_missing,
    create_intent,
    ensure_intent,
    external_ref,
    intent_key,
)
from .failures import record_failure
from .lookup import (
    CANNOT,
    DOUBT,
    FOUND,
    LATER,
    NOTHING,
    Answer,
    ask_destination,
    awaits_lookup,
    last_unknown_at,
    settle_known_failure,
)
from .operator import create_held, hold_open, replay, settle, supersede
from .sweeps import (
    enqueue_due,
    expire,
    expire_claims,
    hold,
    reopen,
    requeue,
    resolve_unknown,
    resolve_unknown_intents,
)

# The package's API: what other modules call (a type checker reads this list too).
__all__ = [
    "ATTEMPT_AUDIT_KIND",
    "AUDIT_KIND",
    "CONFIRMABLE_STATES",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_RETRY_BASE_SECONDS",
    "DEFAULT_RETRY_CAP_SECONDS",
    "FOLLOWING_ACTIONS",
    "NOT_SENT_REF",
    "OPEN_STATES",
    "OPERATOR_RESULT_REF",
    "REPLAYABLE_STATES",
    "SUPERSEDABLE_STATES",
    "EventState",
    "IntentState",
    "claim",
    "fail",
    "follow_up_instead",
    "max_attempts",
    "outcome_unknown",
    "record_acknowledgment_not_sent",
    "record_files_attached",
    "record_success",
    "retry_later",
    "still_claimed",
    "ATTACH_TOPIC",
    "NOTIFY_TOPIC",
    "create_if_missing",
    "create_intent",
    "ensure_intent",
    "external_ref",
    "intent_key",
    "record_failure",
    "CANNOT",
    "DOUBT",
    "FOUND",
    "LATER",
    "NOTHING",
    "Answer",
    "ask_destination",
    "awaits_lookup",
    "last_unknown_at",
    "settle_known_failure",
    "create_held",
    "hold_open",
    "replay",
    "settle",
    "supersede",
    "enqueue_due",
    "expire",
    "expire_claims",
    "hold",
    "reopen",
    "requeue",
    "resolve_unknown",
    "resolve_unknown_intents",
]

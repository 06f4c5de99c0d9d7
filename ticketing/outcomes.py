"""What one call of the pipeline did: the words `process_inbox_event`, the destination call, the set-based
path, attachments and acknowledgments return, for task results, logs, drills and tests.

One word per meaning: the state an event was left in says itself (`AWAITING_REVIEW`, whichever path sent it
there), and a wait says what it waits for. Words that name a state of a model are that state's stored value,
bound by tests/test_registries.py. tests/test_vocabulary.py refuses a bare outcome string in these modules.
"""

from enum import StrEnum


class Outcome(StrEnum):
    # Nothing done now: someone else has it, or it is over.
    MISSING = "missing"  # no such row
    DONE = "done"  # already finished (by an earlier run or another worker)
    BUSY = "busy"  # another worker holds it, or it is not due yet
    NOT_READY = "not_ready"  # its event is not at the stage this call carries on from
    CLAIM_LOST = "claim_lost"  # the claim expired or moved on before the result was recorded
    DRILL = "drill"  # a drill's event: the drill drives it (reconciliation.drills)
    ERROR = "error"  # raised; logged, and the sweeps bring it back
    # Waits: the event is parked and comes back by itself.
    PAUSED = "paused"  # its mailbox, tenant, destination or the platform is paused
    WAITING = "waiting"  # a dependency (the scanner) is unreachable: InboxEvent.State.WAITING
    WAITING_FOR_THREAD = "waiting_for_thread"  # the thread's lease is held, or an earlier message has no ticket
    WAITING_FOR_COPY = "waiting_for_copy"  # the primary delivery of the same message is still open
    OVER_CAP = "over_cap"  # the destination's concurrency cap is full (ticketing.bulkhead)
    # Handed on.
    CLAIMED = "claimed"  # the bulkhead's claim succeeded (the caller goes on to call)
    HANDED_OVER = "handed_over"  # the call waits in the destination pool's queue
    HANDED_BACK = "handed_back"  # the pool gave it back to the per-event path
    FOLLOW_UP = "follow_up"  # the desk refused a comment on a closed ticket: a new ticket is planned
    # Ended, for this event or intent.
    CREATED = "created"  # the destination's write is recorded
    LATE_SUCCESS = "late_success"  # the write succeeded but could not be recorded: reconciliation looks
    LINKED = "linked"  # a copy linked to its primary's ticket
    ATTACHED = "attached"  # the files went to the ticket
    SENT = "sent"  # the acknowledgment was sent
    NO_TICKET = "no_ticket"  # nothing to attach to or acknowledge: no ticket was made
    NOT_DELIVERABLE = "not_deliverable"  # no form of the requester's address this relay can send to
    TEMPLATE_FAILED = "template_failed"  # the acknowledgment's template could not be rendered
    SUPPRESSED = "suppressed"  # InboxEvent.State.SUPPRESSED
    AWAITING_REVIEW = "awaiting_review"  # InboxEvent.State.AWAITING_REVIEW: in the recovery queue
    QUARANTINED = "quarantined"  # InboxEvent.State.QUARANTINED
    FAILED = "failed"  # the intent failed for good (Intent.State.FAILED)
    RETRY_WAIT = "retry_wait"  # the intent waits for its next attempt (Intent.State.RETRY_WAIT)
    UNKNOWN = "unknown"  # the outcome at the desk is unknown (Intent.State.UNKNOWN)

"""Writes of the intake app. Every state change and its audit row share one transaction. By concern:
`ingestion` (storing a message), `events` (the door for `InboxEvent.state`, audit rows, takes and waits),
`outbox` (the transactional outbox), `sweeps` (stale events, nonces); this package re-exports what other modules call
(module internals such as the large-object piece size stay in their module, where a test patches them).

`transition_event` is the one door for `InboxEvent.state`: ingest inserts the
event as `received`, and every later move, whichever app asks for it, is a
conditional UPDATE through that function (see its docstring, and
docs/design.md §6 for the table of moves).
"""

from .events import (
    NOT_COMPLETED_STATES,
    record_audit,
    record_progress,
    record_taken,
    release_waiting_events,
    transition_event,
    transition_events,
    wait_event,
)
from .ingestion import (
    PROVIDER_OWN_IDS,
    IngestItem,
    IngestResult,
    count_webhook_rejection,
    ingest,
    ingest_batch,
    ingest_under_an_unsigned_id,
)
from .outbox import (
    NOTIFY_CHANNEL,
    POLL_TOPIC,
    PROCESS_TOPIC,
    enqueue_outbox,
)
from .sweeps import (
    purge_webhook_nonces,
    requeue_stale_events,
)

__all__ = [
    "NOT_COMPLETED_STATES",
    "record_audit",
    "record_progress",
    "record_taken",
    "release_waiting_events",
    "transition_event",
    "transition_events",
    "wait_event",
    "PROVIDER_OWN_IDS",
    "IngestItem",
    "IngestResult",
    "count_webhook_rejection",
    "ingest",
    "ingest_batch",
    "ingest_under_an_unsigned_id",
    "NOTIFY_CHANNEL",
    "POLL_TOPIC",
    "PROCESS_TOPIC",
    "enqueue_outbox",
    "purge_webhook_nonces",
    "requeue_stale_events",
]

"""Set-based moves of the Intent machine, for a group of built-in-store tickets (`ticketing.batch`).

The same rows as `create_if_missing` + `claim` + `record_success` + `followups.plan_acknowledgment` per event,
as a handful of statements in the caller's transaction:

    create_missing             (insert) -> pending, INSERT ... ON CONFLICT DO NOTHING RETURNING: the
                               events whose intent this call made (another worker's intent wins)
    record_successes_builtin   pending -> succeeded in one conditional UPDATE (claim and success at once:
                               the built-in store's ticket is inserted in this same transaction), the
                               mappings, the events `completed` (intake's door), the audit rows, and the
                               acknowledgment intents with their outbox rows

and for a group of acknowledgments (`acknowledgments.send_group`), the moves of `claim` and of a sent one:

    claim_acknowledgments      pending/retry_wait (due) -> in_flight, one guarded UPDATE ... RETURNING id
    record_acknowledgments_sent  in_flight (this worker's) -> succeeded, one guarded UPDATE ... RETURNING id,
                               and the `acknowledged` audit rows of the ids it returned, in one transaction

A row that does not land (someone else moved it) raises `Conflict`: the caller rolls the whole
transaction back and takes the per-event path, whose conditional writes decide again.

Both databases run this path. PostgreSQL reads a group's rows from typed arrays (`unnest`); SQLite, the
embedded default, has no arrays, so the same statements read them from one JSON array (`json_each`,
one `[...]` per row): the same columns, the same ON CONFLICT and conditional UPDATE, the same `Conflict`
(SQLite 3.35+ for RETURNING and UPDATE ... FROM, as `ticketing.leases` already needs). Portable SQL
rather than the per-event path on SQLite: `make run` then writes a group the way production does (one
write transaction for the group, which also suits SQLite's single writer), and tests/test_sqlite_parity.py
compares its rows with the per-event path's on a real SQLite file.
"""

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from intake.models import AuditEvent, InboxEvent, OutboxMessage
from intake.services import (
    NOT_COMPLETED_STATES,
    NOTIFY_CHANNEL,
    transition_events,
)
from intake.vocabulary import ReasonCode, SystemActor

from .. import ack_policy
from ..models import Destination, Intent, TicketMapping
from .core import AUDIT_KIND, CLAIM_EXPIRED_ERROR, IntentState
from .creation import NOTIFY_TOPIC, external_ref, intent_key

logger = logging.getLogger(__name__)


class Conflict(Exception):
    """A conditional write matched fewer rows than it should: someone else moved one of them."""


@dataclass
class BuiltinSuccess:
    """One event's ticket, already inserted in the caller's transaction."""

    event: InboxEvent  # as normalization stored it (sender, details, auth_results) with its mailbox
    intent_id: int
    destination: Destination
    ticket_id: str
    ticket_url: str
    acknowledgment: Intent | None = None  # planned by `_plan_acknowledgment`, inserted with the others


_INSERT_PENDING = """
INSERT INTO {table} (idempotency_key, inbox_event_id, action, action_version, destination_id, state, attempts,
                     claimed_by, last_error_kind, last_error, external_ref, result_ref, progress, created_at)
SELECT v.key, v.event, %(action)s, 1, v.destination, %(pending)s, 0, '', '', '', v.ref, '', '{{}}', %(now)s
FROM unnest(%(keys)s::text[], %(events)s::bigint[], %(destinations)s::bigint[], %(refs)s::text[])
     AS v(key, event, destination, ref)
ON CONFLICT DO NOTHING
RETURNING id, inbox_event_id, idempotency_key
"""

# pending -> succeeded: the claim (attempts + 1, claimed_by) and the success's fields in one UPDATE.
_SUCCEED = """
UPDATE {table} AS i SET state = %(succeeded)s, attempts = i.attempts + 1, claimed_by = %(worker)s,
       claimed_until = NULL, next_attempt_at = NULL, completed_at = %(now)s, last_error_kind = '',
       last_error = '', result_ref = v.ref
FROM unnest(%(ids)s::bigint[], %(refs)s::text[]) AS v(id, ref)
WHERE i.id = v.id AND i.state = %(pending)s
"""

# The same two statements on SQLite, rows from %(rows)s = a JSON array of [key, event, destination, ref] and
# of [id, ref]. `WHERE true` keeps the parser from reading ON CONFLICT as a join's ON (SQLite's upsert rule).
_INSERT_PENDING_SQLITE = """
INSERT INTO {table} (idempotency_key, inbox_event_id, action, action_version, destination_id, state, attempts,
                     claimed_by, last_error_kind, last_error, external_ref, result_ref, progress, created_at)
SELECT json_extract(v.value, '$[0]'), json_extract(v.value, '$[1]'), %(action)s, 1, json_extract(v.value, '$[2]'),
       %(pending)s, 0, '', '', '', json_extract(v.value, '$[3]'), '', '{{}}', %(now)s
FROM json_each(%(rows)s) AS v WHERE true
ON CONFLICT DO NOTHING
RETURNING id, inbox_event_id, idempotency_key
"""

_SUCCEED_SQLITE = """
UPDATE {table} AS i SET state = %(succeeded)s, attempts = i.attempts + 1, claimed_by = %(worker)s,
       claimed_until = NULL, next_attempt_at = NULL, completed_at = %(now)s, last_error_kind = '',
       last_error = '', result_ref = json_extract(v.value, '$[1]')
FROM json_each(%(rows)s) AS v
WHERE i.id = json_extract(v.value, '$[0]') AND i.state = %(pending)s
"""


def group_statement(
    postgres_sql: str, sqlite_sql: str, columns: dict[str, list[Any]], params: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """(SQL, parameters) for this database: PostgreSQL gets `columns` as arrays, SQLite as one JSON array of rows
    (`rows`, in the columns' order) and its timestamps as the ORM stores them (`now`)."""
    if settings.USING_POSTGRES:
        return postgres_sql, {**params, **columns}
    rows = [list(row) for row in zip(*columns.values(), strict=True)]
    params = {**params, "rows": json.dumps(rows)}
    if "now" in params:
        params["now"] = connection.ops.adapt_datetimefield_value(params["now"])
    return sqlite_sql, params


def create_missing(
    pairs: list[tuple[InboxEvent, Destination]], action: str, now: datetime
) -> dict[int, tuple[int, str]]:
    """Version 1 of `action` for each (event, destination), pending, where none exists yet.

    Returns {event id: (intent id, idempotency key)} for the intents this call inserted; an event
    missing from it already had one (or another worker's insert won): not ours to carry out here.
    """
    if not pairs:
        return {}
    keys = [intent_key(event, action, 1) for event, _ in pairs]
    sql, params = group_statement(
        _INSERT_PENDING,
        _INSERT_PENDING_SQLITE,
        {
            "keys": keys,
            "events": [event.pk for event, _ in pairs],
            "destinations": [d.pk for _, d in pairs],
            "refs": [external_ref(key) for key in keys],
        },
        {"action": action, "pending": IntentState.PENDING, "now": now},
    )
    with connection.cursor() as cursor:
        cursor.execute(sql.format(table=Intent._meta.db_table), params)
        return {event_id: (intent_id, key) for intent_id, event_id, key in cursor.fetchall()}


def record_successes_builtin(
    successes: list[BuiltinSuccess],
    worker: str,
    now: datetime,
    leading_audits: dict[int, list[AuditEvent]] | None = None,
) -> None:
    """pending -> succeeded for each success, with everything `record_success` writes, set-based.

    Call inside the transaction that inserted the intents and the tickets. `leading_audits` are the
    rows each event's history shows before its `ticket_created` (its `classified` row), written in
    the same INSERT so they keep their order. Raises Conflict when a row did not land.
    """
    if not successes:
        return
    actor = f"worker:{worker}"
    sql, params = group_statement(
        _SUCCEED,
        _SUCCEED_SQLITE,
        {"ids": [s.intent_id for s in successes], "refs": [s.ticket_id for s in successes]},
        {"succeeded": IntentState.SUCCEEDED, "pending": IntentState.PENDING, "worker": worker, "now": now},
    )
    with connection.cursor() as cursor:
        cursor.execute(sql.format(table=Intent._meta.db_table), params)
        if cursor.rowcount != len(successes):
            raise Conflict(f"{len(successes) - cursor.rowcount} intents were no longer pending")
    TicketMapping.objects.bulk_create(
        [
            TicketMapping(
                inbox_event_id=s.event.pk,
                action=Intent.Action.CREATE_TICKET,
                destination_id=s.destination.pk,
                ticket_id=s.ticket_id,
                ticket_url=s.ticket_url,
                created_at=now,
            )
            for s in successes
        ]
    )
    moved = transition_events(
        [s.event.pk for s in successes], NOT_COMPLETED_STATES, InboxEvent.State.COMPLETED, now=now
    )
    if moved != len(successes):
        raise Conflict(f"{len(successes) - moved} events were already completed")
    budget = ack_policy.AcknowledgmentBudget(now=now)  # one for the group: it counts its own acknowledgments
    audits: list[AuditEvent] = []
    for s in successes:
        audits.extend((leading_audits or {}).get(s.event.pk, ()))
        audits.append(
            AuditEvent(
                inbox_event_id=s.event.pk,
                kind=AUDIT_KIND[Intent.Action.CREATE_TICKET],
                actor=actor,
                at=now,
                detail={
                    "intent": s.intent_id,
                    "action": Intent.Action.CREATE_TICKET,
                    "destination": s.destination.pk,
                    "ticket_id": s.ticket_id,
                },
            )
        )
        skipped = _plan_acknowledgment(s, now, budget)
        if skipped is not None:
            audits.append(skipped)
    AuditEvent.objects.bulk_create(audits)
    _enqueue_acknowledgments([s for s in successes if s.acknowledgment is not None], now)


def _plan_acknowledgment(
    success: BuiltinSuccess, now: datetime, budget: ack_policy.AcknowledgmentBudget
) -> AuditEvent | None:
    """`followups.plan_acknowledgment`, deferred: the intent to insert (kept on `success`), or the skip's audit row."""
    event = success.event
    skipped: dict[str, Any] | None
    if not ack_policy.mailroom_acknowledges(success.destination):
        skipped = {"reason": ReasonCode.DESK_ACKNOWLEDGES}
    else:
        skipped = ack_policy.skip_audit_detail(event, budget)
    if skipped is not None:
        logger.info("event %s: no acknowledgment (%s)", event.pk, skipped["reason"])
        return AuditEvent(
            inbox_event_id=event.pk,
            kind=ack_policy.SKIP_AUDIT_KIND,
            actor=SystemActor.ACKNOWLEDGMENTS,
            detail=skipped,
            at=now,
        )
    key = intent_key(event, Intent.Action.NOTIFY_REQUESTER, 1)
    # Planned once: the mapping inserted in this transaction is unique per event (a plain INSERT, as
    # `create_intent`).
    success.acknowledgment = Intent(
        idempotency_key=key,
        inbox_event_id=event.pk,
        action=Intent.Action.NOTIFY_REQUESTER,
        action_version=1,
        destination_id=success.destination.pk,
        state=IntentState.PENDING,
        external_ref=external_ref(key),
        created_at=now,
        # As `insert_intent`: entering pending says when it was handed over.
        next_attempt_at=now,
    )
    return None


def _enqueue_acknowledgments(successes: list[BuiltinSuccess], now: datetime) -> None:
    if not successes:
        return
    # The caller passes only the successes with an acknowledgment planned.
    planned = Intent.objects.bulk_create([cast(Intent, s.acknowledgment) for s in successes])
    OutboxMessage.objects.bulk_create(
        [OutboxMessage(topic=NOTIFY_TOPIC, payload={"intent_id": intent.pk}, created_at=now) for intent in planned]
    )
    if settings.USING_POSTGRES:
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {NOTIFY_CHANNEL}")  # delivered at commit, dropped on rollback


# --- a group of acknowledgments (`acknowledgments.send_group`) ------------------------------------------------
# The same moves as `claim` and a sent acknowledgment's in_flight -> succeeded, for a group: one guarded UPDATE
# each (RETURNING the rows that moved, so every other id is someone else's), the audit rows in the same transaction.

# pending/retry_wait (and due) -> in_flight, as `claim` (the entry fields of `core._ENTRY`).
_CLAIM_ACKNOWLEDGMENTS = """
UPDATE {table} SET state = %(in_flight)s, attempts = attempts + 1, claimed_by = %(worker)s, claimed_until = %(until)s
WHERE id = ANY(%(ids)s::bigint[]) AND action = %(notify)s AND state IN (%(pending)s, %(retry_wait)s)
  AND (next_attempt_at IS NULL OR next_attempt_at <= %(now)s)
RETURNING id
"""
_CLAIM_ACKNOWLEDGMENTS_SQLITE = """
UPDATE {table} SET state = %(in_flight)s, attempts = attempts + 1, claimed_by = %(worker)s, claimed_until = %(until)s
WHERE id IN (SELECT json_extract(v.value, '$[0]') FROM json_each(%(rows)s) AS v) AND action = %(notify)s
  AND state IN (%(pending)s, %(retry_wait)s) AND (next_attempt_at IS NULL OR next_attempt_at <= %(now)s)
RETURNING id
"""

# in_flight (still this worker's; or unknown because this worker's claim ran out meanwhile, as `record_success`
# allows: the relay accepted the message, so it is known) -> succeeded, the Message-ID its result.
_ACKNOWLEDGED = """
UPDATE {table} AS i SET state = %(succeeded)s, claimed_until = NULL, next_attempt_at = NULL, completed_at = %(now)s,
       last_error_kind = '', last_error = '', result_ref = v.ref
FROM unnest(%(ids)s::bigint[], %(refs)s::text[]) AS v(id, ref)
WHERE i.id = v.id AND i.claimed_by = %(worker)s
  AND (i.state = %(in_flight)s OR (i.state = %(unknown)s AND i.last_error_kind = %(expired)s))
RETURNING i.id
"""
# SQLite's RETURNING names the updated table's columns unqualified (json_each's own `id` cannot be meant).
_ACKNOWLEDGED_SQLITE = """
UPDATE {table} AS i SET state = %(succeeded)s, claimed_until = NULL, next_attempt_at = NULL, completed_at = %(now)s,
       last_error_kind = '', last_error = '', result_ref = json_extract(v.value, '$[1]')
FROM json_each(%(rows)s) AS v
WHERE i.id = json_extract(v.value, '$[0]') AND i.claimed_by = %(worker)s
  AND (i.state = %(in_flight)s OR (i.state = %(unknown)s AND i.last_error_kind = %(expired)s))
RETURNING id
"""


@dataclass(frozen=True)
class SentAcknowledgment:
    """One acknowledgment the relay accepted: what its intent's success records."""

    intent_id: int
    inbox_event_id: int
    message_id: str
    detail: dict[str, Any]  # for the `acknowledged` audit row (the ticket token, the wording)


def claim_acknowledgments(intent_ids: list[int], *, worker: str) -> set[int]:
    """`claim` for a group of `notify_requester` intents, in one statement: the ids now in_flight, `worker`'s
    until the claim expires. An id missing from the answer was not due, or another worker holds it."""
    if not intent_ids:
        return set()
    now = timezone.now()
    until = connection.ops.adapt_datetimefield_value(now + timedelta(seconds=settings.MAILROOM_CLAIM_SECONDS))
    sql, params = group_statement(
        _CLAIM_ACKNOWLEDGMENTS,
        _CLAIM_ACKNOWLEDGMENTS_SQLITE,
        {"ids": list(intent_ids)},
        {
            "in_flight": IntentState.IN_FLIGHT,
            "pending": IntentState.PENDING,
            "retry_wait": IntentState.RETRY_WAIT,
            "notify": Intent.Action.NOTIFY_REQUESTER,
            "worker": worker,
            "until": until,
            "now": now,
        },
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql.format(table=Intent._meta.db_table), params)
        return {row[0] for row in cursor.fetchall()}


def record_acknowledgments_sent(sent: list[SentAcknowledgment], *, worker: str) -> set[int]:
    """Each sent acknowledgment's intent -> succeeded (its Message-ID the result), with its `acknowledged` audit
    row, in one transaction. The events stay `completed`: there is no mapping to write. Returns the intent ids
    that moved; any other was no longer this worker's attempt (and gets no row)."""
    if not sent:
        return set()
    now = timezone.now()
    sql, params = group_statement(
        _ACKNOWLEDGED,
        _ACKNOWLEDGED_SQLITE,
        {"ids": [s.intent_id for s in sent], "refs": [s.message_id[:200] for s in sent]},
        {
            "succeeded": IntentState.SUCCEEDED,
            "in_flight": IntentState.IN_FLIGHT,
            "unknown": IntentState.UNKNOWN,
            "expired": CLAIM_EXPIRED_ERROR,
            "worker": worker,
            "now": now,
        },
    )
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql.format(table=Intent._meta.db_table), params)
            moved = {row[0] for row in cursor.fetchall()}
        AuditEvent.objects.bulk_create(
            [
                AuditEvent(
                    inbox_event_id=s.inbox_event_id,
                    kind=AUDIT_KIND[Intent.Action.NOTIFY_REQUESTER],
                    actor=f"worker:{worker}",
                    at=now,
                    detail={"intent": s.intent_id, **s.detail},
                )
                for s in sent
                if s.intent_id in moved
            ]
        )
    return moved

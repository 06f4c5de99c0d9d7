"""Storing a message: one statement (event, `received` audit row, outbox row, NOTIFY) or nothing when it is a
duplicate; a batch of them in one statement (IMAP); a message above the spool threshold sent as a large
object so the web holds it once; the per-provider count of refused webhooks."""

import json
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, TypedDict, cast

import psycopg
from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone
from psycopg import postgres
from psycopg.adapt import Dumper
from psycopg.pq import Format

from ..keys import content_fingerprint, dedupe_key, reused_id, thread_key_for_raw
from ..logging import event_line_due
from ..models import AuditEvent, InboxEvent, Mailbox, OutboxMessage
from ..vocabulary import AuditKind, WebhookRejection
from .events import record_audit
from .outbox import NOTIFY_CHANNEL, PROCESS_TOPIC, enqueue_outbox

logger = logging.getLogger(__name__)


UPLOAD_PIECE_BYTES = 1 << 20  # a message above the spool threshold goes to PostgreSQL this much at a time


@dataclass(frozen=True)
class IngestResult:
    inbox_event_id: int
    duplicate: bool


# Providers whose message id is their own, unique per message (never a sender's Message-ID):
# a second delivery under such an id is always the same message.
PROVIDER_OWN_IDS = frozenset({Mailbox.Provider.GMAIL, Mailbox.Provider.GRAPH})


def ingest(
    mailbox: Mailbox,
    provider_message_id: str,
    raw: bytes,
    *,
    source: str,
    thread_key: str | None = None,
    history: bool = False,
) -> IngestResult:
    """Persist a message once per (mailbox, provider message id), with its audit and outbox rows.

    A second delivery under the same id is a duplicate only when its content
    fingerprint matches: a different message that reuses a Message-ID (some
    ticketing and monitoring systems do) is stored as its own event, under the id
    `intake.keys.reused_id` derives, and flagged `message_id_reused`.

    Returns only after the commit (or inside the caller's transaction), so a
    caller that acknowledges the provider afterwards never acknowledges
    something we could lose.

    `history`: mail an archive import fetched from before the mailbox's cut-off (intake.archive); a duplicate
    keeps what the first delivery stored.
    """
    row = _row(mailbox, provider_message_id, raw, source, thread_key, history, timezone.now())
    event_id = _insert_event(row)
    if event_id is not None:
        if event_line_due():
            logger.info("stored event %s via %s (%d bytes)", event_id, source, len(raw))
        return IngestResult(event_id, duplicate=False)
    return _after_conflict(row)


@dataclass(frozen=True)
class IngestItem:
    """One message of `ingest_batch`: what `ingest` takes for one."""

    provider_message_id: str
    raw: bytes
    thread_key: str | None = None
    history: bool = False


def ingest_batch(*, mailbox: Mailbox, items: list[IngestItem], source: str) -> list[IngestResult]:
    """`ingest` for many messages of one mailbox, in the caller's transaction: one result per item, in order.

    On PostgreSQL the new messages are one statement (events, their `received` audit rows, their outbox
    rows and one NOTIFY; nothing for a message already stored); only the items that met a stored event,
    or an earlier item of the batch under the same id, go through `ingest`'s conflict rules one by one, so
    the outcome is the one the same items ingested in order would have. SQLite ingests them one by one.
    Call it inside a transaction that also holds what acknowledges the batch (the poller's cursor).
    """
    now = timezone.now()
    rows = [_row(mailbox, i.provider_message_id, i.raw, source, i.thread_key, i.history, now) for i in items]
    if not settings.USING_POSTGRES:
        return [
            ingest(mailbox, r.provider_message_id, r.raw, source=source, thread_key=r.thread_key, history=r.history)
            for r in rows
        ]
    first_of_key: dict[str, int] = {}
    for index, row in enumerate(rows):
        first_of_key.setdefault(row.key, index)
    inserted = _insert_events_postgres(mailbox, source, now, [rows[i] for i in first_of_key.values()])
    results = []
    for index, row in enumerate(rows):
        event_id = inserted.get(row.key) if first_of_key[row.key] == index else None
        results.append(IngestResult(event_id, duplicate=False) if event_id is not None else _after_conflict(row))
    stored = len(inserted)
    if stored:
        logger.info(
            "stored %d events via %s (%d bytes)",
            stored,
            source,
            sum(len(rows[first_of_key[key]].raw) for key in inserted),
        )
    return results


def _row(
    mailbox: Mailbox,
    provider_message_id: str,
    raw: bytes,
    source: str,
    thread_key: str | None,
    history: bool,
    now: datetime,
) -> "_IngestRow":
    # Keyed now, so a reply that is processed first can see its thread's earlier mail.
    thread_key = thread_key if thread_key is not None else thread_key_for_raw(raw)
    return _IngestRow(
        mailbox, provider_message_id, raw, source, thread_key, content_fingerprint(raw), now, history=history
    )


def _after_conflict(row: "_IngestRow") -> IngestResult:
    """The message's key is taken: a duplicate, or another message reusing its Message-ID (stored as its own)."""
    first = _stored_event(row.mailbox, row.provider_message_id)
    if (
        row.source in PROVIDER_OWN_IDS
        or row.mailbox.provider in PROVIDER_OWN_IDS
        or _same_content(first, row.fingerprint)
    ):
        if event_line_due():
            logger.info("duplicate delivery for event %s via %s", first["pk"], row.source)
        return IngestResult(first["pk"], duplicate=True)

    row = row.reusing(first["pk"])
    event_id = _insert_event(row)
    if event_id is not None:
        logger.warning(
            "event %s reuses the Message-ID of event %s with other content: stored as its own", event_id, first["pk"]
        )
        return IngestResult(event_id, duplicate=False)
    again = _stored_event(row.mailbox, row.provider_message_id)
    if event_line_due():
        logger.info("duplicate delivery for event %s via %s", again["pk"], row.source)
    return IngestResult(again["pk"], duplicate=True)


def ingest_under_an_unsigned_id(
    mailbox: Mailbox, provider_message_id: str, body: bytes, *, thread_key: str
) -> IngestResult:
    """Ingest a v1 request whose X-Mailroom-Message-Id the signature does not cover.

    A captured v1 request could be sent again under any id and be stored as a new message. So the same bytes
    (content fingerprint) stored in this mailbox within twice the tolerance window (a captured signature is
    good for no longer) under another id are answered as that event's duplicate. Such ingests of a mailbox are
    serialised by a row lock, so two replays at once cannot both pass. v2 signs the id and never comes here.
    """
    window = timedelta(seconds=2 * settings.MAILROOM_SIGNATURE_TOLERANCE_SECONDS)
    with transaction.atomic():
        list(Mailbox.objects.select_for_update().filter(pk=mailbox.pk).values_list("pk", flat=True))
        first = (
            InboxEvent.objects.filter(
                mailbox=mailbox, fingerprint=content_fingerprint(body), received_at__gte=timezone.now() - window
            )
            .exclude(provider_message_id=provider_message_id)
            .order_by("pk")
            .values_list("pk", flat=True)
            .first()
        )
        if first is not None:
            logger.warning(
                "mailbox %s: a v1-signed message sent again under another X-Mailroom-Message-Id "
                "within the signature's window: answered as the duplicate of event %s",
                mailbox.slug,
                first,
            )
            return IngestResult(first, duplicate=True)
        return ingest(mailbox, provider_message_id, body, source="raw", thread_key=thread_key)


@dataclass(frozen=True)
class _IngestRow:
    mailbox: Mailbox
    provider_message_id: str
    raw: bytes
    source: str
    thread_key: str
    fingerprint: str
    now: datetime
    reuses_event: int | None = None  # the earlier, different message whose Message-ID this one reuses
    history: bool = False  # imported as history by an archive import (intake.archive)

    @cached_property
    def key(self) -> str:
        return dedupe_key(self.mailbox.tenant_id, self.mailbox.pk, self.provider_message_id)

    @property
    def audit_detail(self) -> dict[str, int | bool]:
        detail: dict[str, int | bool] = {"size": len(self.raw)}
        if self.reuses_event is not None:
            detail.update(message_id_reused=True, first_event=self.reuses_event)
        if self.history:
            detail["history"] = True
        return detail

    def reusing(self, first_event_id: int) -> "_IngestRow":
        return replace(
            self, provider_message_id=reused_id(self.provider_message_id, self.fingerprint), reuses_event=first_event_id
        )


def _insert_event(row: _IngestRow) -> int | None:
    if settings.USING_POSTGRES:
        return _insert_event_postgres(row)
    return _insert_event_orm(row)


class _StoredEvent(TypedDict):
    """What `_stored_event` reads of the event that holds a message's key."""

    pk: int
    fingerprint: str


def _stored_event(mailbox: Mailbox, provider_message_id: str) -> _StoredEvent:
    found = (
        InboxEvent.objects.filter(dedupe_key=dedupe_key(mailbox.tenant_id, mailbox.pk, provider_message_id))
        .values("pk", "fingerprint")
        .first()
    )
    if found is None:  # a conflict that is not ours to hide
        raise IntegrityError("event for a message not stored and not found")
    return found


def _same_content(stored: _StoredEvent, fingerprint: str) -> bool:
    known = stored["fingerprint"]
    if not known:
        # Stored before fingerprints existed: compute it from the kept bytes. Without them,
        # the answer is the old one (a duplicate): a second ticket is the worse mistake here.
        raw = InboxEvent.objects.filter(pk=stored["pk"]).values_list("raw", flat=True).first()
        if raw is None:
            return True
        known = content_fingerprint(bytes(raw))
    return known == fingerprint


# The columns both ingest statements write, in their VALUES/SELECT order.
_INGEST_COLUMNS = (
    "tenant_id, mailbox_id, provider_message_id, dedupe_key, source, state, reason_code, "
    "reason_detail, received_at, updated_at, raw, size, message_id_header, sender, subject, "
    "thread_key, dispatch_count, auth_results, details, route_override, route, fingerprint, "
    "message_id_reused, history"
)


def _ingest_sql(template: str, **parts: str) -> str:
    """`template` with the tables and columns filled in (and `parts`, e.g. how the raw is read)."""
    return template.format(
        event=InboxEvent._meta.db_table,
        columns=_INGEST_COLUMNS,
        audit=AuditEvent._meta.db_table,
        outbox=OutboxMessage._meta.db_table,
        **parts,
    )


# One statement (so, on its own, one transaction and one round trip): the event, its
# `received` audit row, its outbox row and the relay's NOTIFY, or nothing at all when
# the message is already stored (either unique key).
_INGEST_SQL = """
WITH event AS (
    INSERT INTO {event} ({columns})
    VALUES (%(tenant)s, %(mailbox)s, %(pmid)s, %(key)s, %(source)s, 'received', '', '', %(now)s, %(now)s,
            {raw}, %(size)s, '', '', '', %(thread)s, 0, '{{}}', '{{}}', '{{}}', '{{}}', %(fingerprint)s, %(reused)s,
            %(history)s)
    ON CONFLICT DO NOTHING
    RETURNING id
), audit AS (
    INSERT INTO {audit} (inbox_event_id, actor, kind, detail, at)
    SELECT id, %(actor)s, %(kind)s, %(detail)s::jsonb, %(now)s FROM event
), outbox AS (
    INSERT INTO {outbox} (topic, payload, created_at, attempts)
    SELECT %(topic)s, jsonb_build_object('inbox_event_id', id), %(now)s, 0 FROM event
)
SELECT id, pg_notify(%(channel)s, '') FROM event
"""


class MessageBytesDumper(Dumper):
    """bytea in binary format handed to libpq as the very bytes object: psycopg's own (C) dumper copies it
    first, a second whole copy of a large message in the web worker (libpq's send buffer is the other)."""

    format = Format.BINARY
    oid = postgres.types["bytea"].oid

    def dump(self, obj: bytes) -> bytes:
        return obj


def _insert_event_postgres(row: _IngestRow) -> int | None:
    connection.ensure_connection()
    if len(row.raw) <= settings.MAILROOM_SPOOL_THRESHOLD_BYTES:
        return _run_ingest_statement(row, raw_sql="%(raw)s", raw_params={"raw": row.raw})
    # A large message goes to the server a piece at a time, as a large object the ingest statement reads
    # into the row (`lo_get`) and that is unlinked before the commit: libpq's send buffer holds a piece,
    # not a second whole copy of the message. A rollback or a crash leaves no large object behind.
    with transaction.atomic(), connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        oid: int | None = None
        for start in range(0, len(row.raw), UPLOAD_PIECE_BYTES):
            piece = row.raw[start : start + UPLOAD_PIECE_BYTES]
            if oid is None:
                cursor.execute("SELECT lo_from_bytea(0, %s)", [piece], binary=True)
                oid = cast("tuple[int]", cursor.fetchone())[0]  # a SELECT without FROM: always one row
            else:
                cursor.execute("SELECT lo_put(%s, %s, %s)", [oid, start, piece], binary=True)
            del piece
        event_id = _run_ingest_statement(row, raw_sql="lo_get(%(oid)s::oid)", raw_params={"oid": oid})
        cursor.execute("SELECT lo_unlink(%s)", [oid])
    return event_id


def _run_ingest_statement(row: _IngestRow, *, raw_sql: str, raw_params: dict[str, Any]) -> int | None:
    sql = _ingest_sql(_INGEST_SQL, raw=raw_sql)
    # A server-binding psycopg cursor with binary parameters: the message goes to PostgreSQL as bytea
    # bytes, not quoted into the SQL text on the client (Django's default client-side binding). Errors
    # are wrapped as Django's (IntegrityError, OperationalError), as through `connection.cursor()`.
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.adapters.register_dumper(bytes, MessageBytesDumper)
        cursor.execute(
            sql,
            binary=True,
            params={
                "tenant": row.mailbox.tenant_id,
                "mailbox": row.mailbox.pk,
                "pmid": row.provider_message_id,
                "key": row.key,
                "source": row.source,
                "now": row.now,
                **raw_params,
                "size": len(row.raw),
                "thread": row.thread_key,
                "fingerprint": row.fingerprint,
                "reused": row.reuses_event is not None,
                "history": row.history,
                "actor": f"provider:{row.source}",
                "kind": AuditKind.RECEIVED.value,
                "detail": json.dumps(row.audit_detail),
                "topic": PROCESS_TOPIC,
                "channel": NOTIFY_CHANNEL,
            },
        )
        result = cursor.fetchone()
    return result[0] if result else None


# `_INGEST_SQL` for many messages: the events from arrays (one element per message), then the audit and
# outbox rows of those the INSERT returned (the new ones only) and one NOTIFY.
_INGEST_BATCH_SQL = """
WITH event AS (
    INSERT INTO {event} ({columns})
    SELECT %(tenant)s, %(mailbox)s, m.pmid, m.key, %(source)s, 'received', '', '', %(now)s, %(now)s,
           m.raw, octet_length(m.raw), '', '', '', m.thread, 0, '{{}}', '{{}}', '{{}}', '{{}}', m.fingerprint, false,
           m.history
    FROM unnest(%(pmids)s::text[], %(keys)s::text[], %(raws)s::bytea[], %(threads)s::text[],
                %(fingerprints)s::text[], %(histories)s::boolean[]) WITH ORDINALITY
         AS m (pmid, key, raw, thread, fingerprint, history, n)
    ORDER BY m.n
    ON CONFLICT DO NOTHING
    RETURNING id, dedupe_key, size, history
), audit AS (
    INSERT INTO {audit} (inbox_event_id, actor, kind, detail, at)
    SELECT id, %(actor)s, %(kind)s,
           CASE WHEN history THEN jsonb_build_object('size', size, 'history', true)
                ELSE jsonb_build_object('size', size) END, %(now)s
    FROM event ORDER BY id
), outbox AS (
    INSERT INTO {outbox} (topic, payload, created_at, attempts)
    SELECT %(topic)s, jsonb_build_object('inbox_event_id', id), %(now)s, 0 FROM event ORDER BY id
), notify AS (
    SELECT pg_notify(%(channel)s, '') WHERE EXISTS (SELECT 1 FROM event)
)
SELECT id, dedupe_key FROM event, (SELECT count(*) FROM notify) AS notified
"""


def _insert_events_postgres(mailbox: Mailbox, source: str, now: datetime, rows: list[_IngestRow]) -> dict[str, int]:
    """{dedupe key: event id} of the rows stored now; the others' keys were taken already."""
    if not rows:
        return {}
    sql = _ingest_sql(_INGEST_BATCH_SQL)
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(
            sql,
            binary=True,
            params={
                "tenant": mailbox.tenant_id,
                "mailbox": mailbox.pk,
                "source": source,
                "now": now,
                "pmids": [r.provider_message_id for r in rows],
                "keys": [r.key for r in rows],
                "raws": [r.raw for r in rows],
                "threads": [r.thread_key for r in rows],
                "fingerprints": [r.fingerprint for r in rows],
                "histories": [r.history for r in rows],
                "actor": f"provider:{source}",
                "kind": AuditKind.RECEIVED.value,
                "topic": PROCESS_TOPIC,
                "channel": NOTIFY_CHANNEL,
            },
        )
        return dict((key, event_id) for event_id, key in cursor.fetchall())


def _insert_event_orm(row: _IngestRow) -> int | None:
    """The embedded default (SQLite): the same three rows in one transaction."""
    try:
        with transaction.atomic():
            event = InboxEvent.objects.create(
                tenant_id=row.mailbox.tenant_id,
                mailbox=row.mailbox,
                provider_message_id=row.provider_message_id,
                dedupe_key=row.key,
                source=row.source,
                received_at=row.now,
                updated_at=row.now,
                raw=row.raw,
                size=len(row.raw),
                thread_key=row.thread_key,
                dispatch_count=0,
                fingerprint=row.fingerprint,
                message_id_reused=row.reuses_event is not None,
                history=row.history,
            )
            record_audit(
                event.pk, kind=AuditKind.RECEIVED, actor=f"provider:{row.source}", detail=row.audit_detail, at=row.now
            )
            enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": event.pk}, now=row.now)
    except IntegrityError:
        return None
    return event.pk


_REJECTION_UPSERT = """
INSERT INTO intake_webhookrejectioncount (provider, reason, count, last_at) VALUES (%s, %s, 1, %s)
ON CONFLICT (provider, reason) DO UPDATE
SET count = intake_webhookrejectioncount.count + 1, last_at = EXCLUDED.last_at
"""


def count_webhook_rejection(provider: str, reason: WebhookRejection) -> None:
    """Bump `mailroom_webhook_rejections_total{provider, reason}`: one UPSERT, in its own autocommit.

    Called after the request's transaction (if any) rolled back, so a refusal is counted even though
    nothing else of it is stored. `provider` is folded to a known provider or "unknown" (the URL is the
    caller's to choose: labels must not be). Never raises: a counter must not turn a 401 into a 500.
    """
    label = provider if provider in Mailbox.Provider.values else "unknown"
    try:
        with connection.cursor() as cursor:
            cursor.execute(_REJECTION_UPSERT, [label, WebhookRejection(reason).value, timezone.now()])
    except DatabaseError:
        logger.exception("could not count a webhook rejection (%s, %s)", label, reason)

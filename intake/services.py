"""Writes of the intake app. Every state change and its audit row share one transaction."""
import json
import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from . import selectors
from .keys import dedupe_key, thread_key_for_raw
from .models import AuditEvent, InboxEvent, Mailbox, OutboxMessage

logger = logging.getLogger(__name__)

PROCESS_TOPIC = "inbox_event.process"
POLL_TOPIC = "mailbox.poll"
NOTIFY_CHANNEL = "mailroom_outbox"
STALE_CANDIDATE_STATES = (InboxEvent.State.RECEIVED, InboxEvent.State.READY)


@dataclass(frozen=True)
class IngestResult:
    inbox_event_id: int
    duplicate: bool


def record_audit(inbox_event_id: int, kind: str, actor: str, detail: dict | None = None, at=None) -> AuditEvent:
    return AuditEvent.objects.create(
        inbox_event_id=inbox_event_id, kind=kind, actor=actor, detail=detail or {}, at=at or timezone.now()
    )


def enqueue_outbox(topic: str, payload: dict, now=None) -> OutboxMessage:
    """Write an outbox row; call inside the transaction whose change it announces."""
    message = OutboxMessage.objects.create(topic=topic, payload=payload, created_at=now or timezone.now())
    if settings.USING_POSTGRES:
        # Delivered at commit (and dropped on rollback): the relay's fast path.
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {NOTIFY_CHANNEL}")
    return message


def ingest(mailbox: Mailbox, provider_message_id: str, raw: bytes, source: str,
           thread_key: str | None = None) -> IngestResult:
    """Persist a message once per (mailbox, provider message id), with its audit and outbox rows.

    Returns only after the commit (or inside the caller's transaction), so a
    caller that acknowledges the provider afterwards never acknowledges
    something we could lose.
    """
    now = timezone.now()
    key = dedupe_key(mailbox.tenant_id, mailbox.pk, provider_message_id)
    # Keyed now, so a reply that is processed first can see its thread's earlier mail.
    thread_key = thread_key if thread_key is not None else thread_key_for_raw(raw)
    if settings.USING_POSTGRES:
        event_id = _insert_event_postgres(mailbox, provider_message_id, key, raw, source, thread_key, now)
    else:
        event_id = _insert_event_orm(mailbox, provider_message_id, key, raw, source, thread_key, now)
    if event_id is None:
        existing = InboxEvent.objects.filter(dedupe_key=key).values_list("pk", flat=True).first()
        if existing is None:  # a conflict that is not ours to hide
            raise IntegrityError(f"event for {source} message not stored and not found")
        logger.info("duplicate delivery for event %s via %s", existing, source)
        return IngestResult(existing, duplicate=True)
    logger.info("stored event %s via %s (%d bytes)", event_id, source, len(raw))
    return IngestResult(event_id, duplicate=False)


# One statement (so, on its own, one transaction and one round trip): the event, its
# `received` audit row, its outbox row and the relay's NOTIFY, or nothing at all when
# the message is already stored (either unique key).
_INGEST_SQL = """
WITH event AS (
    INSERT INTO {event} (tenant_id, mailbox_id, provider_message_id, dedupe_key, source, state,
                         reason_code, reason_detail, received_at, updated_at, raw, size, message_id_header,
                         sender, subject, thread_key, dispatch_count, auth_results, details, route_override)
    VALUES (%(tenant)s, %(mailbox)s, %(pmid)s, %(key)s, %(source)s, 'received', '', '', %(now)s, %(now)s,
            %(raw)s, %(size)s, '', '', '', %(thread)s, 1, '{{}}', '{{}}', '{{}}')
    ON CONFLICT DO NOTHING
    RETURNING id
), audit AS (
    INSERT INTO {audit} (inbox_event_id, actor, kind, detail, at)
    SELECT id, %(actor)s, 'received', %(detail)s::jsonb, %(now)s FROM event
), outbox AS (
    INSERT INTO {outbox} (topic, payload, created_at, attempts)
    SELECT %(topic)s, jsonb_build_object('inbox_event_id', id), %(now)s, 0 FROM event
)
SELECT id, pg_notify(%(channel)s, '') FROM event
"""


def _insert_event_postgres(mailbox, provider_message_id, key, raw, source, thread_key, now) -> int | None:
    sql = _INGEST_SQL.format(event=InboxEvent._meta.db_table, audit=AuditEvent._meta.db_table,
                             outbox=OutboxMessage._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(sql, {
            "tenant": mailbox.tenant_id, "mailbox": mailbox.pk, "pmid": provider_message_id, "key": key,
            "source": source, "now": now, "raw": raw, "size": len(raw), "thread": thread_key,
            "actor": f"provider:{source}", "detail": json.dumps({"size": len(raw)}), "topic": PROCESS_TOPIC,
            "channel": NOTIFY_CHANNEL,
        })
        row = cursor.fetchone()
    return row[0] if row else None


def _insert_event_orm(mailbox, provider_message_id, key, raw, source, thread_key, now) -> int | None:
    """The embedded default (SQLite): the same three rows in one transaction."""
    try:
        with transaction.atomic():
            event = InboxEvent.objects.create(
                tenant_id=mailbox.tenant_id, mailbox=mailbox, provider_message_id=provider_message_id,
                dedupe_key=key, source=source, received_at=now, updated_at=now, raw=raw, size=len(raw),
                thread_key=thread_key, dispatch_count=1,
            )
            record_audit(event.pk, "received", actor=f"provider:{source}", detail={"size": len(raw)}, at=now)
            enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": event.pk}, now=now)
    except IntegrityError:
        return None
    return event.pk


def requeue_stale_events(older_than_seconds: int | None = None, limit: int = 1000) -> dict:
    """Find events that made no progress and hand them to the broker again.

    Whatever was lost between the database and the broker (a relay that died
    after publishing, a message dropped by a broker, a worker killed while it
    held the task) is found here. Past `MAILROOM_MAX_DISPATCHES` the event is a
    poison message and goes to the recovery queue instead. An event that waits
    on purpose (`retry_at`: a pause, an unreachable scanner) is requeued when
    its wait is over, and that does not count as a failed dispatch.
    """
    if selectors.global_pause_on():
        return {"requeued": 0, "poisoned": 0, "paused": True}
    stale_after = older_than_seconds if older_than_seconds is not None else settings.MAILROOM_STALE_EVENT_SECONDS
    now = timezone.now()
    cutoff = now - timedelta(seconds=stale_after)
    requeued = poisoned = 0
    candidates = list(
        # write_pending events belong to their intent, whose own sweeps watch them.
        InboxEvent.objects.filter(state__in=STALE_CANDIDATE_STATES, mailbox__paused=False)
        .filter(Q(retry_at__isnull=True, updated_at__lt=cutoff) | Q(retry_at__lte=now))
        .order_by("updated_at")
        .values_list("pk", "state", "dispatch_count", "retry_at")[:limit]
    )
    for event_id, state, dispatches, retry_at in candidates:
        with transaction.atomic():
            if retry_at is not None:
                if InboxEvent.objects.filter(pk=event_id, state=state, retry_at=retry_at).update(
                        retry_at=None, updated_at=now):
                    enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": event_id}, now=now)
                    requeued += 1
                continue
            stale = InboxEvent.objects.filter(pk=event_id, state=state, retry_at__isnull=True, updated_at__lt=cutoff)
            if dispatches >= settings.MAILROOM_MAX_DISPATCHES:
                if stale.update(state=InboxEvent.State.FAILED, reason_code="poison",
                                reason_detail=f"dispatched {dispatches} times without progress", updated_at=now):
                    record_audit(event_id, "poison", actor="system:sweep", detail={"dispatches": dispatches}, at=now)
                    poisoned += 1
                continue
            if stale.update(updated_at=now, dispatch_count=F("dispatch_count") + 1):
                enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": event_id}, now=now)
                record_audit(event_id, "requeued", actor="system:sweep", detail={"state": state}, at=now)
                requeued += 1
    if requeued or poisoned:
        logger.warning("stale-event sweep: requeued %d, poisoned %d", requeued, poisoned)
    return {"requeued": requeued, "poisoned": poisoned}


def wait_event(event_id: int, seconds: float) -> None:
    """Park an open event on purpose (a pause, an unreachable scanner) until `seconds` from now."""
    now = timezone.now()
    InboxEvent.objects.filter(pk=event_id, state__in=InboxEvent.OPEN_STATES).update(
        retry_at=now + timedelta(seconds=seconds), updated_at=now)


def release_waiting_events(mailbox_id: int | None = None) -> int:
    """End every deliberate wait now (after a resume) and enqueue those events: the backlog drains."""
    now = timezone.now()
    waiting = InboxEvent.objects.filter(state__in=InboxEvent.OPEN_STATES, retry_at__isnull=False)
    if mailbox_id is not None:
        waiting = waiting.filter(mailbox_id=mailbox_id)
    released = 0
    for event_id, retry_at in waiting.values_list("pk", "retry_at").iterator():
        with transaction.atomic():
            if InboxEvent.objects.filter(pk=event_id, retry_at=retry_at).update(retry_at=None, updated_at=now):
                enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": event_id}, now=now)
                released += 1
    return released


def transition_event(event_id: int, from_states, to_state: str, *, actor: str, kind: str,
                     reason_code: str = "", reason_detail: str = "", detail: dict | None = None,
                     extra: dict | None = None) -> bool:
    """Move an event between states with a conditional UPDATE and its audit row, atomically.

    Returns False, changing nothing, when the event is no longer in one of
    `from_states`: someone else moved it, and the caller stops.
    """
    now = timezone.now()
    with transaction.atomic():
        moved = InboxEvent.objects.filter(pk=event_id, state__in=list(from_states)).update(
            state=to_state, reason_code=reason_code, reason_detail=reason_detail[:2000], updated_at=now,
            **(extra or {}),
        )
        if moved:
            record_audit(event_id, kind, actor=actor,
                         detail={"state": to_state, "reason": reason_code, **(detail or {})}, at=now)
    return bool(moved)


def purge_webhook_nonces(older_than_seconds: int | None = None) -> int:
    """One-time tokens outlive their use only as long as a replay could still be fresh."""
    from .models import WebhookNonce

    keep = older_than_seconds if older_than_seconds is not None else 2 * settings.MAILROOM_SIGNATURE_TOLERANCE_SECONDS
    deleted, _ = WebhookNonce.objects.filter(seen_at__lt=timezone.now() - timedelta(seconds=keep)).delete()
    return deleted

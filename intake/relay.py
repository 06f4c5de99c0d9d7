"""The outbox relay: publishes committed outbox rows to Celery, then marks them published.

A row is published at least once: a crash between publishing and our commit
publishes it again, which the tasks absorb (they re-read state and no-op).
On PostgreSQL, rows are claimed with FOR UPDATE SKIP LOCKED so that two relays
(or the relay and the beat sweep) never publish the same row at the same time.
"""
import json
import logging
import time
from collections import defaultdict
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from .models import OutboxMessage
from .services import NOTIFY_CHANNEL, POLL_TOPIC, PROCESS_TOPIC

logger = logging.getLogger(__name__)


# Topic -> (task name, id field). By name, so intake need not import the apps above it.
# Topics with an id field are published as lists of ids (one task per group amortises
# the broker round trip and the worker's per-task cost); others one task per payload.
TOPIC_TASKS = {
    PROCESS_TOPIC: ("ticketing.tasks.process_inbox_events", "inbox_event_id"),
    "intent.notify": ("ticketing.tasks.send_acknowledgments", "intent_id"),
    "intent.attach_files": ("ticketing.tasks.attach_files", "intent_id"),
    POLL_TOPIC: ("intake.tasks.poll_mailbox", None),
    "mailbox.alert": ("ticketing.tasks.send_mailbox_alerts", "mailbox_audit_id"),  # intake.mailbox_health
}


def _publish(topic: str, payloads: list[dict], group_size: int) -> None:
    if topic not in TOPIC_TASKS:
        raise ValueError(f"no task for outbox topic {topic!r}")
    task_name, id_field = TOPIC_TASKS[topic]
    if id_field:
        ids = sorted({p[id_field] for p in payloads})
        for start in range(0, len(ids), group_size):
            current_app.send_task(task_name, args=[ids[start : start + group_size]])
        return
    # A burst of identical payloads (pushes for one mailbox) is one task.
    for payload in {json.dumps(p, sort_keys=True): p for p in payloads}.values():
        current_app.send_task(task_name, kwargs=payload)


def publish_pending(batch_size: int | None = None, group_size: int | None = None) -> int:
    """Publish one batch of unpublished rows; returns how many rows were published."""
    batch_size = batch_size or settings.MAILROOM_RELAY_BATCH
    group_size = group_size or settings.MAILROOM_RELAY_GROUP
    with transaction.atomic():
        rows = list(
            OutboxMessage.objects.select_for_update(skip_locked=True)
            .filter(published_at__isnull=True)
            .order_by("id")
            .values_list("id", "topic", "payload")[:batch_size]
        )
        if not rows:
            return 0
        by_topic = defaultdict(list)
        for _, topic, payload in rows:
            by_topic[topic].append(payload)
        for topic, payloads in by_topic.items():
            _publish(topic, payloads, group_size)
        OutboxMessage.objects.filter(id__in=[r[0] for r in rows]).update(
            published_at=timezone.now(), attempts=F("attempts") + 1
        )
    return len(rows)


def publish_all_pending() -> int:
    total = 0
    while published := publish_pending():
        total += published
    return total


def purge_published(older_than_days: int | None = None) -> int:
    days = older_than_days if older_than_days is not None else settings.MAILROOM_OUTBOX_RETENTION_DAYS
    cutoff = timezone.now() - timedelta(days=days)
    deleted, _ = OutboxMessage.objects.filter(published_at__lt=cutoff).delete()
    return deleted


def _wait_for_notify(timeout: float) -> None:
    """Block until a NOTIFY arrives on the outbox channel or the timeout passes."""
    if not settings.USING_POSTGRES:
        time.sleep(min(timeout, 0.2))
        return
    connection.ensure_connection()
    pg = connection.connection  # psycopg 3 connection, in autocommit outside atomic()
    for _ in pg.notifies(timeout=timeout, stop_after=1):
        pass
    # Notifications that arrived while we were publishing wait in a backlog:
    # one publish round covers them all, so drain it instead of looping per NOTIFY.
    for _ in pg.notifies(timeout=0):
        pass


def run_relay(stop, sweep_seconds: float | None = None) -> None:
    """Loop until `stop()` is true: publish on every NOTIFY, and sweep at least every few seconds."""
    sweep_seconds = sweep_seconds or settings.MAILROOM_RELAY_SWEEP_SECONDS
    if settings.USING_POSTGRES:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute(f"LISTEN {NOTIFY_CHANNEL}")
    logger.info("outbox relay started")
    batch_size = settings.MAILROOM_RELAY_BATCH
    while not stop():
        try:
            published = publish_pending(batch_size)
            if published >= batch_size:
                continue  # a full batch: more are waiting
            _wait_for_notify(sweep_seconds)
            # Let the rows of concurrent commits gather: groups instead of one task per row,
            # for a few milliseconds of latency.
            time.sleep(settings.MAILROOM_RELAY_LINGER_SECONDS)
        except Exception:
            logger.exception("relay iteration failed; retrying")
            connection.close()
            time.sleep(1)
            if settings.USING_POSTGRES:
                connection.ensure_connection()
                with connection.cursor() as cursor:
                    cursor.execute(f"LISTEN {NOTIFY_CHANNEL}")

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
from collections.abc import Callable
from datetime import timedelta
from typing import Any, cast

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from .models import OutboxMessage
from .services import NOTIFY_CHANNEL, POLL_TOPIC, PROCESS_TOPIC

logger = logging.getLogger(__name__)

# While tasks wait in the broker, the relay looks again this often (one round trip to the broker).
HOLD_POLL_SECONDS = 0.01


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


def _publish(topic: str, payloads: list[dict[str, Any]], group_size: int) -> None:
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


def _wait_for_notify(timeout: float) -> bool:
    """Block until a NOTIFY arrives on the outbox channel or the timeout passes; whether rows may be waiting
    (always, without NOTIFY: SQLite)."""
    if not settings.USING_POSTGRES:
        time.sleep(min(timeout, 0.2))
        return True
    connection.ensure_connection()
    pg = connection.connection  # psycopg 3 connection, in autocommit outside atomic()
    notified = any(True for _ in pg.notifies(timeout=timeout, stop_after=1))
    # Notifications that arrived while we were publishing wait in a backlog:
    # one publish round covers them all, so drain it instead of looping per NOTIFY.
    for _ in pg.notifies(timeout=0):
        pass
    return notified


class BrokerBacklog:
    """How many tasks wait in the broker for a worker (the default queue, where the relay's tasks go).

    One broker connection for the relay's life, reopened after an error (`reset`).
    """

    def __init__(self) -> None:
        self.queue = current_app.amqp.queues[current_app.conf.task_default_queue]
        self.connection: Any = None  # a kombu Connection once opened (kombu ships no type hints)

    def __call__(self) -> int:
        if self.connection is None:
            self.connection = current_app.connection_for_read()
        # Declared as the worker declares it (same arguments: RabbitMQ refuses a different one), which answers
        # with the count of ready messages; not passive: on Redis an empty queue has no key, and passive fails.
        # kombu's queue_declare answers (name, message_count, consumer_count), the broker's counts: ints.
        return cast(int, self.queue(self.connection.default_channel).queue_declare().message_count)

    def reset(self) -> None:
        if self.connection is not None:
            self.connection.release()
            self.connection = None


def _commits_within(timeout: float) -> int:
    """How many NOTIFYs (committed transactions with outbox rows) arrive within `timeout` (0 without NOTIFY)."""
    if not settings.USING_POSTGRES:
        time.sleep(timeout)
        return 0
    return sum(1 for _ in connection.connection.notifies(timeout=timeout))


def gather(
    backlog: Callable[[], int],
    hold_seconds: float,
    group_size: int,
    stop: Callable[[], bool] = lambda: False,
    commits_within: Callable[[float], int] = _commits_within,
    poll_seconds: float = HOLD_POLL_SECONDS,
) -> None:
    """Let a group form only while the workers are busy.

    With nothing waiting in the broker the workers can take a task now, so the relay publishes at once (a
    lone row is not held). While tasks wait, a worker could not start ours before them anyway: the relay
    waits until the queue is empty, a group's worth of commits has arrived, or `hold_seconds` pass, and the
    rows committed meanwhile go out as one group, so per-task costs shrink exactly when the workers are short
    of time.
    """
    deadline = time.monotonic() + hold_seconds
    commits = 1  # the one that woke the relay
    while not stop() and commits < group_size and backlog() > 0:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        commits += commits_within(min(poll_seconds, left))


def _listen() -> None:
    if settings.USING_POSTGRES:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute(f"LISTEN {NOTIFY_CHANNEL}")


def run_relay(
    stop: Callable[[], bool], sweep_seconds: float | None = None, backlog: Callable[[], int] | None = None
) -> None:
    """Loop until `stop()` is true: publish on every NOTIFY (grouping while the workers are busy), and sweep
    at least every few seconds. `backlog`: a callable counting the tasks waiting in the broker."""
    sweep_seconds = sweep_seconds or settings.MAILROOM_RELAY_SWEEP_SECONDS
    backlog = backlog or BrokerBacklog()
    _listen()
    logger.info("outbox relay started")
    batch_size = settings.MAILROOM_RELAY_BATCH
    while not stop():
        try:
            published = publish_pending(batch_size)
            if published >= batch_size:
                continue  # a full batch: more are waiting
            if _wait_for_notify(sweep_seconds):  # a sweep's timeout has no fresh rows to gather
                gather(backlog, settings.MAILROOM_RELAY_HOLD_SECONDS, settings.MAILROOM_RELAY_GROUP, stop)
        except Exception:
            logger.exception("relay iteration failed; retrying")
            connection.close()
            if isinstance(backlog, BrokerBacklog):
                backlog.reset()
            time.sleep(1)
            _listen()

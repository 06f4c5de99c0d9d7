"""The relay groups only while the workers are busy (intake.relay.gather): a lone row on an idle pool goes out
at once, rows committed while tasks wait in the broker go out as one group when the queue empties or a full
group has arrived, and the hold is bounded.

The real relay loop runs in a thread (its own PostgreSQL connection, LISTEN/NOTIFY) against the real Redis
broker of this test process; no worker runs, so what the relay published stays in the broker to be read.
"""

import base64
import json
import threading
import time

import pytest
from celery import current_app
from django.db import connection, transaction

from intake import relay
from intake.models import OutboxMessage
from intake.services import PROCESS_TOPIC, enqueue_outbox
from tests.live import live_broker  # noqa: F401  (fixture)

QUEUE = "celery"


@pytest.fixture
def on_live_broker(live_broker, monkeypatch):
    """This process's Celery app publishes to the live broker for the test (the suite's own broker is another
    Redis database). Celery reads $CELERY_BROKER_URL before its settings, so both move; closing the app drops
    its connection pool, opened on the old URL. `current_app` must be the project's app: a test that builds a
    Celery app of its own without `set_as_current=False` leaves it current, with none of our queue settings."""
    assert current_app.main == "mailroom", f"an earlier test left its Celery app {current_app.main!r} current"
    saved = current_app.conf.broker_url
    monkeypatch.setenv("CELERY_BROKER_URL", live_broker.url)
    current_app.conf.broker_url = live_broker.url
    current_app.close()
    try:
        yield live_broker
    finally:
        current_app.conf.broker_url = saved
        current_app.close()


@pytest.fixture
def running_relay(transactional_db, on_live_broker, settings):
    """The relay loop in a thread, publishing to the live broker; yields the broker. Stopped (and its
    connection closed) at the end."""
    settings.MAILROOM_RELAY_SWEEP_SECONDS = 30.0  # only NOTIFY wakes it within a test
    stopping = threading.Event()
    errors = []

    def loop():
        try:
            relay.run_relay(stop=stopping.is_set, sweep_seconds=0.3)
        except Exception as exc:  # the loop catches its own; anything here is a bug
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    time.sleep(0.5)  # LISTEN is in place
    try:
        yield on_live_broker
    finally:
        stopping.set()
        thread.join(10)
        assert not thread.is_alive() and not errors


def commit_rows(count: int) -> list[int]:
    """`count` process rows, each in its own transaction (its own NOTIFY), as `count` webhook posts commit."""
    ids = []
    for n in range(count):
        with transaction.atomic():
            ids.append(enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": 10_000 + n}).pk)
    return ids


def wait_published(ids: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not OutboxMessage.objects.filter(pk__in=ids, published_at__isnull=True).exists():
            return True
        time.sleep(0.02)
    return False


def published_groups(broker) -> list[list[int]]:
    """The id lists of the process tasks waiting in the broker, oldest first."""
    groups = []
    for message in reversed(broker.queued_messages()):  # kombu LPUSHes: the list's end is the oldest
        if message["headers"]["task"] == "ticketing.tasks.process_inbox_events":
            args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
            groups.append(args[0])
    return groups


def a_task_waiting(broker) -> None:
    """A task in the queue no worker takes: the pool is busy."""
    current_app.send_task("ticketing.tasks.expire_claims")
    assert broker.redis.llen(QUEUE) == 1


def test_an_idle_relay_publishes_a_lone_row_without_holding_it(running_relay, settings):
    settings.MAILROOM_RELAY_HOLD_SECONDS = 60.0  # a held row would not be out within the wait below
    [row] = commit_rows(1)
    assert wait_published([row], within=10)
    assert published_groups(running_relay) == [[10_000]]


def test_rows_committed_while_tasks_wait_go_out_as_one_group_when_the_queue_empties(running_relay, settings):
    settings.MAILROOM_RELAY_HOLD_SECONDS = 60.0
    a_task_waiting(running_relay)
    rows = commit_rows(4)
    time.sleep(1.0)
    assert OutboxMessage.objects.filter(pk__in=rows, published_at__isnull=True).count() == 4, "held while busy"
    running_relay.redis.rpop(QUEUE)  # a worker takes the waiting task
    assert wait_published(rows, within=10)
    assert published_groups(running_relay) == [[10_000, 10_001, 10_002, 10_003]]


def test_a_groups_worth_of_commits_ends_the_hold(running_relay, settings):
    settings.MAILROOM_RELAY_HOLD_SECONDS = 60.0
    settings.MAILROOM_RELAY_GROUP = 3
    a_task_waiting(running_relay)
    rows = commit_rows(3)
    assert wait_published(rows, within=10), "three commits make a full group: no reason to hold them"
    assert published_groups(running_relay) == [[10_000, 10_001, 10_002]]
    assert running_relay.redis.llen(QUEUE) == 2  # the waiting task was not taken: the hold ended on the count


def test_the_hold_is_bounded_when_the_queue_never_empties(running_relay, settings):
    settings.MAILROOM_RELAY_HOLD_SECONDS = 0.5
    a_task_waiting(running_relay)
    rows = commit_rows(2)
    assert wait_published(rows, within=10)
    assert sum(len(group) for group in published_groups(running_relay)) == 2


def test_the_backlog_counts_what_waits_in_the_broker(on_live_broker):
    live_broker = on_live_broker
    backlog = relay.BrokerBacklog()
    try:
        assert backlog() == 0
        for _ in range(3):
            current_app.send_task("ticketing.tasks.expire_claims")
        assert backlog() == 3
        live_broker.redis.delete(QUEUE)
        assert backlog() == 0
    finally:
        backlog.reset()

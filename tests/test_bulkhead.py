"""Bulkheads for slow destinations (ticketing.bulkhead): external calls on their own queue and thread pool,
at most `max_concurrency` in flight per destination across workers, a call over the cap waits and is never
lost, and a call task delivered again makes no second ticket."""

import socket
import threading
import time
from collections import Counter

import pytest
from django.db import connection

from intake.services import requeue_stale_events
from tests.factories import make_desk_destination, make_event, make_mailbox, make_tenant
from tests.live import (  # noqa: F401  (fixtures)
    live_broker,
    live_mailbox,
    live_processes,
    wait_for,
)
from tests.support.pause import drain_outbox
from ticketing import bulkhead, execution, services, tasks
from ticketing.models import Intent, TicketMapping
from ticketing.outcomes import Outcome

CALL_TASK = "ticketing.tasks.call_destination"


class DeskGauge:
    """A FakeDesk request hook: holds every ticket write for `hold` seconds and counts how many overlap."""

    def __init__(self, hold: float, gate: threading.Event | None = None):
        self.hold, self.gate = hold, gate
        self.lock = threading.Lock()
        self.now = self.peak = self.writes = 0

    def __call__(self, request):
        if request.method != "POST":
            return None
        with self.lock:
            self.now += 1
            self.writes += 1
            self.peak = max(self.peak, self.now)
        try:
            if self.gate is not None:
                self.gate.wait(20)
            time.sleep(self.hold)
        finally:
            with self.lock:
                self.now -= 1
        return None  # then FakeDesk writes the ticket as usual


@pytest.fixture
def capped(transactional_db, desk, monkeypatch, settings):
    """A tenant whose default destination is FakeDesk (Zendesk) with max_concurrency 3, and its mailbox.

    transactional_db: the threads below use their own database connections and must see committed rows.
    """
    settings.MAILROOM_CLAMD = "off"
    settings.MAILROOM_DESTINATION_QUEUE = "destinations"
    tenant = make_tenant(slug="acme")
    monkeypatch.setenv("MAILROOM_TEST_WEBHOOK_SECRET", "s")
    mailbox = make_mailbox(tenant, slug="support", address="support@acme.test", settings={"acknowledge": False})
    destination = make_desk_destination(tenant, desk, monkeypatch, max_concurrency=3, read_timeout=10)
    return mailbox, destination


def handed_over_intents(mailbox, n: int) -> list[int]:
    """n events processed by the per-event task up to the hand-over: their intents are pending, no call made."""
    handed: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bulkhead, "pooled", lambda lease=None: lease is None)  # as inside a worker's task
        patch.setattr(bulkhead, "hand_over", lambda intent_id, countdown=None: handed.append(intent_id))
        events = [make_event(mailbox, subject=f"Help #{i}", sender=f"customer{i}@example.com") for i in range(n)]
        assert Counter(services.process_inbox_event(e.pk) for e in events) == {"handed_over": n}
    return handed


def test_the_cap_holds_under_concurrency_and_calls_over_it_complete_later(capped, desk, monkeypatch, settings):
    mailbox, destination = capped
    intent_ids = handed_over_intents(mailbox, 20)
    assert len(intent_ids) == 20 and desk.requests_log() == []  # the per-event task made no call
    assert set(Intent.objects.filter(pk__in=intent_ids).values_list("state", flat=True)) == {"pending"}

    gauge = DeskGauge(hold=0.3)
    desk.on_request(gauge)
    todo, outcomes, over_cap, errors = list(intent_ids), Counter(), Counter(), []
    lock = threading.Lock()

    def pool_thread():  # what a thread of the destinations worker does with each call task it gets
        try:
            worker = bulkhead.worker_identity()
            while True:
                with lock:
                    if not todo:
                        return
                    intent_id = todo.pop()
                while (outcome := execution.call(intent_id, worker)) == Outcome.OVER_CAP:
                    with lock:
                        over_cap[intent_id] += 1
                    time.sleep(0.05)  # the task's countdown, shortened
                with lock:
                    outcomes[outcome] += 1
        except Exception as exc:  # surfaced below, not lost on the thread
            errors.append(exc)
        finally:
            connection.close()

    pool = [threading.Thread(target=pool_thread) for _ in range(10)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(60)
    assert not errors, errors
    assert outcomes == {"created": 20}
    assert gauge.peak == 3, gauge.peak  # never more than the cap at the desk, and the cap was reached
    assert sum(over_cap.values()) > 0  # calls found the cap full, waited, and still completed
    assert gauge.writes == 20 and len(desk.tickets()) == 20
    assert len({t["external_id"] for t in desk.tickets()}) == 20
    assert TicketMapping.objects.filter(inbox_event__mailbox=mailbox).count() == 20
    assert set(Intent.objects.filter(pk__in=intent_ids).values_list("state", flat=True)) == {"succeeded"}


def test_a_call_over_the_cap_waits_and_is_not_lost(capped, desk, monkeypatch, settings):
    mailbox, destination = capped
    destination.settings["max_concurrency"] = 1
    destination.save()
    first, second = handed_over_intents(mailbox, 2)
    settings.MAILROOM_DESTINATION_CAP_WAIT_SECONDS = 0.1
    gate = threading.Event()
    desk.on_request(DeskGauge(hold=0, gate=gate))  # the first call stalls at the desk until the gate opens
    stalled = threading.Thread(target=lambda: (execution.call(first, bulkhead.worker_identity()), connection.close()))
    stalled.start()
    wait_for(lambda: Intent.objects.get(pk=first).state == "in_flight", timeout=10)

    # The pool's task: over the cap, nothing is claimed or sent; it publishes itself again, a little later.
    republished = []
    monkeypatch.setattr(
        bulkhead, "hand_over", lambda intent_id, countdown=None: republished.append((intent_id, countdown))
    )
    assert tasks.call_destination(second) == Outcome.OVER_CAP
    [(intent_id, countdown)] = republished
    assert intent_id == second and 0 < countdown < 1
    # The per-event path (run inline here): the event is parked with a short wait, its intent still pending.
    event_id = Intent.objects.get(pk=second).inbox_event_id
    assert services.process_inbox_event(event_id) == Outcome.OVER_CAP
    intent = Intent.objects.select_related("inbox_event").get(pk=second)
    assert (intent.state, intent.attempts, intent.inbox_event.state) == ("pending", 0, "ready")
    assert intent.inbox_event.retry_at is not None
    assert len([r for r in desk.requests_log() if r["method"] == "POST"]) == 0  # the first is still held

    gate.set()
    stalled.join(20)
    assert Intent.objects.get(pk=first).state == "succeeded"
    time.sleep(0.3)  # the wait is over: the sweep hands the event back, and it completes
    assert requeue_stale_events()["requeued"] == 1
    assert drain_outbox()["created"] == 1  # (the ingest's own outbox rows find the rest done)
    assert Intent.objects.get(pk=second).state == "succeeded" and len(desk.tickets()) == 2


@pytest.mark.live
@pytest.mark.fakedesk(process=True, db_path=True)
def test_calls_run_on_the_destinations_queue_and_a_redelivered_call_makes_one_ticket(
    live_mailbox, live_broker, live_processes, desk, monkeypatch
):
    from celery import Celery

    from tests.support.windows import new_event, state_of, worker_env

    monkeypatch.setenv("CELERY_BROKER_URL", live_broker.url)  # Celery prefers it to the broker argument
    destination = make_desk_destination(live_mailbox.tenant, desk, monkeypatch)
    env = worker_env(live_broker, MAILROOM_DESTINATION_QUEUE="destinations")
    live_processes.queue_worker(env, "celery", pool="prefork", concurrency=1)  # the CPU stages only
    app = Celery("bulkhead-probe", broker=live_broker.url, set_as_current=False)
    try:
        event_id = new_event(live_mailbox)
        app.send_task("ticketing.tasks.process_inbox_events", args=[[event_id]])
        # Processed up to the hand-over: the intent exists, the call waits on the destinations queue.
        wait_for(
            lambda: live_broker.redis.llen("destinations") == 1,
            timeout=30,
            describe=lambda: f"{state_of(event_id)}\n{live_processes.logs(15)}",
        )
        assert state_of(event_id) == ("ready", "", "pending")
        assert desk.requests_log() == []
        intent = Intent.objects.get(inbox_event_id=event_id)
        assert intent.destination_id == destination.pk
        for _ in range(3):  # the same call task delivered again, as a redelivery would
            app.send_task(CALL_TASK, args=[intent.pk], queue="destinations")
    finally:
        app.close()

    calls = live_processes.queue_worker(env, "destinations", pool="threads", concurrency=8)
    wait_for(
        lambda: state_of(event_id) == ("completed", "", "succeeded"),
        timeout=30,
        describe=lambda: f"{state_of(event_id)}\n{live_processes.logs(15)}",
    )
    wait_for(lambda: live_broker.redis.llen("destinations") == 0, timeout=15)
    time.sleep(1)  # the duplicates ran (or were dropped by the claim) before we count
    creates = [r for r in desk.requests_log() if r["method"] == "POST"]
    assert len(creates) == 1 and len(desk.tickets()) == 1
    assert TicketMapping.objects.filter(inbox_event_id=event_id).count() == 1
    # The call was made by the thread-pool worker (its pid), from one of its threads.
    assert Intent.objects.get(pk=intent.pk).claimed_by.startswith(f"{socket.gethostname()}:{calls.pid}/")

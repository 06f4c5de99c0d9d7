"""Every failure window of docs/design.md §8 "Testing", with real worker processes and FakeDesk over HTTP.

FakeDesk runs as its own process (`python -m fakedesk`, the `desk` fixture of
fakedesk.pytest_plugin with `process=True`), workers are real Celery
workers on Redis, the relay is the real relay. Where the design has beat run a
sweep, the test runs that same service function from a sweeper thread, so the
timing is the test's and not the scheduler's.
"""

import signal
import time

import pytest

from tests.live import (  # noqa: F401  (fixtures)
    LIVE_SECRET,
    PYTHON,
    REPO_ROOT,
    kill_group,
    live_broker,
    live_mailbox,
    live_processes,
    make_email,
    subprocess_env,
    wait_for,
)
from tests.support.windows import new_event, settled, state_of, sweeper, worker_env

# FakeDesk in its own process, with its tickets in a SQLite file, driven through its control API.
pytestmark = [pytest.mark.live, pytest.mark.fakedesk(process=True, db_path=True)]


def create_requests(desk) -> list[dict]:
    return [r for r in desk.requests_log() if r["method"] == "POST"]


@pytest.fixture
def zendesk(live_mailbox, desk, monkeypatch):
    """FakeDesk, spoken to as Zendesk, is the live tenant's default destination."""
    from ticketing.models import Destination

    monkeypatch.setenv("FAKEDESK_CREDENTIALS", f"agent@acme.test/token:{desk.token}")
    Destination.objects.filter(tenant=live_mailbox.tenant).update(is_default=False)
    return Destination.objects.create(
        tenant=live_mailbox.tenant,
        slug="desk",
        kind="zendesk",
        base_url=desk.url,
        is_default=True,
        credentials_ref="env:FAKEDESK_CREDENTIALS",
        settings={"read_timeout": 1.0, "retry_base_seconds": 0.05, "retry_cap_seconds": 0.5},
    )


def mapped_ticket_ids():
    from ticketing.models import TicketMapping

    return sorted(int(t) for t in TicketMapping.objects.values_list("ticket_id", flat=True))


def wait_settled(ids, live_processes, timeout=40):
    wait_for(
        lambda: all(settled(i) for i in ids),
        timeout=timeout,
        interval=0.2,
        describe=lambda: f"{[state_of(i) for i in ids]}\n{live_processes.logs(15)}",
    )


def send(event_ids, broker):
    """Publish the task straight to the broker, as a relay (or a redelivery) would."""
    from celery import Celery

    app = Celery("failure-window-probe", broker=broker.url, set_as_current=False)
    try:
        for event_id in event_ids:
            app.send_task("ticketing.tasks.process_inbox_events", args=[[event_id]])
    finally:
        app.close()


# --- the windows ---------------------------------------------------------------------


def test_same_action_requested_twice_makes_one_ticket(
    zendesk, live_mailbox, live_broker, live_processes, desk, monkeypatch
):
    monkeypatch.setenv("CELERY_BROKER_URL", live_broker.url)
    live_processes.worker(worker_env(live_broker))
    event_id = new_event(live_mailbox)
    send([event_id, event_id, event_id], live_broker)
    wait_settled([event_id], live_processes)
    assert state_of(event_id) == ("completed", "", "succeeded")
    assert len(desk.tickets()) == 1 and len(create_requests(desk)) == 1


RACE_SCRIPT = r"""
import os, sys, time, django
django.setup()
from django.db import connection
from ticketing import services
from ticketing.destinations import zendesk  # noqa: F401  (warm the import)
connection.ensure_connection()
ready, go, event_id = sys.argv[1], sys.argv[2], int(sys.argv[3])
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
print(services.process_inbox_event(event_id))
"""


def test_two_workers_racing_for_one_key_make_one_call(zendesk, live_mailbox, desk, tmp_path):
    import subprocess

    for round_ in range(5):
        event_id = new_event(live_mailbox, subject=f"Race {round_}")
        go = tmp_path / f"go-{round_}"
        racers = []
        for n in range(2):
            ready = tmp_path / f"ready-{round_}-{n}"
            racers.append(
                (
                    ready,
                    subprocess.Popen(
                        [PYTHON, "-c", RACE_SCRIPT, str(ready), str(go), str(event_id)],
                        cwd=REPO_ROOT,
                        env=subprocess_env(),
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    ),
                )
            )
        wait_for(lambda: all(ready.exists() for ready, _ in racers), timeout=30)  # noqa: B023 (called at once)
        go.write_text("go")  # the barrier: both are set up and waiting for this file
        outcomes = sorted(p.communicate(timeout=30)[0].strip() for _, p in racers)
        assert "created" in outcomes and set(outcomes) <= {"created", "busy", "done"}, outcomes
        assert state_of(event_id)[0] == "completed"
    assert len(create_requests(desk)) == 5 and len(desk.tickets()) == 5
    assert len(set(t["external_id"] for t in desk.tickets())) == 5


@pytest.mark.parametrize("fault,reason", [("reject_422", "invalid_fields"), ("unauthorized_401", "credentials")])
def test_rejection_before_the_write_fails_without_retry(
    zendesk, live_mailbox, live_broker, live_processes, desk, monkeypatch, fault, reason
):
    from intake.models import InboxEvent

    monkeypatch.setenv("CELERY_BROKER_URL", live_broker.url)
    desk.set_plan([fault])
    live_processes.worker(worker_env(live_broker))
    live_processes.relay(worker_env(live_broker))
    with sweeper():
        event_id = new_event(live_mailbox)
        wait_settled([event_id], live_processes)
        time.sleep(1.5)  # several sweeps: none may retry it
    assert state_of(event_id) == ("failed", reason, "failed")
    if reason == "invalid_fields":
        assert "Requester email is invalid" in InboxEvent.objects.get(pk=event_id).reason_detail
    assert len(create_requests(desk)) == 1 and desk.tickets() == []


def test_rate_limit_retry_after_is_honoured(zendesk, live_mailbox, live_broker, live_processes, desk, monkeypatch):
    monkeypatch.setenv("CELERY_BROKER_URL", live_broker.url)
    desk.set_plan(["rate_limit:2"])
    live_processes.worker(worker_env(live_broker))
    live_processes.relay(worker_env(live_broker))
    with sweeper():
        event_id = new_event(live_mailbox)
        wait_settled([event_id], live_processes, timeout=30)
    first, second = create_requests(desk)
    gap = second["at"] - first["at"]  # FakeDesk's own clock, in seconds
    assert first["status"] == 429 and second["status"] == 201
    assert gap >= 2.0, gap
    assert state_of(event_id) == ("completed", "", "succeeded") and len(desk.tickets()) == 1


@pytest.mark.parametrize("idempotency", [True, False])
def test_success_with_a_lost_response(
    zendesk, live_mailbox, live_broker, live_processes, desk, monkeypatch, idempotency
):
    monkeypatch.setenv("CELERY_BROKER_URL", live_broker.url)
    if not idempotency:
        zendesk.settings["idempotency_supported"] = False
        zendesk.save()
        desk.set_idempotency(enabled=False)
    desk.set_plan(["drop_after_commit"])
    live_processes.worker(worker_env(live_broker))
    live_processes.relay(worker_env(live_broker))
    with sweeper():
        event_id = new_event(live_mailbox)
        wait_settled([event_id], live_processes, timeout=30)
    assert state_of(event_id) == ("completed", "", "succeeded")
    [ticket] = desk.tickets()
    assert mapped_ticket_ids() == [ticket["id"]]
    creates = create_requests(desk)
    if idempotency:  # retried with the same key; FakeDesk answered with the original ticket
        assert [c["idempotency_lookup"] for c in creates] == ["miss", "hit"]
        assert creates[0]["idempotency_key"] == creates[1]["idempotency_key"]
    else:  # found by external_id: no second create
        assert len(creates) == 1


@pytest.mark.parametrize("idempotency", [True, False])
def test_worker_killed_between_destination_success_and_our_commit(
    zendesk, live_mailbox, live_broker, live_processes, desk, monkeypatch, tmp_path, idempotency
):
    monkeypatch.setenv("CELERY_BROKER_URL", live_broker.url)
    if not idempotency:
        zendesk.settings["idempotency_supported"] = False
        zendesk.save()
        desk.set_idempotency(enabled=False)
    pause = tmp_path / "pause"
    doomed = live_processes.worker(
        worker_env(live_broker, MAILROOM_PAUSE_AT=f"after_destination_success:{pause}"), concurrency=1
    )
    event_id = new_event(live_mailbox)
    send([event_id], live_broker)
    wait_for(lambda: pause.with_name("pause.reached").exists(), timeout=30, describe=lambda: doomed.tail())
    assert len(desk.tickets()) == 1  # the destination has it; we have not recorded it
    assert state_of(event_id) == ("write_pending", "", "in_flight")
    kill_group(doomed.pid, signal.SIGKILL)
    doomed.popen.wait(10)

    live_processes.worker(worker_env(live_broker))
    live_processes.relay(worker_env(live_broker))
    with sweeper():  # the claim expires -> unknown -> resolved (same key, or lookup) -> completed
        wait_for(
            lambda: state_of(event_id)[0] == "completed",
            timeout=40,
            describe=lambda: f"{state_of(event_id)}\n{live_processes.logs(15)}",
        )
    [ticket] = desk.tickets()
    assert mapped_ticket_ids() == [ticket["id"]]
    assert len(create_requests(desk)) == (2 if idempotency else 1)


def test_ambiguous_outcome_without_idempotency_or_lookup_is_held(
    zendesk, live_mailbox, live_broker, live_processes, desk, monkeypatch
):
    from reconciliation.selectors import recovery_queue

    monkeypatch.setenv("CELERY_BROKER_URL", live_broker.url)
    zendesk.settings.update({"idempotency_supported": False, "lookup_supported": False})
    zendesk.save()
    desk.set_idempotency(enabled=False)
    desk.set_plan(["stall_after_commit:2"])
    live_processes.worker(worker_env(live_broker))
    live_processes.relay(worker_env(live_broker))
    with sweeper():
        event_id = new_event(live_mailbox)
        wait_settled([event_id], live_processes, timeout=30)
        time.sleep(1.5)  # sweeps keep running: none may write again
    assert state_of(event_id) == ("unknown", "outcome_unknown", "held")
    assert [e.pk for e in recovery_queue()] == [event_id]
    assert len(create_requests(desk)) == 1

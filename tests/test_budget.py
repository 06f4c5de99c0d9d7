"""The request budget per destination (ticketing.budget), shared by every worker: the pace keeps the desk's own
sliding-minute count under the quota, worker processes on PostgreSQL and on the embedded SQLite file share one
budget, a Retry-After one worker met holds the others back, a slot further than the read timeout fails the call
as rate-limited without sending it, and a destination without a quota asks nothing of the database. FakeDesk's
quota (`quota_per_minute`) answers like Zendesk's account limit."""

import json
import math
import os
import subprocess
import sys
import threading
import time

import pytest
import requests
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fakedesk.desk import RequestQuota
from tests.factories import make_desk_destination, make_tenant
from tests.live import REPO_ROOT, subprocess_env, wait_for
from ticketing import budget
from ticketing.destinations import adapter_for
from ticketing.destinations.base import TransientError
from ticketing.destinations.capabilities import Capabilities
from ticketing.models import Destination

PYTHON = sys.executable

# One worker process: take `count` slots of destination `pk` after the barrier, sleeping each wait, and print
# when each request would have been sent (after its wait), as JSON.
TAKER_SCRIPT = r"""
import json, os, sys, time, django
django.setup()
from django.db import connection
from ticketing import budget
from ticketing.models import Destination
destination_id, count, ready, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
destination = Destination.objects.get(pk=destination_id)
connection.ensure_connection()
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
sent = []
for _ in range(count):
    wait = budget.take(destination)
    if wait:
        time.sleep(wait)
    sent.append(time.time())
print(json.dumps(sent))
"""

# One worker process: "test connection" of destination `pk` (one GET through HttpDestination.send); prints
# how it ended.
CALLER_SCRIPT = r"""
import sys, django
django.setup()
from ticketing.destinations import adapter_for
from ticketing.destinations.base import TransientError
from ticketing.models import Destination
adapter = adapter_for(Destination.objects.get(pk=int(sys.argv[1])))
try:
    adapter.check_connection()
    print("ok")
except TransientError as exc:
    print(f"{exc.reason} {exc.retry_after}")
"""


def most_in_any_window(times: list[float], seconds: float) -> int:
    """The most of `times` in one half-open window [t, t + seconds)."""
    times, most, start = sorted(times), 0, 0
    for end, at in enumerate(times):
        while times[start] <= at - seconds:
            start += 1
        most = max(most, end - start + 1)
    return most


def run_takers(destination_id: int, workers: int, count: int, env: dict, tmp_path) -> list[float]:
    """`workers` processes taking `count` slots each at once (after a barrier); every send time."""
    go, racers = tmp_path / "go", []
    for n in range(workers):
        ready = tmp_path / f"ready-{n}"
        racers.append(
            (
                ready,
                subprocess.Popen(
                    [PYTHON, "-c", TAKER_SCRIPT, str(destination_id), str(count), str(ready), str(go)],
                    cwd=REPO_ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        )
    try:
        wait_for(
            lambda: all(ready.exists() for ready, _ in racers),
            timeout=60,
            describe=lambda: [p.poll() for _, p in racers],
        )
        go.write_text("go")
        sent = []
        for _, process in racers:
            out, err = process.communicate(timeout=120)
            assert process.returncode == 0, err[-3000:]
            sent += json.loads(out.strip().splitlines()[-1])
        return sent
    finally:
        for _, process in racers:
            if process.poll() is None:
                process.kill()
                process.wait()


def assert_shared_pace(sent: list[float], quota: budget.Quota, workers: int):
    """The sends of all workers together keep one budget's pace: never more in a window than one burst and the
    window's share (plus one per worker: each holds at most one slot, whose sleep may end late), and the pace
    is sustained (>= 90 %). Budgets that were not shared would send a burst per worker at once."""
    for seconds in (0.5, 1.0, 3.0):
        allowed = quota.burst + seconds / quota.interval + workers
        assert most_in_any_window(sent, seconds) <= allowed, (seconds, most_in_any_window(sent, seconds), allowed)
    sent = sorted(sent)
    sustained = (len(sent) - quota.burst) / (sent[-1] - sent[0])
    assert sustained >= 0.9 / quota.interval, (sustained, 1 / quota.interval)


@pytest.fixture
def tenant(db):
    return make_tenant(slug="acme")


def zendesk(tenant, base_url="http://127.0.0.1:9", **settings) -> Destination:
    return Destination.objects.create(
        tenant=tenant, slug=f"zd-{Destination.objects.count()}", kind="zendesk", base_url=base_url, settings=settings
    )


# --- the pace ------------------------------------------------------------------------------------------------


def test_the_pace_leaves_the_burst_and_headroom_out_of_the_quota():
    assert budget.pace(120) == budget.Quota(per_minute=120, burst=4, interval=60 / 114)
    assert budget.pace(700).burst == 23 and budget.pace(700).paced_per_minute == 669
    for per_minute in (1, 2, 3, 5, 10, 60, 80, 120, 280, 700, 2500, 100000):
        quota = budget.pace(per_minute)
        # The worst sliding minute: a whole burst at its start, then a request every interval after it.
        assert quota.burst + math.ceil(60 / quota.interval) - 1 <= per_minute, per_minute
        assert quota.paced_per_minute >= 0.9 * per_minute or per_minute < 100, per_minute


def test_callers_far_faster_than_the_quota_never_draw_fakedesks_429(tenant):
    """Callers arriving every 50 ms for three minutes, with a quiet spell in the middle, each sending when its
    slot comes: FakeDesk's own sliding-minute count (the judge, on the same clock) admits every request, and
    the budget sustains >= 90 % of the quota."""
    destination = zendesk(tenant, requests_per_minute=120)
    sent, now = [], 1_000.0
    while now < 1_180.0:
        if not 1_060.0 <= now < 1_090.0:  # 30 s quiet: the burst comes back
            sent.append(now + budget.take(destination, now=now))
        now += 0.05
    clock = [0.0]
    judge = RequestQuota(120, clock=lambda: clock[0])
    for at in sorted(sent):
        clock[0] = at
        assert judge.admit() is None, f"refused at {at}"
    busy = [at for at in sent if at < 1_060.0]
    assert len(busy) >= 0.9 * 120, len(busy)  # the first minute
    assert judge.busiest_minute <= 120


def test_a_slot_further_than_max_wait_is_not_reserved(tenant):
    destination = zendesk(tenant, requests_per_minute=60)  # burst 2, then one every 60/57 s
    quota = budget.quota_for(destination)
    assert [budget.take(destination, now=10.0) for _ in range(2)] == [0.0, 0.0]
    with pytest.raises(budget.OverBudget) as refused:
        budget.take(destination, now=10.0, max_wait=0.5)
    assert refused.value.wait == pytest.approx(quota.interval)
    # Nothing was reserved: the slot is still the next one.
    assert budget.take(destination, now=10.0) == pytest.approx(quota.interval)


def test_retry_after_holds_every_slot_back_then_the_pace_resumes_without_a_burst(tenant):
    destination = zendesk(tenant, requests_per_minute=120)
    quota = budget.quota_for(destination)
    budget.note_retry_after(destination, 30, now=100.0)
    waits = [budget.take(destination, now=101.0) for _ in range(3)]
    assert waits == pytest.approx([29.0, 29.0 + quota.interval, 29.0 + 2 * quota.interval])
    budget.note_retry_after(destination, 1, now=101.0)  # a shorter one never brings the budget forward
    assert budget.take(destination, now=101.0) == pytest.approx(29.0 + 3 * quota.interval)


def test_the_quota_is_the_setting_else_the_kinds_else_none(tenant):
    documented = Capabilities(requests_per_minute=700)
    assert budget.quota_for(zendesk(tenant), documented).per_minute == 700
    assert budget.quota_for(zendesk(tenant, requests_per_minute=120), documented).per_minute == 120
    assert budget.quota_for(zendesk(tenant, requests_per_minute=0), documented) is None  # 0: none
    assert budget.quota_for(zendesk(tenant), Capabilities()) is None
    unsaved = Destination(tenant=tenant, slug="new", kind="zendesk", settings={"requests_per_minute": 120})
    assert budget.quota_for(unsaved) is None  # "test connection" before saving: nothing to share


# --- the hook in HttpDestination.send -----------------------------------------------------------------------


def test_a_destination_without_a_quota_asks_no_budget(tenant, desk, monkeypatch):
    unlimited = make_desk_destination(tenant, desk, monkeypatch, slug="free", requests_per_minute=0)
    limited = make_desk_destination(tenant, desk, monkeypatch, slug="paced", is_default=False, requests_per_minute=120)
    for destination, asked in ((unlimited, False), (limited, True)):
        adapter = adapter_for(destination)
        adapter.check_connection()  # credentials resolved and cached: only the call itself below
        with CaptureQueriesContext(connection) as queries:
            adapter.check_connection()
        assert any(budget.TABLE in q["sql"] for q in queries.captured_queries) is asked, queries.captured_queries


def test_a_slot_beyond_the_read_timeout_fails_rate_limited_and_sends_nothing(tenant, desk, monkeypatch):
    destination = make_desk_destination(tenant, desk, monkeypatch, read_timeout=1.0, requests_per_minute=120)
    seen = []
    desk.on_request(lambda request: seen.append(request.path))
    budget.note_retry_after(destination, 20)
    with pytest.raises(TransientError) as failed:
        adapter_for(destination).check_connection()
    assert failed.value.reason == "rate_limited" and 18 < failed.value.retry_after <= 20.01
    assert seen == []


def test_a_slot_within_the_read_timeout_is_waited_for(tenant, desk, monkeypatch):
    destination = make_desk_destination(tenant, desk, monkeypatch, read_timeout=5.0, requests_per_minute=120)
    arrived = []
    desk.on_request(lambda request: arrived.append(time.time()))
    budget.note_retry_after(destination, 1.5)
    noted = time.time()
    adapter_for(destination).check_connection()
    assert len(arrived) == 1 and arrived[0] - noted >= 1.4


def test_a_429_with_retry_after_is_shared_through_the_budget(tenant, desk, monkeypatch):
    destination = make_desk_destination(tenant, desk, monkeypatch, read_timeout=1.0, requests_per_minute=120)
    answers = iter([(429, {"error": "TooManyRequests"}, {"Retry-After": "30"})])
    desk.on_request(lambda request: next(answers, None))
    with pytest.raises(TransientError) as first:
        adapter_for(destination).check_connection()
    assert first.value.reason == "rate_limited"
    with pytest.raises(TransientError) as second:  # nothing sent: the budget waits the 30 s out
        adapter_for(destination).check_connection()
    assert second.value.reason == "rate_limited" and second.value.retry_after > 28
    assert "request budget" in str(second.value)


# --- several processes, one budget ---------------------------------------------------------------------------


def test_worker_processes_on_postgresql_share_one_budget(transactional_db, tmp_path):
    """Three processes taking slots as fast as they can: together they keep one budget's pace (three separate
    budgets would send three bursts at once), and sustain it."""
    destination = zendesk(make_tenant(slug="acme"), requests_per_minute=600)
    quota = budget.quota_for(destination)
    sent = run_takers(destination.pk, workers=3, count=30, env=subprocess_env(), tmp_path=tmp_path)
    assert len(sent) == 90
    assert_shared_pace(sent, quota, workers=3)


def test_a_retry_after_one_process_met_holds_back_another(transactional_db, desk, monkeypatch, tmp_path):
    """Process A gets a 429 with Retry-After: 3 from the desk; process B, started after, makes its call only
    once those 3 s are over: it waits for its slot instead of drawing another 429."""
    tenant = make_tenant(slug="acme")
    destination = make_desk_destination(tenant, desk, monkeypatch, read_timeout=10.0, requests_per_minute=600)
    arrivals, lock = [], threading.Lock()

    def hook(request):
        with lock:
            arrivals.append(time.time())
            if len(arrivals) == 1:
                return 429, {"error": "TooManyRequests"}, {"Retry-After": "3"}
        return None

    desk.on_request(hook)
    env = subprocess_env()

    def call() -> str:
        process = subprocess.run(
            [PYTHON, "-c", CALLER_SCRIPT, str(destination.pk)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert process.returncode == 0, process.stderr[-3000:]
        return process.stdout.strip().splitlines()[-1]

    assert call().startswith("rate_limited 3")
    assert call() == "ok"
    assert len(arrivals) == 2 and arrivals[1] - arrivals[0] >= 2.9, arrivals


def test_worker_processes_on_the_embedded_sqlite_file_share_one_budget(tmp_path):
    """The same on the embedded default: a SQLite file (WAL, as `make run` has it), migrated, three processes."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MAILROOM_", "CELERY_", "DJANGO_")) and k != "DATABASE_URL"
    }
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        MAILROOM_ENV="development",
        DATABASE_URL=f"sqlite:///{tmp_path / 'mailroom.sqlite3'}",
        MAILROOM_VAR_DIR=str(tmp_path / "var"),
    )

    def manage(*args) -> str:
        process = subprocess.run(
            [PYTHON, "manage.py", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert process.returncode == 0, process.stderr[-3000:]
        return process.stdout

    manage("migrate", "--noinput", "-v0")
    out = manage(
        "shell",
        "-c",
        "from intake.models import Tenant; from ticketing.models import Destination; "
        "t = Tenant.objects.create(slug='acme', name='Acme'); "
        "print(Destination.objects.create(tenant=t, slug='desk', kind='zendesk', "
        "base_url='http://127.0.0.1:9', settings={'requests_per_minute': 600}).pk)",
    )
    destination_id = int(out.strip().splitlines()[-1])
    sent = run_takers(destination_id, workers=3, count=30, env=env, tmp_path=tmp_path)
    assert len(sent) == 90
    assert_shared_pace(sent, budget.pace(600), workers=3)


# --- FakeDesk's quota ----------------------------------------------------------------------------------------


def test_fakedesk_refuses_past_its_quota_like_zendesk(desk_factory):
    desk = desk_factory(quota_per_minute=3)
    url, statuses = desk.url + "/api/v2/users/me.json", []
    for _ in range(4):
        response = requests.get(url, auth=desk.auth, timeout=5)
        statuses.append(response.status_code)
    assert statuses == [200, 200, 200, 429]
    assert 55 <= int(response.headers["Retry-After"]) <= 60
    assert response.headers["X-Rate-Limit"] == "3" and response.headers["X-Rate-Limit-Remaining"] == "0"
    assert response.json()["description"] == "Number of allowed API requests per minute exceeded"
    assert desk.quota_report() == {"quota_per_minute": 3, "admitted": 3, "refused": 1, "busiest_minute": 3}
    refused = [r for r in desk.requests_log() if r["fault"] == "quota"]
    assert [(r["method"], r["path"], r["status"]) for r in refused] == [("GET", "/api/v2/users/me.json", 429)]


def test_fakedesk_quota_counts_a_sliding_minute():
    clock = [0.0]
    quota = RequestQuota(2, clock=lambda: clock[0])
    assert quota.admit() is None
    clock[0] = 30.0
    assert quota.admit() is None
    assert quota.admit() == pytest.approx(30.0)  # the first one leaves the minute at 60
    clock[0] = 60.0
    assert quota.admit() is None  # it has left; the one at 30 is still in
    assert quota.admit() == pytest.approx(30.0)
    assert quota.report() == {"quota_per_minute": 2, "admitted": 3, "refused": 2, "busiest_minute": 2}


@pytest.mark.fakedesk(process=True, quota_per_minute=2)
def test_a_fakedesk_process_takes_its_quota_from_the_command_line(desk):
    statuses = [
        requests.get(desk.url + "/api/v2/users/me.json", auth=desk.auth, timeout=5).status_code for _ in range(3)
    ]
    assert statuses == [200, 200, 429]
    assert [r["status"] for r in desk.requests_log() if r["fault"] == "quota"] == [429]

"""Bulk jobs with the real processes: Celery workers (one killed mid-job), an operator in Chromium at 1400
and 800 px, and the embedded default (SQLite + the SQLAlchemy-transport broker) in a directory of its own.

The services and pages themselves are tested in tests/test_bulk_jobs.py; the helpers both use are in
tests/support/bulk.py.
"""

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from intake.models import InboxEvent
from intake.vocabulary import AuditKind
from reconciliation import services
from reconciliation.models import BulkJob
from tests.browser import browser, chromium_path, page, screenshot_dir  # noqa: F401  (fixtures)
from tests.live import (  # noqa: F401  (fixtures)
    PYTHON,
    REPO_ROOT,
    LiveProcess,
    live_broker,
    live_processes,
    subprocess_env,
    wait_for,
)
from tests.support.bulk import CLOSE_REASON, FLOOD_REASON, applied_per_item, flood, kinds_of
from tests.support.queue import QUEUE_URL
from tests.support.users import PASSWORD, operator  # noqa: F401  (the operator fixture)

pytestmark = pytest.mark.live


# --- a real Celery worker ------------------------------------------------------------------------------


def run_sweep(broker) -> None:
    """Send beat's sweep (`resume_bulk_jobs`) to the worker, as beat would."""
    from celery import Celery

    app = Celery("bulk-sweep-probe", broker=broker.url, set_as_current=False)
    try:
        app.send_task("reconciliation.tasks.resume_bulk_jobs")
    finally:
        app.close()


def wait_for_job(job_id, predicate, timeout, processes, broker=None):
    """Wait until the job meets `predicate`; with `broker`, run the sweep every few seconds meanwhile (the
    test process's own publish may go to another broker than the workers': the sweep finds the job then)."""
    last_sweep = [time.monotonic()]

    def check():
        job = BulkJob.objects.get(pk=job_id)
        if predicate(job):
            return job
        if broker is not None and time.monotonic() - last_sweep[0] > 4:
            run_sweep(broker)
            last_sweep[0] = time.monotonic()
        return None

    return wait_for(
        check, timeout=timeout, interval=0.2, describe=lambda: f"{BulkJob.objects.get(pk=job_id)}\n{processes.logs()}"
    )


def worker_env(broker, **extra) -> dict:
    # Short claims, so the sweep takes over a dead worker's job within seconds.
    return subprocess_env(broker.url, MAILROOM_BULK_JOB_CLAIM_SECONDS=3, **extra)


@pytest.mark.timeout(300)
def test_a_real_worker_runs_a_200_item_job_and_a_second_one_finishes_it_after_the_first_is_killed(
    transactional_db, mailbox, operator, live_processes, live_broker, monkeypatch
):
    monkeypatch.setenv("CELERY_BROKER_URL", live_broker.url)  # this process's publish at the commit, too
    spam = flood(mailbox, 200)
    env = worker_env(live_broker, MAILROOM_BULK_JOB_CHUNK=20)
    first = live_processes.worker(env, concurrency=1)
    job = services.do_start_bulk_job(
        operator, filters={"reason": FLOOD_REASON}, action="close", reason=CLOSE_REASON, expected_count=200
    )
    wait_for_job(job.pk, lambda j: j.done >= 40, 90, live_processes, live_broker)
    os.killpg(first.pid, signal.SIGKILL)  # the worker and its pool child, mid-job
    first.popen.wait(timeout=10)
    live_broker.drop_queued_messages()  # and the next chunk's task with it: only the sweep can go on now
    stopped_at = BulkJob.objects.get(pk=job.pk)
    assert stopped_at.state == "running" and 40 <= stopped_at.done < 200
    assert stopped_at.done % 20 == 0  # whole chunks only
    live_processes.worker(env, concurrency=1)
    job = wait_for_job(job.pk, lambda j: j.state == "done", 120, live_processes, live_broker)
    assert (job.done, job.succeeded, job.skipped, job.failed) == (200, 200, 0, 0)
    assert set(applied_per_item(job.pk).values()) == {1} and len(applied_per_item(job.pk)) == 200
    assert kinds_of(spam)[AuditKind.CLOSED_NOT_A_REQUEST] == 200
    assert set(InboxEvent.objects.filter(pk__in=spam).values_list("state", flat=True)) == {"suppressed"}


# --- an operator in a browser ------------------------------------------------------------------------


def no_horizontal_overflow(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")


@pytest.mark.timeout(300)
def test_an_operator_closes_200_filtered_items_in_a_browser_and_watches_the_progress(
    live_server, page, screenshot_dir, mailbox, operator, live_processes, live_broker, monkeypatch
):
    monkeypatch.setenv("CELERY_BROKER_URL", live_broker.url)
    spam = flood(mailbox, 200)
    others = flood(mailbox, 4, reason="missing_sender", sender="someone@customer.test")
    live_processes.worker(worker_env(live_broker, MAILROOM_BULK_JOB_CHUNK=5), concurrency=1)  # 40 chunks
    page.set_viewport_size({"width": 1400, "height": 1000})
    errors = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(f"{live_server.url}/admin/login/?next={QUEUE_URL}")
    page.fill("#id_username", "oper")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{QUEUE_URL}")

    # Filter the queue by reason, then open the bulk page from it.
    page.goto(f"{live_server.url}{QUEUE_URL}?reason={FLOOD_REASON}")
    assert page.inner_text("#bulk-open") == "Act on all 200 matching items…"
    page.screenshot(path=screenshot_dir / "bulk-00-queue-1400.png", full_page=True)
    page.click("#bulk-open")
    page.wait_for_url("**/bulk/?reason=*")
    assert page.inner_text("#bulk-count") == "200"
    assert page.locator("#bulk-sample tbody tr").count() == 10
    assert "promo@flood.test" not in page.content()  # senders masked
    page.screenshot(path=screenshot_dir / "bulk-01-preview-1400.png", full_page=True)
    assert no_horizontal_overflow(page)
    page.set_viewport_size({"width": 800, "height": 1000})
    page.screenshot(path=screenshot_dir / "bulk-02-preview-800.png", full_page=True)
    assert no_horizontal_overflow(page)
    page.set_viewport_size({"width": 1400, "height": 1000})

    page.check("input[name=job-action][value=close]")
    page.fill("#id_job-reason", CLOSE_REASON)
    page.click("#bulk-confirm")
    page.wait_for_url("**/bulk/*/")
    job = BulkJob.objects.get()
    assert page.inner_text("#bulk-total") == "200"
    page.screenshot(path=screenshot_dir / "bulk-02-confirmed-1400.png", full_page=True)
    # The page follows the job by itself (bulk.js): counts between 0 and 200 on the way, then done.
    seen = set()

    def page_progress():
        seen.add(int(page.inner_text("#bulk-done")))
        if 0 < max(seen) < 200 and not (screenshot_dir / "bulk-03-progress-1400.png").exists():
            page.screenshot(path=screenshot_dir / "bulk-03-progress-1400.png", full_page=True)
        return page.evaluate("document.getElementById('bulk-job').dataset.state") == "done"

    wait_for_job(job.pk, lambda j: page_progress(), 120, live_processes, live_broker)
    assert any(0 < n < 200 for n in seen), seen
    page.wait_for_selector("#bulk-state.bulk-state-done")
    assert page.inner_text("#bulk-done") == "200" and page.inner_text("#bulk-succeeded") == "200"
    assert page.locator("#bulk-progress").get_attribute("value") == "200"
    page.screenshot(path=screenshot_dir / "bulk-04-done-1400.png", full_page=True)
    assert no_horizontal_overflow(page)
    page.set_viewport_size({"width": 800, "height": 1000})
    page.screenshot(path=screenshot_dir / "bulk-05-done-800.png", full_page=True)
    assert no_horizontal_overflow(page)
    text = page.inner_text("body")
    assert "None" not in text and "{'" not in text
    assert errors == []

    job.refresh_from_db()
    assert (job.state, job.succeeded) == ("done", 200)
    assert set(InboxEvent.objects.filter(pk__in=spam).values_list("state", flat=True)) == {"suppressed"}
    assert set(InboxEvent.objects.filter(pk__in=others).values_list("state", flat=True)) == {"awaiting_review"}
    page.goto(f"{live_server.url}{QUEUE_URL}?reason={FLOOD_REASON}")
    assert page.locator("#bulk-open").count() == 0  # nothing left to act on


# --- the embedded default: SQLite and the SQLAlchemy-transport broker ----------------------------------

SQLITE_SCRIPT = """
import json, time
from intake.models import AuditEvent, InboxEvent
from reconciliation import services
from reconciliation.models import BulkJob
from tests.factories import make_destination, make_mailbox, make_tenant
from tests.support.bulk import flood
from tests.support.users import make_user

tenant = make_tenant(slug="acme", domains=("acme.test",))
make_destination(tenant)
mailbox = make_mailbox(tenant, slug="support", address="support@acme.test")
oper = make_user("oper", groups=["operator"], tenants=[tenant])
spam = flood(mailbox, 200)
others = flood(mailbox, 3, reason="missing_sender", sender="someone@customer.test")
count, sample = services.preview_bulk(oper, filters={"reason": "sender_rate_limited"})
job = services.do_start_bulk_job(oper, filters={"reason": "sender_rate_limited"}, action="close",
                                 reason="spam wave", expected_count=count)
deadline = time.monotonic() + 180
while time.monotonic() < deadline:
    job.refresh_from_db()
    if job.state not in ("pending", "running"):
        break
    time.sleep(0.3)
applied = AuditEvent.objects.filter(kind="bulk_job_applied").values_list("inbox_event_id", flat=True)
print(json.dumps({
    "count": count, "sample": len(sample), "state": job.state, "done": job.done, "succeeded": job.succeeded,
    "applied": len(applied), "applied_items": len(set(applied)),
    "spam_states": sorted(set(InboxEvent.objects.filter(pk__in=spam).values_list("state", flat=True))),
    "other_states": sorted(set(InboxEvent.objects.filter(pk__in=others).values_list("state", flat=True))),
}))
"""


def embedded_env(root: Path) -> dict:
    """A development instance on SQLite and the embedded broker, both under `root` (as `make run`)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "SECRET_KEY", "LOG_FORMAT") and not k.startswith(("MAILROOM_", "CELERY_"))
    }
    env.update(
        {
            "DATABASE_URL": f"sqlite:///{root / 'db.sqlite3'}",
            "MAILROOM_ENV": "development",
            "MAILROOM_VAR_DIR": str(root / "var"),
            "MAILROOM_ENV_FILE": str(root / ".env"),
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "MAILROOM_BULK_JOB_CHUNK": "25",
            "SECRET_KEY": f"bulk-{uuid.uuid4().hex}{uuid.uuid4().hex}",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


@pytest.mark.timeout(420)
def test_the_embedded_default_runs_a_200_item_bulk_close_with_a_real_worker(tmp_path):
    env = embedded_env(tmp_path)
    (tmp_path / "var").mkdir()
    migrate = subprocess.run(
        [PYTHON, str(REPO_ROOT / "manage.py"), "migrate", "--noinput"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    # Not the live_processes fixture: its teardown waits on PostgreSQL sessions, and this test has none.
    worker = LiveProcess(
        "worker",
        [
            PYTHON,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--concurrency",
            "1",
            "--loglevel",
            "WARNING",
            "-n",
            f"bulk-{uuid.uuid4().hex[:8]}@%h",
            "--without-mingle",
            "--without-gossip",
        ],
        env,
        REPO_ROOT,
        tmp_path / "worker.log",
    )
    try:
        wait_for(lambda: (tmp_path / "var" / "broker.sqlite3").exists() or not worker.alive(), timeout=60)
        assert worker.alive(), worker.tail()
        run = subprocess.run(
            [PYTHON, str(REPO_ROOT / "manage.py"), "shell", "-c", SQLITE_SCRIPT],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        worker.stop()
    assert run.returncode == 0, run.stdout + run.stderr + worker.tail()
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {
        "count": 200,
        "sample": 10,
        "state": "done",
        "done": 200,
        "succeeded": 200,
        "applied": 200,
        "applied_items": 200,
        "spam_states": ["suppressed"],
        "other_states": ["awaiting_review"],
    }, worker.tail()
    log = worker.tail(400)
    assert "ERROR" not in log and "Traceback" not in log, log

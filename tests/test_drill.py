"""`manage.py drill`: the rehearsal set against its own FakeDesk, in a scratch tenant (reconciliation.drills).

The scratch tenant is a drill tenant (`Tenant.is_drill`): the live paths leave its rows to the drill, and
afterwards it is discarded with everything it made (`--keep` keeps it as evidence). So the drill passes
while the real stack runs (worker, relay, beat) and leaves the queue, the pauses and /metrics as it found
them. Also here: `manage.py reconcile` exits non-zero when a reconciler failed.
"""

import json
import os
import re
import threading
import uuid
from dataclasses import replace
from datetime import timedelta
from io import StringIO

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from intake.keys import provider_message_id_for_raw
from intake.models import InboxEvent, Mailbox, OutboxMessage, Tenant
from intake.services import ingest, transition_event
from intake.vocabulary import AuditKind, ReasonCode
from reconciliation.drills import SCENARIOS, runner
from reconciliation.drills.scratch import Scratch, closed_port
from reconciliation.models import Finding
from reconciliation.selectors import recovery_queue
from tests.factories import make_destination, make_event
from tests.live import (  # noqa: F401  (fixtures)
    PYTHON,
    live_broker,
    live_mailbox,
    live_processes,
    make_email,
    subprocess_env,
    wait_for,
)
from ticketing import intents
from ticketing.models import Destination, DestinationAttempt, Intent, Notification

TOKEN = "drill-metrics-token"
SUMMARY_LINE = re.compile(r": scanned \d+", re.MULTILINE)  # a reconcile summary line of a recorded run
SETTLED_STATES = {"completed", "failed", "awaiting_review"}  # where the drill's messages end


@pytest.fixture(autouse=True)
def forget_drill_variables():
    yield
    for name in [name for name in os.environ if name.startswith("MAILROOM_T_DRILL_")]:  # the drill sets them
        del os.environ[name]


@pytest.fixture
def metrics_token(settings):
    settings.MAILROOM_METRICS_TOKEN = TOKEN


def drill(*args) -> tuple[str, dict]:
    """Run `manage.py drill` here; (its output, its JSON report). A failed drill raises CommandError."""
    out = StringIO()
    try:
        call_command("drill", *args, stdout=out)
    finally:
        text = out.getvalue()
    [path] = re.findall(r"^report: (.+)$", text, re.MULTILINE)
    with open(path) as handle:
        return text, json.load(handle)


def table_rows(text: str) -> list[list[str]]:
    """The printed table's rows, cell by cell (cells are separated by two spaces or more)."""
    lines = text.splitlines()
    assert lines[0].split() == ["scenario", "expected", "tickets", "queue", "state", "result"]
    rows = []
    for line in lines[2:]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.rstrip()))
    return rows


def scrape() -> str:
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    return response.content.decode()


def steady_samples(text: str) -> dict:
    """The samples of a scrape that only a change of state moves (ages and timestamps grow by themselves)."""
    moving = ("_seconds",)
    return {
        line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1]
        for line in text.splitlines()
        if line and not line.startswith("#") and not line.split("{")[0].split(" ")[0].endswith(moving)
    }


def row_counts() -> dict:
    """Rows per model, every app: nothing the drill made may be left anywhere."""
    return {
        model._meta.label: model._default_manager.count()
        for model in apps.get_models()
        if not model._meta.proxy and model._meta.managed
    }


def operators_view() -> dict:
    """What an operator sees: the queue, the pauses, the tenants of every filter."""
    return {
        "queue": sorted(recovery_queue().values_list("pk", flat=True)),
        "paused destinations": sorted(Destination.objects.filter(paused=True).values_list("pk", flat=True)),
        "paused mailboxes": sorted(Mailbox.objects.filter(paused=True).values_list("pk", flat=True)),
        "tenants": sorted(Tenant.objects.values_list("slug", flat=True)),
    }


@pytest.fixture
def busy_tenant(mailbox, scanner_off):
    """The `mailbox` tenant with something for an operator to see: a paused destination and an item in the queue."""
    make_destination(mailbox.tenant, slug="paused-desk", is_default=False, paused=True)
    event = make_event(mailbox)
    transition_event(
        event.pk,
        ["received"],
        "failed",
        actor="tests",
        kind=AuditKind.INTENT_FAILED,
        reason_code=ReasonCode.CREDENTIALS,
        reason_detail="for the queue",
    )
    return mailbox


# --- a default run: it passes, and leaves no trace ------------------------------------------------------


def test_every_scenario_passes_and_the_scratch_tenant_is_discarded(busy_tenant, metrics_token, tmp_path):
    seen, metrics, rows = operators_view(), scrape(), row_counts()
    assert seen["queue"] and seen["paused destinations"]  # something to leave as it was

    text, report = drill("--report", str(tmp_path / "drill.json"))

    for scenario in SCENARIOS:
        [row] = [line for line in text.splitlines() if line.startswith(scenario.name + " ")]
        assert row.rstrip().endswith("pass"), row
    assert "FAIL" not in text and f"drill passed: {len(SCENARIOS)} scenarios" in text
    assert f"scratch tenant {report['slug']} discarded" in text and report["kept"] is False
    # No trace: not in the queue, the pauses, the filters, /metrics; not a row anywhere.
    assert not Tenant.objects.filter(is_drill=True).exists()
    assert operators_view() == seen
    after = scrape()
    assert "drill-" not in after and steady_samples(after) == steady_samples(metrics)
    assert row_counts() == rows
    call_command("reconcile", stdout=StringIO())  # exit 0: nothing of the drill left to fail

    # The JSON report says what the table says, cell for cell, with the run's times and totals.
    assert [[s["row"][h] for h in runner.HEADER] for s in report["scenarios"]] == table_rows(text)
    assert [s["name"] for s in report["scenarios"]] == [s.name for s in SCENARIOS]
    assert all(s["pass"] and s["observed"]["event"] == s["expected"]["event"] for s in report["scenarios"])
    assert report["totals"] == {"scenarios": len(SCENARIOS), "passed": len(SCENARIOS), "failed": 0}
    assert report["passed"] and report["cleanup"]["discarded"] and report["cleanup"]["rows"]["intake.InboxEvent"]
    assert report["started_at"] < report["finished_at"] and report["slug"].startswith("drill-")


def test_the_report_goes_under_the_var_folder_by_default(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    text, report = drill()
    assert os.path.exists(tmp_path / "drill" / f"{report['slug']}.json")
    assert f"report: {tmp_path / 'drill' / (report['slug'] + '.json')}" in text


def test_keep_keeps_the_tenant_and_its_evidence_out_of_every_live_path(busy_tenant, metrics_token, tmp_path):
    seen, metrics, rows = operators_view(), scrape(), row_counts()

    text, report = drill("--keep", "--report", str(tmp_path / "kept.json"))

    assert "drill passed" in text and "kept as evidence (--keep)" in text and report["kept"] is True
    scratch = Tenant.objects.get(is_drill=True)
    assert scratch.slug == report["slug"] and scratch.slug in text
    states = set(InboxEvent.objects.filter(tenant=scratch).values_list("state", flat=True))
    assert states == SETTLED_STATES  # every drill message settled, and kept
    assert Intent.objects.filter(inbox_event__tenant=scratch).exists()
    assert Mailbox.objects.get(tenant=scratch).paused and Destination.objects.get(tenant=scratch).paused
    assert not OutboxMessage.objects.filter(
        payload__inbox_event_id__in=list(InboxEvent.objects.filter(tenant=scratch).values_list("pk", flat=True))
    ).exists()
    # Evidence an operator asked for, but nothing that alerts or fails: /metrics and reconcile leave it out.
    after = scrape()
    assert "drill-" not in after and steady_samples(after) == steady_samples(metrics)
    out = StringIO()
    call_command("reconcile", stdout=out)  # its FakeDesk is gone: a reconciler of it would fail
    out_of_reconcile = out.getvalue()
    assert scratch.slug not in out_of_reconcile

    out = StringIO()
    call_command("drill", "--discard", scratch.slug, stdout=out)
    assert f"drill tenant {scratch.slug} discarded" in out.getvalue()
    left = row_counts()
    assert left.pop("reconciliation.ReconciliationRun") == len(SUMMARY_LINE.findall(out_of_reconcile))  # this test's
    rows.pop("reconciliation.ReconciliationRun")
    assert operators_view() == seen and left == rows


def test_discard_takes_only_a_drill_tenant(busy_tenant):
    rows = row_counts()
    for slug in (busy_tenant.tenant.slug, "no-such-tenant"):
        with pytest.raises(CommandError):
            call_command("drill", "--discard", slug, stdout=StringIO())
    assert row_counts() == rows


def test_a_broken_expectation_fails_the_drill_and_still_cleans_up(db, monkeypatch, tmp_path):
    first = SCENARIOS[0]
    broken = replace(first, expect=replace(first.expect, tickets=first.expect.tickets + 1))
    monkeypatch.setattr(runner, "SCENARIOS", [broken])
    out = StringIO()
    with pytest.raises(CommandError, match=first.name):
        call_command("drill", "--report", str(tmp_path / "failed.json"), stdout=out)
    [row] = [line for line in out.getvalue().splitlines() if line.startswith(first.name + " ")]
    assert row.rstrip().endswith("FAIL")
    report = json.loads((tmp_path / "failed.json").read_text())
    assert report["totals"] == {"scenarios": 1, "passed": 0, "failed": 1} and not report["passed"]
    assert report["scenarios"][0]["row"]["result"] == "FAIL"
    assert not Tenant.objects.filter(is_drill=True).exists()


def test_no_form_can_make_or_unmake_a_drill_tenant(tenant, client):
    """`is_drill` is set by the drill alone: the admin's tenant forms have no such field."""
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests-only"))
    for url in ("/admin/intake/tenant/add/", f"/admin/intake/tenant/{tenant.pk}/change/"):
        response = client.get(url)
        assert response.status_code == 200 and b'name="slug"' in response.content
        assert b"is_drill" not in response.content


def test_the_drill_refuses_a_destination_that_is_not_a_fakedesk(db):
    from reconciliation.drills.scratch import NotAFakeDesk

    class RealDesk:
        url = "https://example.zendesk.com"

    with pytest.raises(NotAFakeDesk):
        Scratch(RealDesk())
    assert not Tenant.objects.filter(slug__startswith="drill-").exists()


# --- the live paths leave a drill tenant's rows alone ------------------------------------------------------


def test_the_workers_sweeps_and_reconcilers_leave_a_drill_tenants_rows_alone(desk, mailbox, scanner_off):
    """Rows in every state a live path acts on, in a drill tenant: not one of those paths touches them."""
    from intake import retention
    from intake.services import release_waiting_events, requeue_stale_events
    from reconciliation.drills.cleanup import discard
    from reconciliation.reconcilers import reconcile
    from reconciliation.services import escalation
    from ticketing import breaker, tasks

    scratch = Scratch(desk)
    long_ago = timezone.now() - timedelta(days=400)

    def new_event(plan=None):
        desk.set_plan(plan or [])
        return scratch.deliver(scratch.message(f"Subject {uuid.uuid4().hex[:6]}", "Body.")).inbox_event_id

    stale = new_event()  # received, never processed
    InboxEvent.objects.filter(pk=stale).update(updated_at=long_ago)
    waiting = new_event()
    InboxEvent.objects.filter(pk=waiting).update(retry_at=long_ago)
    retrying = new_event(["rate_limit:1"])
    assert scratch.process(retrying) == "retry_wait"
    claimed = new_event()
    scratch.set_paused(True)
    assert scratch.process(claimed) == "paused"
    scratch.set_paused(False)
    assert intents.claim(scratch.intent(claimed).pk, worker="tests:a-worker-that-died")
    unknown = new_event(["stall_after_commit:2"])
    assert scratch.process(unknown) == "unknown"
    failed = new_event(["reject_422"])
    assert scratch.process(failed) == "failed"
    done = new_event()
    assert scratch.process(done) == "created"
    events = [stale, waiting, retrying, claimed, unknown, failed, done]
    for event_id in events:
        scratch.advance(event_id)  # every wait is over, every claim ran out
    InboxEvent.objects.filter(pk__in=events).update(received_at=long_ago, escalate_at=long_ago)
    # An operator of the drill tenant who would be emailed about its overdue item.
    operator = get_user_model().objects.create_user("drill-operator", email="operator@acme.test")
    operator.groups.add(Group.objects.get_or_create(name=escalation.OPERATOR_GROUP)[0])
    scratch.tenant.members.add(operator)

    def snapshot():
        return (
            list(
                InboxEvent.objects.filter(pk__in=events)
                .order_by("pk")
                .values_list("pk", "state", "updated_at", "retry_at", "dispatch_count", "owner", "purged_at")
            ),
            list(
                Intent.objects.filter(inbox_event_id__in=events)
                .order_by("pk")
                .values_list("pk", "state", "attempts", "next_attempt_at", "claimed_until")
            ),
            OutboxMessage.objects.count(),
            Finding.objects.count(),
            Notification.objects.count(),
            DestinationAttempt.objects.filter(destination=scratch.destination).count(),
        )

    before = snapshot()
    assert tasks.process_inbox_events([*events, stale]) == {"drill": len(events) + 1}  # as a worker gets them
    assert requeue_stale_events(older_than_seconds=0) == {"requeued": 0, "poisoned": 0}
    assert release_waiting_events() == 0
    assert intents.expire_claims() == 0 and intents.enqueue_due(lost_after_seconds=0) == 0
    assert intents.resolve_unknown_intents() == {}
    assert retention.purge_expired_bodies()["purged"] == 0
    assert escalation.send_escalations() == 0
    assert breaker.prune(older_than_seconds=-60) == 0  # its attempts stay (the drill's, discarded with it)
    summaries = reconcile()
    assert scratch.slug not in " ".join(s.line() for s in summaries)
    assert snapshot() == before

    scratch.close()
    discard(slug=scratch.slug)
    assert not InboxEvent.objects.filter(pk__in=events).exists()


# --- `manage.py reconcile` exits non-zero when a reconciler failed -----------------------------------------


def test_reconcile_exits_non_zero_when_a_reconciler_failed(mailbox, monkeypatch):
    monkeypatch.setenv("FAKEDESK_CREDENTIALS", "agent@acme.test/token:nothing-listens")
    make_destination(
        mailbox.tenant,
        slug="refused",
        kind="zendesk",
        is_default=False,
        base_url=f"http://127.0.0.1:{closed_port()}",
        credentials_ref="env:FAKEDESK_CREDENTIALS",
        settings={"connect_timeout": 1.0, "read_timeout": 1.0},
    )
    out = StringIO()
    with pytest.raises(CommandError, match=r"1 reconciler\(s\) failed: destination destination:acme/refused"):
        call_command("reconcile", stdout=out)
    [line] = [line for line in out.getvalue().splitlines() if "destination:acme/refused" in line]
    assert ", error: " in line
    call_command("reconcile", "--mailbox", mailbox.slug, stdout=StringIO())  # the others pass: exit 0


# --- while the real stack runs -------------------------------------------------------------------------------


class Sweeper:
    """Beat's sweeps and passes, far more often than beat: every live path that could touch a drill's rows."""

    def __init__(self):
        self.stop, self.errors, self.rounds = threading.Event(), [], 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        from intake import retention
        from intake.services import release_waiting_events, requeue_stale_events
        from reconciliation.reconcilers import reconcile
        from reconciliation.services import escalation

        try:
            while not self.stop.is_set():
                requeue_stale_events(older_than_seconds=1)
                release_waiting_events()
                intents.expire_claims()
                intents.enqueue_due(lost_after_seconds=1)
                intents.resolve_unknown_intents()
                reconcile()
                escalation.send_escalations()
                retention.purge_expired_bodies()
                self.rounds += 1
                self.stop.wait(0.05)
        except Exception as exc:  # surfaced by the test, not swallowed by the thread
            self.errors.append(exc)
        finally:
            connection.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)


@pytest.mark.live
def test_the_drill_passes_five_times_in_a_row_while_the_stack_runs(
    live_mailbox, live_broker, live_processes, metrics_token, tmp_path, monkeypatch
):
    monkeypatch.setenv("CELERY_BROKER_URL", live_broker.url)
    # The stack as `make run` starts it, on short periods: beat's sweeps every second, a reconciliation pass
    # every second, stale events after one; the worker logs each task's outcome (CELERY_LOG_LEVEL).
    env = subprocess_env(
        live_broker.url,
        MAILROOM_CLAMD="off",
        MAILROOM_SWEEP_SECONDS=1,
        MAILROOM_STALE_EVENT_SECONDS=1,
        MAILROOM_RECONCILE_SECONDS=1,
        MAILROOM_RELAY_SWEEP_SECONDS=0.2,
        CELERY_LOG_LEVEL="INFO",
    )
    celery = [PYTHON, "-m", "celery", "-A", "config"]
    worker = live_processes.start(
        "worker",
        [
            *celery,
            "worker",
            "--concurrency",
            "2",
            "--loglevel",
            "INFO",
            "-n",
            f"drill-{uuid.uuid4().hex[:8]}@%h",
            "--without-mingle",
            "--without-gossip",
        ],
        env,
    )
    live_processes.relay(env)
    beat = live_processes.start(
        "beat",
        [*celery, "beat", "--loglevel", "INFO", "--scheduler", "django_celery_beat.schedulers:DatabaseScheduler"],
        env,
    )
    wait_for(
        lambda: "ticketing.tasks.enqueue_due_intents" in worker.log_path.read_text(errors="replace"),
        timeout=60,
        describe=live_processes.logs,
    )  # beat's tasks reach the worker
    paused_before = [line for line in scrape().splitlines() if line.startswith("mailroom_destination_paused{")]

    live_ids, reports = [], []
    with Sweeper() as sweeper:
        for run in range(5):
            for n in range(3):  # the live tenant's mail goes on while the drill runs
                raw = make_email(f"Live request {run}.{n}")
                live_ids.append(
                    ingest(live_mailbox, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id
                )
            text, report = drill("--report", str(tmp_path / f"run-{run}.json"))
            reports.append(report)
            assert "FAIL" not in text and f"drill passed: {len(SCENARIOS)} scenarios" in text, text
            assert not Tenant.objects.filter(is_drill=True).exists()
        wait_for(
            lambda: set(InboxEvent.objects.filter(pk__in=live_ids).values_list("state", flat=True)) == {"completed"},
            timeout=60,
            describe=live_processes.logs,
        )
    assert not sweeper.errors, sweeper.errors
    assert sweeper.rounds > 0 and worker.alive() and beat.alive(), live_processes.logs()

    assert [r["totals"] for r in reports] == [{"scenarios": len(SCENARIOS), "passed": len(SCENARIOS), "failed": 0}] * 5
    # The live worker did get the drill's events (the relay published them) and dropped them.
    assert "'drill': " in worker.log_path.read_text(errors="replace")
    after = scrape()
    assert "drill-" not in after
    assert [line for line in after.splitlines() if line.startswith("mailroom_destination_paused{")] == paused_before
    assert recovery_queue().count() == 0 and not Destination.objects.filter(paused=True).exists()
    call_command("reconcile", stdout=StringIO())

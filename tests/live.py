"""Helpers and fixtures for tests that start real processes (Celery worker, relay, web).

Every process is started in its own session (`start_new_session=True`), so it
and its children form one process group; it is stopped by its pid at teardown
(SIGTERM to the process, then SIGKILL to its group), never by name.

The test database is the one pytest-django created (`connection.settings_dict`);
`transactional_db` / `live_server` commit what a test writes, so the
subprocesses, which connect to the same database, see it.

Test modules import the fixtures they use from here.
"""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from email.message import EmailMessage
from pathlib import Path
from urllib.parse import quote

import pytest

from config.test_settings import redis_database
from tests.services import free_port  # noqa: F401  (imported from here by other tests)

REPO_ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable  # the venv's python: the suite runs as .venv/bin/pytest
MANAGE = str(REPO_ROOT / "manage.py")

# Redis databases owned by these tests, flushed before and after each use; each pytest-xdist worker has its own
# (config/test_settings.py).
LIVE_REDIS_HOST = "127.0.0.1"
LIVE_REDIS_PORT = 6379
PIPELINE_REDIS_DB = redis_database("pipeline")

LIVE_SECRET_VAR = "MAILROOM_LIVE_TEST_WEBHOOK_SECRET"
LIVE_SECRET = "live-test-webhook-secret"
PROCESS_TASK = "ticketing.tasks.process_inbox_events"


# --- small utilities --------------------------------------------------------


def wait_for(predicate, timeout: float, interval: float = 0.1, describe=None):
    """Poll `predicate` until it returns something truthy; fail with `describe()` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = describe() if describe else ""
            pytest.fail(f"condition not met within {timeout:.0f} s{': ' if detail else ''}{detail}")
        time.sleep(interval)


def make_email(
    subject: str,
    to: str = "support@live.mailroom.test",
    sender: str = "customer@example.com",
    body: str = "Please help, the printer is on fire.\n",
) -> bytes:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = to
    message["Subject"] = subject
    message["Message-ID"] = f"<{uuid.uuid4()}@live.mailroom.test>"
    message.set_content(body)
    return message.as_bytes()


def database_url() -> str:
    """A DATABASE_URL for the database this test process uses (pytest-django's test database)."""
    from django.db import connection

    s = connection.settings_dict
    user = quote(s.get("USER") or "", safe="")
    password = quote(s.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or "5432"
    return f"postgres://{auth}{host}:{port}/{s['NAME']}"


def subprocess_env(broker_url: str | None = None, **extra) -> dict:
    """The environment of a child Mailroom process: config.settings (development), on the test database."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "MAILROOM_ENV": "development",  # plain HTTP, the built-in SECRET_KEY (tests of production strip it)
            "DATABASE_URL": database_url(),
            "CELERY_DB_REUSE_MAX": "1000",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if broker_url:
        env["CELERY_BROKER_URL"] = broker_url
    env.update({k: str(v) for k, v in extra.items()})
    return env


# --- /proc: process trees, without psutil ------------------------------------


def _stat(pid: int):
    """(state, ppid, starttime) of a pid, or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            raw = handle.read()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def descendants(root_pid: int) -> dict[int, tuple[int, str]]:
    """Every living descendant of `root_pid`: pid -> (starttime, cmdline)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _stat(int(entry))
        if stat and stat[0] != "Z":
            children.setdefault(stat[1], []).append(int(entry))
    found, todo = {}, [root_pid]
    while todo:
        for child in children.get(todo.pop(), []):
            stat = _stat(child)
            if stat is not None and child not in found:
                found[child] = (stat[2], _cmdline(child))
                todo.append(child)
    return found


def is_running(pid: int, starttime: int) -> bool:
    """True while that very process (same start time, so not a reused pid) exists and is not a zombie."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and stat[2] == starttime


def kill_group(pid: int, sig=signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_for_other_sessions_to_end(timeout: float = 10.0) -> None:
    """Wait until the server has closed the sessions of processes we stopped.

    A killed client's backend exits a moment after the client; pytest-django's
    DROP DATABASE at the end of the session fails while one is still there.
    """
    from django.db import connection

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0] == 0:
                return
        time.sleep(0.1)


# --- managed processes --------------------------------------------------------


class LiveProcess:
    def __init__(self, name: str, argv: list[str], env: dict, cwd: Path, log_path: Path):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM to the process (it shuts its own children down), SIGKILL to the group at the deadline."""
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_group(self.pid)
                self.popen.wait(timeout=10)
        kill_group(self.pid)  # whatever it left behind in its group
        self._log.close()
        return self.popen.returncode

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class LiveProcesses:
    """Starts the real Mailroom processes of a test and stops every one of them at teardown."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.started: list[LiveProcess] = []

    def start(self, name: str, argv: list[str], env: dict, cwd: Path = REPO_ROOT) -> LiveProcess:
        process = LiveProcess(name, argv, env, cwd, self.log_dir / f"{name}-{len(self.started)}.log")
        self.started.append(process)
        return process

    def worker(self, env: dict, node: str | None = None, concurrency: int = 2) -> LiveProcess:
        node = node or f"live-{uuid.uuid4().hex[:8]}@%h"
        return self.start(
            "worker",
            [
                PYTHON,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "--concurrency",
                str(concurrency),
                "--loglevel",
                "WARNING",
                "-n",
                node,
                "--without-mingle",
                "--without-gossip",
            ],
            env,
        )

    def queue_worker(self, env: dict, queues: str, pool: str = "prefork", concurrency: int = 2) -> LiveProcess:
        """A worker consuming only `queues` (comma-separated) with the given pool, as run_stack starts them."""
        return self.start(
            f"worker-{pool}",
            [
                PYTHON,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "--pool",
                pool,
                "--concurrency",
                str(concurrency),
                "-Q",
                queues,
                "--loglevel",
                "WARNING",
                "-n",
                f"live-{uuid.uuid4().hex[:8]}@%h",
                "--without-mingle",
                "--without-gossip",
            ],
            env,
        )

    def relay(self, env: dict) -> LiveProcess:
        return self.start("relay", [PYTHON, MANAGE, "run_relay", "--sweep-seconds", "1"], env)

    def stop_all(self) -> None:
        for process in reversed(self.started):
            process.stop()
        wait_for_other_sessions_to_end()

    def logs(self, lines: int = 30) -> str:
        return "\n".join(
            f"----- {p.name} (pid {p.pid}, rc {p.popen.poll()}) -----\n{p.tail(lines)}" for p in self.started
        )


# --- fixtures -------------------------------------------------------------------


@pytest.fixture
def live_processes(tmp_path):
    processes = LiveProcesses(tmp_path)
    try:
        yield processes
    finally:
        processes.stop_all()


class LiveBroker:
    def __init__(self, db: int):
        import redis

        self.url = f"redis://{LIVE_REDIS_HOST}:{LIVE_REDIS_PORT}/{db}"
        self.redis = redis.Redis(host=LIVE_REDIS_HOST, port=LIVE_REDIS_PORT, db=db)

    def queued_messages(self) -> list[dict]:
        """The task messages waiting in the broker's queue lists (kombu keeps them as JSON in Redis lists)."""
        messages = []
        for key in self.redis.scan_iter(match="celery*"):
            if self.redis.type(key) == b"list":
                messages.extend(json.loads(item) for item in self.redis.lrange(key, 0, -1))
        return messages

    def drop_queued_messages(self) -> int:
        """Lose every waiting message, as a broker failure would: returns how many were dropped."""
        dropped = 0
        for key in list(self.redis.scan_iter(match="celery*")):
            if self.redis.type(key) == b"list":
                dropped += self.redis.llen(key)
                self.redis.delete(key)
        return dropped

    def ping_worker(self, node: str, timeout: float = 1.0) -> bool:
        """True when worker `node` answers a remote-control ping on this broker."""
        from celery import Celery

        # Celery prefers $CELERY_BROKER_URL (this process's own broker) to broker=, everywhere.
        saved = os.environ.get("CELERY_BROKER_URL")
        os.environ["CELERY_BROKER_URL"] = self.url
        app = Celery("live-probe", broker=self.url, set_as_current=False)
        try:
            return bool(app.control.ping(destination=[node], timeout=timeout))
        finally:
            app.close()
            if saved is None:
                os.environ.pop("CELERY_BROKER_URL", None)
            else:
                os.environ["CELERY_BROKER_URL"] = saved


@contextmanager
def flushed_broker(db: int):
    """A LiveBroker on Redis database `db`, empty at the start and flushed at the end."""
    broker = LiveBroker(db)
    broker.redis.flushdb()
    try:
        yield broker
    finally:
        broker.redis.flushdb()
        broker.redis.close()


@pytest.fixture
def live_broker():
    """Redis database PIPELINE_REDIS_DB, empty at the start and flushed at the end."""
    with flushed_broker(PIPELINE_REDIS_DB) as broker:
        yield broker


@pytest.fixture
def live_mailbox(transactional_db, monkeypatch):
    """A raw mailbox of its own tenant, with a built-in default destination; committed for subprocesses."""
    from intake.models import Mailbox, Tenant
    from ticketing.models import Destination

    monkeypatch.setenv(LIVE_SECRET_VAR, LIVE_SECRET)
    tenant = Tenant.objects.create(slug="live", name="Live")
    Destination.objects.create(tenant=tenant, slug="builtin", kind="builtin", is_default=True)
    return Mailbox.objects.create(
        tenant=tenant,
        slug="live-support",
        address="support@live.mailroom.test",
        provider="raw",
        webhook_secret_ref=f"env:{LIVE_SECRET_VAR}",
        # These tests count tickets (acknowledgments have their own tests) and send many
        # messages from one sender, which the default sender rate limit would suppress.
        settings={"acknowledge": False, "sender_rate_limit": {"count": 1_000_000, "seconds": 600}},
    )


# --- what the database says ------------------------------------------------------


def event_states(ids) -> Counter:
    from intake.models import InboxEvent

    return Counter(InboxEvent.objects.filter(pk__in=list(ids)).values_list("state", flat=True))


def audit_kinds(event_id: int) -> Counter:
    from intake.models import AuditEvent

    return Counter(AuditEvent.objects.filter(inbox_event_id=event_id).values_list("kind", flat=True))

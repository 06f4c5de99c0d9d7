"""Shared plumbing of the benchmarks: a throw-away database, the processes of the stack,
signed messages made before the clock starts, HTTP clients, and percentiles.

Nothing here is imported by the application; the scripts in this folder run it as
`.venv/bin/python bench/<name>.py` from the repository root.
"""
from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"
if not PYTHON.exists():  # e.g. a venv elsewhere: use the interpreter running us
    PYTHON = Path(sys.executable)
BIN = PYTHON.parent
PG_ADMIN_DSN = os.environ.get("BENCH_PG_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
BROKER_URL = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/14")
SECRET = "bench-" + uuid.uuid4().hex  # resolved by the app through env:BENCH_SECRET
MAILBOX_SLUG = "bench"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- statistics
def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted list (NaN when empty)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-pct * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


# --------------------------------------------------------------------------- database
def db_url(name: str) -> str:
    return PG_ADMIN_DSN.rsplit("/", 1)[0] + "/" + name


def recreate_database(name: str) -> None:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(name: str) -> None:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_sessions(name: str) -> int | None:
    """Sessions ever opened on database `name` (pg_stat_database.sessions, PostgreSQL 14+)."""
    try:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = %s", (name,)).fetchone()
            return None if row is None else int(row[0])
    except psycopg.Error:
        return None


def flush_broker() -> None:
    import redis  # celery[redis] brings it

    redis.Redis.from_url(BROKER_URL).flushdb()


def app_env(db_name: str, tmp: Path, log_level: str) -> dict:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL=db_url(db_name),
        CELERY_BROKER_URL=BROKER_URL,
        BENCH_SECRET=SECRET,
        MAILROOM_PLATFORM_SECRET_REFS=f"env:BENCH_SECRET=mailbox:{MAILBOX_SLUG}",  # the bench mailbox's webhook secret
        CELERY_DB_REUSE_MAX="1000",
        MAILROOM_VAR_DIR=str(tmp / "var"),
        LOG_LEVEL=log_level,
        DEBUG="false",
        MAILROOM_ENV="development",  # plain HTTP on 127.0.0.1, the built-in SECRET_KEY
        PYTHONUNBUFFERED="1",
    )
    return env


def with_app_name(env: dict, name: str) -> dict:
    """`env` whose DATABASE_URL names the connection (`application_name`), so that the bench can
    tell PostgreSQL backends apart by the process they serve (pg_stat_activity)."""
    return dict(env, DATABASE_URL=env["DATABASE_URL"] + f"?application_name={name}")


def manage(env: dict, *args: str, timeout: float = 120) -> str:
    proc = subprocess.run([str(PYTHON), "manage.py", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)[:60]} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


SETUP_SCRIPT = r'''
import json, os
from datetime import timedelta
from django.db import connection
from django.utils import timezone
from intake.keys import dedupe_key, stable_key
from intake.models import AuditEvent, InboxEvent, Mailbox, OutboxMessage, Tenant
from ticketing.models import Destination, Intent, Ticket, TicketMapping

preload = int(os.environ["BENCH_PRELOAD"])
tenant = Tenant.objects.create(slug="bench", name="Benchmark tenant")
mailbox = Mailbox.objects.create(tenant=tenant, slug=os.environ["BENCH_MAILBOX"], address="support@bench.test",
                                 provider="raw", webhook_secret_ref="env:BENCH_SECRET")
destination = Destination.objects.create(tenant=tenant, slug="builtin", kind="builtin", is_default=True)
# History, so that PostgreSQL plans for tables of a realistic shape (SETUP.md: never benchmark on
# empty tables). Completed events with their audit rows, published outbox rows, intents, tickets
# and mappings, as the pipeline itself would have left them a while ago.
then = timezone.now() - timedelta(days=1)
raw = b"From: old@example.com\r\nSubject: old\r\n\r\nold message\r\n"
B = 2000
for start in range(0, preload, B):
    n = min(B, preload - start)
    events = InboxEvent.objects.bulk_create([
        InboxEvent(tenant=tenant, mailbox=mailbox, provider_message_id=f"preload-{i}@bench",
                   dedupe_key=dedupe_key(tenant.pk, mailbox.pk, f"preload-{i}@bench"), source="raw",
                   state="completed", received_at=then, updated_at=then, raw=raw, size=len(raw), dispatch_count=1,
                   sender="old@example.com", subject="old")
        for i in range(start, start + n)])
    AuditEvent.objects.bulk_create([AuditEvent(inbox_event=e, actor="provider:raw", kind="received", detail={}, at=then)
                                    for e in events])
    OutboxMessage.objects.bulk_create([OutboxMessage(topic="inbox_event.process", payload={"inbox_event_id": e.pk},
                                                     created_at=then, published_at=then, attempts=1) for e in events])
    keys = [stable_key(tenant.pk, mailbox.pk, e.provider_message_id, "create_ticket", 1) for e in events]
    tickets = Ticket.objects.bulk_create([
        Ticket(destination=destination, idempotency_key=k, external_ref=f"mailroom-{k[:40]}", subject="old",
               requester="old@example.com", description="old message", created_at=then) for k in keys])
    Intent.objects.bulk_create([
        Intent(idempotency_key=k, inbox_event=e, action="create_ticket", action_version=1, destination=destination,
               state="succeeded", attempts=1, external_ref=f"mailroom-{k[:40]}", result_ref=str(t.pk),
               created_at=then, completed_at=then) for k, e, t in zip(keys, events, tickets)])
    TicketMapping.objects.bulk_create([
        TicketMapping(inbox_event=e, action="create_ticket", destination=destination, ticket_id=str(t.pk),
                      ticket_url="", created_at=then) for e, t in zip(events, tickets)])
    AuditEvent.objects.bulk_create([AuditEvent(inbox_event=e, actor="worker:preload", kind="ticket_created",
                                               detail={}, at=then) for e in events])
with connection.cursor() as cursor:
    cursor.execute("VACUUM ANALYZE")
print("BENCH_SETUP " + json.dumps({"tenant": tenant.pk, "mailbox": mailbox.pk, "destination": destination.pk,
                                    "preloaded": preload}))
'''


def prepare_database(db_name: str, env: dict, preload: int) -> dict:
    """Drop and create the database, migrate it, and create tenant, raw mailbox and default destination."""
    recreate_database(db_name)
    t0 = time.monotonic()
    manage(env, "migrate", "--noinput", "-v0")
    setup_env = dict(env, BENCH_PRELOAD=str(preload), BENCH_MAILBOX=MAILBOX_SLUG)
    out = manage(setup_env, "shell", "-c", SETUP_SCRIPT)
    line = next(text for text in out.splitlines() if text.startswith("BENCH_SETUP "))
    info = json.loads(line.split(" ", 1)[1])
    log(f"database {db_name}: migrated, tenant + raw mailbox + default built-in destination, "
        f"{preload} completed events of history preloaded, ANALYZEd ({time.monotonic() - t0:.1f} s)")
    return info


def analyze(db_name: str) -> None:
    with psycopg.connect(db_url(db_name), autocommit=True) as conn:
        conn.execute("ANALYZE")


# --------------------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """The processes this run started; stops each of them (its own process group) at the end."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], env: dict) -> subprocess.Popen:
        logfile = open(self.tmp / f"{name}.log", "ab")
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=logfile,
                                stderr=subprocess.STDOUT, start_new_session=True)
        logfile.close()
        self.procs.append((name, proc))
        return proc

    def pid(self, name: str) -> int:
        """The pid (and process group id) of the process started as `name`."""
        return next(proc.pid for n, proc in self.procs if n == name)

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {self.tmp / (name + '.log')}:\n"
                                   + self.tail(name))

    def tail(self, name: str, lines: int = 30) -> str:
        try:
            return "\n".join((self.tmp / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, name: str | None = None, timeout: float = 10) -> None:
        chosen = [(n, p) for n, p in self.procs if name is None or n == name]
        for _, proc in chosen:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)  # the group we created for it
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for _, proc in chosen:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        self.procs = [(n, p) for n, p in self.procs if (n, p) not in chosen]


def start_gunicorn(stack: Stack, env: dict, workers: int, port: int, app: str = "config.wsgi", name: str = "gunicorn",
                   worker_class: str = "sync", threads: int = 1, extra: tuple[str, ...] = ()) -> None:
    """gunicorn on 127.0.0.1:`port`; the framework floor (bench/floor_app) passes its own `app` and
    `extra` (its --pythonpath) and otherwise gets exactly the same settings as the app."""
    argv = [str(BIN / "gunicorn"), app, "--workers", str(workers), "--worker-class", worker_class,
            "--bind", f"127.0.0.1:{port}", "--no-control-socket", "--log-level", "warning", *extra]
    if threads > 1:
        argv += ["--threads", str(threads)]
    stack.start(name, argv, env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stack.check_alive()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                conn.close()
                # Let every worker import the app: a few more health checks.
                for _ in range(workers * 4):
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                    c.request("GET", "/healthz")
                    c.getresponse().read()
                    c.close()
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not answer /healthz within 30 s:\n" + stack.tail(name))


def install_signal_handlers() -> None:
    """SIGTERM behaves like Ctrl-C, so the `finally` blocks stop what we started."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def make_tmp(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def remove_tmp(tmp: Path, keep: bool) -> None:
    if keep:
        log(f"logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)



def clean_up(stack, db_name: str, tmp: Path, keep: bool) -> None:
    """Stop what a run started, then drop its database and temporary files (unless --keep)."""
    stack.stop()
    if not keep:
        try:
            drop_database(db_name)
        except psycopg.Error as exc:
            log(f"could not drop {db_name}: {exc}")
    remove_tmp(tmp, keep=keep)


def git_revision() -> str:
    """The checked-out commit, read from .git without running git (short hash, or "unknown")."""
    try:
        git = REPO / ".git"
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head[:7]
        ref = head[5:]
        if (git / ref).exists():
            return (git / ref).read_text().strip()[:7]
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line[:7]
    except OSError:
        pass
    return "unknown"


# --------------------------------------------------------------------------- messages
_FILLER = ("Hello support team, the printer on the third floor is on fire again and the "
           "extinguisher is out of date. Could someone please look at it today? Thanks.\r\n")


def make_body(tag: str, i: int, body_bytes: int) -> bytes:
    """A unique RFC 5322 message (distinct Message-ID) of roughly `body_bytes` bytes."""
    head = (f"From: Customer {i} <customer{i}@example.com>\r\n"
            f"To: support@bench.test\r\n"
            f"Subject: [{tag}] request {i}: printer on fire\r\n"
            f"Date: Mon, 06 Jan 2025 10:00:00 +0000\r\n"
            f"Message-ID: <{tag}.{i}@bench.mailroom>\r\n"
            f"MIME-Version: 1.0\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Transfer-Encoding: 7bit\r\n\r\n")
    text = (_FILLER * (max(0, body_bytes - len(head)) // len(_FILLER) + 1))[: max(0, body_bytes - len(head))]
    return (head + text).encode()


def sign(body: bytes, timestamp: int) -> str:
    # The documented scheme (intake/signing.py); inlined so that this file needs no Django.
    return "v1=" + hmac.new(SECRET.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def make_messages(tag: str, count: int, body_bytes: int) -> list[tuple[bytes, dict]]:
    ts = int(time.time())
    out = []
    for i in range(count):
        body = make_body(tag, i, body_bytes)
        out.append((body, {"X-Mailroom-Timestamp": str(ts), "X-Mailroom-Signature": sign(body, ts),
                           "Content-Type": "message/rfc822"}))
    return out


def raw_http_request(port: int, path: str, body: bytes, headers: dict) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


WEBHOOK_PATH = f"/webhooks/raw/{MAILBOX_SLUG}/"


# --------------------------------------------------------------------------- python HTTP client
def _client_proc(port, messages, deadline_at, start_evt, out_q, pace=None):
    """One client: posts its messages one after the other on a keep-alive-capable connection.

    Records (t_send, t_answer, status, inbox_event_id) per post. gunicorn's sync workers close
    the connection after each answer; http.client then reconnects by itself.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler: terminate() just ends us
    results = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    start_evt.wait()
    started = time.time()
    for k, (body, headers) in enumerate(messages):
        if pace:  # (offset, interval): an open-loop schedule, whatever the answers' latency
            delay = started + pace[0] + k * pace[1] - time.time()
            if delay > 0:
                time.sleep(delay)
        t0 = time.time()
        if deadline_at and t0 >= deadline_at:
            break
        try:
            conn.request("POST", WEBHOOK_PATH, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            status = resp.status
            if resp.will_close:
                conn.close()
        except (OSError, http.client.HTTPException):
            conn.close()
            results.append((t0, time.time(), -1, None))
            continue
        event_id = None
        if status in (200, 202):
            try:
                event_id = json.loads(data)["inbox_event_id"]
            except (ValueError, KeyError):
                pass
        results.append((t0, time.time(), status, event_id))
    conn.close()
    out_q.put(results)


def post_with_python_clients(port: int, messages: list, clients: int, duration: float | None = None,
                             rate: float | None = None) -> dict:
    """Post `messages` from `clients` processes (forked, so the client's CPU is not our GIL).

    With `rate` (posts/s in all), the posts are paced: client i sends its k-th post at
    (i + k * clients) / rate seconds after the start, so together they post evenly at `rate`."""
    ctx = multiprocessing.get_context("fork")
    start_evt = ctx.Event()
    out_q = ctx.Queue()
    shares = [messages[i::clients] for i in range(clients)]
    # The processes are forked before the start signal; a duration becomes an absolute deadline.
    deadline_at = time.time() + 0.3 + duration if duration else 0
    paces = [(i / rate, clients / rate) if rate else None for i in range(clients)]
    procs = [ctx.Process(target=_client_proc, args=(port, share, deadline_at, start_evt, out_q, pace), daemon=True)
             for share, pace in zip(shares, paces, strict=True)]
    results = []
    wall0 = wall1 = time.time()
    try:
        for p in procs:
            p.start()
        time.sleep(0.2)  # let every process reach the start line
        start_evt.set()
        for _ in procs:
            results.extend(out_q.get(timeout=600))
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(5)
    if results:
        wall0 = min(r[0] for r in results)
        wall1 = max(r[1] for r in results)
    latencies = sorted(r[1] - r[0] for r in results)
    statuses: dict = {}
    for r in results:
        statuses[r[2]] = statuses.get(r[2], 0) + 1
    return {"results": results, "wall": max(1e-9, wall1 - wall0), "requests": len(results),
            "statuses": statuses, "p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
            "max": latencies[-1] if latencies else float("nan")}


# --------------------------------------------------------------------------- CPU accounting
_TICK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: str):
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    comm = data[data.index("(") + 1 : data.rindex(")")]
    fields = data[data.rindex(")") + 2 :].split()
    # fields[0] is state (field 3); pgrp is field 5, utime 14, stime 15, cutime 16, cstime 17
    # own CPU plus that of reaped children (e.g. our finished client processes)
    return comm, int(fields[2]), sum(int(v) for v in fields[11:15]) / _TICK


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy since boot (all cores)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    return (sum(values) - values[3] - values[4]) / _TICK


def pg_backend_labels(db_name: str) -> dict[int, str]:
    """pid -> application_name of the PostgreSQL backends serving `db_name` (see with_app_name)."""
    try:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            rows = conn.execute("SELECT pid, application_name FROM pg_stat_activity WHERE datname = %s",
                                (db_name,)).fetchall()
    except psycopg.Error:
        return {}
    return {int(pid): (app or "unnamed") for pid, app in rows}


def cpu_by_group(groups: dict[str, int], db_name: str | None = None, leaders: tuple[str, ...] = (),
                 backends: bool = False) -> dict[str, float]:
    """CPU seconds used so far by each process group in `groups` (name -> pgid), by the PostgreSQL
    backends of `db_name` ("postgres"), by the rest of PostgreSQL (WAL writer, checkpointer, other
    databases: "postgres-other"), and by everything else on the machine ("other").

    `leaders`: groups whose leader (e.g. Celery's parent process) is counted apart from its
    children, as "<name> parent" and "<name> children". `backends`: the database's backends are
    split by the application_name of their connection ("postgres[<name>]", pg_stat_activity).
    Take the difference of two of these with cpu_delta, which goes process by process."""
    out: dict = {name: 0.0 for name in groups if name not in leaders}
    for name in leaders:
        out[f"{name} parent"] = out[f"{name} children"] = 0.0
    out["postgres"] = 0.0
    out["postgres-other"] = 0.0
    labels = pg_backend_labels(db_name) if (backends and db_name) else {}
    for label in sorted(set(labels.values())):
        out[f"postgres[{label}]"] = 0.0
    by_pgid = {pgid: name for name, pgid in groups.items()}
    pids: dict[int, tuple[str, float]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        st = _proc_stat(pid)
        if st is None:
            continue
        comm, pgrp, cpu = st
        if pgrp in by_pgid:
            name = by_pgid[pgrp]
            if name in leaders:
                name += " parent" if int(pid) == pgrp else " children"
        elif comm == "postgres":
            if int(pid) in labels:
                name = f"postgres[{labels[int(pid)]}]"
            elif db_name and f" {db_name} " in _cmdline(pid):
                name = "postgres"
            else:
                name = "postgres-other"
        else:
            continue
        out[name] += cpu
        pids[int(pid)] = (name, cpu)
    # Exited processes (e.g. finished backends) drop out of the sums above; "other" absorbs that.
    out["_machine"] = machine_busy()
    out["other"] = out["_machine"] - sum(v for k, v in out.items() if k != "_machine")
    out["_pids"] = pids
    return out


def children(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc/<pid>/task/*/children)."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(v) for v in f.read().split()]
    except OSError:
        pass
    return out


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of `pid`, in KiB ({} once the process is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line.split(":")[0]] = int(line.split()[1])
    except OSError:
        return {}
    return out


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM of `pid` (writing 5 to clear_refs, Linux >= 4.0; needs the right to)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def wait_for_quiet(max_wait: float, threshold: float = 0.3) -> float:
    """Wait (up to `max_wait` s) until the machine is nearly idle, since other sessions share it.
    Returns the busy fraction of one core measured over the last second."""
    deadline = time.monotonic() + max_wait
    while True:
        b0 = machine_busy()
        time.sleep(1.0)
        busy = machine_busy() - b0
        if busy <= threshold or time.monotonic() >= deadline:
            if busy > threshold:
                log(f"WARNING: the machine is busy with other work ({busy * 100:.0f}% of one core); "
                    f"figures will be lower than on an idle machine")
            return busy
        log(f"machine busy with other work ({busy * 100:.0f}% of one core): waiting")


def cpu_delta(before: dict, after: dict) -> dict:
    """CPU seconds spent between two cpu_by_group() readings, per name. Counted process by process:
    a process that exited in between (a backend whose connection closed) is left to "other",
    and one that started counts from zero."""
    names = [k for k in {**before, **after} if not k.startswith("_")]
    out = {k: 0.0 for k in names}
    old = before["_pids"]
    for pid, (name, cpu) in after["_pids"].items():
        prev = old.get(pid)
        out[name] += cpu - (prev[1] if prev and prev[0] == name else 0.0)
    out["other"] = 0.0
    out["other"] = (after["_machine"] - before["_machine"]) - sum(out.values())
    return out


def format_cpu(delta: dict, wall: float, count: int, what: str = "request") -> str:
    parts = [f"{name} {sec / wall * 100:.0f}% ({sec / max(1, count) * 1000:.2f} ms/{what})"
             for name, sec in delta.items()]
    return "CPU over the timed phase (100% = one core): " + ", ".join(parts)


def cpu_ceiling(delta: dict, count: int) -> tuple[float, float]:
    """(CPU ms per unit spent by this benchmark's own processes and its database, the rate that
    would saturate this machine's cores with that much work per unit). Other sessions' load and
    the rest of PostgreSQL are left out: an estimate for an idle machine, not a measurement."""
    ours = sum(v for k, v in delta.items() if k not in ("other", "postgres-other"))
    per_unit = ours / max(1, count)
    return per_unit * 1000, (os.cpu_count() or 1) / per_unit if per_unit > 0 else float("nan")


# --------------------------------------------------------------------------- wrk client
WRK_LUA = r'''
-- Each thread (one connection) sends its own precomputed, signed, unique requests.
local threads = {}
local next_id = 0
function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

local reqs = {}
local counter = 0
-- Globals, not locals: done() reads them with thread:get().
s202, s200, sother, exhausted, ranout = 0, 0, 0, 0, 0
local fallback = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

function init(args)
  local dir = args[1]
  local f = assert(io.open(dir .. "/req-" .. id .. ".bin", "rb"))
  local data = f:read("*a")
  f:close()
  local pos = 1
  while pos <= #data do
    local nl = data:find("\n", pos, true)
    local len = tonumber(data:sub(pos, nl - 1))
    reqs[#reqs + 1] = data:sub(nl + 1, nl + len)
    pos = nl + len + 1
  end
  marker = dir .. "/done-" .. id
  stopfile = dir .. "/stop"
end

local function finish(ran_out)
  if ran_out and exhausted == 0 then ranout = 1 end
  if exhausted == 0 then
    exhausted = 1
    local m = io.open(marker, "w")
    if m then m:write("done") m:close() end
    wrk.thread:stop()
  end
end

function request()
  counter = counter + 1
  if counter > #reqs then
    finish(true)
    return fallback
  end
  return reqs[counter]
end

function response(status, headers, body)
  if counter > #reqs then return end  -- the answer to the harmless fallback
  if status == 202 then s202 = s202 + 1
  elseif status == 200 then s200 = s200 + 1
  else sother = sother + 1 end
  if counter >= #reqs then
    finish(true)
  else
    -- Duration mode: the benchmark creates this file when the time is up; stopping here, after
    -- a whole answer, leaves no request in flight, so 202 answers and stored rows can be compared.
    local f = io.open(stopfile, "r")
    if f then f:close() finish(false) end
  end
end

function done(summary, latency, requests)
  local a, b, c, e = 0, 0, 0, 0
  for _, t in ipairs(threads) do
    a = a + (t:get("s202") or 0)
    b = b + (t:get("s200") or 0)
    c = c + (t:get("sother") or 0)
    e = e + (t:get("ranout") or 0)
  end
  local er = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "s202": %d, "s200": %d, "sother": %d, "exhausted": %d, ' ..
    '"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d, ' ..
    '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d, "mean_us": %f}\n',
    summary.requests, summary.duration, a, b, c, e, er.connect, er.read, er.write, er.status, er.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
'''


def ensure_wrk(allow_install: bool) -> str | None:
    path = shutil.which("wrk")
    if path or not allow_install or os.geteuid() != 0:
        return path
    log("wrk not found: apt-get install -y wrk")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for attempt in (["apt-get", "install", "-y", "-qq", "wrk"], ["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "wrk"]):
        try:
            subprocess.run(attempt, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return None
        path = shutil.which("wrk")
        if path:
            return path
    return None


def post_with_wrk(wrk: str, port: int, messages: list, clients: int, duration: float | None, workdir: Path,
                  on_start=None, on_end=None) -> dict:
    """Run wrk with one thread per connection; each sends its share of `messages` once.

    Every thread stops after a whole answer, never with a request in flight: when it has sent its
    share, or, with `duration`, once that time is up (a thread that runs out of messages first
    stops early and says so). Then we stop wrk with SIGINT and read its summary.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    for i in range(clients):
        with open(workdir / f"req-{i}.bin", "wb") as f:
            share = messages[i::clients]
            if i == 0 and share:
                # wrk calls request() once on thread 0 to check the script before it starts:
                # that call takes this sacrificial copy, never sent.
                share = [share[0]] + share
            for body, headers in share:
                req = raw_http_request(port, WEBHOOK_PATH, body, headers)
                f.write(f"{len(req)}\n".encode())
                f.write(req)
    script = workdir / "post.lua"
    script.write_text(WRK_LUA)
    argv = [wrk, "-t", str(clients), "-c", str(clients), "-d", "600s", "--timeout", "10s",
            "-s", str(script), f"http://127.0.0.1:{port}{WEBHOOK_PATH}", "--", str(workdir)]
    out_path = workdir / "wrk.out"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        t_start = time.monotonic()
        if on_start:
            on_start(proc)
        stop_file = workdir / "stop"
        while True:
            if proc.poll() is not None:
                raise RuntimeError("wrk exited early:\n" + out_path.read_text(errors="replace")[-2000:])
            now = time.monotonic()
            if duration and now - t_start >= duration and not stop_file.exists():
                stop_file.write_text("stop")
            if all((workdir / f"done-{i}").exists() for i in range(clients)):
                break
            if now - t_start > (duration or 0) + 300:
                raise RuntimeError("wrk did not finish")
            time.sleep(0.005)
        if on_end:
            on_end(proc)
        proc.send_signal(signal.SIGINT)  # wrk then prints its summary as usual
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out_path.read_text(errors="replace")
    line = next((row for row in text.splitlines() if row.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError("wrk printed no summary:\n" + text[-2000:])
    r = json.loads(line.split(" ", 1)[1])
    wall = r["duration_us"] / 1e6
    errors = r["connect"] + r["read"] + r["write"] + r["timeout"] + r["sother"]
    return {"wall": wall, "requests": r["s202"] + r["s200"] + r["sother"], "statuses": {202: r["s202"], 200: r["s200"],
            "other": r["sother"]}, "socket_errors": {k: r[k] for k in ("connect", "read", "write", "timeout")},
            "errors": errors, "p50": r["p50_us"] / 1e6, "p90": r["p90_us"] / 1e6, "p99": r["p99_us"] / 1e6,
            "max": r["max_us"] / 1e6, "exhausted_threads": r["exhausted"], "raw": r}


# --------------------------------------------------------------------------- optional profiling (py-spy)
class Profiler:
    """py-spy on chosen processes during the timed phase (`--profile`); summarised afterwards.

    Sampling costs some CPU of its own: figures of a profiled run are a little lower.
    """

    def __init__(self, outdir: Path, rate: int = 250):
        self.outdir = outdir
        self.rate = rate
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []
        self.exe = shutil.which("py-spy", path=str(BIN)) or shutil.which("py-spy")

    def start(self, name: str, pid: int, subprocesses: bool = False) -> None:
        if not self.exe:
            log("py-spy not installed (.venv/bin/pip install py-spy): no profile")
            return
        out = self.outdir / f"profile-{name}.txt"
        # --gil: only samples that hold the GIL, i.e. Python code running on a CPU. Without it,
        # py-spy here also counts threads blocked in socket waits (psycopg's wait, gunicorn's
        # graceful close) as active, which reads as CPU time that is not.
        argv = [self.exe, "record", "-p", str(pid), "-f", "raw", "-o", str(out), "-r", str(self.rate),
                "--nonblocking", "--gil"]
        if subprocesses:
            argv.append("--subprocesses")
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append((name, proc, out))

    def stop(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for _, proc, _ in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def report(self, top: int = 22) -> str:
        lines = []
        for name, _, out in self.procs:
            lines.append(summarise_profile(name, out, top))
        return "\n".join(lines)


def summarise_profile(name: str, path: Path, top: int = 22) -> str:
    from collections import Counter

    total = 0
    own: Counter = Counter()
    inclusive: Counter = Counter()
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"[{name}] no profile written"
    for line in text.splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        # py-spy marks threads/processes in the first frame; skip idle loops of the process
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    if not total:
        return f"[{name}] no samples"
    out = [f"[{name}] {total} samples holding the GIL: where the Python CPU time goes (self %)"]
    out += [f"  {n / total * 100:5.1f}%  {f[:140]}" for f, n in own.most_common(top)]
    out.append(f"[{name}] inclusive %, application and library entry points")
    interesting = [(f, n) for f, n in inclusive.most_common(400)
                   if any(k in f for k in ("intake/", "ticketing/", "config/", "celery/app/trace", "kombu/",
                                           "django/db/models/query.py", "django/db/transaction",
                                           "django/db/backends/utils.py", "django/core/handlers",
                                           "logging/__init__", "psycopg/", "redis/"))]
    out += [f"  {n / total * 100:5.1f}%  {f[:140]}" for f, n in interesting[:top]]
    return "\n".join(out)


def add_common_arguments(parser, profile_help: str) -> None:
    """The options both benchmarks take."""
    parser.add_argument("--preload", type=int, default=10000, help="completed events of history loaded first")
    parser.add_argument("--log-level", default="INFO", help="the app's LOG_LEVEL (default INFO, the app default)")
    parser.add_argument("--quiet-wait", type=float, default=15,
                        help="wait up to this long for other work on the machine to stop before timing (default 15)")
    parser.add_argument("--profile", action="store_true", help=profile_help)
    parser.add_argument("--keep", action="store_true", help="keep the database and the logs")

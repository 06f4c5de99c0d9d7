"""The processes of the stack a benchmark starts (gunicorn, `manage.py`), and what a run needs
around them: the broker, free ports, temporary folders, signals, the options every script takes."""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .report import log

REPO = Path(__file__).resolve().parent.parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"
if not PYTHON.exists():  # e.g. a venv elsewhere: use the interpreter running us
    PYTHON = Path(sys.executable)
BIN = PYTHON.parent
BROKER_URL = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/14")


def flush_broker() -> None:
    import redis  # celery[redis] brings it

    redis.Redis.from_url(BROKER_URL).flushdb()


def with_app_name(env: dict, name: str) -> dict:
    """`env` whose DATABASE_URL names the connection (`application_name`), so that the bench can
    tell PostgreSQL backends apart by the process they serve (pg_stat_activity)."""
    return dict(env, DATABASE_URL=env["DATABASE_URL"] + f"?application_name={name}")


def manage(env: dict, *args: str, timeout: float = 120) -> str:
    proc = subprocess.run(
        [str(PYTHON), "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)[:60]} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


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
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        logfile.close()
        self.procs.append((name, proc))
        return proc

    def pid(self, name: str) -> int:
        """The pid (and process group id) of the process started as `name`."""
        return next(proc.pid for n, proc in self.procs if n == name)

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {proc.returncode}; see {self.tmp / (name + '.log')}:\n" + self.tail(name)
                )

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


def start_gunicorn(
    stack: Stack,
    env: dict,
    workers: int,
    port: int,
    app: str = "config.wsgi",
    name: str = "gunicorn",
    worker_class: str = "sync",
    threads: int = 1,
    extra: tuple[str, ...] = (),
) -> None:
    """gunicorn on 127.0.0.1:`port`; the framework floor (bench/floor_app) passes its own `app` and
    `extra` (its --pythonpath) and otherwise gets exactly the same settings as the app."""
    argv = [
        str(BIN / "gunicorn"),
        app,
        "--workers",
        str(workers),
        "--worker-class",
        worker_class,
        "--bind",
        f"127.0.0.1:{port}",
        "--no-control-socket",
        "--log-level",
        "warning",
        *extra,
    ]
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


def add_common_arguments(parser, profile_help: str) -> None:
    """The options both benchmarks take."""
    parser.add_argument("--preload", type=int, default=10000, help="completed events of history loaded first")
    parser.add_argument("--log-level", default="INFO", help="the app's LOG_LEVEL (default INFO, the app default)")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=15,
        help="wait up to this long for other work on the machine to stop before timing (default 15)",
    )
    parser.add_argument("--profile", action="store_true", help=profile_help)
    parser.add_argument("--keep", action="store_true", help="keep the database and the logs")

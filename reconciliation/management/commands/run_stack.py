"""Run web, worker(s), beat and the outbox relay (and the LMTP listener when MAILROOM_LMTP_PORT is set) in the
foreground, and keep them running; Ctrl-C stops them all. With MAILROOM_DESTINATION_QUEUE set (the default on
PostgreSQL) a second worker, `--pool threads`, makes the external destination calls (ticketing.bulkhead).

A development tool (`make run`, which sets MAILROOM_ENV=development: plain HTTP on 127.0.0.1); the children
inherit this process's environment, with PORT and HOST set to where the web listens.

- Supervision: a child other than the web that exits is started again after a backoff (1 s, doubling up to
  60 s, back to 1 s once it has stayed up STABLE_SECONDS), each restart a line on the console. The web's own
  exit, Ctrl-C or SIGTERM stops everything.
- Logs: each child's output goes to `<var>/log/<child>.log` (the web's access log, ACCESS_LOG_FORMAT without
  static files, in web.log); the console shows the children's WARNING and above, and our own lines.
- The banner comes last: once the web answers /healthz and every worker consumes (its ready file, config.celery).
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from config.celery import READY_FILE_VAR
from intake.logging import ACCESS_LOG_FORMAT
from reconciliation.services import DEMO_PASSWORD_VAR

FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 60.0
STABLE_SECONDS = 60.0  # up this long, a child's next restart waits FIRST_BACKOFF_SECONDS again
STOP_SECONDS = 15.0  # then SIGKILL
READY_SECONDS = 90.0  # the banner waits this long for the web and the workers
# A log line's level: Django's plain format, gunicorn's "[date] [pid] [LEVEL]", LOG_FORMAT=json.
_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
_LOUD = {"WARNING", "ERROR", "CRITICAL"}


class Child:
    """One supervised process: its command, its log file, its restarts."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict, say, ready_file: Path | None = None):
        self.name, self.argv, self.say = name, argv, say
        # A worker writes `ready_file` once it consumes (config.celery); the others are ready when started.
        self.ready_file = ready_file
        self.env = {**env, READY_FILE_VAR: str(ready_file)} if ready_file else env
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0
        self.restarts = 0
        self.backoff = FIRST_BACKOFF_SECONDS
        self.restart_at: float | None = None
        self.reaped = True
        self._log_lock = threading.Lock()
        self._readers: list[threading.Thread] = []

    def start(self) -> None:
        if self.ready_file:
            self.ready_file.unlink(missing_ok=True)
        self._log = self.log_path.open("a", buffering=1, errors="replace")
        self._log.write(f"--- run_stack: {self.name} started {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n")
        # Its own process group: Ctrl-C reaches only us, and we stop the children in order.
        self.process = subprocess.Popen(
            self.argv,
            cwd=settings.BASE_DIR,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.started_at = time.monotonic()
        self.restart_at = None
        self.reaped = False
        self._readers = [
            threading.Thread(target=self._read, args=(stream, echo), daemon=True)
            for stream, echo in ((self.process.stdout, self.name != "web"), (self.process.stderr, True))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, echo: bool) -> None:
        """Every line to the log file; WARNING and above (and tracebacks) to the console too. A line without a
        level continues the one before (a traceback, a multi-line message); the web's stdout is its access log."""
        loud = False
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._log_lock:
                if not self._log.closed:  # closed by reap() when a straggler kept the pipe open past its wait
                    self._log.write(line + "\n")
            level = _LEVEL.search(line[:80])
            if level:
                loud = level.group(1) in _LOUD
            elif line.startswith("Traceback (most recent call last)"):
                loud = True
            if echo and loud:
                self.say(f"{self.name}: {line}")
        stream.close()

    def reap(self) -> None:
        """After an exit: whatever it left in its group goes, its output is drained, its log closed."""
        self.kill_group(signal.SIGKILL)
        for reader in self._readers:
            reader.join(timeout=5)
        self._log.close()
        self.reaped = True

    def kill_group(self, sig) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> bool:
        return self.running() and (self.ready_file is None or self.ready_file.exists())


def exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with {code}"


class Command(BaseCommand):
    help = (
        "Start web (gunicorn), a Celery worker (and a thread-pool one for destination calls when "
        "MAILROOM_DESTINATION_QUEUE is set), beat, the relay and, when MAILROOM_LMTP_PORT is set, the LMTP "
        "listener; restart any but the web when it dies; stop all of them on Ctrl-C."
    )

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--web-workers", type=int, default=2)
        parser.add_argument("--worker-concurrency", type=int, default=2)

    def _commands(self, options):
        python = sys.executable
        bin_dir = os.path.dirname(python)
        celery = [python, "-m", "celery", "-A", "config"]
        return {
            "web": [
                os.path.join(bin_dir, "gunicorn"),
                "config.wsgi",
                "--bind",
                f"{options['host']}:{options['port']}",
                "--workers",
                str(options["web_workers"]),
                "--access-logfile",
                "-",
                "--access-logformat",
                ACCESS_LOG_FORMAT,
                "--logger-class",
                "intake.logging.AccessLogger",
                "--no-control-socket",
            ],
            **self._worker_commands(celery, options),
            "beat": celery + ["beat", "--loglevel", "INFO", "--scheduler", settings.CELERY_BEAT_SCHEDULER],
            "relay": [python, "manage.py", "run_relay"],
            **self._lmtp_command(python),
        }

    def _worker_commands(self, celery, options):
        """Prefork for the CPU stages; with MAILROOM_DESTINATION_QUEUE set, a thread-pool worker for the
        external destination calls (I/O: ticketing.bulkhead). Without it one worker does everything."""
        worker = celery + ["worker", "--loglevel", "INFO", "--concurrency", str(options["worker_concurrency"])]
        queue = settings.MAILROOM_DESTINATION_QUEUE
        if not queue:
            return {"worker": worker}
        return {
            "worker": worker + ["-Q", settings.CELERY_TASK_DEFAULT_QUEUE, "-n", "worker@%h"],
            "calls": celery
            + [
                "worker",
                "--loglevel",
                "INFO",
                "--pool",
                "threads",
                "--concurrency",
                str(settings.MAILROOM_DESTINATION_THREADS),
                "-Q",
                queue,
                "-n",
                "calls@%h",
            ],
        }

    def _lmtp_command(self, python):
        """The LMTP listener (manage.py run_lmtp), only when MAILROOM_LMTP_PORT is set."""
        port = os.environ.get("MAILROOM_LMTP_PORT", "").strip()
        if not port:
            return {}
        host = os.environ.get("MAILROOM_LMTP_HOST", "").strip() or "127.0.0.1"
        return {"lmtp": [python, "manage.py", "run_lmtp", "--host", host, "--port", port]}

    def _say(self, text: str) -> None:
        with self._console_lock:
            self.stdout.write(text)
            self.stdout.flush()

    def _banner(self, options, log_dir: Path, waiting: list[str]) -> None:
        host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(options["host"], options["host"])
        base = f"http://{host}:{options['port']}"
        password = os.environ.get(DEMO_PASSWORD_VAR, "(see .env)")
        shown_dir = log_dir.relative_to(settings.BASE_DIR) if log_dir.is_relative_to(settings.BASE_DIR) else log_dir
        lines = [
            self.style.SUCCESS("\nMailroom is ready\n"),
            f"  admin:     {base}/admin/",
            "  user:      admin",
            f"  password:  {password}",
            f"  API docs:  {base}/api/docs/   (a token: .venv/bin/python manage.py api_token admin)",
            f"  database:  {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}"
            f"   broker: {settings.CELERY_BROKER_URL.split('://')[0]}",
            f"  logs:      {shown_dir}/<process>.log (this console: their warnings and errors, restarts)",
        ]
        if os.environ.get("MAILROOM_LMTP_PORT", "").strip():
            lmtp_host = os.environ.get("MAILROOM_LMTP_HOST", "").strip() or "127.0.0.1"
            lines.append(f"  lmtp:      {lmtp_host}:{os.environ['MAILROOM_LMTP_PORT'].strip()} (manage.py run_lmtp)")
        if waiting:
            lines.append(self.style.WARNING(f"  not ready yet: {', '.join(waiting)} (see its log)"))
        lines += [
            "\n  send a signed sample email to the webhook:",
            f"    PORT={options['port']} .venv/bin/python manage.py send_test_email demo",
            "\n  Ctrl-C stops everything.\n",
        ]
        self._say("\n".join(lines))

    def _wait_until_ready(self, options, children: dict, stopping: list) -> list[str]:
        """Until the web answers /healthz and each worker consumes; returns what is still waited for."""
        url = (
            f"http://{options['host'] if options['host'] not in ('0.0.0.0', '::') else '127.0.0.1'}:"
            f"{options['port']}/healthz"
        )
        web_up = False
        deadline = time.monotonic() + READY_SECONDS
        workers = [child for child in children.values() if child.ready_file]
        while time.monotonic() < deadline and not stopping and children["web"].running():
            if not web_up:
                try:
                    with urllib.request.urlopen(url, timeout=1):
                        web_up = True
                except OSError:
                    pass
            if web_up and all(child.ready() for child in workers):
                return []
            time.sleep(0.2)
        return ([] if web_up else ["web"]) + [child.name for child in workers if not child.ready()]

    def _supervise(self, children: dict, stopping: list) -> None:
        """Restart whatever dies, with backoff; return when the web died or we were told to stop."""
        while not stopping:
            now = time.monotonic()
            for name, child in children.items():
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        child.restarts += 1
                        child.start()
                        self._say(f"{name}: restarted (restart {child.restarts}, pid {child.process.pid})")
                    continue
                if child.running():
                    continue
                child.reap()
                uptime = now - child.started_at
                if name == "web":
                    self._say(f"web {exit_text(child.process.returncode)}; stopping the rest")
                    stopping.append(True)
                    return
                if uptime >= STABLE_SECONDS:
                    child.backoff = FIRST_BACKOFF_SECONDS
                delay, child.backoff = child.backoff, min(child.backoff * 2, MAX_BACKOFF_SECONDS)
                child.restart_at = now + delay
                self._say(
                    f"{name}: {exit_text(child.process.returncode)} after {uptime:.0f} s; restarting in "
                    f"{delay:.0f} s (see {child.log_path})"
                )
            time.sleep(0.25)

    def _stop(self, children: dict) -> None:
        running = [child for child in children.values() if child.running()]
        for child in running:
            child.process.terminate()  # the parent shuts its own children down (Celery: warm shutdown)
        deadline = time.monotonic() + STOP_SECONDS
        for child in running:
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill_group(signal.SIGKILL)
                child.process.wait()
        for child in children.values():
            if not child.reaped:
                child.reap()

    def handle(self, *args, **options):
        self._console_lock = threading.Lock()
        log_dir = Path(settings.VAR_DIR) / "log"
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PORT": str(options["port"]), "HOST": options["host"], "PYTHONUNBUFFERED": "1"}
        stopping: list = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopping.append(True))
        run_dir = Path(settings.VAR_DIR) / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        children = {
            name: Child(
                name,
                argv,
                log_dir,
                env,
                self._say,
                ready_file=run_dir / f"{name}.ready" if name in ("worker", "calls") else None,
            )
            for name, argv in self._commands(options).items()
        }
        self._say(f"starting {', '.join(children)} (logs in {log_dir}) ...")
        try:
            for child in children.values():
                child.start()
            waiting = self._wait_until_ready(options, children, stopping)
            if not stopping and children["web"].running():
                self._banner(options, log_dir, waiting)
            self._supervise(children, stopping)
        finally:
            self._say("stopping ...")
            self._stop(children)
        self._say("stopped")

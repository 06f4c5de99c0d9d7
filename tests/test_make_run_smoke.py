"""`make run` from a fresh copy of the repository, on the embedded default (SQLite + the embedded SQLite broker).

What a newcomer does: `make run`, wait for the banner, paste the printed send
command, see the ticket; Ctrl-C stops everything. The copy reuses this
checkout's virtualenv through a `.venv` symlink, and make is told that the
install stamp is up to date (`-o .venv/.installed`), so nothing is installed
and nothing is written into the real venv or the source tree.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.live import REPO_ROOT, descendants, free_port, is_running, kill_group

pytestmark = pytest.mark.live

# Variables that would switch the copy away from its embedded default, or leak this process's state into it.
STRIPPED_PREFIXES = ("MAILROOM_", "CELERY_", "MAKE")
STRIPPED = {"DATABASE_URL", "DJANGO_SETTINGS_MODULE", "PORT", "HOST", "MFLAGS", "VIRTUAL_ENV", "SECRET_KEY",
            "ALLOWED_HOSTS", "DEBUG"}


def project_files() -> list[str]:
    """Tracked files plus new, not ignored ones (work not yet committed), as they are in the working tree."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                         check=True, capture_output=True).stdout.decode()
    return sorted({name for name in out.split("\0") if name and (REPO_ROOT / name).is_file()})


def copy_project(target):
    for name in project_files():
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, destination)
    # The venv this suite runs in (make test's $(VENV)): the copy's `.venv` points at it.
    assert sys.prefix != sys.base_prefix, "the suite must run inside the project's virtualenv"
    (target / ".venv").symlink_to(Path(sys.prefix).resolve(), target_is_directory=True)


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in STRIPPED and not k.startswith(STRIPPED_PREFIXES)}


class Output:
    """Drains a process's stdout in a thread (the web's access log shares it: a full pipe would block it)."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        for line in stream:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def tail(self, n: int = 60) -> str:
        with self._lock:
            return "\n".join(self.lines[-n:])


class TreeWatcher:
    """Remembers every process ever seen below `root` (pid -> (starttime, cmdline)), for checks and cleanup."""

    def __init__(self, root: int):
        self.root = root
        self.seen: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        while not self._stop.wait(0.25):
            self.seen.update(descendants(self.root))

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5)

    def kill_all(self):
        self.stop()
        for pid, (start, _) in list(self.seen.items()):
            if is_running(pid, start):
                kill_group(pid)  # the stack's children lead their own process groups
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def wait_until(predicate, timeout: float, what: str, output: Output, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"{what} not within {timeout:.0f} s; make run printed:\n{output.tail()}")


def shell_json(cwd, env, code: str) -> dict:
    result = subprocess.run([".venv/bin/python", "manage.py", "shell", "-c", code], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


STATE_CODE = (
    "import json; from intake.models import InboxEvent; from ticketing.models import Ticket, TicketMapping; "
    "print(json.dumps({'tickets': list(Ticket.objects.values_list('subject', flat=True)), "
    "'mappings': TicketMapping.objects.count(), "
    "'events': list(InboxEvent.objects.values_list('state', flat=True))}))"
)


def roles(tree: dict) -> dict:
    """Which of the stack's processes a process tree holds: role -> pids."""
    found = {"web": [], "worker": [], "beat": [], "relay": []}
    for pid, (_, cmdline) in tree.items():
        if "gunicorn" in cmdline and "config.wsgi" in cmdline:
            found["web"].append(pid)
        elif "celery" in cmdline and " worker" in cmdline:
            found["worker"].append(pid)
        elif "celery" in cmdline and " beat" in cmdline:
            found["beat"].append(pid)
        elif "run_relay" in cmdline:
            found["relay"].append(pid)
    return found


def test_make_run_serves_the_demo_and_stops_on_ctrl_c(tmp_path):
    workdir = tmp_path / "mailroom"
    copy_project(workdir)
    env = clean_env()
    port = free_port()
    make = ["make", "run", f"PORT={port}", "-o", ".venv/.installed"]

    # Guard: the copy's make must not (re)install into the shared venv.
    dry = subprocess.run(make + ["-n"], cwd=workdir, env=env, capture_output=True, text=True, timeout=30)
    assert dry.returncode == 0, dry.stderr
    assert "pip" not in dry.stdout and "venv" not in dry.stdout.replace(".venv/bin/", ""), dry.stdout

    process = subprocess.Popen(make, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    output = Output(process.stdout)
    watcher = TreeWatcher(process.pid)
    try:
        # The banner, with the command to paste.
        command = wait_until(
            lambda: next((line.strip() for line in output.lines if "manage.py send_test_email" in line), None),
            timeout=90, what="the banner", output=output)
        assert command.startswith(f"PORT={port} "), command
        banner = output.text()
        assert f"http://127.0.0.1:{port}/admin/" in banner
        assert re.search(r"database:\s+sqlite3\s+broker:\s+sqlite", banner), banner
        username = re.search(r"user:\s+(\S+)", banner).group(1)
        password = re.search(r"password:\s+(\S+)", banner).group(1)

        base = f"http://127.0.0.1:{port}"

        def web_up():
            try:
                return requests.get(f"{base}/readyz", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_until(web_up, timeout=30, what="GET /readyz answering 200", output=output)

        # Paste the printed command, as a user would.
        sent = subprocess.run(command, shell=True, cwd=workdir, env=env, capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stdout + sent.stderr
        assert sent.stdout.startswith("202 "), sent.stdout
        sent_at = time.monotonic()

        state = wait_until(lambda: (s := shell_json(workdir, env, STATE_CODE))["mappings"] == 1 and s,
                           timeout=20, what="the ticket", output=output, interval=0.5)
        assert state == {"tickets": ["Sample request from Mailroom"], "mappings": 1, "events": ["completed"]}
        ticket_seconds = time.monotonic() - sent_at

        # The printed credentials open the admin, which lists the ticket.
        with requests.Session() as session:
            login_page = session.get(f"{base}/admin/login/", timeout=10)
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page.text).group(1)
            logged_in = session.post(f"{base}/admin/login/?next=/admin/", timeout=10, headers={"Referer": base},
                                     data={"username": username, "password": password,
                                           "csrfmiddlewaretoken": token, "next": "/admin/"})
            assert logged_in.url.rstrip("/").endswith("/admin"), logged_in.url
            tickets_page = session.get(f"{base}/admin/ticketing/ticket/", timeout=10)
            assert tickets_page.status_code == 200 and "Sample request from Mailroom" in tickets_page.text

        # Every part of the stack is up, and nothing exited on its own.
        stack = descendants(process.pid)
        found = roles(stack)
        assert all(found.values()), (found, stack)
        assert process.poll() is None and "exited with" not in output.text(), output.tail()

        # Idle, the stack says nothing at INFO: beat sends a due task every 2 s and the relay and
        # the sweeps run, but a routine tick is not a line of its own.
        before = len(output.lines)
        time.sleep(7)
        idle_lines = output.lines[before:]
        assert not [line for line in idle_lines if re.search(r"\bINFO\b", line)], "\n".join(idle_lines)

        # Ctrl-C: SIGINT to make's process group, as a terminal does.
        stopping_at = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        wait_until(lambda: not any(is_running(pid, start) for pid, (start, _) in stack.items())
                   and process.poll() is not None,
                   timeout=20, what="every process of the stack exiting after Ctrl-C", output=output, interval=0.1)
        stop_seconds = time.monotonic() - stopping_at
        assert any(line.strip() == "stopped" for line in output.text().splitlines()[-5:]), output.tail()
        # Stopped by run_stack's orderly shutdown, not by its SIGKILL fallback 15 s later.
        assert stop_seconds < 14, output.tail()
        print(f"ticket after {ticket_seconds:.1f} s; stack stopped {stop_seconds:.1f} s after SIGINT; "
              f"processes: { {role: len(pids) for role, pids in found.items()} }")
    finally:
        watcher.kill_all()
        if process.poll() is None:
            kill_group(process.pid)
            process.wait(timeout=10)

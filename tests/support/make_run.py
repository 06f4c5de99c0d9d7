"""`make run` from a fresh copy of the repository: the copy, a clean environment, output and process watchers."""

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

from tests.live import REPO_ROOT, descendants, free_port, is_running, kill_group

# Variables that would switch the copy away from its embedded default, or leak this process's state into it.
STRIPPED_PREFIXES = ("MAILROOM_", "CELERY_", "MAKE")
STRIPPED = {
    "DATABASE_URL",
    "DJANGO_SETTINGS_MODULE",
    "PORT",
    "HOST",
    "MFLAGS",
    "VIRTUAL_ENV",
    "SECRET_KEY",
    "ALLOWED_HOSTS",
    "DEBUG",
}


def project_files() -> list[str]:
    """Tracked files plus new, not ignored ones (work not yet committed), as they are in the working tree."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
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
    result = subprocess.run(
        [".venv/bin/python", "manage.py", "shell", "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture
def running_stack(tmp_path):
    import subprocess

    workdir = tmp_path / "mailroom"
    copy_project(workdir)
    port = free_port()
    process = subprocess.Popen(
        ["make", "run", f"PORT={port}", "-o", ".venv/.installed"],
        cwd=workdir,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output = Output(process.stdout)
    watcher = TreeWatcher(process.pid)
    try:
        wait_until(lambda: "Mailroom is ready" in output.text(), timeout=120, what="the ready banner", output=output)
        yield port, output
    finally:
        watcher.kill_all()
        if process.poll() is None:
            kill_group(process.pid)
            process.wait(timeout=10)


def banner_value(output: Output, label: str) -> str:
    banner = output.text().split("Mailroom is ready", 1)[1]
    return re.search(rf"{label}:\s+(\S+)", banner).group(1)

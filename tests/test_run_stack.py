"""run_stack supervises its children, on the embedded default (SQLite + the embedded broker in a temporary folder).

Real processes: migrate and bootstrap_demo, then `manage.py run_stack` in its own session. A SIGKILLed worker
comes back (with a longer wait the second time) while the web keeps serving, and the next message still gets
its ticket; a killed web stops everything. The console carries the banner and run_stack's own lines, not the
children's start-up chatter, which is in <var>/log/<child>.log.
"""

import os
import re
import signal
import subprocess
import time

import pytest
import requests

from tests.live import PYTHON, REPO_ROOT, descendants, free_port, is_running, kill_group
from tests.support.make_run import Output, clean_env, shell_json, wait_until

pytestmark = pytest.mark.live

STATE_CODE = (
    "import json; from intake.models import InboxEvent; "
    "print(json.dumps({'states': list(InboxEvent.objects.values_list('state', flat=True))}))"
)


def children(root: int) -> dict:
    """run_stack's direct children by role: role -> pid."""
    found = {}
    for pid, (_, cmdline) in descendants(root).items():
        try:
            with open(f"/proc/{pid}/stat") as handle:
                raw = handle.read()
        except OSError:
            continue
        if int(raw[raw.rindex(")") + 2 :].split()[1]) != root:
            continue
        for role, needle in (("web", "gunicorn"), ("worker", " worker"), ("beat", " beat"), ("relay", "run_relay")):
            if needle in cmdline:
                found[role] = pid
    return found


@pytest.fixture
def embedded(tmp_path):
    env = {
        **clean_env(),
        "MAILROOM_ENV": "development",
        "MAILROOM_VAR_DIR": str(tmp_path / "var"),
        "MAILROOM_ENV_FILE": str(tmp_path / ".env"),
        "PORT": str(free_port()),
        "PYTHONUNBUFFERED": "1",
    }
    (tmp_path / "var").mkdir()  # as `make run` does
    for command in (["migrate", "--noinput", "-v0"], ["bootstrap_demo"]):
        result = subprocess.run(
            [PYTHON, "manage.py", *command], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180
        )
        assert result.returncode == 0, result.stdout + result.stderr
    return env


def send(env) -> str:
    result = subprocess.run(
        [PYTHON, "manage.py", "send_test_email", "demo"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def kill_tree(process, seen: dict) -> None:
    """Whatever of run_stack's tree still runs after a test: each child's group, then run_stack's."""
    for pid, (start, _) in seen.items():
        if is_running(pid, start):
            kill_group(pid)
    if process.poll() is None:
        kill_group(process.pid)
        process.wait(timeout=10)


def test_a_dead_worker_is_restarted_and_a_dead_web_stops_everything(embedded, tmp_path):
    env = embedded
    base = f"http://127.0.0.1:{env['PORT']}"
    process = subprocess.Popen(
        [PYTHON, "manage.py", "run_stack", "--web-workers", "1", "--worker-concurrency", "1"],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output = Output(process.stdout)
    seen: dict = {}
    try:
        wait_until(lambda: "Mailroom is ready" in output.text(), timeout=120, what="the banner", output=output)
        # The banner comes once the web serves and the worker is ready.
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
        log_dir = tmp_path / "var" / "log"
        assert re.search(r"celery@\S+ ready\.", (log_dir / "worker.log").read_text()), output.text()
        banner = output.text()
        for expected in (
            f"{base}/admin/",
            f"{base}/api/docs/",
            "Ctrl-C stops everything",
            f"PORT={env['PORT']} .venv/bin/python manage.py send_test_email demo",
        ):
            assert expected in banner, banner
        # Start-up chatter is in the logs, not on the console.
        assert "Booting worker" in (log_dir / "web.log").read_text() and "Booting worker" not in banner
        assert "[tasks]" in (log_dir / "worker.log").read_text() and "[tasks]" not in banner
        assert not [line for line in output.lines if re.search(r"\bINFO\b", line)], banner

        stack = children(process.pid)
        assert set(stack) == {"web", "worker", "beat", "relay"}, stack
        seen.update(descendants(process.pid))

        # SIGKILL the worker: it comes back, the web serves all along.
        os.kill(stack["worker"], signal.SIGKILL)
        wait_until(
            lambda: "worker: was killed by SIGKILL" in output.text() and "worker: restarted" in output.text(),
            timeout=30,
            what="the worker's restart",
            output=output,
        )
        assert re.search(r"worker: was killed by SIGKILL after \d+ s; restarting in 1 s", output.text()), output.text()
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
        new_worker = wait_until(
            lambda: (
                children(process.pid).get("worker") not in (None, stack["worker"]) and children(process.pid)["worker"]
            ),
            timeout=30,
            what="a new worker",
            output=output,
        )
        seen.update(descendants(process.pid))

        # Again at once: the wait doubles.
        wait_until(
            lambda: len(re.findall(r"celery@\S+ ready\.", (log_dir / "worker.log").read_text())) >= 2,
            timeout=60,
            what="the new worker ready",
            output=output,
        )
        os.kill(new_worker, signal.SIGKILL)
        wait_until(
            lambda: output.text().count("worker: restarted") >= 2, timeout=30, what="the second restart", output=output
        )
        assert re.search(r"worker: was killed by SIGKILL after \d+ s; restarting in 2 s", output.text()), output.text()
        wait_until(
            lambda: len(re.findall(r"celery@\S+ ready\.", (log_dir / "worker.log").read_text())) >= 3,
            timeout=60,
            what="the third worker ready",
            output=output,
        )

        # The restarted stack still turns mail into tickets.
        assert send(env).startswith("202 ")
        wait_until(
            lambda: shell_json(REPO_ROOT, env, STATE_CODE)["states"] == ["completed"],
            timeout=60,
            what="the event completed",
            output=output,
            interval=0.5,
        )
        assert process.poll() is None

        # The web's death stops everything.
        seen.update(descendants(process.pid))
        os.kill(children(process.pid)["web"], signal.SIGKILL)
        wait_until(lambda: process.poll() is not None, timeout=40, what="run_stack exiting", output=output)
        assert "web was killed by SIGKILL; stopping the rest" in output.text(), output.text()
        assert output.lines[-1].strip() == "stopped", output.tail()
        time.sleep(1)
        assert not [pid for pid, (start, _) in seen.items() if is_running(pid, start)], seen
    finally:
        kill_tree(process, seen)


def test_sigterm_stops_everything_and_bootstrap_keeps_the_password(embedded, tmp_path):
    env = embedded
    env_file = tmp_path / ".env"
    password = re.search(r"^MAILROOM_DEMO_ADMIN_PASSWORD=(\S+)$", env_file.read_text(), re.M).group(1)
    hash_code = (
        "import json; from django.contrib.auth.models import User; "
        "print(json.dumps({'hash': User.objects.get(username='admin').password}))"
    )
    before = shell_json(REPO_ROOT, env, hash_code)["hash"]
    again = subprocess.run(
        [PYTHON, "manage.py", "bootstrap_demo"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0 and "password unchanged" in again.stdout, again.stdout + again.stderr
    # The same hash: sessions (whose auth hash derives from it) stay valid; the password is the one in .env.
    assert shell_json(REPO_ROOT, env, hash_code)["hash"] == before
    assert env_file.read_text().count("MAILROOM_DEMO_ADMIN_PASSWORD=") == 1

    # At LOG_LEVEL=WARNING the worker logs no "ready." line: the banner still waits for it (its ready file).
    process = subprocess.Popen(
        [PYTHON, "manage.py", "run_stack", "--web-workers", "1", "--worker-concurrency", "1"],
        cwd=REPO_ROOT,
        env={**env, "LOG_LEVEL": "WARNING"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output = Output(process.stdout)
    seen: dict = {}
    try:
        wait_until(lambda: "Mailroom is ready" in output.text(), timeout=120, what="the banner", output=output)
        assert "not ready yet" not in output.text() and (tmp_path / "var" / "run" / "worker.ready").exists()
        assert re.search(rf"password:\s+{re.escape(password)}\b", output.text()), output.text()
        seen.update(descendants(process.pid))
        assert len(children(process.pid)) == 4
        process.send_signal(signal.SIGTERM)
        wait_until(lambda: process.poll() is not None, timeout=30, what="run_stack exiting", output=output)
        assert output.lines[-1].strip() == "stopped" and "restarting in" not in output.text(), output.tail()
        time.sleep(1)
        assert not [pid for pid, (start, _) in seen.items() if is_running(pid, start)], seen
    finally:
        kill_tree(process, seen)


def test_the_web_run_stack_starts_leaves_static_files_out_of_its_access_log(tmp_path):
    from reconciliation.management.commands.run_stack import Command
    from tests.live import subprocess_env

    port = free_port()
    web = Command()._commands({"host": "127.0.0.1", "port": port, "web_workers": 1, "worker_concurrency": 1})["web"]
    access_log = tmp_path / "web-stdout.log"
    with access_log.open("wb") as out:
        process = subprocess.Popen(
            web,
            cwd=REPO_ROOT,
            env=subprocess_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(f"{base}/healthz?token=q-s3cr3t", timeout=2, headers={"X-Request-ID": "req-access-1"})
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.2)
        for path in ("/static/admin/css/base.css", "/favicon.ico", "/static/nothing-here.js"):
            requests.get(base + path, timeout=5)
        requests.get(f"{base}/readyz", timeout=10, headers={"X-Request-ID": "req-access-2"})
        wait_for = time.monotonic() + 10
        while "req-access-2" not in access_log.read_text() and time.monotonic() < wait_for:
            time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=20)
        kill_group(process.pid)
    lines = access_log.read_text().splitlines()
    assert [line for line in lines if "req-access-1" in line] and [line for line in lines if "req-access-2" in line]
    assert any('"GET /healthz HTTP/1.1" 200' in line for line in lines), lines
    assert not [line for line in lines if "/static/" in line or "favicon" in line or "s3cr3t" in line], lines


@pytest.mark.parametrize(
    "variables, expected",
    [
        ({"PORT": "9123"}, "http://127.0.0.1:9123"),
        ({"PORT": "9123", "HOST": "0.0.0.0"}, "http://127.0.0.1:9123"),
        ({"HOST": "::1"}, "http://[::1]:8000"),
        ({"PORT": "9123", "MAILROOM_PUBLIC_URL": "https://mailroom.example.com/"}, "https://mailroom.example.com"),
    ],
)
def test_the_public_url_follows_where_make_run_serves_unless_set(variables, expected):
    env = {
        **clean_env(),
        "MAILROOM_ENV": "development",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "MAILROOM_ENV_FILE": os.devnull,
        **variables,
    }
    result = subprocess.run(
        [PYTHON, "-c", "from django.conf import settings; print(settings.MAILROOM_PUBLIC_URL)"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected

"""`make run` from a fresh copy of the repository, on the embedded default (SQLite + the embedded SQLite broker).

What a newcomer does: `make run`, wait for the banner, paste the printed send
command, see the ticket; Ctrl-C stops everything. The copy reuses this
checkout's virtualenv through a `.venv` symlink, and make is told that the
install stamp is up to date (`-o .venv/.installed`), so nothing is installed
and nothing is written into the real venv or the source tree.
"""

import os
import re
import signal
import subprocess
import time

import pytest
import requests

from tests.live import descendants, free_port, is_running, kill_group
from tests.support.make_run import Output, TreeWatcher, clean_env, copy_project, shell_json, wait_until

pytestmark = pytest.mark.live


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

    process = subprocess.Popen(
        make,
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output = Output(process.stdout)
    watcher = TreeWatcher(process.pid)
    try:
        # The banner, with the command to paste.
        command = wait_until(
            lambda: next((line.strip() for line in output.lines if "manage.py send_test_email" in line), None),
            timeout=90,
            what="the banner",
            output=output,
        )
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

        state = wait_until(
            lambda: (s := shell_json(workdir, env, STATE_CODE))["mappings"] == 1 and s,
            timeout=20,
            what="the ticket",
            output=output,
            interval=0.5,
        )
        assert state == {"tickets": ["Sample request from Mailroom"], "mappings": 1, "events": ["completed"]}
        ticket_seconds = time.monotonic() - sent_at

        # The printed credentials open the admin, which lists the ticket.
        with requests.Session() as session:
            login_page = session.get(f"{base}/admin/login/", timeout=10)
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page.text).group(1)
            logged_in = session.post(
                f"{base}/admin/login/?next=/admin/",
                timeout=10,
                headers={"Referer": base},
                data={"username": username, "password": password, "csrfmiddlewaretoken": token, "next": "/admin/"},
            )
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
        wait_until(
            lambda: not any(is_running(pid, start) for pid, (start, _) in stack.items()) and process.poll() is not None,
            timeout=20,
            what="every process of the stack exiting after Ctrl-C",
            output=output,
            interval=0.1,
        )
        stop_seconds = time.monotonic() - stopping_at
        assert any(line.strip() == "stopped" for line in output.text().splitlines()[-5:]), output.tail()
        # Stopped by run_stack's orderly shutdown, not by its SIGKILL fallback 15 s later.
        assert stop_seconds < 14, output.tail()
        print(
            f"ticket after {ticket_seconds:.1f} s; stack stopped {stop_seconds:.1f} s after SIGINT; "
            f"processes: { {role: len(pids) for role, pids in found.items()} }"
        )
    finally:
        watcher.kill_all()
        if process.poll() is None:
            kill_group(process.pid)
            process.wait(timeout=10)

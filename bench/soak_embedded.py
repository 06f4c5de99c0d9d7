"""Soak the embedded default: `make run`'s stack (SQLite + the embedded broker) for --minutes N under light,
steady use, then figures against goals.

    .venv/bin/python bench/soak_embedded.py                     # 60 minutes
    .venv/bin/python bench/soak_embedded.py --minutes 10
    .venv/bin/python bench/soak_embedded.py --seconds 90 --drill-every 0    # a short run (tests/test_soak_embedded.py)

As `make run` does, in a temporary folder (MAILROOM_VAR_DIR, MAILROOM_ENV_FILE; a free PORT): migrate,
collectstatic, bootstrap_demo, then `manage.py run_stack`. While it runs, a client posts a signed sample
message to the demo mailbox's raw webhook every --post-every seconds (2), opens the recovery queue and the
dashboard as the logged-in admin every --pages-every seconds (30, expect 200), and runs `manage.py drill`
every --drill-every seconds (600; 0: never). At the end it waits for the posted messages to settle, stops the
stack as Ctrl-C does and prints:

- process exits and restarts of the stack's children (run_stack's console lines; goal 0);
- ERROR/CRITICAL lines in the children's logs (<var>/log/*.log) until the stop (goal 0);
- messages posted vs completed vs in the recovery queue with a reason (goal: every one accounted for);
- admin pages answered 200 / opened, drills passed / run; memory of the stack's processes, first and last.

The last line is the summary as JSON. Exits 1 only when a posted message is unaccounted for (a guarantee).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from intake.signing import signed_headers  # noqa: E402
from lib.report import log  # noqa: E402
from lib.stack import PYTHON, free_port  # noqa: E402

QUEUE_PATH = "/admin/reconciliation/recoveryitem/"
DASHBOARD_PATH = "/admin/reconciliation/recoveryitem/dashboard/"
QUEUE_STATES = {"awaiting_review", "quarantined", "failed", "unknown"}
_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
_EXIT = re.compile(r"^(\w+): (was killed by \S+|exited with -?\d+) after")
# Variables that would move the stack off its embedded default or leak this process's state into it.
STRIPPED = {
    "DATABASE_URL",
    "DJANGO_SETTINGS_MODULE",
    "PORT",
    "HOST",
    "SECRET_KEY",
    "ALLOWED_HOSTS",
    "DEBUG",
    "VIRTUAL_ENV",
}
STRIPPED_PREFIXES = ("MAILROOM_", "CELERY_", "MAKE")

SETTLED_CODE = """
import json
from intake.models import InboxEvent
ids = json.loads(open({path!r}).read())
rows = InboxEvent.objects.filter(id__in=ids).values_list("id", "state", "reason_code")
print(json.dumps([list(r) for r in rows]))
"""


def stack_env(tmp: Path, port: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in STRIPPED and not k.startswith(STRIPPED_PREFIXES)}
    env.update(
        {
            "MAILROOM_ENV": "development",
            "MAILROOM_VAR_DIR": str(tmp / "var"),
            "MAILROOM_ENV_FILE": str(tmp / ".env"),
            "PORT": str(port),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def manage(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(PYTHON), "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def read_env_file(path: Path) -> dict:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def sample(n: int) -> bytes:
    message = EmailMessage()
    # A customer each: one sender's 21st message in 10 minutes goes to review (sender_rate_limited).
    message["From"] = f"A Customer <customer-{n}@example.com>"
    message["To"] = "support@demo.mailroom.test"
    message["Subject"] = f"Soak request {n}"
    message["Date"] = format_datetime(datetime.now(UTC))
    message["Message-ID"] = f"<soak-{uuid.uuid4()}@sample.mailroom.test>"
    message.set_content(f"Hello,\n\nsoak message {n}: the printer is on fire again.\n\nThanks\n")
    return message.as_bytes()


class Console:
    """run_stack's console output, drained by a thread (a full pipe would block it) and kept."""

    def __init__(self, stream, path: Path):
        self.lines: list[str] = []
        self._file = path.open("w")
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        for line in stream:
            self.lines.append(line.rstrip("\n"))
            self._file.write(line)
            self._file.flush()

    def text(self) -> str:
        return "\n".join(self.lines)


def stack_pids(root: int) -> list[int]:
    """Every process below `root` (from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                raw = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents.setdefault(int(raw[raw.rindex(")") + 2 :].split()[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def log_lines(log_dir: Path, levels: tuple[str, ...]) -> list[str]:
    """The children's log lines at these levels, each prefixed with its file's name."""
    found = []
    for path in sorted(log_dir.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            level = _LEVEL.search(line[:80])
            if level and level.group(1) in levels:
                found.append(f"{path.name}: {line}")
    return found


def warning_kinds(lines: list[str]) -> Counter:
    """WARNING lines by file and logger (Django's plain format: date time LEVEL logger message)."""
    kinds: Counter = Counter()
    for line in lines:
        name, _, rest = line.partition(": ")
        parts = rest.split()
        kinds[f"{name} {parts[3] if len(parts) > 3 else '?'}"] += 1
    return kinds


def login(base: str, username: str, password: str) -> requests.Session:
    session = requests.Session()
    page = session.get(f"{base}/admin/login/", timeout=10)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    done = session.post(
        f"{base}/admin/login/?next=/admin/",
        timeout=10,
        headers={"Referer": base},
        data={"username": username, "password": password, "csrfmiddlewaretoken": token, "next": "/admin/"},
    )
    if not done.url.rstrip("/").endswith("/admin"):
        raise RuntimeError(f"admin login failed: {done.status_code} {done.url}")
    return session


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=60)
    length.add_argument("--seconds", type=float, help="the length in seconds instead (short runs, tests)")
    parser.add_argument("--post-every", type=float, default=2.0)
    parser.add_argument("--pages-every", type=float, default=30.0)
    parser.add_argument("--drill-every", type=float, default=600.0, help="seconds between drills (0: none)")
    parser.add_argument("--settle", type=float, default=90.0, help="seconds to wait for the last messages")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder and print where")
    args = parser.parse_args()
    duration = args.seconds if args.seconds is not None else args.minutes * 60

    tmp = Path(tempfile.mkdtemp(prefix="mailroom-soak-"))
    port = free_port()
    env = stack_env(tmp, port)
    base = f"http://127.0.0.1:{port}"
    log_dir = tmp / "var" / "log"
    log(f"soak of the embedded default for {duration:.0f} s in {tmp}, port {port}")
    (tmp / "var").mkdir()  # as `make run` does
    for step in (["migrate", "--noinput", "-v0"], ["collectstatic", "--noinput", "-v0"], ["bootstrap_demo"]):
        done = manage(env, *step)
        if done.returncode:
            raise SystemExit(f"{' '.join(step)} failed:\n{done.stdout}{done.stderr}")
    stack = subprocess.Popen(
        [str(PYTHON), "manage.py", "run_stack"],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    console = Console(stack.stdout, tmp / "console.log")
    posted: list[int] = []
    statuses: dict[str, int] = {}
    pages = {"opened": 0, "ok": 0, "failures": []}
    drills = {"run": 0, "passed": 0, "failures": []}
    figures: dict = {}
    try:
        deadline = time.monotonic() + 180
        while "Mailroom is ready" not in console.text():
            if stack.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("run_stack did not become ready:\n" + console.text()[-3000:])
            time.sleep(0.2)
        secrets = read_env_file(tmp / ".env")
        session = login(base, "admin", secrets["MAILROOM_DEMO_ADMIN_PASSWORD"])
        rss_first = rss_mb(stack_pids(stack.pid))
        log(f"ready; the stack's processes hold {rss_first:.0f} MB")

        started = time.monotonic()
        next_post = next_pages = started
        next_drill = started + args.drill_every if args.drill_every else float("inf")
        drill: subprocess.Popen | None = None
        n = 0
        while time.monotonic() - started < duration or drill is not None:
            now = time.monotonic()
            if stack.poll() is not None:
                log(f"run_stack exited with {stack.returncode}")
                break
            if now >= next_post and now - started < duration:
                next_post += args.post_every
                n += 1
                body = sample(n)
                try:
                    answer = requests.post(
                        f"{base}/webhooks/raw/demo/",
                        data=body,
                        timeout=30,
                        headers={
                            **signed_headers(secrets["MAILROOM_DEMO_WEBHOOK_SECRET"], body),
                            "Content-Type": "message/rfc822",
                        },
                    )
                    statuses[str(answer.status_code)] = statuses.get(str(answer.status_code), 0) + 1
                    if answer.status_code == 202:
                        posted.append(answer.json()["inbox_event_id"])
                except requests.RequestException as exc:
                    statuses[type(exc).__name__] = statuses.get(type(exc).__name__, 0) + 1
            if now >= next_pages and now - started < duration:
                next_pages += args.pages_every
                for path in (QUEUE_PATH, DASHBOARD_PATH):
                    pages["opened"] += 1
                    try:
                        answer = session.get(base + path, timeout=60)
                        if answer.status_code == 200 and "login" not in answer.url:
                            pages["ok"] += 1
                        else:
                            pages["failures"].append(f"{path}: {answer.status_code} {answer.url}")
                    except requests.RequestException as exc:
                        pages["failures"].append(f"{path}: {type(exc).__name__}")
            if drill is None and now >= next_drill and now - started < duration:
                next_drill += args.drill_every
                drill_log = (tmp / f"drill-{drills['run'] + 1}.log").open("w")
                drill = subprocess.Popen(
                    [str(PYTHON), "manage.py", "drill"],
                    cwd=REPO,
                    env=env,
                    stdout=drill_log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
                drill_log.close()
                drills["run"] += 1
            if drill is not None and drill.poll() is not None:
                if drill.returncode == 0:
                    drills["passed"] += 1
                else:
                    drills["failures"].append(
                        f"drill {drills['run']}: exit {drill.returncode} "
                        f"(see {tmp / ('drill-' + str(drills['run']) + '.log')})"
                    )
                drill = None
            time.sleep(0.05)
        rss_last = rss_mb(stack_pids(stack.pid))
        ran_for = time.monotonic() - started

        # Settle: every posted message completed, suppressed or in the recovery queue.
        ids_path = tmp / "posted.json"
        ids_path.write_text(json.dumps(posted))
        settle_deadline = time.monotonic() + args.settle
        while True:
            done = manage(env, "shell", "-c", SETTLED_CODE.format(path=str(ids_path)), timeout=120)
            rows = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else []
            open_rows = [r for r in rows if r[1] != "completed" and r[1] != "suppressed" and r[1] not in QUEUE_STATES]
            if (len(rows) == len(posted) and not open_rows) or time.monotonic() > settle_deadline:
                break
            time.sleep(2)
        errors = log_lines(log_dir, ("ERROR", "CRITICAL"))  # before the stop, which makes lines of its own
        warnings = log_lines(log_dir, ("WARNING",))
    finally:
        if stack.poll() is None:
            stack.send_signal(signal.SIGINT)  # as Ctrl-C
            try:
                stack.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(stack.pid, signal.SIGKILL)
                stack.wait()
    time.sleep(0.5)
    text = console.text()
    exits = [line for line in console.lines if _EXIT.match(line) or "stopping the rest" in line]
    restarts = [line for line in console.lines if re.match(r"^\w+: restarted", line)]
    completed = sum(1 for r in rows if r[1] == "completed")
    suppressed = sum(1 for r in rows if r[1] == "suppressed")
    queued = sum(1 for r in rows if r[1] in QUEUE_STATES and r[2])
    reasons = Counter(f"{r[1]}/{r[2]}" for r in rows if r[1] in QUEUE_STATES)
    unaccounted = len(posted) - completed - suppressed - queued
    stopped = bool(text.strip()) and text.strip().splitlines()[-1].strip() == "stopped"
    figures = {
        "seconds": round(ran_for),
        "exits": len(exits),
        "restarts": len(restarts),
        "errors": len(errors),
        "warnings": len(warnings),
        "posts": sum(statuses.values()),
        "statuses": statuses,
        "posted": len(posted),
        "completed": completed,
        "suppressed": suppressed,
        "queued_with_reason": queued,
        "unaccounted": unaccounted,
        "pages_opened": pages["opened"],
        "pages_ok": pages["ok"],
        "drills_run": drills["run"],
        "drills_passed": drills["passed"],
        "stopped_cleanly": stopped,
        "rss_first_mb": round(rss_first),
        "rss_last_mb": round(rss_last),
    }

    def goal(ok: bool) -> str:
        return "MET" if ok else "MISSED"

    print(f"\nsoak of the embedded default, {ran_for / 60:.1f} minutes:")
    print(
        f"  process exits            {len(exits):>6}   restarts {len(restarts)}   goal 0   "
        f"{goal(not exits and not restarts)}"
    )
    for line in exits[:5]:
        print(f"    {line}")
    print(f"  ERROR/CRITICAL log lines {len(errors):>6}   goal 0   {goal(not errors)}")
    for line in errors[:8]:
        print(f"    {line[:220]}")
    print(
        f"  WARNING log lines        {len(warnings):>6}   (not a goal; by file and logger: "
        f"{dict(warning_kinds(warnings).most_common(6))})"
    )
    for line in warnings[-3:]:
        print(f"    {line[:220]}")
    print(f"  messages posted          {len(posted):>6}   (answers {statuses})")
    print(f"    completed              {completed:>6}")
    print(f"    suppressed             {suppressed:>6}")
    print(f"    in the queue, reasoned {queued:>6}   {dict(reasons) if reasons else ''}")
    print(f"    unaccounted            {unaccounted:>6}   goal 0   {goal(unaccounted == 0)}")
    print(
        f"  admin pages 200          {pages['ok']:>6} of {pages['opened']}   goal all   "
        f"{goal(pages['ok'] == pages['opened'])}"
    )
    for line in pages["failures"][:4]:
        print(f"    {line}")
    print(
        f"  drills passed            {drills['passed']:>6} of {drills['run']}   goal all   "
        f"{goal(drills['passed'] == drills['run'])}"
    )
    for line in drills["failures"][:4]:
        print(f"    {line}")
    print(f"  stack memory             {rss_first:>6.0f} MB at the start, {rss_last:.0f} MB at the end")
    print(f"  stopped on Ctrl-C        {'yes' if stopped else 'NO'}")
    print(json.dumps(figures))
    if args.keep:
        print(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if unaccounted else 0


if __name__ == "__main__":
    sys.exit(main())

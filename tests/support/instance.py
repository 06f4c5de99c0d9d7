"""The embedded default on a real SQLite file: an instance in a directory, its environment, commands and gunicorn."""

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

from intake.signing import signed_headers
from tests.live import REPO_ROOT, LiveProcess, free_port

PYTHON = sys.executable
GUNICORN = str(Path(sys.executable).with_name("gunicorn"))
MANAGE = str(REPO_ROOT / "manage.py")
SECRET = "sqlite-parity-webhook-secret"
PASSWORD = "sqlite-parity-admin-password"
ERROR_LINE = re.compile(r"\bERROR\b|\[ERROR\]|\bCRITICAL\b|Traceback \(most recent call last\)")

# Variables that would switch the instance away from its embedded default, or leak the suite's into it.
STRIPPED_PREFIXES = ("MAILROOM_", "CELERY_", "DJANGO_")
STRIPPED = {"DATABASE_URL", "SECRET_KEY", "ALLOWED_HOSTS", "DEBUG", "EMAIL_URL", "LOG_FORMAT", "LOG_LEVEL", "PORT"}


class Instance:
    """The SQLite instance: its directory, environment, web server and the output of everything it ran."""

    def __init__(self, root: Path):
        self.root = root
        self.env = {k: v for k, v in os.environ.items() if k not in STRIPPED and not k.startswith(STRIPPED_PREFIXES)}
        self.env.update(
            {
                "DATABASE_URL": f"sqlite:///{root / 'db.sqlite3'}",
                "MAILROOM_ENV": "development",
                "MAILROOM_VAR_DIR": str(root / "var"),
                "MAILROOM_ENV_FILE": str(root / ".env"),
                "SECRET_KEY": f"sqlite-parity-{uuid.uuid4().hex}{uuid.uuid4().hex}",
                "MAILROOM_DEMO_WEBHOOK_SECRET": SECRET,
                "MAILROOM_DEMO_ADMIN_PASSWORD": PASSWORD,
                "MAILROOM_PLATFORM_SECRET_REFS": "env:MAILROOM_DEMO_WEBHOOK_SECRET=mailbox:demo",
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.web: LiveProcess | None = None
        self.url = ""
        self.token = ""
        self.ids: dict[str, int] = {}
        self.processed: dict = {}

    def manage(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PYTHON, MANAGE, *args], cwd=REPO_ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def manage_ok(self, *args: str, timeout: float = 300) -> str:
        """Run a command; it must exit 0 and log nothing at ERROR. Its stdout."""
        result = self.manage(*args, timeout=timeout)
        assert result.returncode == 0, f"{args[0]}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
        assert_no_error_lines(result.stdout + result.stderr, f"manage.py {args[0]}")
        return result.stdout

    def start_web(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.web = LiveProcess(
            "web",
            [GUNICORN, "config.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "1", "--access-logfile", "-"],
            self.env,
            REPO_ROOT,
            self.root / "web.log",
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.web.alive(), self.web.tail()
            try:
                if requests.get(f"{self.url}/healthz", timeout=5).status_code == 200:
                    return
            except requests.RequestException:  # refused, or a first answer slower than the timeout
                pass
            time.sleep(0.2)
        pytest.fail(f"gunicorn did not answer /healthz within 30 s:\n{self.web.tail()}")

    def web_log(self) -> str:
        return self.web.log_path.read_text(errors="replace") if self.web else ""

    def api(self) -> requests.Session:
        session = requests.Session()
        session.headers["Authorization"] = f"Token {self.token}"
        return session

    def post_mail(self, raw: bytes, secret: str = SECRET) -> requests.Response:
        return requests.post(
            f"{self.url}/webhooks/raw/demo/",
            data=raw,
            timeout=10,
            headers={**signed_headers(secret, raw), "Content-Type": "message/rfc822"},
        )

    def console(self) -> requests.Session:
        """A browser's session, logged in through the login form as the demo's admin."""
        session = requests.Session()
        session.get(f"{self.url}/admin/login/", timeout=10).raise_for_status()
        response = session.post(
            f"{self.url}/admin/login/?next=/admin/",
            timeout=10,
            allow_redirects=False,
            data={
                "username": "admin",
                "password": PASSWORD,
                "csrfmiddlewaretoken": session.cookies["csrftoken"],
                "next": "/admin/",
            },
        )
        assert response.status_code == 302 and response.headers["Location"] == "/admin/", response.text[:500]
        return session


def assert_no_error_lines(text: str, what: str) -> None:
    errors = [line for line in text.splitlines() if ERROR_LINE.search(line)]
    assert not errors, f"{what} logged errors:\n" + "\n".join(errors[:20]) + f"\n---\n{text[-3000:]}"

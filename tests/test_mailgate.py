"""`mailroom-mailgate` (intake.channels.mailgate): the exit status an MTA acts on, for each answer the webhook gives.

Each test runs the program as a real subprocess with the message on stdin, against a real server on
127.0.0.1: Mailroom itself (pytest-django's `live_server`, the raw webhook in this process's
database), or a small HTTP server that answers a fixed status, stalls, or is not there at all.
"""

import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from intake.models import InboxEvent
from tests.conftest import WEBHOOK_SECRET
from tests.factories import email_message
from tests.services import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
CONSOLE_SCRIPT = Path(sys.executable).parent / "mailroom-mailgate"
EX_OK, EX_DATAERR, EX_NOUSER, EX_TEMPFAIL = 0, 65, 67, 75


def mailgate(
    *args: str, stdin: bytes, env: dict | None = None, console_script: bool = False, timeout: float = 60
) -> subprocess.CompletedProcess:
    command = [str(CONSOLE_SCRIPT)] if console_script else [sys.executable, "-m", "intake.channels.mailgate"]
    environment = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MAILROOM_MAILGATE_SECRET", "DJANGO_SETTINGS_MODULE", "DATABASE_URL")
    }
    environment.update(env or {})
    return subprocess.run(
        [*command, *args], input=stdin, capture_output=True, cwd=REPO_ROOT, env=environment, timeout=timeout
    )


def stderr_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1, done.stderr.decode()  # one line: what the MTA logs
    return lines[0]


@pytest.fixture
def secret_file(tmp_path) -> str:
    path = tmp_path / "mailgate.secret"
    path.write_text(WEBHOOK_SECRET + "\n")
    return str(path)


class AnsweringServer:
    """An HTTP server on 127.0.0.1 that answers every POST with one status; counts the requests."""

    def __init__(self, status: int, body: bytes = b'{"error": "try later"}', content_type="application/json"):
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                server.requests += 1
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def answering_server():
    servers = []

    def start(status: int, **kwargs) -> AnsweringServer:
        servers.append(AnsweringServer(status, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def stalling_server():
    """Accepts connections and never answers."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held, stop = [], threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(timeout=5)
    for connection in held:
        connection.close()
    listener.close()


# --- against Mailroom ------------------------------------------------------------------------------


def test_delivered_once_and_a_second_delivery_is_a_duplicate(mailbox, live_server, secret_file):
    raw = email_message(subject="Printer on fire", sender="jane.doe@example.com")
    args = ("--url", live_server.url, "--mailbox", "support", "--secret-file", secret_file)

    first = mailgate(*args, stdin=raw, console_script=True)  # the installed entry point
    assert first.returncode == EX_OK, first.stderr
    [event] = InboxEvent.objects.all()
    assert bytes(event.raw) == raw and event.source == "raw"
    line = stderr_line(first)
    assert f"stored as event {event.pk}" in line
    for private in ("jane.doe@example.com", "Printer on fire", WEBHOOK_SECRET):
        assert private not in line

    again = mailgate(*args, stdin=raw)
    assert again.returncode == EX_OK, again.stderr
    assert f"already stored as event {event.pk}" in stderr_line(again)
    assert InboxEvent.objects.count() == 1


def test_the_mailgate_signs_with_v2(secret_file):
    # What the MTA host sends, as the server reads it: a v2 signature (v1 is deprecated).
    seen = {}

    class Recorder(BaseHTTPRequestHandler):
        def do_POST(self):
            seen["body"] = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen["headers"] = dict(self.headers)
            answer = b'{"inbox_event_id": 1, "duplicate": false}'
            self.send_response(202)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        raw = email_message()
        done = mailgate(
            "--url",
            f"http://127.0.0.1:{httpd.server_address[1]}",
            "--mailbox",
            "support",
            "--secret-file",
            secret_file,
            stdin=raw,
        )
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert done.returncode == EX_OK, done.stderr
    from intake import signing

    headers = seen["headers"]
    assert headers["X-Mailroom-Signature"].startswith("v2=") and seen["body"] == raw
    assert (
        signing.verify(WEBHOOK_SECRET, headers["X-Mailroom-Timestamp"], headers["X-Mailroom-Signature"], raw, 300)
        == signing.V2
    )


def test_full_webhook_url_and_the_secret_from_the_environment(mailbox, live_server):
    done = mailgate(
        "--url",
        f"{live_server.url}/webhooks/raw/support/",
        "--mailbox",
        "support",
        stdin=email_message(),
        env={"MAILROOM_MAILGATE_SECRET": WEBHOOK_SECRET},
    )
    assert done.returncode == EX_OK, done.stderr
    assert InboxEvent.objects.count() == 1


def test_unknown_mailbox_is_67(mailbox, live_server, secret_file):
    done = mailgate(
        "--url", live_server.url, "--mailbox", "no-such-box", "--secret-file", secret_file, stdin=email_message()
    )
    assert done.returncode == EX_NOUSER, done.stderr
    assert "unknown mailbox" in stderr_line(done)
    assert InboxEvent.objects.count() == 0


def test_too_large_for_the_server_is_65(mailbox, live_server, secret_file, settings):
    settings.MAILROOM_MAX_MESSAGE_BYTES = 4096
    raw = email_message(body="x" * 8000 + "\n")
    done = mailgate("--url", live_server.url, "--mailbox", "support", "--secret-file", secret_file, stdin=raw)
    assert done.returncode == EX_DATAERR, done.stderr
    assert "413" in stderr_line(done)
    assert InboxEvent.objects.count() == 0


def test_wrong_secret_defers_and_stores_nothing(mailbox, live_server, tmp_path):
    wrong = tmp_path / "wrong.secret"
    wrong.write_text("not-the-secret\n")
    done = mailgate(
        "--url", live_server.url, "--mailbox", "support", "--secret-file", str(wrong), stdin=email_message()
    )
    # Our misconfiguration, not the sender's fault: the MTA keeps the message until the secret is fixed.
    assert done.returncode == EX_TEMPFAIL, done.stderr
    assert "check the secret" in stderr_line(done) and "not-the-secret" not in stderr_line(done)
    assert InboxEvent.objects.count() == 0


# --- refused before posting ------------------------------------------------------------------------


def test_larger_than_max_bytes_is_65_without_posting(answering_server, secret_file):
    server = answering_server(202, body=b'{"inbox_event_id": 1, "duplicate": false}')
    raw = email_message(body="x" * 3000 + "\n")
    done = mailgate(
        "--url", server.url, "--mailbox", "support", "--secret-file", secret_file, "--max-bytes", "2000", stdin=raw
    )
    assert done.returncode == EX_DATAERR, done.stderr
    assert "--max-bytes" in stderr_line(done)
    assert server.requests == 0


def test_empty_message_is_65_without_posting(answering_server, secret_file):
    server = answering_server(202)
    done = mailgate("--url", server.url, "--mailbox", "support", "--secret-file", secret_file, stdin=b"")
    assert done.returncode == EX_DATAERR
    assert server.requests == 0


@pytest.mark.parametrize(
    "args",
    [
        ("--mailbox", "support"),  # no --url
        ("--url", "mailroom.example.com", "--mailbox", "support"),  # no scheme
        ("--url", "http://127.0.0.1:9", "--mailbox", "../admin"),  # not a slug
        ("--url", "http://127.0.0.1:9", "--mailbox", "support", "--timeout", "0"),
    ],
)
def test_bad_arguments_defer_instead_of_bouncing(args, answering_server, secret_file):
    done = mailgate(*args, "--secret-file", secret_file, stdin=email_message())
    assert done.returncode == EX_TEMPFAIL  # argparse's own 2 would make the MTA bounce the message
    assert "message deferred" in stderr_line(done)


def test_missing_secret_defers_without_posting(answering_server, tmp_path):
    server = answering_server(202)
    no_file = mailgate(
        "--url", server.url, "--mailbox", "support", "--secret-file", str(tmp_path / "absent"), stdin=email_message()
    )
    assert no_file.returncode == EX_TEMPFAIL and "secret file" in stderr_line(no_file)
    no_secret = mailgate("--url", server.url, "--mailbox", "support", stdin=email_message())
    assert no_secret.returncode == EX_TEMPFAIL and "no secret" in stderr_line(no_secret)
    assert server.requests == 0


# --- the webhook down, failing or slow --------------------------------------------------------------


def test_webhook_down_is_75(secret_file):
    done = mailgate(
        "--url",
        f"http://127.0.0.1:{free_port()}",
        "--mailbox",
        "support",
        "--secret-file",
        secret_file,
        stdin=email_message(),
    )
    assert done.returncode == EX_TEMPFAIL
    assert "cannot reach" in stderr_line(done)


@pytest.mark.parametrize("status", [500, 502, 503, 429, 408])
def test_server_errors_and_throttling_are_75(status, answering_server, secret_file):
    server = answering_server(status)
    done = mailgate("--url", server.url, "--mailbox", "support", "--secret-file", secret_file, stdin=email_message())
    assert done.returncode == EX_TEMPFAIL
    assert f"({status})" in stderr_line(done)
    assert server.requests == 1


def test_a_404_that_is_not_the_webhooks_is_a_wrong_url_and_defers(answering_server, secret_file):
    server = answering_server(404, body=b"<h1>Not Found</h1>", content_type="text/html")
    done = mailgate("--url", server.url, "--mailbox", "support", "--secret-file", secret_file, stdin=email_message())
    assert done.returncode == EX_TEMPFAIL  # never "unknown user" for a mistyped URL
    assert "fix --url" in stderr_line(done)


@pytest.mark.parametrize(
    "status, body, content_type, code",
    [
        (
            400,
            b'{"error": "empty body: expected an RFC 5322 message"}',
            "application/json",
            EX_DATAERR,
        ),  # the webhook's
        (400, b"<h1>Bad Request</h1>", "text/html", EX_TEMPFAIL),  # something else at that URL: not the sender's fault
        (403, b'{"detail": "forbidden"}', "application/json", EX_TEMPFAIL),  # a proxy or the secret: ours to fix
    ],
)
def test_other_refusals(status, body, content_type, code, answering_server, secret_file):
    server = answering_server(status, body=body, content_type=content_type)
    done = mailgate("--url", server.url, "--mailbox", "support", "--secret-file", secret_file, stdin=email_message())
    assert done.returncode == code, stderr_line(done)


def test_redirect_is_not_followed_and_defers(answering_server, secret_file):
    server = answering_server(301, body=b"")
    done = mailgate("--url", server.url, "--mailbox", "support", "--secret-file", secret_file, stdin=email_message())
    assert done.returncode == EX_TEMPFAIL
    assert "redirected" in stderr_line(done) and server.requests == 1


def test_stall_past_the_timeout_is_75(stalling_server, secret_file):
    started = time.monotonic()
    done = mailgate(
        "--url",
        stalling_server,
        "--mailbox",
        "support",
        "--secret-file",
        secret_file,
        "--timeout",
        "1",
        stdin=email_message(),
        timeout=30,
    )
    took = time.monotonic() - started
    assert done.returncode == EX_TEMPFAIL
    assert "no answer within 1 s" in stderr_line(done)
    assert took < 15, took


# --- runs on the MTA host --------------------------------------------------------------------------


def test_imports_no_django():
    probe = (
        "import sys, intake.channels.mailgate, requests; "
        "print(sorted(m for m in sys.modules if m == 'django' or m.startswith('django.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        cwd=REPO_ROOT,
        timeout=30,
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == "[]"

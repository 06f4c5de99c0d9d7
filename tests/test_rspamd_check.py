"""The optional rspamd check (MAILROOM_RSPAMD_URL): its score decides the acknowledgment like a header's,
and an rspamd that is down, slow or talking nonsense never holds a message back.

The stand-in is a real HTTP server on 127.0.0.1 that answers POST /checkv2 as rspamd's protocol documents
(the raw message as the body; a JSON object with score, required_score, action, is_skipped, symbols).
"""

import json
import socket
import threading
import time
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from intake import spamcheck
from intake.models import AuditEvent, InboxEvent
from tests.factories import make_event
from ticketing.services import process_inbox_event

TRUSTED = "mx1.acme.test"


class FakeRspamd:
    def __init__(self):
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        self.reply = (
            200,
            {
                "is_skipped": False,
                "score": 9.3,
                "required_score": 15.0,
                "action": "add header",
                "symbols": {"BAYES_SPAM": {"name": "BAYES_SPAM", "score": 5.1, "metric_score": 5.1}},
                "messages": {},
                "message-id": "a1@example.com",
                "time_real": 0.012,
            },
        )
        self.delay = 0.0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                owner.paths.append(self.path)
                owner.bodies.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                time.sleep(owner.delay)
                status, body = owner.reply
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (the timeout test)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)


@pytest.fixture
def rspamd(settings):
    fake = FakeRspamd()
    fake.thread.start()
    settings.MAILROOM_RSPAMD_URL = fake.url
    settings.MAILROOM_RSPAMD_TIMEOUT = 0.5
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()


@pytest.fixture
def box(mailbox, settings):
    settings.MAILROOM_CLAMD = "off"
    mailbox.settings = {"trusted_authserv_id": TRUSTED}
    mailbox.save()
    return mailbox


def message(headers=None) -> bytes:
    msg = EmailMessage()
    msg["From"] = "Jane Doe <jane@example.com>"
    msg["To"] = "support@acme.test"
    msg["Subject"] = "Scanner"
    msg["Message-ID"] = "<a1@example.com>"
    msg["Authentication-Results"] = f"{TRUSTED}; dmarc=pass (p=none dis=none) header.from=example.com"
    for name, value in (headers or {}).items():
        msg[name] = value
    msg.set_content("The scanner in bay 2 drops the Wi-Fi.\n")
    return msg.as_bytes()


def run(mailbox, raw: bytes) -> InboxEvent:
    event = make_event(mailbox, raw)
    process_inbox_event(event.pk)
    return InboxEvent.objects.get(pk=event.pk)


def skip_reasons(event) -> list:
    return [row.detail["reason"] for row in AuditEvent.objects.filter(inbox_event=event, kind="acknowledgment_skipped")]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_rspamds_score_is_stored_and_skips_the_acknowledgment(box, rspamd):
    raw = message()
    event = run(box, raw)
    assert rspamd.paths == ["/checkv2"] and rspamd.bodies == [raw]
    assert event.state == "completed"
    assert event.details["spam_score"] == {
        "score": 9.3,
        "source": "rspamd",
        "threshold": 5.0,
        "action": "add header",
        "required_score": 15.0,
    }
    assert skip_reasons(event) == ["spam_score"]


def test_a_higher_header_score_wins_over_rspamds(box, rspamd):
    rspamd.reply = (200, {"is_skipped": False, "score": 1.2, "required_score": 15.0, "action": "no action"})
    event = run(box, message({"X-Spam-Score": "6.5"}))
    assert event.details["spam_score"]["source"] == "X-Spam-Score"
    assert skip_reasons(event) == ["spam_score"]


def test_a_low_score_from_rspamd_leaves_the_acknowledgment_alone(box, rspamd):
    rspamd.reply = (200, {"is_skipped": False, "score": -0.4, "required_score": 15.0, "action": "no action"})
    event = run(box, message())
    assert event.details["spam_score"]["score"] == -0.4 and skip_reasons(event) == []


def test_suppressed_mail_is_not_sent_to_rspamd(box, rspamd):
    event = run(box, message({"Auto-Submitted": "auto-replied"}))
    assert event.state == "suppressed" and rspamd.bodies == []


@pytest.mark.parametrize(
    "reply",
    [
        (500, {"error": "overloaded"}),
        (200, b"<html>proxy error</html>"),
        (200, {"action": "no action"}),
        (200, {"score": "high"}),
        (200, {"is_skipped": True, "score": 0, "action": "no action"}),
    ],
)
def test_an_erroring_or_skipping_rspamd_means_no_remote_score_and_the_message_goes_on(box, rspamd, reply):
    rspamd.reply = reply
    event = run(box, message())
    assert event.state == "completed" and "spam_score" not in event.details
    assert skip_reasons(event) == []


def test_a_slow_rspamd_is_given_up_after_the_timeout(box, rspamd):
    rspamd.delay = 2.0
    started = time.monotonic()
    event = run(box, message())
    assert time.monotonic() - started < 1.9
    assert event.state == "completed" and "spam_score" not in event.details


def test_an_unreachable_rspamd_never_fails_the_pipeline(box, settings, caplog):
    settings.MAILROOM_RSPAMD_URL = f"http://127.0.0.1:{closed_port()}"
    event = run(box, message())
    assert event.state == "completed" and skip_reasons(event) == []
    assert "rspamd unavailable (ConnectionError)" in caplog.text


def test_the_check_is_off_unless_the_platform_names_a_url():
    assert spamcheck.rspamd_from_setting("") is None
    assert spamcheck.rspamd_from_setting("off") is None
    assert spamcheck.rspamd_from_setting("http://127.0.0.1:11333/").url == "http://127.0.0.1:11333/checkv2"
    assert spamcheck.rspamd_from_setting("http://rspamd:11333/checkv2").url == "http://rspamd:11333/checkv2"

"""A stub OpenAI-compatible chat-completions server on 127.0.0.1 (a free port), for the AI proposer's tests.

    def test_x(fake_chat, settings):      # settings.MAILROOM_AI_BASE_URL already points at it
        fake_chat.answer_json({"queue": "billing", ...})   # or .answer_content("not json"), .status(500), .stall(2)

Every request is recorded (`fake_chat.requests`: the parsed JSON bodies, `fake_chat.headers`).
The fixture is a pytest plugin fixture: import it into the test module (`from tests.fake_chat import fake_chat`).
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class FakeChat:
    def __init__(self):
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self._reply = (200, "{}")  # (status, message content) or ("stall", seconds)
        self._stop = threading.Event()
        handler = type("Handler", (_Handler,), {"chat": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    # --- what the next requests get
    def answer_content(self, content: str, status: int = 200):
        self._reply = (status, content)

    def answer_json(self, answer: dict):
        self.answer_content(json.dumps(answer))

    def status(self, code: int):
        self._reply = (code, None)

    def stall(self, seconds: float):
        self._reply = ("stall", seconds)

    # --- lifecycle
    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    chat: FakeChat

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"_unparsed": raw.decode("utf-8", "replace")}
        self.chat.requests.append({"path": self.path, **body})
        self.chat.headers.append(dict(self.headers))
        kind, value = self.chat._reply
        if kind == "stall":
            self.chat._stop.wait(value)
            kind, value = (
                200,
                json.dumps({"queue": "", "priority": "low", "request_type": "", "confidence": 1, "rationale": "late"}),
            )
        if value is None:
            payload = json.dumps({"error": {"message": "server error"}}).encode()
        else:
            payload = json.dumps(
                {
                    "id": "chatcmpl-test",
                    "object": "chat.completion",
                    "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": value}}
                    ],
                }
            ).encode()
        try:
            self.send_response(kind)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:  # the client gave up (a stall past its timeout)
            pass


@pytest.fixture
def fake_chat(settings):
    """A running FakeChat; the AI settings point at it (model "test-model", a short timeout)."""
    chat = FakeChat().start()
    settings.MAILROOM_AI_BASE_URL = chat.url
    settings.MAILROOM_AI_MODEL = "test-model"
    settings.MAILROOM_AI_API_KEY_REF = ""
    settings.MAILROOM_AI_TIMEOUT_SECONDS = 0.5
    yield chat
    chat.stop()

"""FakeDesk itself: binds the HTTP server, owns the store and the plan, makes writes idempotent."""
import json
import threading

from .faults import FaultPlan
from .handler import WriteOutcome, _Server
from .store import TicketStore, ValidationFailed

DEFAULT_RETENTION_SECONDS = 7200  # Zendesk keeps idempotency keys for two hours.


def _fingerprint(method: str, path: str, payload: dict) -> str:
    # Same key + same operation + same JSON (key order aside) is a replay; anything else is misuse.
    return json.dumps([method, path, payload], sort_keys=True, separators=(",", ":"))


class FakeDesk:
    """The server: bind on construction (so `.url` is known), `start()` serves from a daemon thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, db_path: str | None = None,
                 token: str | None = None, idempotency_enabled: bool = True,
                 retention_seconds: float = DEFAULT_RETENTION_SECONDS):
        self.store = TicketStore(db_path)
        self.plan = FaultPlan()
        self.token = token or None
        self.idempotency_enabled = bool(idempotency_enabled)
        self.retention_seconds = float(retention_seconds)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self._server = _Server((host, port), self)
        except OSError:
            self.store.close()
            raise

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def start(self) -> "FakeDesk":
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name=f"fakedesk:{self.port}",
            daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stopping.set()  # wakes stalled requests
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
        self._server.close_live_connections()
        self.store.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()

    def pause(self, seconds: float):
        """Sleep for a stall fault, but wake at once when the server stops."""
        self._stopping.wait(seconds)

    # The idempotent write, shared by create and comment.

    def write(self, method: str, path: str, key: str | None, payload: dict, action) -> WriteOutcome:
        """Run `action` at most once per idempotency key, like Zendesk.

        Key lookup, the write and remembering the key happen under one lock and in
        one transaction, so two racing requests with the same key make one ticket
        and the second one gets the stored answer.
        """
        use_key = bool(key) and self.idempotency_enabled
        fingerprint = _fingerprint(method, path, payload)
        with self.store.transaction():
            if use_key:
                prior = self.store.recall(key, self.retention_seconds)
                if prior is not None:
                    prior_fingerprint, status, response = prior
                    if prior_fingerprint != fingerprint:
                        return WriteOutcome(400, {
                            "error": "IdempotentRequestError",
                            "description": "The idempotency key was already used with a different request",
                        })
                    ticket_id = (response.get("ticket") or {}).get("id")
                    return WriteOutcome(status, response, committed=False, lookup="hit", ticket_id=ticket_id)
            try:
                outcome = action()
            except ValidationFailed as exc:
                outcome = WriteOutcome(422, {"error": "RecordInvalid", "description": "Record validation errors",
                                             "details": exc.details})
            # Only a successful answer is remembered: a rejected request may be fixed and retried with its key.
            if use_key and outcome.committed:
                self.store.remember(key, fingerprint, outcome.status, outcome.body)
            outcome.lookup = "miss" if use_key else None
            return outcome

    # What the control API exposes, callable from Python too.

    def set_plan(self, faults=(), random_spec=None):
        self.plan.replace(faults, random_spec)

    def idempotency_settings(self) -> dict:
        return {"enabled": self.idempotency_enabled, "retention_seconds": self.retention_seconds}

    def set_idempotency(self, enabled=None, retention_seconds=None):
        if enabled is not None and not isinstance(enabled, bool):
            raise ValueError("enabled must be true or false")
        if retention_seconds is not None:
            if isinstance(retention_seconds, bool) or not isinstance(retention_seconds, (int, float)) \
                    or retention_seconds < 0:
                raise ValueError("retention_seconds must be a number >= 0")
            self.retention_seconds = float(retention_seconds)
        if enabled is not None:
            self.idempotency_enabled = enabled

    def tickets(self, base_url: str | None = None) -> list[dict]:
        base_url = base_url or self.url
        with self.store.transaction():
            tickets = self.store.tickets(base_url)
            for ticket in tickets:
                ticket["comments"] = self.store.comments(ticket["id"])
        return tickets

    def requests_log(self) -> list[dict]:
        with self.store.transaction():
            return self.store.requests()

    def reset(self):
        with self.store.transaction():
            self.store.reset()
        self.plan.replace()

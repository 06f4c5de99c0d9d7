"""A small HTTP client for FakeDesk's control API (`/_control/`), standard library only.

The one way tests and drills steer a FakeDesk, whether it runs in this process
or in another one:

    desk = DeskClient("http://127.0.0.1:8025", token="T")
    desk.set_plan(["rate_limit:2", "drop_after_commit"])
    desk.set_plan(random_spec={"seed": 7, "weights": {"error_500": 0.1}})
    desk.set_idempotency(enabled=False)
    desk.tickets()          # every ticket, each with its "comments"
    desk.requests_log()     # every ticket-writing request: fault, status, committed, idempotency_lookup, ...
    desk.reset()

`token` is not needed by the control API (it takes no auth); it is carried so
that whoever holds the client can build Zendesk credentials for the desk
(`desk.auth`, `desk.credentials`).
"""

import json
import time
import urllib.error
import urllib.request

AGENT = "agent@fakedesk.test"


class ControlError(Exception):
    """The control API refused a request (e.g. 400 BadPlan); `status` and `body` say why."""

    def __init__(self, method: str, path: str, status: int, body):
        self.method, self.path, self.status, self.body = method, path, status, body
        super().__init__(f"{method} /_control/{path}: {status} {body}")


class DeskClient:
    def __init__(self, url: str, token: str | None = None, timeout: float = 5.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        # Never through a proxy: FakeDesk is on this machine, whatever http_proxy says.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __repr__(self):
        return f"<{type(self).__name__} {self.url}>"

    # Zendesk credentials for this desk (basic auth `<email>/token:<token>`).

    @property
    def auth(self) -> tuple[str, str] | None:
        """(user, password) for basic auth, e.g. `requests.post(..., auth=desk.auth)`; None without a token."""
        return None if not self.token else (f"{AGENT}/token", self.token)

    @property
    def credentials(self) -> str:
        """The secret a Mailroom `zendesk` destination reads: `<email>/token:<token>`."""
        return f"{AGENT}/token:{self.token or ''}"

    # The control API.

    def control(self, path: str, payload: dict | None = None):
        """GET /_control/<path>, or POST it `payload` as JSON; the JSON answer. Raises ControlError."""
        method = "GET" if payload is None else "POST"
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(
            f"{self.url}/_control/{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data else {},
        )
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode(errors="replace")
            raise ControlError(method, path, exc.code, body) from None

    def plan(self) -> dict:
        """The faults still queued and the random spec: {"faults": [...], "random": {...} | None}."""
        return self.control("plan")

    def set_plan(self, faults=(), random_spec: dict | None = None) -> dict:
        """Replace the plan: `faults` are used one per ticket write, FIFO, then `random_spec` draws, else ok."""
        payload = {"faults": list(faults)}
        if random_spec is not None:
            payload["random"] = random_spec
        return self.control("plan", payload)

    def idempotency(self) -> dict:
        """{"enabled": bool, "retention_seconds": float}."""
        return self.control("idempotency")

    def set_idempotency(self, enabled: bool | None = None, retention_seconds: float | None = None) -> dict:
        """Turn Idempotency-Key support on or off and/or change how long keys are kept; the new settings."""
        payload = {}
        if enabled is not None:
            payload["enabled"] = enabled
        if retention_seconds is not None:
            payload["retention_seconds"] = retention_seconds
        return self.control("idempotency", payload)

    def set_search_lag(self, seconds: float) -> dict:
        """How long a search (Jira's JQL, Freshdesk's filter) takes to see a new record."""
        return self.control("search_lag", {"search_lag_seconds": seconds})

    def advance_clock(self, seconds: float) -> float:
        """Move the desk's clock forward: the search index catches up and kept keys age, without a sleep."""
        return self.control("clock", {"advance_seconds": seconds})["offset_seconds"]

    def revoke_sessions(self) -> int:
        """Expire every OAuth access token handed out (Salesforce): the next call answers 401."""
        return self.control("revoke_sessions", {})["revoked"]

    def tickets(self) -> list[dict]:
        """Every ticket, oldest first, each with its "comments"."""
        return self.control("tickets")["tickets"]

    def close(self, ticket_id: int) -> dict:
        """Close ticket `ticket_id` (the store's id, `record["id"]`) as an agent would."""
        return self.control("close", {"id": int(ticket_id)})

    def quota_report(self) -> dict:
        """What the desk's quota admitted and refused ({} when it has none)."""
        return self.control("quota")

    def people(self) -> list[dict]:
        """The desk's users / customers / contacts: {"id", "email", "name", "role"}."""
        return self.control("people")["people"]

    def requests_log(self) -> list[dict]:
        """Every ticket-writing request (create and comment), oldest first."""
        return self.control("requests")["requests"]

    def reset(self) -> dict:
        """Forget tickets, idempotency keys, the request log and the plan; ids start again from 1."""
        return self.control("reset", {})

    # Liveness.

    def is_up(self) -> bool:
        try:
            self.plan()
        except (OSError, ControlError):
            return False
        return True

    def wait_until_up(self, timeout: float = 20.0, interval: float = 0.05) -> "DeskClient":
        deadline = time.monotonic() + timeout
        while not self.is_up():
            if time.monotonic() > deadline:
                raise TimeoutError(f"FakeDesk at {self.url} did not answer within {timeout}s")
            time.sleep(interval)
        return self

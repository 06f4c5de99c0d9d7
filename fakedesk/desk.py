"""The desk without HTTP: its state (store, fault plan, settings), the idempotent write, request hooks.

Nothing here knows about sockets. `handler` speaks HTTP on behalf of a `Desk`;
`server.FakeDesk` is a `Desk` bound to a port. The imports go one way:
server -> handler -> desk -> store, faults.
"""

import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .faults import FaultPlan
from .store import TicketStore, ValidationFailed

log = logging.getLogger("fakedesk")

DEFAULT_RETENTION_SECONDS = 7200  # Zendesk keeps idempotency keys for two hours.


@dataclass
class WriteOutcome:
    status: int
    body: dict
    committed: bool = False
    lookup: str | None = None  # "hit" / "miss" when an idempotency key was looked up
    ticket_id: int | None = None


@dataclass(frozen=True)
class ApiRequest:
    """What a request hook sees: one request to the Zendesk API (never the control API)."""

    method: str
    path: str  # without the query string
    query: dict  # parse_qs() of the query string: name -> [values]
    headers: dict  # header name -> value (the last one when repeated)
    body: bytes = field(repr=False, default=b"")

    def json(self):
        """The body parsed as JSON, or None."""
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            return None


# A hook returns None to let the request through, or an answer that replaces FakeDesk's own:
# (status, body) or (status, body, headers). An intercepted request consumes no fault and is not
# in the request log.
RequestHook = Callable[[ApiRequest], "tuple | None"]


class RequestQuota:
    """The account's API rate limit: at most `per_minute` requests in any sliding minute, every API request
    counted (reads, uploads and token requests too), as Zendesk and Freshdesk count them. A request over it is
    refused with 429 and a Retry-After that names when the oldest counted request leaves the minute; a
    refused request is not counted against the limit."""

    WINDOW_SECONDS = 60.0

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.time):
        if isinstance(per_minute, bool) or not isinstance(per_minute, int) or per_minute < 1:
            raise ValueError("quota_per_minute must be a whole number >= 1")
        self.per_minute = per_minute
        self._clock = clock
        self._lock = threading.Lock()
        self._window: deque[float] = deque()  # the admitted requests of the last minute, oldest first
        self.admitted = 0
        self.refused = 0
        self.busiest_minute = 0  # the most requests admitted in one sliding minute
        self.on_admit: Callable[[float], None] | None = None  # told the time of each admitted request (a bench)

    def admit(self) -> float | None:
        """None: the request is counted and goes on; else the seconds until one would be admitted."""
        with self._lock:
            now = self._clock()
            while self._window and self._window[0] <= now - self.WINDOW_SECONDS:
                self._window.popleft()
            if len(self._window) >= self.per_minute:
                self.refused += 1
                return self._window[0] + self.WINDOW_SECONDS - now
            self._window.append(now)
            self.admitted += 1
            self.busiest_minute = max(self.busiest_minute, len(self._window))
            if self.on_admit is not None:
                self.on_admit(now)
            return None

    def report(self) -> dict:
        with self._lock:
            return {
                "quota_per_minute": self.per_minute,
                "admitted": self.admitted,
                "refused": self.refused,
                "busiest_minute": self.busiest_minute,
            }

    def reset(self):
        with self._lock:
            self._window.clear()
            self.admitted = self.refused = self.busiest_minute = 0


# The rate-limit headers each API sends with its 429 (limit, remaining), beside Retry-After.
QUOTA_HEADERS = {
    "zendesk": ("X-Rate-Limit", "X-Rate-Limit-Remaining"),
    "freshdesk": ("X-Ratelimit-Total", "X-Ratelimit-Remaining"),
}


def _fingerprint(method: str, path: str, payload: dict) -> str:
    # Same key + same operation + same JSON (key order aside) is a replay; anything else is misuse.
    return json.dumps([method, path, payload], sort_keys=True, separators=(",", ":"))


class Desk:
    """Tickets, the fault plan, the idempotency settings and the request hooks of one FakeDesk."""

    def __init__(
        self,
        db_path: str | None = None,
        token: str | None = None,
        idempotency_enabled: bool = True,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        dialect: str = "zendesk",
        search_lag_seconds: float = 0.0,
        quota_per_minute: int | None = None,
    ):
        # The account's API rate limit (None: none); checked before authentication and faults.
        self.quota = RequestQuota(quota_per_minute) if quota_per_minute else None
        self.store = TicketStore(db_path)
        self.dialect = dialect
        # An eventually consistent search (Jira, Freshdesk) sees a record only this long after its write.
        self.search_lag_seconds = float(search_lag_seconds)
        # Seconds the desk's clock runs ahead of the wall clock (`advance_clock`); the store reads `now`.
        self.clock_offset = 0.0
        self.store.clock = self.now
        # Bearer tokens handed out by an OAuth token endpoint (Salesforce); revoking them forces a refresh.
        self._sessions: set[str] = set()
        self._sessions_lock = threading.Lock()
        self.plan = FaultPlan()
        self.token = token or None
        self.idempotency_enabled = bool(idempotency_enabled)
        self.retention_seconds = float(retention_seconds)
        self._stopping = threading.Event()
        self._hooks: list[RequestHook] = []
        self._hooks_lock = threading.Lock()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def pause(self, seconds: float):
        """Sleep for a stall fault, but wake at once when the desk stops."""
        self._stopping.wait(seconds)

    # Request hooks: how an in-process test observes or intercepts API requests.

    def add_request_hook(self, hook: RequestHook) -> Callable[[], None]:
        """Call `hook(ApiRequest)` for every Zendesk API request, before authentication and faults.

        Runs on the server's handler thread; returns a function that removes the hook.
        A hook that raises makes the request answer 500.
        """
        with self._hooks_lock:
            self._hooks.append(hook)

        def remove():
            with self._hooks_lock:
                if hook in self._hooks:
                    self._hooks.remove(hook)

        return remove

    def run_request_hooks(self, request: ApiRequest):
        """The first answer a hook gives, normalised to (status, body, headers); else the quota's 429 when the
        request is over it; None to carry on. (A hook sees every request, the ones the quota refuses too.)"""
        with self._hooks_lock:
            hooks = list(self._hooks)
        for hook in hooks:
            answer = hook(request)
            if answer is not None:
                status, body, *rest = answer
                return int(status), body, dict(rest[0]) if rest else {}
        return self.over_quota(request)

    def over_quota(self, request: ApiRequest):
        """The 429 of a request over the quota (logged in the request log, fault "quota"), or None."""
        if self.quota is None:
            return None
        wait = self.quota.admit()
        if wait is None:
            return None
        limit_header, remaining_header = QUOTA_HEADERS.get(self.dialect, QUOTA_HEADERS["zendesk"])
        # Retry-After carries whole seconds; rounded up, so a client that honours it is admitted.
        headers = {
            "Retry-After": str(max(1, math.ceil(wait))),
            limit_header: str(self.quota.per_minute),
            remaining_header: "0",
        }
        with self.store.transaction():
            self.store.log_request(
                {
                    "at": time.time(),
                    "method": request.method,
                    "path": request.path,
                    "idempotency_key": request.headers.get("Idempotency-Key"),
                    "external_id": None,
                    "fault": "quota",
                    "committed": False,
                    "status": 429,
                    "idempotency_lookup": None,
                    "ticket_id": None,
                }
            )
        log.info(
            "fakedesk: %s %s over the quota of %s/min: 429, Retry-After %s",
            request.method,
            request.path,
            self.quota.per_minute,
            headers["Retry-After"],
        )
        return (
            429,
            {"error": "TooManyRequests", "description": "Number of allowed API requests per minute exceeded"},
            headers,
        )

    def quota_report(self) -> dict | None:
        """{quota_per_minute, admitted, refused, busiest_minute} since the start (or reset); None: no quota."""
        return None if self.quota is None else self.quota.report()

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
                        return WriteOutcome(
                            400,
                            {
                                "error": "IdempotentRequestError",
                                "description": "The idempotency key was already used with a different request",
                            },
                        )
                    ticket_id = (response.get("ticket") or {}).get("id")
                    return WriteOutcome(status, response, committed=False, lookup="hit", ticket_id=ticket_id)
            try:
                outcome = action()
            except ValidationFailed as exc:
                outcome = WriteOutcome(
                    422, {"error": "RecordInvalid", "description": "Record validation errors", "details": exc.details}
                )
            # Only a successful answer is remembered: a rejected request may be fixed and retried with its key.
            if use_key and outcome.committed:
                self.store.remember(key, fingerprint, outcome.status, outcome.body)
            outcome.lookup = "miss" if use_key else None
            return outcome

    # OAuth sessions (dialects with a token endpoint).

    def issue_session(self) -> str:
        import secrets

        session = secrets.token_urlsafe(24)
        with self._sessions_lock:
            self._sessions.add(session)
        return session

    def session_valid(self, session: str) -> bool:
        with self._sessions_lock:
            return session in self._sessions

    def revoke_sessions(self) -> int:
        with self._sessions_lock:
            count, self._sessions = len(self._sessions), set()
        return count

    # What the control API exposes.

    def set_plan(self, faults=(), random_spec=None):
        self.plan.replace(faults, random_spec)

    def idempotency_settings(self) -> dict:
        return {"enabled": self.idempotency_enabled, "retention_seconds": self.retention_seconds}

    def set_idempotency(self, enabled=None, retention_seconds=None):
        if enabled is not None and not isinstance(enabled, bool):
            raise ValueError("enabled must be true or false")
        if retention_seconds is not None:
            if (
                isinstance(retention_seconds, bool)
                or not isinstance(retention_seconds, (int, float))
                or retention_seconds < 0
            ):
                raise ValueError("retention_seconds must be a number >= 0")
            self.retention_seconds = float(retention_seconds)
        if enabled is not None:
            self.idempotency_enabled = enabled

    def tickets(self, base_url: str) -> list[dict]:
        with self.store.transaction():
            tickets = self.store.tickets(base_url)
            for ticket in tickets:
                ticket["comments"] = self.store.comments(ticket["id"])
                # The same view for every dialect: the files on the record and who is on it.
                ticket["attachments"] = self.store.attachments(ticket["id"])
                ticket["people"] = self.store.ticket_people(ticket["id"])
        return tickets

    def requests_log(self) -> list[dict]:
        with self.store.transaction():
            return self.store.requests()

    def now(self) -> float:
        """The desk's clock: the wall clock plus what `advance_clock` added."""
        return time.time() + self.clock_offset

    def advance_clock(self, seconds: float) -> float:
        """Move the desk's clock forward (never back): the search index catches up, kept keys and upload
        tokens age, as if `seconds` had passed. Returns the offset from the wall clock."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            raise ValueError("advance_seconds must be a number >= 0")
        self.clock_offset += float(seconds)
        return self.clock_offset

    def reset(self):
        with self.store.transaction():
            self.store.reset()
        self.clock_offset = 0.0
        self.plan.replace()
        if self.quota is not None:
            self.quota.reset()

"""FakeDesk: a fault-injecting stand-in for the Zendesk ticket API (DESIGN.md §9).

Drills and tests point a `zendesk` destination at it and tell it, request by
request, to answer normally or to fail the ways a real help desk fails: rate
limits, 5xx, validation and credential errors, a connection dropped before or
after the ticket was written, a reply that arrives after the client gave up.
Everything it writes is kept in SQLite, so tickets can be counted by
`external_id` after the server (or the client under test) restarts.

Standard library only, so it runs without Django:

    python -m ticketing.fakedesk --port 8025 --db var/fakedesk.sqlite3 [--token T]

or, from a test:

    desk = FakeDesk().start()      # port 0: the OS picks a free port
    ... desk.url ...
    desk.stop()

Zendesk API subset (basic auth `<anything>/token:<token>` when a token is set):
    POST /api/v2/tickets.json                  create; honours Idempotency-Key
    GET  /api/v2/tickets.json?external_id=X    list by external_id (not unique)
    GET  /api/v2/tickets/{id}.json             show
    PUT  /api/v2/tickets/{id}.json             add a comment; honours Idempotency-Key
    GET  /api/v2/tickets/{id}/comments.json    list comments

Control API (no auth):
    GET/POST /_control/plan         {"faults": ["ok", "rate_limit:2", ...],
                                     "random": {"seed": 7, "weights": {"error_500": 0.1}}}
    GET/POST /_control/idempotency  {"enabled": bool, "retention_seconds": N}
    GET  /_control/tickets          every ticket with its comments
    GET  /_control/requests         the log of ticket-writing requests
    POST /_control/reset            forget tickets, keys, the log and the plan

Faults (consumed one per ticket-writing request, i.e. create and comment):
    ok                        answer normally
    rate_limit:S              429, Retry-After: S seconds; nothing written
    rate_limit_date:S         429, Retry-After as an HTTP date S seconds ahead; nothing written
    unavailable_503[:S]       503 (with Retry-After: S when given); nothing written
    error_500                 500; nothing written
    reject_422                422 RecordInvalid (invalid requester email); nothing written
    unauthorized_401          401; nothing written
    drop_before_commit        close the connection without answering; nothing written
    drop_after_commit         write (and remember the key), then close without answering
    stall_before_commit:S     wait S seconds, then write and answer (the write lands late)
    stall_after_commit:S      write, wait S seconds, then answer (the client has timed out)
"""
import argparse
import base64
import binascii
import email.utils
import hmac
import json
import logging
import math
import random
import re
import signal
import socket
import sqlite3
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger(__name__)

DEFAULT_RETENTION_SECONDS = 7200  # Zendesk keeps idempotency keys for two hours.


# --- Faults -----------------------------------------------------------------

# Fault name -> how it takes its seconds argument: "required", "optional" or None (no argument).
FAULT_ARGUMENTS = {
    "ok": None,
    "rate_limit": "required",
    "rate_limit_date": "required",
    "unavailable_503": "optional",
    "error_500": None,
    "reject_422": None,
    "unauthorized_401": None,
    "drop_before_commit": None,
    "drop_after_commit": None,
    "stall_before_commit": "required",
    "stall_after_commit": "required",
}


@dataclass(frozen=True)
class Fault:
    name: str
    seconds: float | None = None
    spec: str = "ok"


OK = Fault("ok")


def parse_fault(spec) -> Fault:
    """`"rate_limit:2"` -> Fault("rate_limit", 2.0). Raises ValueError for anything unknown."""
    name, has_argument, argument = str(spec).partition(":")
    if name not in FAULT_ARGUMENTS:
        raise ValueError(f"unknown fault {spec!r}; known: {', '.join(FAULT_ARGUMENTS)}")
    takes = FAULT_ARGUMENTS[name]
    if not has_argument:
        if takes == "required":
            raise ValueError(f"fault {name} needs a number of seconds, e.g. {name}:2")
        return Fault(name, None, name)
    if takes is None:
        raise ValueError(f"fault {name} takes no argument")
    try:
        seconds = float(argument)
    except ValueError:
        raise ValueError(f"fault {spec!r}: {argument!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"fault {spec!r}: seconds must be a finite number >= 0")
    return Fault(name, seconds, str(spec))


class FaultPlan:
    """Which fault the next ticket-writing request gets.

    The queued list comes first (FIFO); when it is empty a seeded random draw is
    used if one was configured, else `ok`. The draw uses its own `random.Random`,
    so the n-th request gets the same fault for the same seed and weights.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._queue: deque[Fault] = deque()
        self._random_spec = None
        self._rng = None
        self._weights: list[tuple[Fault, float]] = []

    def replace(self, faults=(), random_spec=None):
        queue = deque(parse_fault(spec) for spec in faults)
        weights, rng = [], None
        if random_spec is not None:
            weights, rng = self._parse_random(random_spec)
        with self._lock:
            self._queue = queue
            self._random_spec = random_spec
            self._weights, self._rng = weights, rng

    @staticmethod
    def _parse_random(spec):
        if not isinstance(spec, dict) or not isinstance(spec.get("weights", {}), dict):
            raise ValueError('random must look like {"seed": 7, "weights": {"error_500": 0.1}}')
        seed = spec.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError("random.seed must be an integer")
        weights = []
        for fault_spec, weight in spec.get("weights", {}).items():
            if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight < 0:
                raise ValueError(f"weight of {fault_spec!r} must be a number >= 0")
            weights.append((parse_fault(fault_spec), float(weight)))
        if sum(weight for _, weight in weights) > 1 + 1e-9:
            raise ValueError("random weights are probabilities: they must add up to at most 1 (the rest is ok)")
        return weights, random.Random(seed)

    def next(self) -> Fault:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
            if self._rng is None:
                return OK
            draw, cumulative = self._rng.random(), 0.0
            for fault, weight in self._weights:
                cumulative += weight
                if draw < cumulative:
                    return fault
            return OK

    def describe(self) -> dict:
        with self._lock:
            return {"faults": [fault.spec for fault in self._queue], "random": self._random_spec}


def _retry_after_seconds(seconds: float) -> str:
    # Retry-After carries whole seconds; round up so a client never comes back early.
    return str(math.ceil(seconds))


def rejection_for(fault: Fault):
    """The answer of a fault that refuses the request before anything is written, or None."""
    if fault.name == "rate_limit":
        return 429, {"Retry-After": _retry_after_seconds(fault.seconds)}, {
            "error": "TooManyRequests", "description": "Rate limit exceeded"}
    if fault.name == "rate_limit_date":
        at = email.utils.formatdate(time.time() + fault.seconds, usegmt=True)
        return 429, {"Retry-After": at}, {"error": "TooManyRequests", "description": "Rate limit exceeded"}
    if fault.name == "unavailable_503":
        headers = {} if fault.seconds is None else {"Retry-After": _retry_after_seconds(fault.seconds)}
        return 503, headers, {"error": "ServiceUnavailable", "description": "Try again later"}
    if fault.name == "error_500":
        return 500, {}, {"error": "InternalServerError", "description": "Something went wrong"}
    if fault.name == "reject_422":
        return 422, {}, {
            "error": "RecordInvalid",
            "description": "Record validation errors",
            "details": {"requester": [{"description": "Requester email is invalid"}]},
        }
    if fault.name == "unauthorized_401":
        return 401, {}, {"error": "Couldn't authenticate you"}
    return None


# --- Storage ----------------------------------------------------------------

class ValidationFailed(Exception):
    """The request is well-formed JSON but not a valid ticket: Zendesk answers 422 RecordInvalid."""

    def __init__(self, details: dict):
        super().__init__("record invalid")
        self.details = details


_SCHEMA = """
CREATE TABLE IF NOT EXISTS tickets (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    external_id TEXT,
    subject TEXT NOT NULL DEFAULT '',
    description TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'new',
    requester TEXT NOT NULL DEFAULT '{}',
    tags TEXT NOT NULL DEFAULT '[]',
    custom_fields TEXT NOT NULL DEFAULT '[]',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tickets_external_id ON tickets (external_id);
CREATE TABLE IF NOT EXISTS comments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ticket_id INTEGER NOT NULL REFERENCES tickets (id),
    body TEXT NOT NULL,
    public INTEGER NOT NULL,
    author_id INTEGER,
    metadata TEXT NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS comments_ticket ON comments (ticket_id);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    status INTEGER NOT NULL,
    response TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    idempotency_key TEXT,
    external_id TEXT,
    fault TEXT,
    committed INTEGER NOT NULL,
    status INTEGER,
    idempotency_lookup TEXT,
    ticket_id INTEGER
);
"""

_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class TicketStore:
    """Tickets, comments, idempotency keys and the request log in one SQLite database.

    One connection is shared by every handler thread behind one lock: a fake
    needs simple, obviously serial behaviour more than throughput. Callers wrap
    each unit of work in `transaction()`, so a ticket and the idempotency key
    that remembers it are committed together or not at all.
    """

    def __init__(self, path: str | None = None):
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path or ":memory:", check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.executescript(_SCHEMA)

    @contextmanager
    def transaction(self):
        with self._lock, self._db:
            yield

    def close(self):
        with self._lock:
            self._db.close()

    def reset(self):
        # Ids start again from 1, as on a fresh desk.
        self._db.execute("DELETE FROM comments")
        self._db.execute("DELETE FROM tickets")
        self._db.execute("DELETE FROM idempotency_keys")
        self._db.execute("DELETE FROM requests")
        self._db.execute("DELETE FROM sqlite_sequence")

    # Tickets and comments.

    def create_ticket(self, ticket: dict) -> int:
        comment = ticket.get("comment") if isinstance(ticket.get("comment"), dict) else {}
        body = comment.get("body") or ticket.get("description") or ""
        requester = ticket.get("requester") if isinstance(ticket.get("requester"), dict) else {}
        details = {}
        if not isinstance(body, str) or not body.strip():
            details["description"] = [{"description": "Description: cannot be blank", "error": "BlankValue"}]
        if "email" in requester and not _EMAIL.fullmatch(str(requester["email"])):
            details["requester"] = [{"description": "Requester email is invalid"}]
        if details:
            raise ValidationFailed(details)
        now = _now_iso()
        external_id = ticket.get("external_id")
        cursor = self._db.execute(
            "INSERT INTO tickets (external_id, subject, description, status, requester, tags, custom_fields,"
            " created_at, updated_at) VALUES (?, ?, ?, 'new', ?, ?, ?, ?, ?)",
            (
                None if external_id is None else str(external_id),
                str(ticket.get("subject") or ""),
                body,
                json.dumps(requester),
                json.dumps(list(ticket.get("tags") or [])),
                json.dumps(list(ticket.get("custom_fields") or [])),
                now,
                now,
            ),
        )
        ticket_id = cursor.lastrowid
        # Zendesk keeps the description as the ticket's first comment.
        self._insert_comment(ticket_id, body, bool(comment.get("public", True)), comment.get("author_id"), {})
        return ticket_id

    def add_comment(self, ticket_id: int, ticket: dict) -> dict | None:
        """Apply a ticket update (a comment, maybe a status). None if there is no such ticket."""
        if self._ticket_row(ticket_id) is None:
            return None
        comment = ticket.get("comment")
        events = []
        if comment is not None:
            if not isinstance(comment, dict) or not isinstance(comment.get("body"), str) or not comment["body"].strip():
                raise ValidationFailed({"comment": [{"description": "Comment: body cannot be blank"}]})
            metadata = ticket.get("metadata") if isinstance(ticket.get("metadata"), dict) else {}
            comment_id = self._insert_comment(
                ticket_id, comment["body"], bool(comment.get("public", True)), comment.get("author_id"), metadata)
            events.append({"id": comment_id, "type": "Comment", "body": comment["body"],
                           "public": bool(comment.get("public", True)), "author_id": comment.get("author_id")})
        if isinstance(ticket.get("status"), str):
            self._db.execute("UPDATE tickets SET status = ? WHERE id = ?", (ticket["status"], ticket_id))
        self._db.execute("UPDATE tickets SET updated_at = ? WHERE id = ?", (_now_iso(), ticket_id))
        return {
            "id": events[0]["id"] if events else None,
            "ticket_id": ticket_id,
            "created_at": _now_iso(),
            "events": events,
            "metadata": {"custom": ticket.get("metadata") or {}},
        }

    def _insert_comment(self, ticket_id, body, public, author_id, metadata) -> int:
        cursor = self._db.execute(
            "INSERT INTO comments (ticket_id, body, public, author_id, metadata, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (ticket_id, body, int(public), author_id if isinstance(author_id, int) else None,
             json.dumps(metadata), _now_iso()),
        )
        return cursor.lastrowid

    def _ticket_row(self, ticket_id):
        return self._db.execute("SELECT * FROM tickets WHERE id = ?", (ticket_id,)).fetchone()

    def ticket(self, ticket_id: int, base_url: str) -> dict | None:
        row = self._ticket_row(ticket_id)
        return None if row is None else _ticket_json(row, base_url)

    def tickets(self, base_url: str, external_id: str | None = None) -> list[dict]:
        if external_id is None:
            rows = self._db.execute("SELECT * FROM tickets ORDER BY id").fetchall()
        else:
            rows = self._db.execute(
                "SELECT * FROM tickets WHERE external_id = ? ORDER BY id", (external_id,)).fetchall()
        return [_ticket_json(row, base_url) for row in rows]

    def comments(self, ticket_id: int) -> list[dict]:
        rows = self._db.execute("SELECT * FROM comments WHERE ticket_id = ? ORDER BY id", (ticket_id,)).fetchall()
        return [
            {"id": row["id"], "type": "Comment", "body": row["body"], "public": bool(row["public"]),
             "author_id": row["author_id"], "metadata": {"custom": json.loads(row["metadata"])},
             "created_at": row["created_at"]}
            for row in rows
        ]

    # Idempotency keys.

    def recall(self, key: str, retention_seconds: float):
        """The stored (fingerprint, status, response) for a key still inside its retention, else None."""
        self._db.execute("DELETE FROM idempotency_keys WHERE created_at <= ?", (time.time() - retention_seconds,))
        row = self._db.execute(
            "SELECT fingerprint, status, response FROM idempotency_keys WHERE key = ?", (key,)).fetchone()
        return None if row is None else (row["fingerprint"], row["status"], json.loads(row["response"]))

    def remember(self, key: str, fingerprint: str, status: int, response: dict):
        self._db.execute(
            "INSERT OR REPLACE INTO idempotency_keys (key, fingerprint, status, response, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (key, fingerprint, status, json.dumps(response), time.time()),
        )

    # The request log.

    def log_request(self, entry: dict):
        self._db.execute(
            "INSERT INTO requests (at, method, path, idempotency_key, external_id, fault, committed, status,"
            " idempotency_lookup, ticket_id) VALUES (:at, :method, :path, :idempotency_key, :external_id, :fault,"
            " :committed, :status, :idempotency_lookup, :ticket_id)",
            {**entry, "committed": int(bool(entry["committed"]))},
        )

    def requests(self) -> list[dict]:
        rows = self._db.execute("SELECT * FROM requests ORDER BY id").fetchall()
        return [{**dict(row), "committed": bool(row["committed"])} for row in rows]


def _ticket_json(row, base_url: str) -> dict:
    return {
        "id": row["id"],
        "url": f"{base_url}/api/v2/tickets/{row['id']}.json",
        "external_id": row["external_id"],
        "subject": row["subject"],
        "description": row["description"],
        "status": row["status"],
        "requester": json.loads(row["requester"]),
        "tags": json.loads(row["tags"]),
        "custom_fields": json.loads(row["custom_fields"]),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


# --- HTTP -------------------------------------------------------------------

@dataclass
class WriteOutcome:
    status: int
    body: dict
    committed: bool = False
    lookup: str | None = None  # "hit" / "miss" when an idempotency key was looked up
    ticket_id: int | None = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, desk):
        self.desk = desk
        self.live_connections: set[socket.socket] = set()
        self.live_lock = threading.Lock()
        super().__init__(address, _Handler)

    def close_live_connections(self):
        # Keep-alive connections would otherwise outlive the server (as a crash would not).
        with self.live_lock:
            connections = list(self.live_connections)
        for connection in connections:
            _hard_close(connection)


def _hard_close(connection: socket.socket):
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real desk behind a load balancer
    server_version = "FakeDesk/1.0"
    timeout = 60  # an idle keep-alive connection gives its thread back

    # (method, path pattern, handler name, needs auth)
    ROUTES = [
        ("POST", re.compile(r"/api/v2/tickets(?:\.json)?"), "create_ticket", True),
        ("GET", re.compile(r"/api/v2/tickets(?:\.json)?"), "list_tickets", True),
        ("GET", re.compile(r"/api/v2/tickets/(\d+)(?:\.json)?"), "show_ticket", True),
        ("PUT", re.compile(r"/api/v2/tickets/(\d+)(?:\.json)?"), "update_ticket", True),
        ("GET", re.compile(r"/api/v2/tickets/(\d+)/comments(?:\.json)?"), "list_comments", True),
        ("GET", re.compile(r"/_control/plan"), "control_get_plan", False),
        ("POST", re.compile(r"/_control/plan"), "control_set_plan", False),
        ("GET", re.compile(r"/_control/idempotency"), "control_get_idempotency", False),
        ("POST", re.compile(r"/_control/idempotency"), "control_set_idempotency", False),
        ("GET", re.compile(r"/_control/tickets"), "control_tickets", False),
        ("GET", re.compile(r"/_control/requests"), "control_requests", False),
        ("POST", re.compile(r"/_control/reset"), "control_reset", False),
    ]

    @property
    def desk(self) -> "FakeDesk":
        return self.server.desk

    def setup(self):
        super().setup()
        with self.server.live_lock:
            self.server.live_connections.add(self.connection)

    def finish(self):
        with self.server.live_lock:
            self.server.live_connections.discard(self.connection)
        super().finish()

    def log_message(self, format, *args):
        # Access lines go to logging at debug level; the interesting ones are logged per write.
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    # Plumbing.

    def _dispatch(self, method: str):
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        try:
            # Read the whole body first, whatever the route: an unread body would corrupt a keep-alive
            # connection, and a drop fault should come after the client has sent everything.
            self.raw_body = self._read_body()
            for route_method, pattern, name, needs_auth in self.ROUTES:
                match = pattern.fullmatch(url.path)
                if match and route_method == method:
                    if needs_auth and not self._authenticated():
                        self._reject_unauthenticated(method, url.path)
                        return
                    getattr(self, name)(*match.groups())
                    return
            self._send(404, {"error": "InvalidEndpoint", "description": "Not found"})
        except ConnectionError:
            # The client gave up first (it timed out during a stall): nobody is left to answer.
            self.close_connection = True
            log.info("fakedesk: %s %s: client went away before the answer", method, url.path)
        except Exception:
            if self.desk.stopping:
                return  # the server is going away under a stalled request: nothing left to answer
            log.exception("fakedesk: %s %s failed", method, url.path)
            self._send(500, {"error": "InternalServerError", "description": "FakeDesk bug, see its log"})

    def _read_body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        return self.rfile.read(length) if length > 0 else b""

    def _parse_json(self) -> dict | None:
        try:
            payload = json.loads(self.raw_body or b"{}")
        except ValueError:
            return None
        return payload if isinstance(payload, dict) else None

    def _json_body(self) -> dict | None:
        """The parsed body, or None after answering 400 when it is not a JSON object."""
        payload = self._parse_json()
        if payload is None:
            self._send(400, {"error": "InvalidJSON", "description": "The body must be a JSON object"})
        return payload

    def _base_url(self) -> str:
        return f"http://{self.headers.get('Host') or self.desk.address}"

    def _send(self, status: int, body: dict, headers: dict | None = None):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _drop_connection(self):
        # A real close with no response at all: the client sees RemoteDisconnected /
        # ConnectionResetError, exactly like a load balancer dropping the request.
        self.close_connection = True
        _hard_close(self.connection)

    def _authenticated(self) -> bool:
        token = self.desk.token
        if not token:
            return True
        scheme, _, encoded = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return user.endswith("/token") and hmac.compare_digest(password.encode(), token.encode())

    def _reject_unauthenticated(self, method: str, path: str):
        if method in ("POST", "PUT"):
            self._log_write(method, path, fault=None, outcome=WriteOutcome(401, {}))
        self._send(401, {"error": "Couldn't authenticate you"})

    # Ticket writes: the only requests that consume faults.

    def create_ticket(self):
        self._ticket_write("POST", "/api/v2/tickets.json", self._do_create)

    def update_ticket(self, ticket_id):
        self._ticket_write("PUT", f"/api/v2/tickets/{ticket_id}.json",
                           lambda ticket: self._do_update(int(ticket_id), ticket))

    def _do_create(self, ticket: dict) -> WriteOutcome:
        ticket_id = self.desk.store.create_ticket(ticket)
        body = {"ticket": self.desk.store.ticket(ticket_id, self._base_url())}
        return WriteOutcome(201, body, committed=True, ticket_id=ticket_id)

    def _do_update(self, ticket_id: int, ticket: dict) -> WriteOutcome:
        audit = self.desk.store.add_comment(ticket_id, ticket)
        if audit is None:
            return WriteOutcome(404, {"error": "RecordNotFound", "description": "Not found"})
        body = {"ticket": self.desk.store.ticket(ticket_id, self._base_url()), "audit": audit}
        return WriteOutcome(200, body, committed=True, ticket_id=ticket_id)

    def _ticket_write(self, method: str, path: str, action):
        fault = self.desk.plan.next()
        rejection = rejection_for(fault)
        if rejection is not None:
            status, headers, body = rejection
            self._log_write(method, path, fault, WriteOutcome(status, body))
            self._send(status, body, headers)
            return
        if fault.name == "drop_before_commit":
            self._log_write(method, path, fault, WriteOutcome(0, {}))
            self._drop_connection()
            return
        if fault.name == "stall_before_commit":
            self.desk.pause(fault.seconds)

        payload = self._parse_json()
        ticket = payload.get("ticket") if payload is not None else None
        if not isinstance(ticket, dict):
            body = {"error": "InvalidJSON", "description": 'The body must be {"ticket": {...}}'}
            self._log_write(method, path, fault, WriteOutcome(400, body))
            self._send(400, body)
            return
        outcome = self.desk.write(method, path, self.headers.get("Idempotency-Key"), payload, lambda: action(ticket))
        self._log_write(method, path, fault, outcome, external_id=ticket.get("external_id"))

        if fault.name == "drop_after_commit":
            self._drop_connection()
            return
        if fault.name == "stall_after_commit":
            self.desk.pause(fault.seconds)
        headers = {"x-idempotency-lookup": outcome.lookup} if outcome.lookup else {}
        self._send(outcome.status, outcome.body, headers)

    def _log_write(self, method, path, fault, outcome: WriteOutcome, external_id=None):
        entry = {
            "at": time.time(),
            "method": method,
            "path": path,
            "idempotency_key": self.headers.get("Idempotency-Key"),
            "external_id": None if external_id is None else str(external_id),
            "fault": None if fault is None else fault.spec,
            "committed": outcome.committed,
            # None when no answer is sent at all (a dropped connection).
            "status": outcome.status or None,
            "idempotency_lookup": outcome.lookup,
            "ticket_id": outcome.ticket_id,
        }
        with self.desk.store.transaction():
            self.desk.store.log_request(entry)
        log.info("fakedesk: %s %s fault=%s status=%s committed=%s lookup=%s ticket=%s", method, path,
                 entry["fault"], entry["status"], outcome.committed, outcome.lookup, outcome.ticket_id)

    # Ticket reads.

    def list_tickets(self):
        external_id = (self.query.get("external_id") or [None])[0]
        with self.desk.store.transaction():
            tickets = self.desk.store.tickets(self._base_url(), external_id)
        self._send(200, {"tickets": tickets, "count": len(tickets), "next_page": None, "previous_page": None})

    def show_ticket(self, ticket_id):
        with self.desk.store.transaction():
            ticket = self.desk.store.ticket(int(ticket_id), self._base_url())
        if ticket is None:
            self._send(404, {"error": "RecordNotFound", "description": "Not found"})
        else:
            self._send(200, {"ticket": ticket})

    def list_comments(self, ticket_id):
        with self.desk.store.transaction():
            exists = self.desk.store.ticket(int(ticket_id), self._base_url()) is not None
            comments = self.desk.store.comments(int(ticket_id))
        if not exists:
            self._send(404, {"error": "RecordNotFound", "description": "Not found"})
        else:
            self._send(200, {"comments": comments, "count": len(comments), "next_page": None})

    # Control API.

    def control_get_plan(self):
        self._send(200, self.desk.plan.describe())

    def control_set_plan(self):
        payload = self._json_body()
        if payload is None:
            return
        try:
            self.desk.plan.replace(payload.get("faults") or [], payload.get("random"))
        except ValueError as exc:
            self._send(400, {"error": "BadPlan", "description": str(exc)})
            return
        self._send(200, self.desk.plan.describe())

    def control_get_idempotency(self):
        self._send(200, self.desk.idempotency_settings())

    def control_set_idempotency(self):
        payload = self._json_body()
        if payload is None:
            return
        try:
            self.desk.set_idempotency(payload.get("enabled"), payload.get("retention_seconds"))
        except ValueError as exc:
            self._send(400, {"error": "BadSettings", "description": str(exc)})
            return
        self._send(200, self.desk.idempotency_settings())

    def control_tickets(self):
        tickets = self.desk.tickets(self._base_url())
        self._send(200, {"tickets": tickets, "count": len(tickets)})

    def control_requests(self):
        entries = self.desk.requests_log()
        self._send(200, {"requests": entries, "count": len(entries)})

    def control_reset(self):
        self.desk.reset()
        self._send(200, {"reset": True})


# --- The server -------------------------------------------------------------

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


# --- Command line -------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser):
    """The options shared by `python -m ticketing.fakedesk` and `manage.py fakedesk`."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8025, help="0 picks a free port (printed at start)")
    parser.add_argument("--db", default=None, help="SQLite file; in memory when omitted")
    parser.add_argument("--token", default=None, help="require basic auth <anything>/token:<TOKEN>")
    parser.add_argument("--no-idempotency", action="store_true", help="ignore Idempotency-Key headers")
    parser.add_argument("--retention-seconds", type=float, default=DEFAULT_RETENTION_SECONDS,
                        help="how long idempotency keys are kept")


def desk_from_options(options) -> FakeDesk:
    return FakeDesk(host=options.host, port=options.port, db_path=options.db, token=options.token,
                    idempotency_enabled=not options.no_idempotency, retention_seconds=options.retention_seconds)


def run_until_signalled(desk: FakeDesk, out=sys.stdout):
    """Serve until SIGTERM or Ctrl-C, then stop cleanly.

    Prints the URL first: with --port 0 it is the only way to know the port.
    """
    done = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: done.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        desk.start()
        out.write(f"FakeDesk listening on {desk.url}\n")
        out.flush()
        while not done.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        desk.stop()
    out.write("FakeDesk stopped\n")
    out.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ticketing.fakedesk", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--log-level", default="INFO")
    options = parser.parse_args(argv)
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    run_until_signalled(desk_from_options(options))


if __name__ == "__main__":
    main()

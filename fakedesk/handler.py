"""The HTTP side: routing, authentication, fault injection per ticket write, the control API.

`Handler` serves one `desk.Desk`, found as `self.server.desk`; the server (see
`server.py`) also keeps `live_connections` and `live_lock` so that it can close
keep-alive connections when it stops. This module does not import the server.
"""
import base64
import binascii
import hmac
import json
import re
import socket
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from .desk import ApiRequest, Desk, WriteOutcome, log
from .faults import rejection_for

CONTROL_PREFIX = "/_control/"


def hard_close(connection: socket.socket):
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real desk behind a load balancer
    server_version = "FakeDesk/1.0"
    timeout = 60  # an idle keep-alive connection gives its thread back

    # (method, path pattern, handler name, needs auth). A dialect (fakedesk.dialects) replaces API_ROUTES.
    API_ROUTES = [
        ("POST", re.compile(r"/api/v2/tickets(?:\.json)?"), "create_ticket", True),
        ("GET", re.compile(r"/api/v2/tickets(?:\.json)?"), "list_tickets", True),
        ("GET", re.compile(r"/api/v2/tickets/show_many(?:\.json)?"), "show_many", True),
        ("GET", re.compile(r"/api/v2/incremental/tickets/cursor(?:\.json)?"), "incremental_tickets", True),
        ("GET", re.compile(r"/api/v2/tickets/(\d+)(?:\.json)?"), "show_ticket", True),
        ("PUT", re.compile(r"/api/v2/tickets/(\d+)(?:\.json)?"), "update_ticket", True),
        ("GET", re.compile(r"/api/v2/tickets/(\d+)/comments(?:\.json)?"), "list_comments", True),
        ("GET", re.compile(r"/api/v2/users/me(?:\.json)?"), "show_me", True),
    ]
    CONTROL_ROUTES = [
        ("GET", re.compile(r"/_control/plan"), "control_get_plan", False),
        ("POST", re.compile(r"/_control/plan"), "control_set_plan", False),
        ("GET", re.compile(r"/_control/idempotency"), "control_get_idempotency", False),
        ("POST", re.compile(r"/_control/idempotency"), "control_set_idempotency", False),
        ("GET", re.compile(r"/_control/search_lag"), "control_get_search_lag", False),
        ("POST", re.compile(r"/_control/search_lag"), "control_set_search_lag", False),
        ("POST", re.compile(r"/_control/revoke_sessions"), "control_revoke_sessions", False),
        ("GET", re.compile(r"/_control/tickets"), "control_tickets", False),
        ("GET", re.compile(r"/_control/requests"), "control_requests", False),
        ("GET", re.compile(r"/_control/people"), "control_people", False),
        ("POST", re.compile(r"/_control/close"), "control_close", False),
        ("POST", re.compile(r"/_control/reset"), "control_reset", False),
    ]
    # The header a replay-protecting API reads its key from (None: the API has no such thing).
    IDEMPOTENCY_HEADER: str | None = "Idempotency-Key"
    # The JSON member that holds the record in a write's body (None: the whole body is the record).
    PAYLOAD_KEY: str | None = "ticket"
    UNAUTHENTICATED = (401, {"error": "Couldn't authenticate you"})

    @property
    def desk(self) -> Desk:
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

    def do_PATCH(self):
        self._dispatch("PATCH")

    # Plumbing.

    def _dispatch(self, method: str):
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        try:
            # Read the whole body first, whatever the route: an unread body would corrupt a keep-alive
            # connection, and a drop fault should come after the client has sent everything.
            self.raw_body = self._read_body()
            if not url.path.startswith(CONTROL_PREFIX) and self._answered_by_a_hook(method, url.path):
                return
            for route_method, pattern, name, needs_auth in self.API_ROUTES + self.CONTROL_ROUTES:
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

    def _answered_by_a_hook(self, method: str, path: str) -> bool:
        request = ApiRequest(method, path, self.query, dict(self.headers.items()), self.raw_body)
        answer = self.desk.run_request_hooks(request)
        if answer is None:
            return False
        status, body, headers = answer
        log.info("fakedesk: %s %s answered %s by a request hook", method, path, status)
        self._send(status, body, headers)
        return True

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
        if self.headers.get("Host"):
            return f"http://{self.headers['Host']}"
        host, port = self.server.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

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
        hard_close(self.connection)

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
        status, body = self.UNAUTHENTICATED
        if method in ("POST", "PUT", "PATCH"):
            self._log_write(method, path, fault=None, outcome=WriteOutcome(status, {}))
        self._send(status, body)

    # Ticket writes: the only requests that consume faults.

    def create_ticket(self):
        self._ticket_write("POST", "/api/v2/tickets.json", self._do_create)

    def update_ticket(self, ticket_id):
        self._ticket_write("PUT", f"/api/v2/tickets/{ticket_id}.json",
                           lambda ticket: self._do_update(int(ticket_id), ticket))

    def _do_create(self, ticket: dict) -> WriteOutcome:
        # Standard fields beside the ones the store has columns for (priority, group_id, type, ...).
        standard = {k: v for k, v in ticket.items()
                    if k not in ("comment", "requester", "tags", "custom_fields", "subject", "external_id")}
        ticket_id = self.desk.store.create_ticket(ticket, fields=standard)
        body = {"ticket": self.desk.store.ticket(ticket_id, self._base_url())}
        return WriteOutcome(201, body, committed=True, ticket_id=ticket_id)

    def _do_update(self, ticket_id: int, ticket: dict) -> WriteOutcome:
        audit = self.desk.store.add_comment(ticket_id, ticket)
        if audit is None:
            return WriteOutcome(404, {"error": "RecordNotFound", "description": "Not found"})
        body = {"ticket": self.desk.store.ticket(ticket_id, self._base_url()), "audit": audit}
        return WriteOutcome(200, body, committed=True, ticket_id=ticket_id)

    def rejection(self, fault):
        """How this API answers a refusing fault: (status, headers, body) or None. Dialects reshape the body."""
        return rejection_for(fault)

    def invalid_body(self) -> tuple[int, dict]:
        return 400, {"error": "InvalidJSON", "description": 'The body must be {"ticket": {...}}'}

    def _ticket_write(self, method: str, path: str, action, external_id_of=None):
        """One record-writing request, through the fault plan: `action(record) -> WriteOutcome` runs at most
        once per idempotency key (when the API honours one). `external_id_of(record)` names it in the log."""
        fault = self.desk.plan.next()
        rejection = self.rejection(fault)
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
        record = payload if self.PAYLOAD_KEY is None or payload is None else payload.get(self.PAYLOAD_KEY)
        if not isinstance(record, dict):
            status, body = self.invalid_body()
            self._log_write(method, path, fault, WriteOutcome(status, body))
            self._send(status, body)
            return
        key = self.headers.get(self.IDEMPOTENCY_HEADER) if self.IDEMPOTENCY_HEADER else None
        outcome = self.desk.write(method, path, key, payload, lambda: action(record))
        external_id = external_id_of(record) if external_id_of else record.get("external_id")
        self._log_write(method, path, fault, outcome, external_id=external_id)

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
            "idempotency_key": self.headers.get(self.IDEMPOTENCY_HEADER) if self.IDEMPOTENCY_HEADER else None,
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

    def show_many(self):
        ids = [int(i) for i in ",".join(self.query.get("ids") or []).split(",") if i.strip().isdigit()][:100]
        with self.desk.store.transaction():
            tickets = [t for t in (self.desk.store.ticket(i, self._base_url()) for i in ids) if t is not None]
        self._send(200, {"tickets": tickets, "count": len(tickets), "next_page": None, "previous_page": None})

    def incremental_tickets(self):
        """Zendesk's cursor-based incremental export: tickets updated since start_time, in pages."""
        def first(name, default=""):
            return (self.query.get(name) or [default])[0]
        cursor, start = first("cursor"), first("start_time")
        if not cursor and not start.isdigit():
            self._send(400, {"error": "InvalidValue", "description": "start_time or cursor is required"})
            return
        per_page = min(1000, int(first("per_page", "1000"))) if first("per_page", "1000").isdigit() else 1000
        if cursor:
            start, _, after = cursor.partition(":")
        else:
            after = "0"
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(start or 0)))
        with self.desk.store.transaction():
            tickets = self.desk.store.updated_since(self._base_url(), since, int(after or 0), per_page + 1)
        end = len(tickets) <= per_page
        tickets = tickets[:per_page]
        last = tickets[-1]["id"] if tickets else int(after or 0)
        self._send(200, {"tickets": tickets, "after_cursor": f"{start}:{last}", "before_cursor": None,
                         "end_of_stream": end, "after_url": None if end else
                         f"{self._base_url()}/api/v2/incremental/tickets/cursor.json?cursor={start}:{last}"})

    def show_me(self):
        """The authenticated user (Zendesk answers an anonymous one, id null, to a request without auth)."""
        self._send(200, {"user": {"id": 1, "name": "Mailroom API", "role": "agent", "active": True}})

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

    def control_get_search_lag(self):
        self._send(200, {"search_lag_seconds": self.desk.search_lag_seconds})

    def control_set_search_lag(self):
        payload = self._json_body()
        if payload is None:
            return
        seconds = payload.get("search_lag_seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            self._send(400, {"error": "BadSettings", "description": "search_lag_seconds must be a number >= 0"})
            return
        self.desk.search_lag_seconds = float(seconds)
        self._send(200, {"search_lag_seconds": self.desk.search_lag_seconds})

    def control_revoke_sessions(self):
        self._send(200, {"revoked": self.desk.revoke_sessions()})

    def control_tickets(self):
        tickets = self.desk.tickets(self._base_url())
        self._send(200, {"tickets": tickets, "count": len(tickets)})

    def control_requests(self):
        entries = self.desk.requests_log()
        self._send(200, {"requests": entries, "count": len(entries)})

    def control_people(self):
        with self.desk.store.transaction():
            people = self.desk.store.people()
        self._send(200, {"people": people, "count": len(people)})

    def control_close(self):
        """Close a ticket as an agent would ({"id": the store's id}): each dialect then answers writes to it as
        its API answers writes to a closed (archived, resolved) record."""
        payload = self._json_body()
        if payload is None:
            return
        ticket_id = payload.get("id")
        with self.desk.store.transaction():
            found = isinstance(ticket_id, int) and self.desk.store.ticket(ticket_id, self._base_url()) is not None
            if found:
                self.desk.store.set_status(ticket_id, "closed")
        self._send(200 if found else 404, {"closed": bool(found)})

    def control_reset(self):
        self.desk.reset()
        self._send(200, {"reset": True})

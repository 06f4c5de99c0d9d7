"""The HTTP side: routing, authentication, fault injection per ticket write, the control API.

`Handler` serves one `desk.Desk`, found as `self.server.desk`; the server (see
`server.py`) also keeps `live_connections` and `live_lock` so that it can close
keep-alive connections when it stops. This module does not import the server.

The default dialect is Zendesk's. Beside tickets it keeps what a rich ticket needs:
    POST /api/v2/uploads.json?filename=N       raw bytes (Content-Type: the file's); 201 {"upload": {"token",
                                               "expires_at", "attachment", "attachments"}}; through the fault
                                               plan, no Idempotency-Key (Zendesk keeps none for uploads).
                                               A token is valid for 60 minutes.
    "uploads": [tokens] on a create/update comment   each file becomes an attachment of that comment (inline
                                               when the comment's html_body shows its content_url); an unknown
                                               or expired token is a 422 RecordInvalid, nothing written
    "html_body"                                kept as the comment's body when "body" is missing
    "requester": {"name", "email"}             the person found or created, on the ticket as its requester
    "email_ccs": [{"user_email"|"user_id", "action": "put"}]   CCs on the ticket (found or created)
    "comment": {"author_id": N}                the comment is written as that person (their address)
    "via_followup_source_id": N                kept in the ticket's fields (a follow-up of closed ticket N)
    POST /api/v2/imports/tickets[.json]        a create (same body, faults, key) whose "status" is kept as sent
    a ticket closed with POST /_control/close  refuses every update: 422 RecordInvalid, details.status
                                               "Status: closed prevents ticket update"
    GET  /api/v2/users/search.json?query=email:ADDR   {"users": [...]} (exact address, case-insensitive)
    POST /api/v2/users/create_or_update.json {"user": {"email", "name", "role"}}   201 made / 200 found;
                                               through the fault plan
"""

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import socket
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, quote, urlsplit

from .desk import ApiRequest, Desk, WriteOutcome, log
from .faults import rejection_for

CONTROL_PREFIX = "/_control/"
UPLOAD_TOKEN_SECONDS = 3600  # Zendesk: "The attachment's token expires after 60 minutes."
CLOSED_TICKET = {
    "error": "RecordInvalid",
    "description": "Record validation errors",
    "details": {"status": [{"description": "Status: closed prevents ticket update"}]},
}
# What a create keeps as it is beside the store's own columns and what becomes people.
NOT_STANDARD_FIELDS = ("comment", "requester", "tags", "custom_fields", "subject", "external_id", "email_ccs")


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
        ("POST", re.compile(r"/api/v2/imports/tickets(?:\.json)?"), "import_ticket", True),
        ("GET", re.compile(r"/api/v2/tickets(?:\.json)?"), "list_tickets", True),
        ("GET", re.compile(r"/api/v2/tickets/show_many(?:\.json)?"), "show_many", True),
        ("GET", re.compile(r"/api/v2/incremental/tickets/cursor(?:\.json)?"), "incremental_tickets", True),
        ("GET", re.compile(r"/api/v2/tickets/(\d+)(?:\.json)?"), "show_ticket", True),
        ("PUT", re.compile(r"/api/v2/tickets/(\d+)(?:\.json)?"), "update_ticket", True),
        ("GET", re.compile(r"/api/v2/tickets/(\d+)/comments(?:\.json)?"), "list_comments", True),
        ("GET", re.compile(r"/api/v2/users/me(?:\.json)?"), "show_me", True),
        ("POST", re.compile(r"/api/v2/uploads(?:\.json)?"), "upload_file", True),
        ("GET", re.compile(r"/api/v2/users/search(?:\.json)?"), "search_users", True),
        ("POST", re.compile(r"/api/v2/users/create_or_update(?:\.json)?"), "create_or_update_user", True),
    ]
    CONTROL_ROUTES = [
        ("GET", re.compile(r"/_control/plan"), "control_get_plan", False),
        ("POST", re.compile(r"/_control/plan"), "control_set_plan", False),
        ("GET", re.compile(r"/_control/idempotency"), "control_get_idempotency", False),
        ("POST", re.compile(r"/_control/idempotency"), "control_set_idempotency", False),
        ("GET", re.compile(r"/_control/search_lag"), "control_get_search_lag", False),
        ("POST", re.compile(r"/_control/search_lag"), "control_set_search_lag", False),
        ("GET", re.compile(r"/_control/clock"), "control_get_clock", False),
        ("POST", re.compile(r"/_control/clock"), "control_advance_clock", False),
        ("POST", re.compile(r"/_control/revoke_sessions"), "control_revoke_sessions", False),
        ("GET", re.compile(r"/_control/tickets"), "control_tickets", False),
        ("GET", re.compile(r"/_control/requests"), "control_requests", False),
        ("GET", re.compile(r"/_control/people"), "control_people", False),
        ("POST", re.compile(r"/_control/close"), "control_close", False),
        ("GET", re.compile(r"/_control/quota"), "control_quota", False),
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

    def import_ticket(self):
        """Zendesk's Ticket Import API: a create whose status (e.g. "closed") is kept as sent; the dates sent
        are kept in the ticket's fields. No triggers run on an import in Zendesk, and none exist here."""

        def do_import(ticket: dict) -> WriteOutcome:
            outcome = self._do_create(ticket)
            if outcome.committed and isinstance(ticket.get("status"), str):
                self.desk.store.set_status(outcome.ticket_id, ticket["status"])
                outcome.body = {"ticket": self.desk.store.ticket(outcome.ticket_id, self._base_url())}
            return outcome

        self._ticket_write("POST", "/api/v2/imports/tickets", do_import)

    def update_ticket(self, ticket_id):
        self._ticket_write(
            "PUT", f"/api/v2/tickets/{ticket_id}.json", lambda ticket: self._do_update(int(ticket_id), ticket)
        )

    def _do_create(self, ticket: dict) -> WriteOutcome:
        store = self.desk.store
        comment = ticket.get("comment") if isinstance(ticket.get("comment"), dict) else {}
        uploads, refusal = self._uploads_of(comment)
        if refusal is not None:
            return refusal
        # Standard fields beside the ones the store has columns for (priority, group_id, type,
        # via_followup_source_id, ...).
        standard = {k: v for k, v in ticket.items() if k not in NOT_STANDARD_FIELDS}
        ticket_id = store.create_ticket({**ticket, "comment": _with_body(comment)}, fields=standard)
        requester = ticket.get("requester") if isinstance(ticket.get("requester"), dict) else {}
        if requester.get("email"):
            store.find_or_create_person(str(requester["email"]), str(requester.get("name") or ""))
            store.add_ticket_person(ticket_id, str(requester["email"]), "requester")
        self._add_email_ccs(ticket_id, ticket.get("email_ccs"))
        first_comment = store.comments(ticket_id)[0]["id"]
        self._attach_uploads(ticket_id, first_comment, uploads, comment)
        body = {"ticket": store.ticket(ticket_id, self._base_url())}
        return WriteOutcome(201, body, committed=True, ticket_id=ticket_id)

    def _do_update(self, ticket_id: int, ticket: dict) -> WriteOutcome:
        store = self.desk.store
        existing = store.ticket(ticket_id, self._base_url())
        if existing is None:
            return WriteOutcome(404, {"error": "RecordNotFound", "description": "Not found"})
        if existing["status"] == "closed":
            return WriteOutcome(422, CLOSED_TICKET)  # Zendesk: a closed ticket takes no update at all
        comment = ticket.get("comment")
        uploads, refusal = self._uploads_of(comment if isinstance(comment, dict) else {})
        if refusal is not None:
            return refusal
        if isinstance(comment, dict):
            ticket = {**ticket, "comment": _with_body(comment)}
        audit = store.add_comment(ticket_id, ticket)
        self._add_email_ccs(ticket_id, ticket.get("email_ccs"))
        if audit["id"] is not None:
            self._attach_uploads(ticket_id, audit["id"], uploads, ticket["comment"])
        body = {"ticket": store.ticket(ticket_id, self._base_url()), "audit": audit}
        return WriteOutcome(200, body, committed=True, ticket_id=ticket_id)

    def _uploads_of(self, comment: dict):
        """(the uploads a comment's tokens name, None), or (None, the 422 Zendesk answers for a token it does not
        know or that expired): checked before anything is written."""
        tokens = comment.get("uploads") or []
        if not isinstance(tokens, list):
            tokens = [tokens]
        uploads = []
        for token in tokens:
            upload = self.desk.store.upload(str(token))
            if upload is None or self.desk.now() - upload["created_epoch"] > UPLOAD_TOKEN_SECONDS:
                return None, WriteOutcome(
                    422,
                    {
                        "error": "RecordInvalid",
                        "description": "Record validation errors",
                        "details": {"uploads": [{"description": "Upload token is invalid or has expired"}]},
                    },
                )
            uploads.append(upload)
        return uploads, None

    def _attach_uploads(self, ticket_id: int, comment_id: int, uploads: list[dict], comment: dict):
        html_body = str(comment.get("html_body") or "")
        for upload in uploads:
            # Zendesk's `inline` is read-only: an image is inline when the HTML shows it.
            inline = self._content_url(upload["token"], upload["filename"]) in html_body
            self.desk.store.add_attachment(
                ticket_id,
                filename=upload["filename"],
                content_type=upload["content_type"],
                size=upload["size"],
                sha256=upload["sha256"],
                inline=inline,
                comment_id=comment_id,
            )

    def _add_email_ccs(self, ticket_id: int, email_ccs):
        store = self.desk.store
        for cc in email_ccs if isinstance(email_ccs, list) else []:
            if not isinstance(cc, dict) or cc.get("action", "put") != "put":
                continue
            if cc.get("user_email"):
                store.find_or_create_person(str(cc["user_email"]), str(cc.get("user_name") or ""))
                store.add_ticket_person(ticket_id, str(cc["user_email"]), "cc")
            elif isinstance(cc.get("user_id"), int) and (person := store.person(person_id=cc["user_id"])):
                store.add_ticket_person(ticket_id, person["email"], "cc")

    def _content_url(self, token: str, filename: str) -> str:
        return f"{self._base_url()}/attachments/token/{token}/?name={quote(filename)}"

    def rejection(self, fault):
        """How this API answers a refusing fault: (status, headers, body) or None. Dialects reshape the body."""
        return rejection_for(fault)

    def invalid_body(self) -> tuple[int, dict]:
        return 400, {"error": "InvalidJSON", "description": 'The body must be {"ticket": {...}}'}

    def _ticket_write(self, method: str, path: str, action, external_id_of=None):
        """One record-writing request, through the fault plan: `action(record) -> WriteOutcome` runs at most
        once per idempotency key (when the API honours one). `external_id_of(record)` names it in the log."""
        fault = self._fault_before_write(method, path)
        if fault is None:
            return
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
        self._answer_write(fault, outcome)

    def _fault_before_write(self, method: str, path: str):
        """The next fault of the plan for a write; None when it has answered already (a refusal, a drop before
        the commit). A stall before the commit happens here."""
        fault = self.desk.plan.next()
        rejection = self.rejection(fault)
        if rejection is not None:
            status, headers, body = rejection
            self._log_write(method, path, fault, WriteOutcome(status, body))
            self._send(status, body, headers)
            return None
        if fault.name == "drop_before_commit":
            self._log_write(method, path, fault, WriteOutcome(0, {}))
            self._drop_connection()
            return None
        if fault.name == "stall_before_commit":
            self.desk.pause(fault.seconds)
        return fault

    def _answer_write(self, fault, outcome: WriteOutcome):
        """The answer to a write that ran, unless the fault loses or delays it."""
        if fault.name == "drop_after_commit":
            self._drop_connection()
            return
        if fault.name == "stall_after_commit":
            self.desk.pause(fault.seconds)
        headers = {"x-idempotency-lookup": outcome.lookup} if outcome.lookup else {}
        self._send(outcome.status, outcome.body, headers)

    # Uploads and users (Zendesk): writes through the fault plan, without an idempotency key.

    def upload_file(self):
        path = "/api/v2/uploads.json"
        fault = self._fault_before_write("POST", path)
        if fault is None:
            return
        filename = (self.query.get("filename") or [""])[0]
        if not filename:
            outcome = WriteOutcome(
                422,
                {
                    "error": "RecordInvalid",
                    "description": "Record validation errors",
                    "details": {"filename": [{"description": "cannot be blank"}]},
                },
            )
        else:
            content_type = (self.headers.get("Content-Type") or "application/octet-stream").split(";")[0].strip()
            token = secrets.token_hex(12)
            with self.desk.store.transaction():
                upload = self.desk.store.add_upload(token, filename, content_type, self.raw_body)
            url = self._content_url(token, filename)
            attachment = {
                "id": int(hashlib.sha256(token.encode()).hexdigest()[:10], 16),
                "url": f"{self._base_url()}/api/v2/attachments/{token}.json",
                "file_name": filename,
                "content_url": url,
                "mapped_content_url": url,
                "content_type": content_type,
                "size": upload["size"],
                "inline": False,
                "deleted": False,
                "thumbnails": [],
            }
            expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(upload["created_epoch"] + UPLOAD_TOKEN_SECONDS))
            outcome = WriteOutcome(
                201,
                {
                    "upload": {
                        "token": token,
                        "expires_at": expires,
                        "attachment": attachment,
                        "attachments": [attachment],
                    }
                },
                committed=True,
            )
        self._log_write("POST", path, fault, outcome)
        self._answer_write(fault, outcome)

    def search_users(self):
        """Zendesk's user search, for the `email:ADDR` query Mailroom sends (exact address, any case)."""
        query = (self.query.get("query") or [""])[0].strip()
        name, _, value = query.partition(":")
        with self.desk.store.transaction():
            person = self.desk.store.person(email=value.strip().strip('"')) if name == "email" and value else None
        users = [] if person is None else [self._user(person)]
        self._send(200, {"users": users, "count": len(users), "next_page": None, "previous_page": None})

    def create_or_update_user(self):
        path = "/api/v2/users/create_or_update.json"
        fault = self._fault_before_write("POST", path)
        if fault is None:
            return
        user = (self._parse_json() or {}).get("user")
        if not isinstance(user, dict) or not isinstance(user.get("email"), str) or not user["email"].strip():
            outcome = WriteOutcome(
                422,
                {
                    "error": "RecordInvalid",
                    "description": "Record validation errors",
                    "details": {"email": [{"description": "Email: cannot be blank"}]},
                },
            )
        else:
            role = user.get("role") if user.get("role") in ("end-user", "agent", "admin") else "end-user"
            with self.desk.store.transaction():
                person_id, created = self.desk.store.find_or_create_person(
                    user["email"], str(user.get("name") or ""), role
                )
                person = self.desk.store.person(person_id=person_id)
            outcome = WriteOutcome(201 if created else 200, {"user": self._user(person)}, committed=True)
        self._log_write("POST", path, fault, outcome)
        self._answer_write(fault, outcome)

    def _user(self, person: dict) -> dict:
        return {
            "id": person["id"],
            "url": f"{self._base_url()}/api/v2/users/{person['id']}.json",
            "name": person["name"],
            "email": person["email"],
            "role": person["role"],
            "active": True,
        }

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
        log.info(
            "fakedesk: %s %s fault=%s status=%s committed=%s lookup=%s ticket=%s",
            method,
            path,
            entry["fault"],
            entry["status"],
            outcome.committed,
            outcome.lookup,
            outcome.ticket_id,
        )

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
        self._send(
            200,
            {
                "tickets": tickets,
                "after_cursor": f"{start}:{last}",
                "before_cursor": None,
                "end_of_stream": end,
                "after_url": None
                if end
                else f"{self._base_url()}/api/v2/incremental/tickets/cursor.json?cursor={start}:{last}",
            },
        )

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

    def control_get_clock(self):
        self._send(200, {"offset_seconds": self.desk.clock_offset})

    def control_advance_clock(self):
        payload = self._json_body()
        if payload is None:
            return
        try:
            offset = self.desk.advance_clock(payload.get("advance_seconds"))
        except ValueError as exc:
            self._send(400, {"error": "BadSettings", "description": str(exc)})
            return
        self._send(200, {"offset_seconds": offset})

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

    def control_quota(self):
        self._send(200, self.desk.quota_report() or {})

    def control_reset(self):
        self.desk.reset()
        self._send(200, {"reset": True})


def _with_body(comment: dict) -> dict:
    """A Zendesk comment as the store keeps it: its html_body is its body when it has no plain one."""
    if not comment.get("body") and isinstance(comment.get("html_body"), str):
        return {**comment, "body": comment["html_body"]}
    return comment

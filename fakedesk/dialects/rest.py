"""FakeDesk speaking a small generic JSON API, the kind a generic REST destination is pointed at.

Endpoints (bearer-token auth on every one):
    POST /records                      create; honours `Idempotency-Key` while the desk's idempotency is
                                       enabled (a replay answers the original); 201 {"data": {"id", ...}}
    PUT  /records/by-ref/<ref>         upsert on the reference: 201 when created, 200 when updated
    GET  /records?ref=<ref>            consistent lookup: 200 {"data": [records, oldest first]}
    GET  /search?ref=<ref>             the same through a search index that lags `search_lag_seconds`
    GET  /records/<id>                 one record; 404 when there is none
    POST /records/<id>/comments        {"body", "public"?}; honours `Idempotency-Key`; 201 {"data": {"id", ...}}
    GET  /health                       {"status": "ok"}

A record is the JSON object sent, plus "id" and "created_at"; the store reads "subject", "description",
"requester": {"email"} and "external_ref" from it. Errors are {"error": {"code", "message", "details"?}}:
401 unauthorized, 404 not_found, 422 validation_failed, 429 rate_limited (Retry-After), 5xx.
"""
import hmac
import re
from urllib.parse import unquote

from fakedesk.desk import WriteOutcome
from fakedesk.faults import rejection_for
from fakedesk.handler import Handler
from fakedesk.store import ValidationFailed

ERROR_CODES = {400: "bad_request", 401: "unauthorized", 404: "not_found", 422: "validation_failed",
               429: "rate_limited", 500: "internal_error", 503: "unavailable"}


def failure(status: int, message: str, details: dict | None = None) -> dict:
    error = {"code": ERROR_CODES.get(status, "error"), "message": message}
    if details is not None:
        error["details"] = details
    return {"error": error}


def store_ticket(record: dict) -> dict:
    requester = record.get("requester") if isinstance(record.get("requester"), dict) else {}
    ticket = {"subject": str(record.get("subject") or ""), "description": record.get("description") or "",
              "external_id": record.get("external_ref")}
    if requester.get("email"):
        ticket["requester"] = {"email": str(requester["email"])}
    return ticket


def record_json(ticket: dict) -> dict:
    return {**ticket["fields"], "id": ticket["id"], "created_at": ticket["created_at"]}


def invalid(exc: ValidationFailed) -> WriteOutcome:
    details = {name: [problem.get("description", "is invalid") for problem in problems]
               for name, problems in exc.details.items()}
    return WriteOutcome(422, failure(422, "The record is invalid", details))


class RestHandler(Handler):
    API_ROUTES = [
        ("POST", re.compile(r"/records"), "create_record", True),
        ("GET", re.compile(r"/records"), "list_records", True),
        ("GET", re.compile(r"/search"), "search_records", True),
        ("PUT", re.compile(r"/records/by-ref/([^/]+)"), "upsert_record", True),
        ("GET", re.compile(r"/records/(\d+)"), "show_record", True),
        ("POST", re.compile(r"/records/(\d+)/comments"), "create_comment", True),
        ("GET", re.compile(r"/health"), "health", True),
    ]
    IDEMPOTENCY_HEADER = "Idempotency-Key"
    PAYLOAD_KEY = None
    UNAUTHENTICATED = (401, failure(401, "Missing or invalid bearer token"))

    def _authenticated(self) -> bool:
        token = self.desk.token
        if not token:
            return True
        scheme, _, value = (self.headers.get("Authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())

    def rejection(self, fault):
        refused = rejection_for(fault)
        if refused is None:
            return None
        status, headers, body = refused
        details = {"requester.email": ["is invalid"]} if status == 422 else None
        return status, headers, failure(status, body.get("description") or body.get("error") or "refused", details)

    def invalid_body(self) -> tuple[int, dict]:
        return 400, failure(400, "The body must be a JSON object")

    # Writes.

    def create_record(self):
        self._ticket_write("POST", "/records", self._create, external_id_of=lambda record: record.get("external_ref"))

    def _create(self, record: dict) -> WriteOutcome:
        try:
            ticket_id = self.desk.store.create_ticket(store_ticket(record), fields=record)
        except ValidationFailed as exc:
            return invalid(exc)
        ticket = self.desk.store.ticket(ticket_id, self._base_url())
        return WriteOutcome(201, {"data": record_json(ticket)}, committed=True, ticket_id=ticket_id)

    def upsert_record(self, quoted_ref):
        ref = unquote(quoted_ref)

        def upsert(record: dict) -> WriteOutcome:
            record = {**record, "external_ref": ref}
            existing = self.desk.store.tickets(self._base_url(), ref)
            if not existing:
                return self._create(record)
            ticket_id = existing[0]["id"]
            self.desk.store.update_fields(ticket_id, store_ticket(record), record)
            ticket = self.desk.store.ticket(ticket_id, self._base_url())
            return WriteOutcome(200, {"data": record_json(ticket)}, committed=True, ticket_id=ticket_id)

        self._ticket_write("PUT", f"/records/by-ref/{quoted_ref}", upsert, external_id_of=lambda record: ref)

    def create_comment(self, record_id):
        def comment(payload: dict) -> WriteOutcome:
            body = {"comment": {"body": payload.get("body"), "public": bool(payload.get("public", True))}}
            try:
                audit = self.desk.store.add_comment(int(record_id), body)
            except ValidationFailed as exc:
                return invalid(exc)
            if audit is None:
                return WriteOutcome(404, failure(404, f"No record {record_id}"))
            data = {"id": audit["id"], "record_id": int(record_id), "body": payload.get("body"),
                    "public": body["comment"]["public"]}
            return WriteOutcome(201, {"data": data}, committed=True, ticket_id=int(record_id))

        self._ticket_write("POST", f"/records/{record_id}/comments", comment, external_id_of=lambda payload: None)

    # Reads.

    def _ref(self) -> str | None:
        return (self.query.get("ref") or [None])[0]

    def list_records(self):
        with self.desk.store.transaction():
            tickets = self.desk.store.tickets(self._base_url(), self._ref())
        self._send(200, {"data": [record_json(t) for t in tickets]})

    def search_records(self):
        ref = self._ref()
        if ref is None:
            self._send(400, failure(400, "ref is required"))
            return
        with self.desk.store.transaction():
            tickets = self.desk.store.search(self._base_url(), ref, self.desk.search_lag_seconds)
        self._send(200, {"data": [record_json(t) for t in tickets]})

    def show_record(self, record_id):
        with self.desk.store.transaction():
            ticket = self.desk.store.ticket(int(record_id), self._base_url())
        if ticket is None:
            self._send(404, failure(404, f"No record {record_id}"))
        else:
            self._send(200, {"data": record_json(ticket)})

    def health(self):
        self._send(200, {"status": "ok"})

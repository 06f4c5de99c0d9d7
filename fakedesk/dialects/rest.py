"""FakeDesk speaking a small generic JSON API, the kind a generic REST destination is pointed at.

Endpoints (bearer-token auth on every one):
    POST /records                      create; honours `Idempotency-Key` while the desk's idempotency is
                                       enabled (a replay answers the original); 201 {"data": {"id", ...}}
    PUT  /records/by-ref/<ref>         upsert on the reference: 201 when created, 200 when updated
    GET  /records?ref=<ref>            consistent lookup: 200 {"data": [records, oldest first]}
    GET  /search?ref=<ref>             the same through a search index that lags `search_lag_seconds`
    GET  /records/<id>                 one record; 404 when there is none
    POST /records/<id>/comments        {"body", "public"?, "author"?, "attachments"?}; honours `Idempotency-Key`;
                                       201 {"data": {"id", ...}}
    POST /records/<id>/attachments     one file {"filename", "content_type", "content_base64", "sha256"?, "key"?};
                                       honours `Idempotency-Key`; 201 {"data": {"id", "filename", "size", "sha256",
                                       "key"}}
    GET  /records/<id>/attachments     its files, `?key=` those with that key: 200 {"data": [files]}
    GET  /health                       {"status": "ok"}

A record is the JSON object sent (without the files' content), plus "id" and "created_at"; the store reads
"subject", "description", "requester": {"email", "name"} (found or made as a person, the record's
requester), "cc" (addresses, or {"email"} objects: the record's CCs) and "external_ref" from it. Files come
inline as "attachments": [{"filename", "content_type", "content_base64", "sha256"?}] (in a create or a comment)
or one per call; each is kept with the sha256 of the bytes received, and a declared sha256 that does not match
them is refused. A comment's "author" (an address, or {"email", "name"}) is who it is written as, "public"
(default true) whether the requester sees it. A record closed by `/_control/close` refuses comments and files
with 409 {"error": {"code": "record_closed"}}.

Errors are {"error": {"code", "message", "details"?}}: 401 unauthorized, 404 not_found, 409 record_closed,
422 validation_failed, 429 rate_limited (Retry-After), 5xx.
"""

import base64
import binascii
import hashlib
import hmac
import re
from urllib.parse import unquote

from fakedesk.desk import WriteOutcome
from fakedesk.faults import rejection_for
from fakedesk.handler import Handler
from fakedesk.store import ValidationFailed

ERROR_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    409: "record_closed",
    422: "validation_failed",
    429: "rate_limited",
    500: "internal_error",
    503: "unavailable",
}
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")


def failure(status: int, message: str, details: dict | None = None) -> dict:
    error = {"code": ERROR_CODES.get(status, "error"), "message": message}
    if details is not None:
        error["details"] = details
    return {"error": error}


def store_ticket(record: dict) -> dict:
    requester = record.get("requester") if isinstance(record.get("requester"), dict) else {}
    ticket = {
        "subject": str(record.get("subject") or ""),
        "description": record.get("description") or "",
        "external_id": record.get("external_ref"),
    }
    if requester.get("email"):
        ticket["requester"] = {"email": str(requester["email"])}
    return ticket


def record_json(ticket: dict) -> dict:
    return {**ticket["fields"], "id": ticket["id"], "created_at": ticket["created_at"]}


def invalid(exc: ValidationFailed) -> WriteOutcome:
    details = {
        name: [problem.get("description", "is invalid") for problem in problems]
        for name, problems in exc.details.items()
    }
    return WriteOutcome(422, failure(422, "The record is invalid", details))


def decoded_file(item, where: str) -> dict:
    """One sent file {"filename", "content_type", "bytes", "key"}; ValidationFailed when it is not one."""
    if not isinstance(item, dict) or not isinstance(item.get("filename"), str) or not item["filename"]:
        raise ValidationFailed({where: [{"description": "needs a filename"}]})
    try:
        data = base64.b64decode(str(item.get("content_base64") or ""), validate=True)
    except (binascii.Error, ValueError):
        raise ValidationFailed({where: [{"description": "content_base64 is not base64"}]}) from None
    declared = item.get("sha256")
    if declared is not None and str(declared).lower() != hashlib.sha256(data).hexdigest():
        raise ValidationFailed({where: [{"description": "sha256 does not match the content"}]})
    return {
        "filename": item["filename"],
        "content_type": str(item.get("content_type") or "application/octet-stream"),
        "bytes": data,
        "key": str(item.get("key") or ""),
    }


def sent_files(payload: dict) -> list[dict]:
    files = payload.get("attachments")
    if files is None:
        return []
    if not isinstance(files, list):
        raise ValidationFailed({"attachments": [{"description": "must be a list of files"}]})
    return [decoded_file(item, f"attachments.{n}") for n, item in enumerate(files)]


def without_content(payload: dict) -> dict:
    """What the record keeps of a payload: its files described, not their content."""
    if not isinstance(payload.get("attachments"), list):
        return payload
    described = [
        {k: v for k, v in item.items() if k != "content_base64"} if isinstance(item, dict) else item
        for item in payload["attachments"]
    ]
    return {**payload, "attachments": described}


def addresses(value) -> list[str]:
    """The CC'd addresses of a record: strings or {"email"} objects."""
    if value is None:
        return []
    items = (
        [item.get("email") if isinstance(item, dict) else item for item in value]
        if isinstance(value, list)
        else [value]
    )
    if any(not isinstance(a, str) or not _EMAIL.fullmatch(a) for a in items):
        raise ValidationFailed({"cc": [{"description": "must be a list of email addresses"}]})
    return items


def author_of(payload: dict) -> tuple[str, str]:
    author = payload.get("author")
    if isinstance(author, dict):
        return str(author.get("email") or ""), str(author.get("name") or "")
    return (author, "") if isinstance(author, str) else ("", "")


def file_json(attachment: dict) -> dict:
    return {
        "id": attachment["id"],
        "filename": attachment["filename"],
        "content_type": attachment["content_type"],
        "size": attachment["size"],
        "sha256": attachment["sha256"],
        "key": attachment["marker"],
    }


class RestHandler(Handler):
    API_ROUTES = [
        ("POST", re.compile(r"/records"), "create_record", True),
        ("GET", re.compile(r"/records"), "list_records", True),
        ("GET", re.compile(r"/search"), "search_records", True),
        ("PUT", re.compile(r"/records/by-ref/([^/]+)"), "upsert_record", True),
        ("GET", re.compile(r"/records/(\d+)"), "show_record", True),
        ("POST", re.compile(r"/records/(\d+)/comments"), "create_comment", True),
        ("POST", re.compile(r"/records/(\d+)/attachments"), "create_attachment", True),
        ("GET", re.compile(r"/records/(\d+)/attachments"), "list_attachments", True),
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
        store = self.desk.store
        try:
            files, cc = sent_files(record), addresses(record.get("cc"))
            ticket_id = store.create_ticket(store_ticket(record), fields=without_content(record))
        except ValidationFailed as exc:
            return invalid(exc)
        requester = record.get("requester") if isinstance(record.get("requester"), dict) else {}
        if requester.get("email"):
            store.find_or_create_person(str(requester["email"]), str(requester.get("name") or ""))
            store.add_ticket_person(ticket_id, str(requester["email"]), "requester")
        for address in cc:
            store.add_ticket_person(ticket_id, address, "cc")
        for file in files:
            store.attach_data(ticket_id, file["filename"], file["content_type"], file["bytes"])
        ticket = store.ticket(ticket_id, self._base_url())
        return WriteOutcome(201, {"data": record_json(ticket)}, committed=True, ticket_id=ticket_id)

    def upsert_record(self, quoted_ref):
        ref = unquote(quoted_ref)

        def upsert(record: dict) -> WriteOutcome:
            record = {**record, "external_ref": ref}
            existing = self.desk.store.tickets(self._base_url(), ref)
            if not existing:
                return self._create(record)
            ticket_id = existing[0]["id"]
            self.desk.store.update_fields(ticket_id, store_ticket(record), without_content(record))
            ticket = self.desk.store.ticket(ticket_id, self._base_url())
            return WriteOutcome(200, {"data": record_json(ticket)}, committed=True, ticket_id=ticket_id)

        self._ticket_write("PUT", f"/records/by-ref/{quoted_ref}", upsert, external_id_of=lambda record: ref)

    def _open_record(self, record_id: int) -> WriteOutcome | None:
        """None when record `record_id` takes writes; else the answer (not found, closed)."""
        ticket = self.desk.store.ticket(record_id, self._base_url())
        if ticket is None:
            return WriteOutcome(404, failure(404, f"No record {record_id}"))
        if ticket["status"] == "closed":
            return WriteOutcome(409, failure(409, f"Record {record_id} is closed"))
        return None

    def create_comment(self, record_id):
        def comment(payload: dict) -> WriteOutcome:
            store = self.desk.store
            refused = self._open_record(int(record_id))
            if refused is not None:
                return refused
            body, public = payload.get("body"), payload.get("public", True) is not False
            try:
                if not isinstance(body, str) or not body.strip():
                    raise ValidationFailed({"body": [{"description": "can't be blank"}]})
                files = sent_files(payload)
            except ValidationFailed as exc:
                return invalid(exc)
            author, name = author_of(payload)
            if author:
                store.find_or_create_person(author, name)
            comment_id = store.insert_comment(int(record_id), body, public=public, author=author)
            for file in files:
                store.attach_data(
                    int(record_id), file["filename"], file["content_type"], file["bytes"], comment_id=comment_id
                )
            data = {"id": comment_id, "record_id": int(record_id), "body": body, "public": public, "author": author}
            return WriteOutcome(201, {"data": data}, committed=True, ticket_id=int(record_id))

        self._ticket_write("POST", f"/records/{record_id}/comments", comment, external_id_of=lambda payload: None)

    def create_attachment(self, record_id):
        def attach(payload: dict) -> WriteOutcome:
            store = self.desk.store
            refused = self._open_record(int(record_id))
            if refused is not None:
                return refused
            try:
                file = decoded_file(payload, "file")
            except ValidationFailed as exc:
                return invalid(exc)
            attachment_id = store.attach_data(
                int(record_id), file["filename"], file["content_type"], file["bytes"], marker=file["key"]
            )
            [stored] = [a for a in store.attachments(int(record_id)) if a["id"] == attachment_id]
            return WriteOutcome(201, {"data": file_json(stored)}, committed=True, ticket_id=int(record_id))

        self._ticket_write("POST", f"/records/{record_id}/attachments", attach, external_id_of=lambda payload: None)

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

    def list_attachments(self, record_id):
        key = (self.query.get("key") or [None])[0]
        with self.desk.store.transaction():
            exists = self.desk.store.ticket(int(record_id), self._base_url()) is not None
            files = [
                file_json(a) for a in self.desk.store.attachments(int(record_id)) if key is None or a["marker"] == key
            ]
        if not exists:
            self._send(404, failure(404, f"No record {record_id}"))
        else:
            self._send(200, {"data": files})

    def health(self):
        self._send(200, {"status": "ok"})

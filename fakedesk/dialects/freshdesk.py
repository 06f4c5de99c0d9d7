"""FakeDesk speaking the Freshdesk API v2 subset Mailroom uses.

    POST /api/v2/tickets                      create a ticket: JSON, or multipart/form-data with attachments[]
                                              (201, fault plan)
    PUT  /api/v2/tickets/{id}                 update a ticket (its status: 2 reopens a closed one; fault plan)
    POST /api/v2/tickets/{id}/notes           add a note: JSON, or multipart with attachments[] (201, fault plan)
    GET  /api/v2/tickets/{id}                 one ticket (`include=requester` adds the requester contact)
    GET  /api/v2/tickets/{id}/conversations   its notes (after the description)
    GET  /api/v2/contacts?email=              the contacts with that address (a list)
    GET  /api/v2/search/tickets?query="..."   the filter API, lagging by `search_lag_seconds`
    GET  /api/v2/ticket_fields                the ticket fields (defaults, cf_mailroom_ref, cf_product)

People: a create finds or makes the contact for `email` (with `name`) and makes it the requester; `cc_emails`
are kept on the ticket (as Freshdesk does, no contact is made for them). A note's `user_id` must be a contact:
the note is written as it. Files (multipart `attachments[]`, parsed with the standard library's email parser)
are kept with the sha256 of the bytes received; all of a ticket's attachments together may not pass 20 MB.
A ticket closed by `/_control/close` reads as status 5 (Closed); a note is still taken, as the API does, and
`PUT {"status": 2}` reopens it.

Validation as Freshdesk answers it: 400 {"description": "Validation failed", "errors": [{field, message,
code}]} for a bad email, priority (1-4), status (2-5), source, type (its choices), group_id / responder_id
(groups 101 Billing, 102 Technical, 103 Refunds; agents 201, 202), a custom field that does not exist,
a tag with a comma, a cc_emails entry that is no address, a user_id that is no contact, or attachments past
20 MB. The search parses leniently: one `<field>:'<value>'` clause (quotes around the
whole query optional), where the field is a custom field named with or without its cf_ prefix; the index
sees a ticket `search_lag_seconds` after its create (it indexes cf_mailroom_ref).

Auth: basic `<api key>:<anything>` (`Desk.token` is the key); 401 {"code": "invalid_credentials"}.
"""

import base64
import binascii
import hmac
import html
import re
import time
from email.parser import BytesParser
from email.policy import HTTP
from urllib.parse import unquote

from ..desk import WriteOutcome
from ..faults import rejection_for
from ..handler import Handler

REFERENCE_FIELD = "cf_mailroom_ref"
CUSTOM_FIELDS = {REFERENCE_FIELD: "Mailroom reference", "cf_product": "Product"}
TYPES = ("Question", "Incident", "Problem", "Feature Request", "Refund")
GROUPS = {101: "Billing", 102: "Technical", 103: "Refunds"}
AGENTS = {201: "Alice Agent", 202: "Bob Agent"}
STANDARD = (
    "subject",
    "description",
    "email",
    "name",
    "status",
    "priority",
    "source",
    "tags",
    "type",
    "group_id",
    "responder_id",
    "custom_fields",
    "cc_emails",
    "due_by",
    "fr_due_by",
    "product_id",
    "company_id",
    "attachments",
)
# What a form field's text becomes (Freshdesk's parameters are typed; a form sends text).
INTEGER_FIELDS = (
    "status",
    "priority",
    "source",
    "group_id",
    "responder_id",
    "product_id",
    "company_id",
    "user_id",
    "email_config_id",
    "requester_id",
)
BOOLEAN_FIELDS = ("private", "incoming")
FORM_FIELD = re.compile(r"(\w+)(?:\[(\w*)\])?")
MAX_ATTACHMENT_BYTES = 20 * 1024 * 1024  # all of a ticket's attachments together
STATUS_CLOSED = 5
# Who a note without a user_id is written as: the agent whose API key made the call.
API_AGENT_ID = 201
CLAUSE = re.compile(r"""(\w+)\s*:\s*(?:'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)")""")
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")


def validation_failed(*errors: tuple[str, str, str]) -> dict:
    return {
        "description": "Validation failed",
        "errors": [{"field": field, "message": message, "code": code} for field, message, code in errors],
    }


def html_to_text(body: str) -> str:
    """Freshdesk's *_text twin of an HTML body."""
    return html.unescape(re.sub(r"<[^>]+>", "", re.sub(r"<br\s*/?>", "\n", body or "")))


def form_text(name: str, text: str):
    if name in INTEGER_FIELDS and text.isdigit():
        return int(text)
    if name in BOOLEAN_FIELDS and text in ("true", "false"):
        return text == "true"
    return text


def form_name(text: str) -> str:
    """A name or filename as Rails reads it: percent-escapes (%22 for a quote, as browsers send it) decoded when
    every "%" in it starts one."""
    if "%" in text and all(re.fullmatch(r"%[0-9A-Fa-f]{2}", found) for found in re.findall(r"%.?.?", text)):
        return unquote(text)
    return text


def parse_form(content_type: str, body: bytes) -> dict | None:
    """A multipart/form-data body as the record Freshdesk reads from it (`name[]` a list, `name[key]` an object),
    each file of `attachments[]` as {"filename", "content_type", "data" (base64)}; None when it is no form."""
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        return None
    record: dict = {}
    for part in message.iter_parts():
        match = FORM_FIELD.fullmatch(form_name(part.get_param("name", header="content-disposition") or ""))
        if match is None:
            return None
        name, key = match.group(1), match.group(2)
        data = part.get_payload(decode=True) or b""
        if part.get_filename() is not None:
            value = {
                "filename": form_name(part.get_filename()),
                "content_type": part.get_content_type(),
                "data": base64.b64encode(data).decode(),
            }
        else:
            value = form_text(name, data.decode(part.get_content_charset() or "utf-8", "replace"))
        if key is None:
            record[name] = value
        elif key == "":
            record.setdefault(name, []).append(value)
        else:
            record.setdefault(name, {})[key] = value
    return record


def received_files(record: dict) -> list[dict]:
    """The files of a record's `attachments`, decoded ({"filename", "content_type", "bytes"})."""
    return [
        {"filename": f["filename"], "content_type": f["content_type"], "bytes": base64.b64decode(f["data"])}
        for f in record.get("attachments") or []
    ]


def attachment_problems(record: dict, already: int = 0) -> list[tuple[str, str, str]]:
    files = record.get("attachments")
    if files is None:
        return []
    if not isinstance(files, list) or any(not isinstance(f, dict) or "data" not in f for f in files):
        return [("attachments", "It should be a/an Array of files sent as multipart/form-data", "datatype_mismatch")]
    if already + sum(len(f["bytes"]) for f in received_files(record)) > MAX_ATTACHMENT_BYTES:
        return [("attachments", "The cumulative attachment size cannot exceed 20MB", "invalid_size")]
    return []


def _one_of(values) -> str:
    return "It should be one of these values: '" + ",".join(map(str, values)) + "'"


def ticket_problems(record: dict) -> list[tuple[str, str, str]]:
    """What Freshdesk would refuse in a create, as (field, message, code)."""
    problems = [
        (name, "Unexpected/invalid field in request", "invalid_field") for name in record if name not in STANDARD
    ]
    address = record.get("email")
    if address is None:
        problems.append(
            (
                "requester_id",
                "Please fill at least 1 of requester_id, phone, email, twitter_id, "
                "unique_external_id, facebook_id fields",
                "missing_field",
            )
        )
    elif not isinstance(address, str) or not _EMAIL.fullmatch(address):
        problems.append(("email", "It should be in the 'valid email address' format", "invalid_value"))
    for name in ("subject", "description"):
        if not isinstance(record.get(name), str) or not record[name].strip():
            problems.append((name, "It should not be blank as this is a mandatory field", "missing_field"))
    checks = (
        ("priority", (1, 2, 3, 4)),
        ("status", (2, 3, 4, 5)),
        ("source", (1, 2, 3, 5, 6, 7, 9, 10)),
        ("type", TYPES),
        ("group_id", tuple(GROUPS)),
        ("responder_id", tuple(AGENTS)),
    )
    for name, allowed in checks:
        if name in record and record[name] not in allowed:
            problems.append((name, _one_of(allowed), "invalid_value"))
    tags = record.get("tags", [])
    if not isinstance(tags, list) or any(not isinstance(t, str) or "," in t for t in tags):
        problems.append(("tags", "It should be a list of strings without commas", "invalid_value"))
    custom = record.get("custom_fields", {})
    if not isinstance(custom, dict):
        problems.append(("custom_fields", "It should be a/an key/value pair", "datatype_mismatch"))
    else:
        problems += [
            (name, "Unexpected/invalid field in request", "invalid_field")
            for name in custom
            if name not in CUSTOM_FIELDS
        ]
    cc = record.get("cc_emails", [])
    if not isinstance(cc, list) or any(not isinstance(a, str) or not _EMAIL.fullmatch(a) for a in cc):
        problems.append(
            ("cc_emails", "It should contain elements that are in the 'valid email address' format", "invalid_value")
        )
    return problems + attachment_problems(record)


class FreshdeskHandler(Handler):
    API_ROUTES = [
        ("POST", re.compile(r"/api/v2/tickets"), "create_ticket", True),
        ("PUT", re.compile(r"/api/v2/tickets/(\d+)"), "update_ticket", True),
        ("POST", re.compile(r"/api/v2/tickets/(\d+)/notes"), "add_note", True),
        ("GET", re.compile(r"/api/v2/tickets/(\d+)"), "show_ticket", True),
        ("GET", re.compile(r"/api/v2/contacts"), "list_contacts", True),
        ("GET", re.compile(r"/api/v2/tickets/(\d+)/conversations"), "list_conversations", True),
        ("GET", re.compile(r"/api/v2/search/tickets"), "search_tickets", True),
        ("GET", re.compile(r"/api/v2/ticket_fields"), "ticket_fields", True),
    ]
    IDEMPOTENCY_HEADER = None  # Freshdesk has no idempotency key
    PAYLOAD_KEY = None
    UNAUTHENTICATED = (
        401,
        {"code": "invalid_credentials", "message": "You have to be logged in to perform this action."},
    )

    def _authenticated(self) -> bool:
        token = self.desk.token
        if not token:
            return True
        scheme, _, encoded = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            key = base64.b64decode(encoded, validate=True).decode().partition(":")[0]
        except (binascii.Error, UnicodeDecodeError):
            return False
        return hmac.compare_digest(key.encode(), token.encode())

    def rejection(self, fault):
        refusal = rejection_for(fault)
        if refusal is None:
            return None
        status, headers, _ = refusal
        if status == 422:  # Freshdesk answers invalid fields with 400
            return (
                400,
                headers,
                validation_failed(("email", "It should be in the 'valid email address' format", "invalid_value")),
            )
        if status == 401:
            return self.UNAUTHENTICATED[0], headers, self.UNAUTHENTICATED[1]
        if status == 429:
            return status, headers, {"code": "rate_limit_exceeded", "message": "You have exceeded the API limit"}
        return status, headers, {"code": "internal_error", "message": "We're sorry, but something went wrong."}

    def invalid_body(self):
        return 400, validation_failed(("body", "It should be a JSON object", "invalid_json"))

    def _parse_json(self) -> dict | None:
        """The request's record: a JSON object, or a multipart/form-data form (files and all)."""
        content_type = self.headers.get("Content-Type") or ""
        if content_type.lower().startswith("multipart/form-data"):
            return parse_form(content_type, self.raw_body)
        return super()._parse_json()

    # --- Writes ---------------------------------------------------------------

    def create_ticket(self):
        self._ticket_write(
            "POST",
            "/api/v2/tickets",
            self._do_create,
            external_id_of=lambda record: (
                (record.get("custom_fields") or {}).get(REFERENCE_FIELD)
                if isinstance(record.get("custom_fields"), dict)
                else None
            ),
        )

    def _do_create(self, record: dict) -> WriteOutcome:
        problems = ticket_problems(record)
        if problems:
            return WriteOutcome(400, validation_failed(*problems))
        store = self.desk.store
        reference = record.get("custom_fields", {}).get(REFERENCE_FIELD)
        ticket_id = store.create_ticket(
            {
                "subject": record["subject"],
                "description": record["description"],
                "tags": record.get("tags") or [],
                "external_id": None if reference is None else str(reference),
                "requester": {"email": record["email"]},
            },
            fields={name: value for name, value in record.items() if name != "attachments"},
        )
        store.find_or_create_person(record["email"], record.get("name") or "")
        store.add_ticket_person(ticket_id, record["email"], "requester")
        for address in record.get("cc_emails") or []:
            store.add_ticket_person(ticket_id, address, "cc")
        for file in received_files(record):
            store.attach_data(ticket_id, file["filename"], file["content_type"], file["bytes"])
        return WriteOutcome(201, self._ticket(ticket_id), committed=True, ticket_id=ticket_id)

    def update_ticket(self, ticket_id):
        self._ticket_write(
            "PUT",
            f"/api/v2/tickets/{ticket_id}",
            lambda record: self._do_update(int(ticket_id), record),
            external_id_of=lambda record: None,
        )

    def _do_update(self, ticket_id: int, record: dict) -> WriteOutcome:
        store = self.desk.store
        if store.ticket(ticket_id, self._base_url()) is None:
            return WriteOutcome(404, {})
        allowed = ("status", "priority", "group_id", "responder_id", "type", "tags")
        problems = [
            (name, "Unexpected/invalid field in request", "invalid_field") for name in record if name not in allowed
        ]
        problems += [
            p
            for p in ticket_problems({"email": "x@example.com", "subject": "x", "description": "x", **record})
            if p[0] in allowed
        ]
        if problems:
            return WriteOutcome(400, validation_failed(*problems))
        store.update_fields(ticket_id, {}, record)
        if "status" in record:
            store.set_status(ticket_id, "closed" if record["status"] == STATUS_CLOSED else "open")
        return WriteOutcome(200, self._ticket(ticket_id), committed=True, ticket_id=ticket_id)

    def add_note(self, ticket_id):
        self._ticket_write(
            "POST",
            f"/api/v2/tickets/{ticket_id}/notes",
            lambda record: self._do_note(int(ticket_id), record),
            external_id_of=lambda record: None,
        )

    def _do_note(self, ticket_id: int, record: dict) -> WriteOutcome:
        store = self.desk.store
        if store.ticket(ticket_id, self._base_url()) is None:
            return WriteOutcome(404, {})
        body = record.get("body")
        if not isinstance(body, str) or not body.strip():
            return WriteOutcome(
                400, validation_failed(("body", "It should not be blank as this is a mandatory field", "missing_field"))
            )
        user_id = record.get("user_id")
        author = store.person(person_id=user_id) if isinstance(user_id, int) and not isinstance(user_id, bool) else None
        if user_id is not None and author is None:
            return WriteOutcome(
                400, validation_failed(("user_id", "There is no contact matching the given user_id", "invalid_value"))
            )
        already = sum(a["size"] for a in store.attachments(ticket_id))
        problems = attachment_problems(record, already)
        if problems:
            return WriteOutcome(400, validation_failed(*problems))
        # The API takes a note on a closed ticket too (it stays closed).
        private, incoming = record.get("private", True) is not False, record.get("incoming") is True
        note_id = store.insert_comment(
            ticket_id, body, public=not private, author_id=user_id if author else None, metadata={"incoming": incoming}
        )
        for file in received_files(record):
            store.attach_data(ticket_id, file["filename"], file["content_type"], file["bytes"], comment_id=note_id)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        note = {
            "id": note_id,
            "ticket_id": ticket_id,
            "body": body,
            "body_text": html_to_text(body),
            "private": private,
            "incoming": incoming,
            "user_id": user_id if author else API_AGENT_ID,
            "support_email": None,
            "to_emails": [],
            "attachments": self._attachments(ticket_id, note_id),
            "created_at": now,
            "updated_at": now,
        }
        return WriteOutcome(201, note, committed=True, ticket_id=ticket_id)

    # --- Reads ----------------------------------------------------------------

    def _attachments(self, ticket_id: int, comment_id: int | None) -> list[dict]:
        return [
            {
                "id": a["id"],
                "name": a["filename"],
                "content_type": a["content_type"],
                "size": a["size"],
                "attachment_url": f"{self._base_url()}/attachments/{a['id']}",
                "created_at": a["created_at"],
                "updated_at": a["created_at"],
            }
            for a in self.desk.store.attachments(ticket_id)
            if a["comment_id"] == comment_id
        ]

    def _ticket(self, ticket_id: int, include: str = "") -> dict | None:
        store = self.desk.store
        stored = store.ticket(ticket_id, self._base_url())
        if stored is None:
            return None
        record = stored["fields"]
        email = record.get("email") or ""
        contact = store.person(email=email) or {}
        people = store.ticket_people(ticket_id)
        ticket = {
            "id": stored["id"],
            "subject": stored["subject"],
            "description": stored["description"],
            "description_text": html_to_text(stored["description"]),
            "requester_id": contact.get("id"),
            "priority": record.get("priority", 1),
            "status": STATUS_CLOSED if stored["status"] == "closed" else record.get("status", 2),
            "source": record.get("source", 2),
            "type": record.get("type"),
            "group_id": record.get("group_id"),
            "responder_id": record.get("responder_id"),
            "tags": stored["tags"],
            "custom_fields": {**dict.fromkeys(CUSTOM_FIELDS), **record.get("custom_fields", {})},
            "cc_emails": people["cc"],
            "fwd_emails": [],
            "reply_cc_emails": people["cc"],
            "attachments": self._attachments(ticket_id, None),
            "is_escalated": False,
            "spam": False,
            "created_at": stored["created_at"],
            "updated_at": stored["updated_at"],
        }
        if include == "requester" and contact:
            ticket["requester"] = {
                "id": contact["id"],
                "name": contact["name"],
                "email": contact["email"],
                "mobile": None,
                "phone": None,
            }
        return ticket

    def show_ticket(self, ticket_id):
        with self.desk.store.transaction():
            ticket = self._ticket(int(ticket_id), include=(self.query.get("include") or [""])[0])
        if ticket is None:
            self._send(404, {})
        else:
            self._send(200, ticket)

    def list_conversations(self, ticket_id):
        with self.desk.store.transaction():
            exists = self._ticket(int(ticket_id)) is not None
            comments = self.desk.store.comments(int(ticket_id))[1:] if exists else []  # the first: the description
            files = {c["id"]: self._attachments(int(ticket_id), c["id"]) for c in comments}
        if not exists:
            self._send(404, {})
            return
        self._send(
            200,
            [
                {
                    "id": c["id"],
                    "body": c["body"],
                    "body_text": html_to_text(c["body"]),
                    "private": not c["public"],
                    "incoming": bool(c["metadata"]["custom"].get("incoming")),
                    "user_id": c["author_id"] if c["author_id"] is not None else API_AGENT_ID,
                    "attachments": files[c["id"]],
                    "created_at": c["created_at"],
                }
                for c in comments
            ],
        )

    def list_contacts(self):
        wanted = (self.query.get("email") or [None])[0]
        with self.desk.store.transaction():
            people = [
                p
                for p in self.desk.store.people()
                if p["role"] == "end-user" and (wanted is None or p["email"].lower() == wanted.strip().lower())
            ]
        self._send(
            200,
            [
                {
                    "id": p["id"],
                    "name": p["name"],
                    "email": p["email"],
                    "active": False,
                    "created_at": p["created_at"],
                    "updated_at": p["created_at"],
                }
                for p in people
            ],
        )

    def search_tickets(self):
        query = (self.query.get("query") or [""])[0].strip()
        if query.startswith('"') and query.endswith('"') and len(query) > 1:
            query = query[1:-1]
        match = CLAUSE.search(query)
        if match is None:
            self._send(400, validation_failed(("query", "Invalid query: expected field:'value'", "invalid_value")))
            return
        field = match.group(1) if match.group(1).startswith("cf_") else f"cf_{match.group(1)}"
        if field not in CUSTOM_FIELDS:
            self._send(400, validation_failed((match.group(1), "It is not a valid ticket field", "invalid_field")))
            return
        wanted = re.sub(r"\\(.)", r"\1", match.group(2) if match.group(2) is not None else match.group(3))
        with self.desk.store.transaction():
            found = self.desk.store.search(self._base_url(), wanted, self.desk.search_lag_seconds)
            results = [
                self._ticket(t["id"]) for t in found if (t["fields"].get("custom_fields") or {}).get(field) == wanted
            ]
        self._send(200, {"results": results[:30], "total": len(results)})

    def ticket_fields(self):
        defaults = [
            ("requester", "Search a requester", "default_requester"),
            ("subject", "Subject", "default_subject"),
            ("ticket_type", "Type", "default_ticket_type"),
            ("source", "Source", "default_source"),
            ("status", "Status", "default_status"),
            ("priority", "Priority", "default_priority"),
            ("group", "Group", "default_group"),
            ("agent", "Agent", "default_agent"),
            ("description", "Description", "default_description"),
        ]
        fields = [
            {
                "id": 1 + position,
                "name": name,
                "label": label,
                "type": kind,
                "default": True,
                "position": 1 + position,
                "required_for_agents": name in ("requester", "subject"),
            }
            for position, (name, label, kind) in enumerate(defaults)
        ]
        fields += [
            {
                "id": 100 + position,
                "name": name,
                "label": label,
                "type": "custom_text",
                "default": False,
                "position": len(defaults) + 1 + position,
                "required_for_agents": False,
            }
            for position, (name, label) in enumerate(CUSTOM_FIELDS.items())
        ]
        self._send(200, fields)

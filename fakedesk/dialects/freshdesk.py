"""FakeDesk speaking the Freshdesk API v2 subset Mailroom uses.

    POST /api/v2/tickets                      create a ticket (201, fault plan)
    POST /api/v2/tickets/{id}/notes           add a note (201, fault plan)
    GET  /api/v2/tickets/{id}                 one ticket
    GET  /api/v2/tickets/{id}/conversations   its notes (after the description)
    GET  /api/v2/search/tickets?query="..."   the filter API, lagging by `search_lag_seconds`
    GET  /api/v2/ticket_fields                the ticket fields (defaults, cf_mailroom_ref, cf_product)

Validation as Freshdesk answers it: 400 {"description": "Validation failed", "errors": [{field, message,
code}]} for a bad email, priority (1-4), status (2-5), source, type (its choices), group_id / responder_id
(groups 101 Billing, 102 Technical, 103 Refunds; agents 201, 202), a custom field that does not exist,
or a tag with a comma. The search parses leniently: one `<field>:'<value>'` clause (quotes around the
whole query optional), where the field is a custom field named with or without its cf_ prefix; the index
sees a ticket `search_lag_seconds` after its create (it indexes cf_mailroom_ref).

Auth: basic `<api key>:<anything>` (`Desk.token` is the key); 401 {"code": "invalid_credentials"}.
"""
import base64
import binascii
import hashlib
import hmac
import html
import re
import time

from ..desk import WriteOutcome
from ..faults import rejection_for
from ..handler import Handler

REFERENCE_FIELD = "cf_mailroom_ref"
CUSTOM_FIELDS = {REFERENCE_FIELD: "Mailroom reference", "cf_product": "Product"}
TYPES = ("Question", "Incident", "Problem", "Feature Request", "Refund")
GROUPS = {101: "Billing", 102: "Technical", 103: "Refunds"}
AGENTS = {201: "Alice Agent", 202: "Bob Agent"}
STANDARD = ("subject", "description", "email", "name", "status", "priority", "source", "tags", "type", "group_id",
            "responder_id", "custom_fields", "cc_emails", "due_by", "fr_due_by", "product_id", "company_id")
CLAUSE = re.compile(r"""(\w+)\s*:\s*(?:'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)")""")
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")


def validation_failed(*errors: tuple[str, str, str]) -> dict:
    return {"description": "Validation failed",
            "errors": [{"field": field, "message": message, "code": code} for field, message, code in errors]}


def html_to_text(body: str) -> str:
    """Freshdesk's *_text twin of an HTML body."""
    return html.unescape(re.sub(r"<[^>]+>", "", re.sub(r"<br\s*/?>", "\n", body or "")))


def _one_of(values) -> str:
    return "It should be one of these values: '" + ",".join(map(str, values)) + "'"


def ticket_problems(record: dict) -> list[tuple[str, str, str]]:
    """What Freshdesk would refuse in a create, as (field, message, code)."""
    problems = [(name, "Unexpected/invalid field in request", "invalid_field") for name in record
                if name not in STANDARD]
    address = record.get("email")
    if address is None:
        problems.append(("requester_id", "Please fill at least 1 of requester_id, phone, email, twitter_id, "
                                         "unique_external_id, facebook_id fields", "missing_field"))
    elif not isinstance(address, str) or not _EMAIL.fullmatch(address):
        problems.append(("email", "It should be in the 'valid email address' format", "invalid_value"))
    for name in ("subject", "description"):
        if not isinstance(record.get(name), str) or not record[name].strip():
            problems.append((name, "It should not be blank as this is a mandatory field", "missing_field"))
    checks = (("priority", (1, 2, 3, 4)), ("status", (2, 3, 4, 5)), ("source", (1, 2, 3, 5, 6, 7, 9, 10)),
              ("type", TYPES), ("group_id", tuple(GROUPS)), ("responder_id", tuple(AGENTS)))
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
        problems += [(name, "Unexpected/invalid field in request", "invalid_field") for name in custom
                     if name not in CUSTOM_FIELDS]
    return problems


class FreshdeskHandler(Handler):
    API_ROUTES = [
        ("POST", re.compile(r"/api/v2/tickets"), "create_ticket", True),
        ("POST", re.compile(r"/api/v2/tickets/(\d+)/notes"), "add_note", True),
        ("GET", re.compile(r"/api/v2/tickets/(\d+)"), "show_ticket", True),
        ("GET", re.compile(r"/api/v2/tickets/(\d+)/conversations"), "list_conversations", True),
        ("GET", re.compile(r"/api/v2/search/tickets"), "search_tickets", True),
        ("GET", re.compile(r"/api/v2/ticket_fields"), "ticket_fields", True),
    ]
    IDEMPOTENCY_HEADER = None  # Freshdesk has no idempotency key
    PAYLOAD_KEY = None
    UNAUTHENTICATED = (401, {"code": "invalid_credentials",
                             "message": "You have to be logged in to perform this action."})

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
            return 400, headers, validation_failed(
                ("email", "It should be in the 'valid email address' format", "invalid_value"))
        if status == 401:
            return self.UNAUTHENTICATED[0], headers, self.UNAUTHENTICATED[1]
        if status == 429:
            return status, headers, {"code": "rate_limit_exceeded", "message": "You have exceeded the API limit"}
        return status, headers, {"code": "internal_error", "message": "We're sorry, but something went wrong."}

    def invalid_body(self):
        return 400, validation_failed(("body", "It should be a JSON object", "invalid_json"))

    # --- Writes ---------------------------------------------------------------

    def create_ticket(self):
        self._ticket_write("POST", "/api/v2/tickets", self._do_create,
                           external_id_of=lambda record: (record.get("custom_fields") or {}).get(REFERENCE_FIELD)
                           if isinstance(record.get("custom_fields"), dict) else None)

    def _do_create(self, record: dict) -> WriteOutcome:
        problems = ticket_problems(record)
        if problems:
            return WriteOutcome(400, validation_failed(*problems))
        reference = record.get("custom_fields", {}).get(REFERENCE_FIELD)
        ticket_id = self.desk.store.create_ticket(
            {"subject": record["subject"], "description": record["description"], "tags": record.get("tags") or [],
             "external_id": None if reference is None else str(reference), "requester": {"email": record["email"]}},
            fields={**record})
        return WriteOutcome(201, self._ticket(ticket_id), committed=True, ticket_id=ticket_id)

    def add_note(self, ticket_id):
        self._ticket_write("POST", f"/api/v2/tickets/{ticket_id}/notes",
                           lambda record: self._do_note(int(ticket_id), record), external_id_of=lambda record: None)

    def _do_note(self, ticket_id: int, record: dict) -> WriteOutcome:
        if self.desk.store.ticket(ticket_id, self._base_url()) is None:
            return WriteOutcome(404, {})
        body = record.get("body")
        if not isinstance(body, str) or not body.strip():
            return WriteOutcome(400, validation_failed(
                ("body", "It should not be blank as this is a mandatory field", "missing_field")))
        private, incoming = record.get("private", True) is not False, record.get("incoming") is True
        audit = self.desk.store.add_comment(ticket_id, {"comment": {"body": body, "public": not private},
                                                        "metadata": {"incoming": incoming}})
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        note = {"id": audit["id"], "ticket_id": ticket_id, "body": body, "body_text": html_to_text(body),
                "private": private, "incoming": incoming, "user_id": 201, "support_email": None, "to_emails": [],
                "attachments": [], "created_at": now, "updated_at": now}
        return WriteOutcome(201, note, committed=True, ticket_id=ticket_id)

    # --- Reads ----------------------------------------------------------------

    def _ticket(self, ticket_id: int) -> dict | None:
        stored = self.desk.store.ticket(ticket_id, self._base_url())
        if stored is None:
            return None
        record = stored["fields"]
        email = record.get("email") or ""
        return {
            "id": stored["id"], "subject": stored["subject"], "description": stored["description"],
            "description_text": html_to_text(stored["description"]),
            # A stable contact id per address, as Freshdesk finds or creates the contact.
            "requester_id": 1000 + int(hashlib.sha256(email.encode()).hexdigest()[:6], 16),
            "priority": record.get("priority", 1), "status": record.get("status", 2), "source": record.get("source", 2),
            "type": record.get("type"), "group_id": record.get("group_id"), "responder_id": record.get("responder_id"),
            "tags": stored["tags"],
            "custom_fields": {**dict.fromkeys(CUSTOM_FIELDS), **record.get("custom_fields", {})},
            "cc_emails": [], "fwd_emails": [], "reply_cc_emails": [], "attachments": [], "is_escalated": False,
            "spam": False, "created_at": stored["created_at"], "updated_at": stored["updated_at"],
        }

    def show_ticket(self, ticket_id):
        with self.desk.store.transaction():
            ticket = self._ticket(int(ticket_id))
        if ticket is None:
            self._send(404, {})
        else:
            self._send(200, ticket)

    def list_conversations(self, ticket_id):
        with self.desk.store.transaction():
            exists = self._ticket(int(ticket_id)) is not None
            comments = self.desk.store.comments(int(ticket_id))[1:] if exists else []  # the first: the description
        if not exists:
            self._send(404, {})
            return
        self._send(200, [{"id": c["id"], "body": c["body"], "body_text": html_to_text(c["body"]),
                          "private": not c["public"], "incoming": bool(c["metadata"]["custom"].get("incoming")),
                          "created_at": c["created_at"]} for c in comments])

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
            results = [self._ticket(t["id"]) for t in found
                       if (t["fields"].get("custom_fields") or {}).get(field) == wanted]
        self._send(200, {"results": results[:30], "total": len(results)})

    def ticket_fields(self):
        defaults = [("requester", "Search a requester", "default_requester"), ("subject", "Subject", "default_subject"),
                    ("ticket_type", "Type", "default_ticket_type"), ("source", "Source", "default_source"),
                    ("status", "Status", "default_status"), ("priority", "Priority", "default_priority"),
                    ("group", "Group", "default_group"), ("agent", "Agent", "default_agent"),
                    ("description", "Description", "default_description")]
        fields = [{"id": 1 + position, "name": name, "label": label, "type": kind, "default": True,
                   "position": 1 + position, "required_for_agents": name in ("requester", "subject")}
                  for position, (name, label, kind) in enumerate(defaults)]
        fields += [{"id": 100 + position, "name": name, "label": label, "type": "custom_text", "default": False,
                    "position": len(defaults) + 1 + position, "required_for_agents": False}
                   for position, (name, label) in enumerate(CUSTOM_FIELDS.items())]
        self._send(200, fields)

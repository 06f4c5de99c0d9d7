"""FakeDesk speaking ServiceNow: the Table API and the Import Set API, over the shared store.

Endpoints (`/api/now/v1/...` and `/api/now/v2/...` work as well):
    POST  /api/now/table/<table>             create; 201 {"result": {"sys_id", "number", ...}}
    GET   /api/now/table/<table>             query: sysparm_query (field=, !=, STARTSWITH, IN, >=, <=,
                                             ORDERBY, ORDERBYDESC; "^^" a literal caret), sysparm_fields,
                                             sysparm_limit, sysparm_offset; 200 {"result": [...]}
    GET   /api/now/table/<table>/<sys_id>    one record; 404 "No Record found"
    PATCH /api/now/table/<table>/<sys_id>    update (PUT too); `comments` / `work_notes` add a journal entry
                                             (public / internal, written as the authenticated user); an
                                             inactive record (Closed, Canceled) refuses it: 403 "Operation
                                             Failed", as the baseline write ACL on closed incidents does
    GET   /api/now/table/sys_user            the store's people as users (query on email, sys_id, ...)
    POST  /api/now/table/sys_user            a new user ({"user_name", "email", "first_name", "last_name"});
                                             403 when the user_name is taken (its unique index)
    GET   /api/now/table/sys_watermark       each record's watermark: number, source_table, source_id
    POST  /api/now/attachment/file?table_name=&table_sys_id=&file_name=   the raw bytes as one attachment
                                             (201 its metadata, fault plan); 403 on an inactive record
    GET   /api/now/attachment                attachments' metadata (sysparm_query on table_sys_id, file_name,
                                             ...), with size_bytes and the SHA-256 `hash`
    POST  /api/now/import/<staging table>    insert a row; the transform map (`u_<field>` -> `<field>` on
                                             `IMPORT_TARGET`) coalesces on `COALESCE_FIELD`: 201 {"import_set",
                                             "staging_table", "result": [{"transform_map", "table", "status":
                                             "inserted" | "updated" | "skipped" | "error", "sys_id", ...}]}

Tables: the standard ones (incident, problem, ...) and any "u_" / "x_" name; another is answered
400 "Invalid table <name>". Errors are `{"error": {"message", "detail"}, "status": "failure"}`.
Auth: basic (any user, the desk token as password) or `Bearer <desk token>`. Every create, import,
update and attachment goes through the fault plan and the request log; users do not (the plan is
about records and their files). ServiceNow has no idempotency key. Reads are consistent.
A record's `caller_id` and `watch_list` (sys_ids of users, or addresses) are its people in the store's
view: requester and CCs. POST /_control/close makes a record Closed (state 7, inactive).
"""

import base64
import binascii
import hmac
import re

from fakedesk.desk import WriteOutcome
from fakedesk.faults import rejection_for
from fakedesk.handler import Handler
from fakedesk.store import ValidationFailed

from . import servicenow_records as records

TABLE = r"/api/now/(?:v[12]/)?table/([A-Za-z0-9_]+)"
JOURNAL_FIELDS = ("comments", "work_notes")


class ServiceNowHandler(Handler):
    API_ROUTES = [
        ("POST", re.compile(TABLE), "table_create", True),
        ("GET", re.compile(TABLE), "table_query", True),
        ("GET", re.compile(TABLE + r"/([A-Za-z0-9]+)"), "table_get", True),
        ("PATCH", re.compile(TABLE + r"/([A-Za-z0-9]+)"), "table_update", True),
        ("PUT", re.compile(TABLE + r"/([A-Za-z0-9]+)"), "table_update", True),
        ("POST", re.compile(r"/api/now/(?:v[12]/)?import/([A-Za-z0-9_]+)"), "import_insert", True),
        ("POST", re.compile(r"/api/now/(?:v1/)?attachment/file"), "attachment_upload", True),
        ("GET", re.compile(r"/api/now/(?:v1/)?attachment"), "attachment_query", True),
    ]
    IDEMPOTENCY_HEADER = None
    PAYLOAD_KEY = None
    UNAUTHENTICATED = (401, records.failure("User Not Authenticated", "Required to provide Auth information"))
    # The transform map every import set table has here: u_<field> -> <field> on this table.
    IMPORT_TARGET = "incident"
    COALESCE_FIELD = "u_correlation_id"
    TRANSFORM_MAP = "Mailroom to incident"

    def _authenticated(self) -> bool:
        token = self.desk.token
        if not token:
            return True
        scheme, _, value = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer":
            return hmac.compare_digest(value.strip().encode(), token.encode())
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return bool(user) and hmac.compare_digest(password.encode(), token.encode())

    def rejection(self, fault):
        refused = rejection_for(fault)
        if refused is None:
            return None
        status, headers, _ = refused
        if status == 422:
            return 400, headers, records.failure("Invalid input", "caller_id: Invalid reference")
        messages = {
            429: ("Rate limit exceeded", "Too many requests: the rate limit rule for this user is exhausted"),
            503: ("Service Unavailable", "The instance is unavailable"),
            500: ("Internal Server Error", "An unexpected error occurred"),
            401: ("User Not Authenticated", "Required to provide Auth information"),
        }
        message, detail = messages[status]
        return status, headers, records.failure(message, detail)

    def invalid_body(self) -> tuple[int, dict]:
        return 400, records.failure("Exception while reading request", "The payload is not valid JSON.")

    def _first(self, name: str, default: str = "") -> str:
        return (self.query.get(name) or [default])[0]

    def _user_name(self) -> str:
        """The user the request authenticates as (basic auth), else the integration user."""
        scheme, _, value = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "basic":
            try:
                user = base64.b64decode(value, validate=True).decode().partition(":")[0]
            except (binascii.Error, UnicodeDecodeError):
                user = ""
            if user:
                return user
        return "mailroom.integration"

    # Table API.

    def table_create(self, table):
        if table == "sys_user":
            self._create_user()
            return
        if table in records.DERIVED_TABLES:
            self._send(403, records.failure("Operation Failed", f"ACL Exception Insert Failed on {table}"))
            return

        def create(record: dict) -> WriteOutcome:
            if not records.table_exists(table):
                return WriteOutcome(*records.invalid_table(table))
            return self._insert(table, record)

        self._ticket_write(
            "POST", f"/api/now/table/{table}", create, external_id_of=lambda record: record.get("correlation_id")
        )

    def _insert(self, table: str, record: dict) -> WriteOutcome:
        store = self.desk.store
        fields = records.new_record(store, self._base_url(), table, record)
        try:
            ticket_id = store.create_ticket(records.store_ticket(fields, store), fields=fields)
        except ValidationFailed as exc:
            detail = "; ".join(f"{name}: {problems[0]['description']}" for name, problems in exc.details.items())
            return WriteOutcome(400, records.failure("Invalid input", detail))
        records.record_people(store, ticket_id, fields)
        return WriteOutcome(201, {"result": fields}, committed=True, ticket_id=ticket_id)

    def _create_user(self):
        """A sys_user record: one of the store's people (outside the fault plan)."""
        user = self._parse_json()
        address = str((user or {}).get("email") or "").strip()
        if user is None or "@" not in address:
            self._send(400, records.failure("Invalid input", "email: a user needs a valid email address"))
            return
        name = " ".join(str(user.get(part) or "").strip() for part in ("first_name", "last_name")).strip()
        with self.desk.store.transaction():
            taken = self.desk.store.person(email=str(user.get("user_name") or address))
            if taken is None:
                person_id, _ = self.desk.store.find_or_create_person(address, name or str(user.get("name") or ""))
                person = self.desk.store.person(person_id)
        if taken is not None:
            self._send(
                403,
                records.failure(
                    "Operation Failed", "Error during insert of sys_user (a user with this user_name exists)"
                ),
            )
            return
        self._send(201, {"result": records.user_row(person)})

    def table_query(self, table):
        if not records.table_exists(table):
            self._send(*records.invalid_table(table))
            return
        with self.desk.store.transaction():
            if table == "sys_user":
                rows = [records.user_row(person) for person in self.desk.store.people()]
            elif table == "sys_watermark":
                rows = records.watermark_rows(self.desk.store, self._base_url())
            else:
                rows = [fields for _, fields in records.records(self.desk.store, self._base_url(), table)]
        result = records.query(
            rows,
            self._first("sysparm_query"),
            self._first("sysparm_fields"),
            self._first("sysparm_limit"),
            self._first("sysparm_offset"),
        )
        self._send(200, {"result": result}, {"X-Total-Count": str(len(result))})

    def table_get(self, table, sys_id):
        if not records.table_exists(table):
            self._send(*records.invalid_table(table))
            return
        with self.desk.store.transaction():
            found = records.find(self.desk.store, self._base_url(), table, sys_id)
        if found is None:
            self._send(
                404, records.failure("No Record found", "Record doesn't exist or ACL restricts the record retrieval")
            )
        else:
            self._send(200, {"result": found[1]})

    def table_update(self, table, sys_id):
        def update(changes: dict) -> WriteOutcome:
            if not records.table_exists(table):
                return WriteOutcome(*records.invalid_table(table))
            found = records.find(self.desk.store, self._base_url(), table, sys_id)
            if found is None:
                return WriteOutcome(
                    404,
                    records.failure("No Record found", "Record doesn't exist or ACL restricts the record retrieval"),
                )
            ticket_id, fields = found
            if fields.get("active") == "false":
                # The baseline write ACL on closed incidents (the integration user is no admin).
                return WriteOutcome(
                    403, records.failure("Operation Failed", "ACL Exception Update Failed due to security constraints")
                )
            store = self.desk.store
            for name in JOURNAL_FIELDS:
                if str(changes.get(name) or "").strip():
                    store.insert_comment(
                        ticket_id, str(changes[name]), public=name == "comments", author=self._user_name()
                    )
            plain = {k: v for k, v in changes.items() if k not in JOURNAL_FIELDS}
            merged = {**fields, **plain, "sys_updated_on": records.now()}
            merged["active"] = records.active_for(merged)
            store.update_fields(ticket_id, records.store_ticket(merged, store), merged)
            records.record_people(store, ticket_id, merged)
            return WriteOutcome(200, {"result": merged}, committed=True, ticket_id=ticket_id)

        self._ticket_write(
            self.command, f"/api/now/table/{table}/{sys_id}", update, external_id_of=lambda changes: None
        )

    # Import Set API.

    def import_insert(self, staging_table):
        def transform(row: dict) -> WriteOutcome:
            if not records.table_exists(staging_table):
                return WriteOutcome(*records.invalid_table(staging_table))
            return self._transform(staging_table, row)

        self._ticket_write(
            "POST",
            f"/api/now/import/{staging_table}",
            transform,
            external_id_of=lambda row: row.get(self.COALESCE_FIELD),
        )

    def _transform(self, staging_table: str, row: dict) -> WriteOutcome:
        store, base, table = self.desk.store, self._base_url(), self.IMPORT_TARGET
        answer = {"import_set": f"ISET{10001 + len(store.requests()):07d}", "staging_table": staging_table}
        outcome = {"transform_map": self.TRANSFORM_MAP, "table": table}
        key = str(row.get(self.COALESCE_FIELD) or "")
        if not key:
            error = f"Unable to resolve target record, coalesce values not present: {self.COALESCE_FIELD}"
            return WriteOutcome(
                201,
                {**answer, "result": [{**outcome, "status": "error", "error_message": error, "status_message": error}]},
            )
        target = {name[2:]: value for name, value in row.items() if name.startswith("u_")}
        existing = next(
            ((i, f) for i, f in records.records(store, base, table) if str(f.get("correlation_id") or "") == key), None
        )
        if existing is None:
            written = self._insert(table, target)
            if not written.committed:
                error = written.body["error"]["detail"]
                return WriteOutcome(
                    201,
                    {
                        **answer,
                        "result": [{**outcome, "status": "error", "error_message": error, "status_message": error}],
                    },
                )
            ticket_id, fields, status = written.ticket_id, written.body["result"], "inserted"
        else:
            ticket_id, fields = existing
            changed = {name: value for name, value in target.items() if fields.get(name) != value}
            status = "updated" if changed else "skipped"
            if changed:
                fields = {**fields, **changed, "sys_updated_on": records.now()}
                store.update_fields(ticket_id, records.store_ticket(fields, store), fields)
                records.record_people(store, ticket_id, fields)
        result = {
            **outcome,
            "display_name": "number",
            "display_value": fields["number"],
            "status": status,
            "record_link": f"{base}/api/now/table/{table}/{fields['sys_id']}",
            "sys_id": fields["sys_id"],
        }
        return WriteOutcome(201, {**answer, "result": [result]}, committed=True, ticket_id=ticket_id)

    # Attachment API.

    def attachment_upload(self):
        table, sys_id = self._first("table_name"), self._first("table_sys_id")
        filename = self._first("file_name")
        fault = self._fault_before_write("POST", "/api/now/attachment/file")
        if fault is None:
            return
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        with self.desk.store.transaction():
            found = (
                records.find(self.desk.store, self._base_url(), table, sys_id)
                if records.table_exists(table) and table not in records.DERIVED_TABLES
                else None
            )
            if not (table and sys_id and filename and content_type):
                outcome = WriteOutcome(
                    400,
                    records.failure(
                        "Missing parameters", "table_name, table_sys_id, file_name and a Content-Type are required"
                    ),
                )
            elif found is None:
                outcome = WriteOutcome(
                    404,
                    records.failure(
                        "Invalid table_sys_id", f"{table} record {sys_id} does not exist or cannot be read"
                    ),
                )
            elif found[1].get("active") == "false":
                outcome = WriteOutcome(
                    403, records.failure("Operation Failed", "ACL Exception Insert Failed due to security constraints")
                )
            else:
                attachment_id = self.desk.store.attach_data(found[0], filename, content_type, self.raw_body)
                attachment = next(a for a in self.desk.store.attachments(found[0]) if a["id"] == attachment_id)
                outcome = WriteOutcome(
                    201,
                    {"result": records.attachment_row(self._base_url(), attachment, table, sys_id)},
                    committed=True,
                    ticket_id=found[0],
                )
        self._log_write("POST", "/api/now/attachment/file", fault, outcome)
        self._answer_write(fault, outcome)

    def attachment_query(self):
        base = self._base_url()
        with self.desk.store.transaction():
            rows = []
            for ticket in self.desk.store.tickets(base):
                fields = ticket["fields"]
                for attachment in self.desk.store.attachments(ticket["id"]):
                    rows.append(
                        records.attachment_row(
                            base, attachment, fields.get("sys_class_name", ""), fields.get("sys_id", "")
                        )
                    )
        result = records.query(
            rows,
            self._first("sysparm_query"),
            self._first("sysparm_fields"),
            self._first("sysparm_limit"),
            self._first("sysparm_offset"),
        )
        self._send(200, {"result": result}, {"X-Total-Count": str(len(result))})

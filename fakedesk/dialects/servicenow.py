"""FakeDesk speaking ServiceNow: the Table API and the Import Set API, over the shared store.

Endpoints (`/api/now/v1/...` and `/api/now/v2/...` work as well):
    POST  /api/now/table/<table>             create; 201 {"result": {"sys_id", "number", ...}}
    GET   /api/now/table/<table>             query: sysparm_query (field=, !=, STARTSWITH, IN, >=, <=,
                                             ORDERBY, ORDERBYDESC; "^^" a literal caret), sysparm_fields,
                                             sysparm_limit, sysparm_offset; 200 {"result": [...]}
    GET   /api/now/table/<table>/<sys_id>    one record; 404 "No Record found"
    PATCH /api/now/table/<table>/<sys_id>    update (PUT too); `comments` / `work_notes` add a journal entry
    POST  /api/now/import/<staging table>    insert a row; the transform map (`u_<field>` -> `<field>` on
                                             `IMPORT_TARGET`) coalesces on `COALESCE_FIELD`: 201 {"import_set",
                                             "staging_table", "result": [{"transform_map", "table", "status":
                                             "inserted" | "updated" | "skipped" | "error", "sys_id", ...}]}

Tables: the standard ones (incident, problem, ...) and any "u_" / "x_" name; another is answered
400 "Invalid table <name>". Errors are `{"error": {"message", "detail"}, "status": "failure"}`.
Auth: basic (any user, the desk token as password) or `Bearer <desk token>`. Every create, import
and update goes through the fault plan; ServiceNow has no idempotency key. Reads are consistent.
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
        messages = {429: ("Rate limit exceeded", "Too many requests: the rate limit rule for this user is exhausted"),
                    503: ("Service Unavailable", "The instance is unavailable"),
                    500: ("Internal Server Error", "An unexpected error occurred"),
                    401: ("User Not Authenticated", "Required to provide Auth information")}
        message, detail = messages[status]
        return status, headers, records.failure(message, detail)

    def invalid_body(self) -> tuple[int, dict]:
        return 400, records.failure("Exception while reading request", "The payload is not valid JSON.")

    def _first(self, name: str, default: str = "") -> str:
        return (self.query.get(name) or [default])[0]

    # Table API.

    def table_create(self, table):
        def create(record: dict) -> WriteOutcome:
            if not records.table_exists(table):
                return WriteOutcome(*records.invalid_table(table))
            return self._insert(table, record)

        self._ticket_write("POST", f"/api/now/table/{table}", create,
                           external_id_of=lambda record: record.get("correlation_id"))

    def _insert(self, table: str, record: dict) -> WriteOutcome:
        fields = records.new_record(self.desk.store, self._base_url(), table, record)
        try:
            ticket_id = self.desk.store.create_ticket(records.store_ticket(fields), fields=fields)
        except ValidationFailed as exc:
            detail = "; ".join(f"{name}: {problems[0]['description']}" for name, problems in exc.details.items())
            return WriteOutcome(400, records.failure("Invalid input", detail))
        return WriteOutcome(201, {"result": fields}, committed=True, ticket_id=ticket_id)

    def table_query(self, table):
        if not records.table_exists(table):
            self._send(*records.invalid_table(table))
            return
        with self.desk.store.transaction():
            rows = [fields for _, fields in records.records(self.desk.store, self._base_url(), table)]
        result = records.query(rows, self._first("sysparm_query"), self._first("sysparm_fields"),
                               self._first("sysparm_limit"), self._first("sysparm_offset"))
        self._send(200, {"result": result}, {"X-Total-Count": str(len(result))})

    def table_get(self, table, sys_id):
        if not records.table_exists(table):
            self._send(*records.invalid_table(table))
            return
        with self.desk.store.transaction():
            found = records.find(self.desk.store, self._base_url(), table, sys_id)
        if found is None:
            self._send(404, records.failure("No Record found",
                                            "Record doesn't exist or ACL restricts the record retrieval"))
        else:
            self._send(200, {"result": found[1]})

    def table_update(self, table, sys_id):
        def update(changes: dict) -> WriteOutcome:
            if not records.table_exists(table):
                return WriteOutcome(*records.invalid_table(table))
            found = records.find(self.desk.store, self._base_url(), table, sys_id)
            if found is None:
                return WriteOutcome(404, records.failure(
                    "No Record found", "Record doesn't exist or ACL restricts the record retrieval"))
            ticket_id, fields = found
            for name in JOURNAL_FIELDS:
                if str(changes.get(name) or "").strip():
                    self.desk.store.add_comment(ticket_id, {"comment": {"body": changes[name],
                                                                        "public": name == "comments"}})
            plain = {k: v for k, v in changes.items() if k not in JOURNAL_FIELDS}
            merged = {**fields, **plain, "sys_updated_on": records.now()}
            self.desk.store.update_fields(ticket_id, records.store_ticket(merged), merged)
            return WriteOutcome(200, {"result": merged}, committed=True, ticket_id=ticket_id)

        self._ticket_write(self.command, f"/api/now/table/{table}/{sys_id}", update,
                           external_id_of=lambda changes: None)

    # Import Set API.

    def import_insert(self, staging_table):
        def transform(row: dict) -> WriteOutcome:
            if not records.table_exists(staging_table):
                return WriteOutcome(*records.invalid_table(staging_table))
            return self._transform(staging_table, row)

        self._ticket_write("POST", f"/api/now/import/{staging_table}", transform,
                           external_id_of=lambda row: row.get(self.COALESCE_FIELD))

    def _transform(self, staging_table: str, row: dict) -> WriteOutcome:
        store, base, table = self.desk.store, self._base_url(), self.IMPORT_TARGET
        answer = {"import_set": f"ISET{10001 + len(store.requests()):07d}", "staging_table": staging_table}
        outcome = {"transform_map": self.TRANSFORM_MAP, "table": table}
        key = str(row.get(self.COALESCE_FIELD) or "")
        if not key:
            error = f"Unable to resolve target record, coalesce values not present: {self.COALESCE_FIELD}"
            return WriteOutcome(201, {**answer, "result": [{**outcome, "status": "error", "error_message": error,
                                                             "status_message": error}]})
        target = {name[2:]: value for name, value in row.items() if name.startswith("u_")}
        existing = next(((i, f) for i, f in records.records(store, base, table)
                         if str(f.get("correlation_id") or "") == key), None)
        if existing is None:
            written = self._insert(table, target)
            if not written.committed:
                error = written.body["error"]["detail"]
                return WriteOutcome(201, {**answer, "result": [{**outcome, "status": "error", "error_message": error,
                                                                 "status_message": error}]})
            ticket_id, fields, status = written.ticket_id, written.body["result"], "inserted"
        else:
            ticket_id, fields = existing
            changed = {name: value for name, value in target.items() if fields.get(name) != value}
            status = "updated" if changed else "skipped"
            if changed:
                fields = {**fields, **changed, "sys_updated_on": records.now()}
                store.update_fields(ticket_id, records.store_ticket(fields), fields)
        result = {**outcome, "display_name": "number", "display_value": fields["number"], "status": status,
                  "record_link": f"{base}/api/now/table/{table}/{fields['sys_id']}", "sys_id": fields["sys_id"]}
        return WriteOutcome(201, {**answer, "result": [result]}, committed=True, ticket_id=ticket_id)

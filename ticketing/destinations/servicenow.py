"""ServiceNow destination: records through the Table API, or an Import Set (docs/design.md §6).

Create: `POST /api/now/table/<table>` (with `sysparm_input_display_value=true`, so reference fields
may be given by display value: `caller_id` carries the requester's address and ServiceNow resolves
it to a user where its display value or lookup matches; otherwise the caller stays empty). Our
external reference goes into `correlation_id` (`correlation_display` "Mailroom"), and
`contact_type` is "email". The answer is `{"result": {"sys_id", "number", ...}}`; the ticket id
Mailroom keeps is the `sys_id`.

How a lost answer is settled: ServiceNow keeps no idempotency key, but the Table API reads the
database, so `GET /api/now/table/<table>?sysparm_query=correlation_id=<ref>^ORDERBYsys_created_on`
sees a record as soon as its create returned (`consistent_lookup`; several records: the first
created is kept). In Import Set mode (`import_set_table`) the create is
`POST /api/now/import/<import_set_table>` and the transform map coalesces on `coalesce_field`,
so sending it again updates the one record (`upsert`): a retry is safe. The staging columns are
the Table API names with a `u_` prefix (`u_short_description`, `u_correlation_id`, ...), as the
import set table's generated columns are named; the transform map must map them and coalesce on
the field holding our reference. A row the transform answers `error` is refused (invalid_fields).

Comments: `PATCH /api/now/table/<table>/<sys_id>` with `{"comments": body}` (customer-visible
additional comment) or `work_notes` (`comment_field`). A comment is never retry-safe: ServiceNow
journals each PATCH.

`Destination.settings`:
    table ("incident"), import_set_table (none: Table API mode), coalesce_field ("u_correlation_id"),
    comment_field ("comments" | "work_notes"),
    assignment_groups {queue slug: group name or sys_id}, priorities {low|normal|high|urgent:
    {"impact": "1".."3", "urgency": "1".."3"}} (default: urgent 1/1, high 1/2, normal 2/2, low 2/3,
    i.e. priorities 1 Critical, 2 High, 3 Moderate, 4 Low in the default matrix),
    categories {request type slug: category value}, assignees {name: user name or sys_id},
    connect_timeout, read_timeout and the common retry settings.
    A route value without a mapping is left out; `TicketRequest.fields` are merged last.
`Destination.credentials_ref` resolves to `user:password` (basic auth) or to `Bearer <access token>`
(an OAuth token issued by the instance; when it expires, put a fresh one in the secret store).

Nothing logged here contains a ticket body or a full email address.
"""
import email.utils
import logging
import re
from datetime import UTC

from intake.logging import mask_address
from intake.vocabulary import ReasonCode

from .base import (
    AmbiguousOutcome,
    CommentRequest,
    DestinationRecord,
    PermanentError,
    RecordPage,
    TicketRequest,
    TicketResult,
    TransientError,
)
from .http import HttpDestination, json_object
from .settings import HTTP_SETTINGS, Anything, Mapping, Text

log = logging.getLogger(__name__)

TABLE_NAME = r"[a-z][a-z0-9_]{0,79}"
PRIORITY_WORDS = ("low", "normal", "high", "urgent")
DEFAULT_PRIORITIES = {
    "urgent": {"impact": "1", "urgency": "1"},
    "high": {"impact": "1", "urgency": "2"},
    "normal": {"impact": "2", "urgency": "2"},
    "low": {"impact": "2", "urgency": "3"},
}
SHORT_DESCRIPTION_CHARS = 160   # incident.short_description's length
LOOKUP_LIMIT = 10
MAX_DETAIL_CHARS = 2000


def _impact_urgency_errors(value) -> list[str]:
    if not isinstance(value, dict) or set(value) != {"impact", "urgency"}:
        return ['must be {"impact": "1".."3", "urgency": "1".."3"}']
    return [f"{name} must be 1, 2 or 3" for name in ("impact", "urgency") if str(value[name]) not in ("1", "2", "3")]


class ServiceNowDestination(HttpDestination):
    name = "servicenow"
    consistent_lookup = True
    # incident.description is a 4,000-character field; journal entries (comments) take far more.
    max_description_chars = 4000

    SETTINGS = {
        **HTTP_SETTINGS,
        "table": Text(pattern=TABLE_NAME, help="the table records are created in (incident)"),
        "import_set_table": Text(pattern=TABLE_NAME, help="create through this import set table (upsert)"),
        "coalesce_field": Text(pattern=TABLE_NAME, help="the staging column the transform coalesces on"),
        "comment_field": Text(choices=("comments", "work_notes")),
        "assignment_groups": Mapping(values=Text(), help="queue slug -> assignment group (name or sys_id)"),
        "priorities": Mapping(values=Anything(check=_impact_urgency_errors), keys="|".join(PRIORITY_WORDS),
                              help="priority -> impact and urgency"),
        "categories": Mapping(values=Text(), help="request type slug -> category"),
        "assignees": Mapping(values=Text(), help="assignee name -> user (name or sys_id)"),
    }

    def __init__(self, destination):
        super().__init__(destination)
        settings = self.settings
        self.table = settings.get("table") or "incident"
        self.import_set_table = settings.get("import_set_table") or ""
        self.coalesce_field = settings.get("coalesce_field") or "u_correlation_id"
        self.comment_field = settings.get("comment_field") or "comments"
        # The import set's coalesce makes a create an insert-or-update on our reference.
        self.upsert = bool(self.import_set_table)

    # --- The interface ------------------------------------------------------

    def create_ticket(self, request: TicketRequest, idempotency_key: str, external_ref: str) -> TicketResult:
        record = record_payload(request, external_ref, self.settings)
        if self.import_set_table:
            return self._import(record, external_ref)
        response = self.send("POST", f"/api/now/table/{self.table}", write=True, json_body=record,
                             params={"sysparm_input_display_value": "true", "sysparm_exclude_reference_link": "true",
                                     "sysparm_fields": "sys_id,number"})
        result = json_object(response, write=True).get("result")
        if not isinstance(result, dict) or not result.get("sys_id"):
            # It answered 2xx, so the record probably exists; only the lookup can tell which.
            raise AmbiguousOutcome(ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code} without a sys_id")
        log.info("servicenow: created %s %s for %s", self.table, result.get("number") or result["sys_id"], external_ref)
        return self._result(result["sys_id"])

    def _import(self, record: dict, external_ref: str) -> TicketResult:
        staged = {(name if name.startswith("u_") else f"u_{name}"): value for name, value in record.items()}
        staged[self.coalesce_field] = external_ref
        # The coalesce makes this create an insert-or-update on our reference: sending it twice is harmless.
        response = self.send("POST", f"/api/now/import/{self.import_set_table}", write=True, json_body=staged,
                             params={"sysparm_input_display_value": "true"}, retry_safe=True)
        body = json_object(response, write=True)
        rows = [row for row in body.get("result") or [] if isinstance(row, dict)]
        ours = [row for row in rows if row.get("table") in (self.table, None)] or rows
        failed = [row for row in ours if row.get("status") == "error"]
        if failed:
            message = failed[0].get("error_message") or failed[0].get("status_message") or "transform error"
            raise PermanentError(ReasonCode.INVALID_FIELDS, mask_address(str(message))[:MAX_DETAIL_CHARS])
        targets = {str(row.get("target_sys_id") or row.get("sys_id")) for row in ours
                   if row.get("status") in ("inserted", "updated", "skipped") and (row.get("target_sys_id")
                                                                                    or row.get("sys_id"))}
        if len(targets) > 1:
            raise PermanentError(ReasonCode.MULTIPLE_MATCHES,
                                 f"the transform wrote {len(targets)} {self.table} records for {external_ref}")
        if not targets:
            if any(row.get("status") == "ignored" for row in ours):
                raise PermanentError(ReasonCode.REJECTED, "the transform map ignored the row")
            raise AmbiguousOutcome(ReasonCode.UNREADABLE_RESPONSE,
                                   f"HTTP {response.status_code} without a target sys_id")
        [sys_id] = targets
        log.info("servicenow: import set %s %s %s for %s", body.get("import_set") or "-",
                 "/".join(sorted({str(row.get('status')) for row in ours})), sys_id, external_ref)
        return self._result(sys_id)

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        matches = self._with_correlation_id(external_ref)
        if not matches:
            return None
        if len(matches) > 1:
            log.warning("servicenow: %d %s records carry correlation_id %s; keeping the first created %s",
                        len(matches), self.table, external_ref, matches[0]["sys_id"])
        return self._result(matches[0]["sys_id"])

    def _with_correlation_id(self, external_ref: str) -> list[dict]:
        params = {"sysparm_query": f"correlation_id={query_value(external_ref)}^ORDERBYsys_created_on",
                  "sysparm_fields": "sys_id,number,correlation_id", "sysparm_limit": str(LOOKUP_LIMIT)}
        return [row for row in self._rows(params)
                if row.get("sys_id") and str(row.get("correlation_id", external_ref)) == external_ref]

    def add_comment(self, ticket_id: str, comment: CommentRequest, idempotency_key: str, external_ref: str) -> str:
        body = comment.body
        if not re.fullmatch(r"[0-9a-f]{32}", str(ticket_id)):
            raise PermanentError(ReasonCode.NOT_FOUND, "a ServiceNow sys_id is 32 hexadecimal digits")
        # A journal entry is not an upsert: a 5xx after it is ambiguous (the default for a write here).
        self.send("PATCH", f"/api/now/table/{self.table}/{ticket_id}", write=True,
                  json_body={self.comment_field: body},
                  params={"sysparm_fields": "sys_id", "sysparm_exclude_reference_link": "true"})
        log.info("servicenow: added %s to %s %s for %s", self.comment_field, self.table, ticket_id, external_ref)
        # ServiceNow does not name the journal entry it made: the record stands for it.
        return str(ticket_id)

    def ticket_url(self, ticket_id) -> str:
        return f"{self.base_url}/nav_to.do?uri={self.table}.do?sys_id={ticket_id}" if self.base_url else ""

    def check_connection(self) -> str:
        self._rows({"sysparm_limit": "1", "sysparm_fields": "sys_id"})
        mode = f"; creates through import set {self.import_set_table}" if self.import_set_table else ""
        return f"read the {self.table} table as {self._who()}{mode}"

    # --- Listing (reconciliation) -------------------------------------------

    supports_listing = True

    def records_with_ref(self, prefix: str, since, limit: int, resume: dict | None = None) -> RecordPage:
        limit = max(1, min(1000, int(limit)))
        offset = int((resume or {}).get("offset") or 0)
        # sys_created_on is in UTC in the Table API's answers and queries.
        created = (since.astimezone(UTC) if since.tzinfo else since).strftime("%Y-%m-%d %H:%M:%S")
        params = {"sysparm_query": f"correlation_idSTARTSWITH{query_value(prefix)}^sys_created_on>={created}"
                                   "^ORDERBYsys_created_on",
                  "sysparm_fields": "sys_id,correlation_id", "sysparm_limit": str(limit),
                  "sysparm_offset": str(offset)}
        rows = self._rows(params)
        records = [DestinationRecord(row["sys_id"], str(row["correlation_id"]), self.ticket_url(row["sys_id"]))
                   for row in rows if row.get("sys_id") and str(row.get("correlation_id") or "").startswith(prefix)]
        return RecordPage(records, {"offset": offset + len(rows)} if len(rows) >= limit else None)

    def existing_tickets(self, ticket_ids: list[str]) -> set[str]:
        ids = [str(t) for t in ticket_ids if re.fullmatch(r"[0-9a-f]{32}", str(t))]
        found = set()
        for start in range(0, len(ids), 100):
            chunk = ids[start:start + 100]
            params = {"sysparm_query": f"sys_idIN{','.join(chunk)}", "sysparm_fields": "sys_id",
                      "sysparm_limit": str(len(chunk))}
            found |= {row["sys_id"] for row in self._rows(params) if row.get("sys_id")}
        return found

    def records_for_ref(self, external_ref: str) -> list[DestinationRecord]:
        return [DestinationRecord(row["sys_id"], external_ref, self.ticket_url(row["sys_id"]))
                for row in self._with_correlation_id(external_ref)]

    # --- HTTP and error mapping ---------------------------------------------

    def _rows(self, params: dict) -> list[dict]:
        body = json_object(self.send("GET", f"/api/now/table/{self.table}", write=False, params=params), write=False)
        rows = body.get("result")
        if not isinstance(rows, list):
            raise TransientError(ReasonCode.UNREADABLE_RESPONSE, "a Table API query answered without a result list")
        return [row for row in rows if isinstance(row, dict)]

    def _result(self, sys_id) -> TicketResult:
        return TicketResult(ticket_id=str(sys_id), url=self.ticket_url(sys_id))

    def _who(self) -> str:
        secret = self.secret() or ""
        if secret.startswith("Bearer "):
            return "the OAuth token's user"
        return f"user {mask_address(secret.partition(':')[0])!r}"   # a user name may be an address

    def auth_for(self, secret):
        if secret is None:
            return None, {}
        secret = secret.strip()
        if secret.startswith("Bearer "):
            return None, {"Authorization": secret}
        user, sep, password = secret.partition(":")
        if not sep or not user:
            raise PermanentError(ReasonCode.CREDENTIALS, "credentials_ref must hold user:password or 'Bearer <token>'")
        return (user, password), {}

    def special_error(self, response, body: dict, write: bool):
        status = response.status_code
        message = error_message(body)
        if status == 403 and "data policy" in message.lower():
            # A mandatory field missing or read-only (a data policy): our fields, not our credentials.
            return PermanentError(ReasonCode.INVALID_FIELDS, message)
        if status == 400 and message.startswith("Invalid table"):
            return PermanentError(ReasonCode.CONFIGURATION, f"HTTP {status}: {message}")   # table or import_set_table
        if status == 400 and write:
            return PermanentError(ReasonCode.INVALID_FIELDS, message or f"HTTP {status}")
        if status in (400, 404) and not write:
            # A read of the table itself: "Invalid table <name>" is a setting to fix.
            return PermanentError(ReasonCode.CONFIGURATION, f"HTTP {status}: {message or 'not found'}")
        return None


def error_message(body: dict) -> str:
    """ServiceNow's `{"error": {"message", "detail"}, "status": "failure"}` as one line, masked and capped."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return ""
    parts = [str(error[name]) for name in ("message", "detail") if error.get(name)]
    return mask_address(": ".join(parts))[:MAX_DETAIL_CHARS]


def query_value(value: str) -> str:
    """A value inside an encoded query: "^" separates conditions, "^^" is a literal caret."""
    return str(value).replace("^", "^^")


def route_fields(request: TicketRequest, settings: dict) -> dict:
    """The record's route fields through the destination's mappings (see the module doc)."""
    fields = {}
    group = (settings.get("assignment_groups") or {}).get(request.queue) if request.queue else None
    if group:
        fields["assignment_group"] = str(group)
    priorities = {**DEFAULT_PRIORITIES, **(settings.get("priorities") or {})}
    levels = priorities.get(request.priority) if request.priority else None
    if isinstance(levels, dict) and levels.get("impact") and levels.get("urgency"):
        fields["impact"], fields["urgency"] = str(levels["impact"]), str(levels["urgency"])
    category = (settings.get("categories") or {}).get(request.request_type) if request.request_type else None
    if category:
        fields["category"] = str(category)
    assignee = (settings.get("assignees") or {}).get(request.assignee) if request.assignee else None
    if assignee:
        fields["assigned_to"] = str(assignee)
    return fields


def record_payload(request: TicketRequest, external_ref: str, settings: dict | None = None) -> dict:
    """The Table API record for a request. Deterministic: a retry sends the very same body."""
    _, address = email.utils.parseaddr(request.requester)
    record = {
        "short_description": request.subject[:SHORT_DESCRIPTION_CHARS],
        "description": request.description,
        "caller_id": address or request.requester,
        "contact_type": "email",
        "correlation_id": external_ref,
        "correlation_display": "Mailroom",
    }
    record.update(route_fields(request, settings or {}))
    for name, value in sorted((request.fields or {}).items(), key=lambda item: str(item[0])):
        record[str(name)] = value
    return record

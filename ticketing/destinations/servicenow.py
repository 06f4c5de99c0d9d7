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
additional comment), or `work_notes` for an agent's mail (an internal note; `comment_field`
"work_notes" makes every reply one). A comment is never retry-safe: ServiceNow journals each PATCH.
Each opens with a "From: name <address>" line: the integration user writes it. Before the PATCH the
record is read (`state`, `active`, `watch_list`): an inactive record (Closed, Canceled) is
`TicketClosed` without a write (and a 403 to the PATCH is read the same way); with `closed_policy`
"reopen", a Resolved one (state 6) goes back to In Progress in the same PATCH.

People: the requester is a `sys_user`, found by email (`GET /api/now/table/sys_user?sysparm_query=
emailINaddr,...`) or made (`POST /api/now/table/sys_user`, `create_callers`), and `caller_id` is its
sys_id; the people copied go into `watch_list` (a known user's sys_id, else the address, which the
watch list takes as it is). Both are noted in the journal before the create: a retry sends the same
record. A reply's copied people join the record's watch list.

Files go after the write, one call each (`upload_file`): `POST /api/now/attachment/file?table_name=
<table>&table_sys_id=<sys_id>&file_name=<name>` with the raw bytes and their Content-Type. `find_file`
lists the record's attachments by name (`GET /api/now/attachment?sysparm_query=table_sys_id=X^file_name=N`)
and matches the SHA-256 `hash` the instance keeps (else the size).

References: ServiceNow's notifications carry the record's number ("INC0010001", in the subject) and
a watermark ("Ref:MSG0000123", last line of the body). `resolve_reference` reads the number on the
table, or the watermark's `sys_watermark` record (its source table and sys_id).

A follow-up of a closed incident names it in `parent_incident` (`parent` on another table).

`Destination.settings`:
    table ("incident"), import_set_table (none: Table API mode), coalesce_field ("u_correlation_id"),
    comment_field ("comments" | "work_notes"),
    assignment_groups {queue slug: group name or sys_id}, priorities {low|normal|high|urgent:
    {"impact": "1".."3", "urgency": "1".."3"}} (default: urgent 1/1, high 1/2, normal 2/2, low 2/3,
    i.e. priorities 1 Critical, 2 High, 3 Moderate, 4 Low in the default matrix),
    categories {request type slug: category value}, assignees {name: user name or sys_id},
    create_callers (true): make a sys_user for a sender the instance does not know (needs user_admin),
    connect_timeout, read_timeout, max_file_bytes, closed_policy and the common retry settings.
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
    OutgoingFile,
    PermanentError,
    RecordPage,
    TicketClosed,
    TicketRequest,
    TicketResult,
    TransientError,
)
from .capabilities import FILES_AFTER_WRITE, FOLLOW_UP, MB, REOPEN, REQUESTER_FIND_OR_CREATE, REVIEW, Capabilities
from .http import HttpDestination, json_object
from .settings import HTTP_SETTINGS, Anything, Flag, Mapping, Text

log = logging.getLogger(__name__)

TABLE_NAME = r"[a-z][a-z0-9_]{0,79}"
PRIORITY_WORDS = ("low", "normal", "high", "urgent")
DEFAULT_PRIORITIES = {
    "urgent": {"impact": "1", "urgency": "1"},
    "high": {"impact": "1", "urgency": "2"},
    "normal": {"impact": "2", "urgency": "2"},
    "low": {"impact": "2", "urgency": "3"},
}
SHORT_DESCRIPTION_CHARS = 160  # incident.short_description's length
LOOKUP_LIMIT = 10
MAX_DETAIL_CHARS = 2000
SYS_ID = re.compile(r"[0-9a-f]{32}")
SHA256 = re.compile(r"[0-9a-f]{64}")
# The number prefix of each table whose records a notification names (Number maintenance defaults).
NUMBER_PREFIXES = {
    "incident": "INC",
    "problem": "PRB",
    "change_request": "CHG",
    "sc_request": "REQ",
    "sc_req_item": "RITM",
    "sc_task": "SCTASK",
    "sn_customerservice_case": "CS",
}
RESOLVED = "6"  # the Resolved state of incident and case
# The state a reopened record goes back to: incident's In Progress, case's Open.
REOPENED_STATE = {"incident": "2", "sn_customerservice_case": "10"}
PEOPLE_STEP = "people"


def number_pattern(prefix: str):
    return re.compile(rf"(?<![A-Za-z0-9])(?P<ref>{prefix}\d{{7,12}})(?![A-Za-z0-9])")


# The watermark ServiceNow writes into every notification ("Ref:MSG0000123", newer releases add
# "_" and a random part), which its own inbound actions use to find the record.
WATERMARK = re.compile(r"\bRef:(?P<ref>MSG\d{7,12}(?:_[A-Za-z0-9]+)?)")


def _impact_urgency_errors(value) -> list[str]:
    if not isinstance(value, dict) or set(value) != {"impact", "urgency"}:
        return ['must be {"impact": "1".."3", "urgency": "1".."3"}']
    return [f"{name} must be 1, 2 or 3" for name in ("impact", "urgency") if str(value[name]) not in ("1", "2", "3")]


class ServiceNowDestination(HttpDestination):
    name = "servicenow"
    consistent_lookup = True
    # incident.description is a 4,000-character field; journal entries (comments) take far more.
    max_description_chars = 4000

    capabilities = Capabilities(
        files=FILES_AFTER_WRITE,  # the Attachment API, one call per file on the record
        max_file_bytes=1024 * MB,  # com.glide.attachment.max_size, 1024 MB by default
        html=False,  # description and comments are plain text
        requester=REQUESTER_FIND_OR_CREATE,  # a sys_user, found by email or made: caller_id
        cc_field="watch_list",
        customer_authored_comments=False,  # the integration user writes every journal entry
        internal_notes=True,  # work_notes
        closed_policies=(FOLLOW_UP, REOPEN, REVIEW),
        # The baseline "Incident opened for me" notification mails the caller (a sys_user with an email).
        acknowledges_requester=True,
        requests_per_minute=None,  # no instance-wide quota unless an admin adds a rate limit rule
    )
    reference_patterns = (number_pattern(NUMBER_PREFIXES["incident"]), WATERMARK)
    reference_fields = ("subject", "body")

    SETTINGS = {
        **HTTP_SETTINGS,
        "table": Text(pattern=TABLE_NAME, help="the table records are created in (incident)"),
        "import_set_table": Text(pattern=TABLE_NAME, help="create through this import set table (upsert)"),
        "coalesce_field": Text(pattern=TABLE_NAME, help="the staging column the transform coalesces on"),
        "comment_field": Text(choices=("comments", "work_notes")),
        "assignment_groups": Mapping(values=Text(), help="queue slug -> assignment group (name or sys_id)"),
        "priorities": Mapping(
            values=Anything(check=_impact_urgency_errors),
            keys="|".join(PRIORITY_WORDS),
            help="priority -> impact and urgency",
        ),
        "categories": Mapping(values=Text(), help="request type slug -> category"),
        "assignees": Mapping(values=Text(), help="assignee name -> user (name or sys_id)"),
        "create_callers": Flag(help="make a sys_user for a sender the instance does not know (true)"),
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
        prefix = NUMBER_PREFIXES.get(self.table)
        self.reference_patterns = (number_pattern(prefix), WATERMARK) if prefix else (WATERMARK,)

    # --- The interface ------------------------------------------------------

    def create_ticket(self, request: TicketRequest, idempotency_key: str, external_ref: str) -> TicketResult:
        record = record_payload(
            request, external_ref, {**self.settings, "table": self.table}, people=self._people(request)
        )
        if self.import_set_table:
            return self._import(record, external_ref)
        response = self.send(
            "POST",
            f"/api/now/table/{self.table}",
            write=True,
            json_body=record,
            params={
                "sysparm_input_display_value": "true",
                "sysparm_exclude_reference_link": "true",
                "sysparm_fields": "sys_id,number",
            },
        )
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
        response = self.send(
            "POST",
            f"/api/now/import/{self.import_set_table}",
            write=True,
            json_body=staged,
            params={"sysparm_input_display_value": "true"},
            retry_safe=True,
        )
        body = json_object(response, write=True)
        rows = [row for row in body.get("result") or [] if isinstance(row, dict)]
        ours = [row for row in rows if row.get("table") in (self.table, None)] or rows
        failed = [row for row in ours if row.get("status") == "error"]
        if failed:
            message = failed[0].get("error_message") or failed[0].get("status_message") or "transform error"
            raise PermanentError(ReasonCode.INVALID_FIELDS, mask_address(str(message))[:MAX_DETAIL_CHARS])
        targets = {
            str(row.get("target_sys_id") or row.get("sys_id"))
            for row in ours
            if row.get("status") in ("inserted", "updated", "skipped")
            and (row.get("target_sys_id") or row.get("sys_id"))
        }
        if len(targets) > 1:
            raise PermanentError(
                ReasonCode.MULTIPLE_MATCHES,
                f"the transform wrote {len(targets)} {self.table} records for {external_ref}",
            )
        if not targets:
            if any(row.get("status") == "ignored" for row in ours):
                raise PermanentError(ReasonCode.REJECTED, "the transform map ignored the row")
            raise AmbiguousOutcome(
                ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code} without a target sys_id"
            )
        [sys_id] = targets
        log.info(
            "servicenow: import set %s %s %s for %s",
            body.get("import_set") or "-",
            "/".join(sorted({str(row.get("status")) for row in ours})),
            sys_id,
            external_ref,
        )
        return self._result(sys_id)

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        matches = self._with_correlation_id(external_ref)
        if not matches:
            return None
        if len(matches) > 1:
            log.warning(
                "servicenow: %d %s records carry correlation_id %s; keeping the first created %s",
                len(matches),
                self.table,
                external_ref,
                matches[0]["sys_id"],
            )
        return self._result(matches[0]["sys_id"])

    def _with_correlation_id(self, external_ref: str) -> list[dict]:
        params = {
            "sysparm_query": f"correlation_id={query_value(external_ref)}^ORDERBYsys_created_on",
            "sysparm_fields": "sys_id,number,correlation_id",
            "sysparm_limit": str(LOOKUP_LIMIT),
        }
        return [
            row
            for row in self._rows(params)
            if row.get("sys_id") and str(row.get("correlation_id", external_ref)) == external_ref
        ]

    def add_comment(self, ticket_id: str, comment: CommentRequest, idempotency_key: str, external_ref: str) -> str:
        if not SYS_ID.fullmatch(str(ticket_id)):
            raise PermanentError(ReasonCode.NOT_FOUND, "a ServiceNow sys_id is 32 hexadecimal digits")
        current = self._current(ticket_id)
        if is_closed(current):
            raise TicketClosed(
                f"{self.table} {current.get('number') or ticket_id} is closed (state {current.get('state') or '?'})"
            )
        field = "work_notes" if not comment.public or self.comment_field == "work_notes" else "comments"
        changes = {field: authored_body(comment)}
        if comment.cc:
            watch_list = self._watch_list_with(str(current.get("watch_list") or ""), comment.cc)
            if watch_list != str(current.get("watch_list") or ""):
                changes["watch_list"] = watch_list
        reopened = str(current.get("state")) == RESOLVED and self.closed_policy() == REOPEN
        if reopened:
            changes["state"] = REOPENED_STATE.get(self.table, REOPENED_STATE["incident"])
        try:
            # A journal entry is not an upsert: a 5xx after it is ambiguous (the default for a write here).
            self.send(
                "PATCH",
                f"/api/now/table/{self.table}/{ticket_id}",
                write=True,
                json_body=changes,
                params={"sysparm_fields": "sys_id", "sysparm_exclude_reference_link": "true"},
            )
        except PermanentError as exc:
            raise self._closed_or(exc, ticket_id) from None
        log.info(
            "servicenow: added %s to %s %s for %s%s",
            field,
            self.table,
            ticket_id,
            external_ref,
            " (reopened)" if reopened else "",
        )
        # ServiceNow does not name the journal entry it made: the record stands for it.
        return str(ticket_id)

    def closed_policy(self) -> str:
        """What a reply to a closed record becomes here (as `ticketing.services.closed_policy` decides it)."""
        chosen = self.settings.get("closed_policy")
        if chosen in self.capabilities.closed_policies:
            return chosen
        return self.capabilities.default_closed_policy

    # --- Files after the write (ticketing.destinations.files.attach_each) ----------------------------

    def upload_file(self, ticket_id: str, file: OutgoingFile, file_key: str, *, public: bool = True) -> str:
        """One attachment on the record. ServiceNow has no visibility per attachment: whoever sees the record
        sees its files (`public` is not sent)."""
        if not SYS_ID.fullmatch(str(ticket_id)):
            raise PermanentError(ReasonCode.NOT_FOUND, "a ServiceNow sys_id is 32 hexadecimal digits")
        try:
            response = self.send(
                "POST",
                "/api/now/attachment/file",
                write=True,
                data=file.read(),
                params={"table_name": self.table, "table_sys_id": ticket_id, "file_name": file.filename},
                headers={"Content-Type": file.content_type or "application/octet-stream"},
            )
        except PermanentError as exc:
            raise self._closed_or(exc, ticket_id) from None
        result = json_object(response, write=True).get("result")
        if not isinstance(result, dict) or not result.get("sys_id"):
            raise AmbiguousOutcome(ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code} without a sys_id")
        log.info("servicenow: attached file %s to %s %s", file.index, self.table, ticket_id)
        return str(result["sys_id"])

    def find_file(self, ticket_id: str, file: OutgoingFile, file_key: str) -> str | None:
        params = {
            "sysparm_query": f"table_sys_id={query_value(ticket_id)}^file_name={query_value(file.filename)}",
            "sysparm_limit": "50",
        }
        body = json_object(self.send("GET", "/api/now/attachment", write=False, params=params), write=False)
        for row in body.get("result") or []:
            if not isinstance(row, dict) or row.get("file_name") != file.filename:
                continue
            digest = str(row.get("hash") or "").lower()
            # The SHA-256 of the content where the instance shows it; the size otherwise.
            same = digest == file.sha256 if SHA256.fullmatch(digest) else str(row.get("size_bytes")) == str(file.size)
            if same and row.get("sys_id"):
                return str(row["sys_id"])
        return None

    # --- The desk's own references -------------------------------------------------------------------

    def resolve_reference(self, ref: str) -> str | None:
        """The sys_id of the record a number ("INC0010001") or a watermark ("MSG0000123") names (a read)."""
        ref = str(ref).strip()
        if ref.upper().startswith("MSG"):
            return self._watermarked(ref)
        params = {
            "sysparm_query": f"number={query_value(ref.upper())}",
            "sysparm_fields": "sys_id",
            "sysparm_limit": "1",
        }
        rows = [row for row in self._rows(params) if row.get("sys_id")]
        return str(rows[0]["sys_id"]) if rows else None

    def _watermarked(self, watermark: str) -> str | None:
        number = watermark.split("_", 1)[0].upper()
        params = {
            "sysparm_query": f"number={query_value(number)}",
            "sysparm_fields": "source_id,source_table",
            "sysparm_limit": "1",
        }
        try:
            rows = self._rows(params, table="sys_watermark")
        except PermanentError as exc:
            # Reading sys_watermark needs a role the integration user may lack: the number still works.
            log.info("servicenow: the watermark table cannot be read (%s)", exc.reason)
            return None
        for row in rows:
            if row.get("source_table") in (self.table, "") and SYS_ID.fullmatch(str(row.get("source_id") or "")):
                return str(row["source_id"])
        return None

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
        params = {
            "sysparm_query": f"correlation_idSTARTSWITH{query_value(prefix)}^sys_created_on>={created}"
            "^ORDERBYsys_created_on",
            "sysparm_fields": "sys_id,correlation_id",
            "sysparm_limit": str(limit),
            "sysparm_offset": str(offset),
        }
        rows = self._rows(params)
        records = [
            DestinationRecord(row["sys_id"], str(row["correlation_id"]), self.ticket_url(row["sys_id"]))
            for row in rows
            if row.get("sys_id") and str(row.get("correlation_id") or "").startswith(prefix)
        ]
        return RecordPage(records, {"offset": offset + len(rows)} if len(rows) >= limit else None)

    def existing_tickets(self, ticket_ids: list[str]) -> set[str]:
        ids = [str(t) for t in ticket_ids if re.fullmatch(r"[0-9a-f]{32}", str(t))]
        found = set()
        for start in range(0, len(ids), 100):
            chunk = ids[start : start + 100]
            params = {
                "sysparm_query": f"sys_idIN{','.join(chunk)}",
                "sysparm_fields": "sys_id",
                "sysparm_limit": str(len(chunk)),
            }
            found |= {row["sys_id"] for row in self._rows(params) if row.get("sys_id")}
        return found

    def records_for_ref(self, external_ref: str) -> list[DestinationRecord]:
        return [
            DestinationRecord(row["sys_id"], external_ref, self.ticket_url(row["sys_id"]))
            for row in self._with_correlation_id(external_ref)
        ]

    # --- HTTP and error mapping ---------------------------------------------

    # --- People: sys_user records, noted in the journal before the create --------------------------

    def _people(self, request: TicketRequest) -> dict:
        """{"caller": sys_id or the address, "watch_list": "sys_id,address,..."}, found or made once."""
        noted = self.journal.get(PEOPLE_STEP)
        if noted is not None:
            return noted
        _, address = email.utils.parseaddr(request.requester)
        address = address or request.requester
        copied = [a for a in dict.fromkeys(request.cc) if a.lower() != address.lower()]
        users = self._users_by_email([address, *copied])
        caller = users.get(address.lower(), "")
        if not caller and address and self.settings.get("create_callers", True):
            caller = self._create_user(address, request.requester_name)
        noted = {"caller": caller or address, "watch_list": ",".join(users.get(a.lower(), a) for a in copied)}
        self.journal.put(PEOPLE_STEP, noted)
        return noted

    def _users_by_email(self, addresses: list[str]) -> dict[str, str]:
        """{lower-case address: sys_id} of the users with these addresses (the first created of each)."""
        wanted = [a for a in dict.fromkeys(addresses) if a and "," not in a]
        if not wanted:
            return {}
        params = {
            "sysparm_query": f"emailIN{query_value(','.join(wanted))}^ORDERBYsys_created_on",
            "sysparm_fields": "sys_id,email",
            "sysparm_limit": str(len(wanted) * 5),
        }
        found: dict[str, str] = {}
        for row in self._rows(params, table="sys_user"):
            email_address = str(row.get("email") or "").lower()
            if email_address and SYS_ID.fullmatch(str(row.get("sys_id") or "")):
                found.setdefault(email_address, str(row["sys_id"]))
        return found

    def _create_user(self, address: str, name: str) -> str:
        """A new sys_user for `address`; "" when this user may not create users (the address then stays the
        caller's display value)."""
        first, _, last = (name or "").strip().rpartition(" ")
        user = {
            "user_name": address,
            "email": address,
            "first_name": first or "",
            "last_name": last or "",
            "notification": "2",
        }  # 2: send email notifications
        try:
            response = self.send(
                "POST", "/api/now/table/sys_user", write=True, json_body=user, params={"sysparm_fields": "sys_id"}
            )
        except AmbiguousOutcome as exc:
            found = self._users_by_email([address]).get(address.lower())
            if found:
                return found
            raise TransientError(exc.reason, "making the caller's user: no answer, and none found yet") from None
        except PermanentError as exc:
            if getattr(exc, "http_status", None) in (400, 403):
                found = self._users_by_email([address]).get(address.lower())  # made meanwhile by someone else?
                if not found:
                    log.warning("servicenow: no sys_user made for the caller (HTTP %s)", exc.http_status)
                return found or ""
            raise
        result = json_object(response, write=True).get("result")
        return str(result.get("sys_id") or "") if isinstance(result, dict) else ""

    def _watch_list_with(self, watch_list: str, addresses) -> str:
        present = [item for item in watch_list.split(",") if item]
        users = self._users_by_email(list(addresses))
        for address in dict.fromkeys(addresses):
            entry = users.get(address.lower(), address)
            if entry not in present and address not in present:
                present.append(entry)
        return ",".join(present)

    # --- Closed records -----------------------------------------------------------------------------

    def _current(self, ticket_id: str) -> dict:
        params = {
            "sysparm_query": f"sys_id={ticket_id}",
            "sysparm_fields": "sys_id,number,state,active,watch_list",
            "sysparm_limit": "1",
        }
        rows = self._rows(params)
        if not rows:
            raise PermanentError(ReasonCode.NOT_FOUND, f"no {self.table} record {ticket_id}")
        return rows[0]

    def _closed_or(self, refusal: PermanentError, ticket_id: str) -> PermanentError:
        """A 403 to a write on a record that is closed (an ACL or business rule refusing it) is `TicketClosed`."""
        if getattr(refusal, "http_status", None) != 403:
            return refusal
        try:
            current = self._current(ticket_id)
        except (PermanentError, TransientError):
            return refusal
        if not is_closed(current):
            return refusal
        return TicketClosed(f"{self.table} {current.get('number') or ticket_id} is closed: the write was refused")

    # --- HTTP -------------------------------------------------------------------------------------

    def _rows(self, params: dict, table: str | None = None) -> list[dict]:
        table = table or self.table
        body = json_object(self.send("GET", f"/api/now/table/{table}", write=False, params=params), write=False)
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
        return f"user {mask_address(secret.partition(':')[0])!r}"  # a user name may be an address

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
            return PermanentError(ReasonCode.CONFIGURATION, f"HTTP {status}: {message}")  # table or import_set_table
        if status == 400 and write:
            return PermanentError(ReasonCode.INVALID_FIELDS, message or f"HTTP {status}")
        if status in (400, 404) and not write:
            # A read of the table itself: "Invalid table <name>" is a setting to fix.
            return PermanentError(ReasonCode.CONFIGURATION, f"HTTP {status}: {message or 'not found'}")
        return None


def is_closed(record: dict) -> bool:
    """Closed or canceled: a task record is inactive then (Resolved stays active)."""
    return str(record.get("active", "true")).lower() == "false"


def authored_body(comment: CommentRequest) -> str:
    """The journal entry as the integration user writes it: a "From:" line says whose mail it is."""
    who = comment.author_email
    if comment.author_name and who:
        who = f"{' '.join(comment.author_name.split())} <{who}>"  # as people read it, never RFC 2047-encoded
    return f"From: {who}\n\n{comment.body}" if who else comment.body


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


def record_payload(
    request: TicketRequest, external_ref: str, settings: dict | None = None, *, people: dict | None = None
) -> dict:
    """The Table API record for a request. Deterministic: a retry sends the very same body (`people`: the
    caller and watch list the journal noted; without them the caller is the address)."""
    settings = settings or {}
    _, address = email.utils.parseaddr(request.requester)
    record = {
        "short_description": request.subject[:SHORT_DESCRIPTION_CHARS],
        "description": request.description,
        "caller_id": (people or {}).get("caller") or address or request.requester,
        "contact_type": "email",
        "correlation_id": external_ref,
        "correlation_display": "Mailroom",
    }
    if (people or {}).get("watch_list"):
        record["watch_list"] = people["watch_list"]
    if request.follow_up_of:
        # The closed record this one follows up, linked on the form (incident's own field, else task's).
        record["parent_incident" if (settings.get("table") or "incident") == "incident" else "parent"] = (
            request.follow_up_of
        )
    record.update(route_fields(request, settings))
    for name, value in sorted((request.fields or {}).items(), key=lambda item: str(item[0])):
        record[str(name)] = value
    return record

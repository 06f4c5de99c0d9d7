"""FakeDesk speaking the subset of the Salesforce REST API Mailroom's `salesforce` adapter uses.

    POST  /services/oauth2/token                                   OAuth 2.0 token (no auth)
            grant_type=client_credentials: client_id (any), client_secret == the desk token
            grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer: a well-formed RS256 JWT whose iss (the
            consumer key) == the desk token, with a sub and an exp in the future. The signature is NOT checked.
            -> 200 {"access_token", "instance_url", "id", "token_type": "Bearer", "issued_at", "signature"};
               400 {"error": "invalid_client" | "invalid_grant" | "unsupported_grant_type", "error_description"}
    PATCH /services/data/vXX.X/sobjects/Case/<External ID field>/<value>   upsert (a ticket write)
            -> 201 {"id", "success": true, "errors": [], "created": true}; 200 the same with created false;
               300 [record URLs] when several Cases carry the value; 400 [{"errorCode", "message", "fields"}]
    GET   /services/data/vXX.X/sobjects/Case/<External ID field>/<value>   -> 200 the Case, 300, 404
    GET   /services/data/vXX.X/sobjects/Case/describe                      -> 200 {"name": "Case", "fields": [...]}
    GET   /services/data/vXX.X/sobjects/Case/<Id>?fields=IsClosed,Status   -> 200 the Case (those fields), 404
    PATCH /services/data/vXX.X/sobjects/Case/<Id>  {Status, ...}   (a ticket write) -> 204; "Closed" closes it
    POST  /services/data/vXX.X/sobjects/CaseComment  {ParentId, CommentBody, IsPublished}   (a ticket write)
            -> 201 {"id", "success": true, "errors": []}; a closed Case takes comments too, as in Salesforce
    POST  /services/data/vXX.X/sobjects/ContentVersion  {Title, PathOnClient, VersionData (base64),
            FirstPublishLocationId (a Case), ReasonForChange, Description}   (a ticket write)
            -> 201 {"id": "068...", ...}: the file is on the Case (store attachment, marker = ReasonForChange)
    POST  /services/data/vXX.X/sobjects/Contact  {LastName, FirstName, Email} -> 201 {"id": "003..."}; an Email
            a Contact already has -> 400 DUPLICATES_DETECTED (an org whose duplicate rule blocks)
    GET   /services/data/vXX.X/query?q=<SOQL>  SELECT fields FROM Contact | Case | ContentVersion
            [WHERE f = 'v' [AND ...] | Id IN ('a', ...)] [ORDER BY f] [LIMIT n] -> {"totalSize", "done", "records"}
    POST  /_control/salesforce/cases  {Case fields, the external id field among them}: store a Case as is
            (no upsert), e.g. twice with one reference to provoke a 300.

API calls need `Authorization: Bearer <access token>` from the token endpoint; `revoke_sessions` (control
API) expires every token: 401 [{"errorCode": "INVALID_SESSION_ID"}]. Without a desk token, anything goes.
Cases live in the shared store (`fields`: the Case as received, plus Id and the external id field); a
CaseComment is a store comment (written by the API user: no author); a Contact is a store person, and a
Case's ContactId makes it the ticket's requester. `POST /_control/close` closes a Case: IsClosed true,
Status "Closed". Ids: Case `500` + 12 digits + `AAQ` (18 characters), CaseComment `00a`, Contact `003`,
ContentVersion `068`, ContentDocument `069`. Contacts and queries are not ticket writes: no faults, not in
the request log.
Faults reshape into Salesforce's answers; `rate_limit` becomes 403 REQUEST_LIMIT_EXCEEDED (the daily API
limit; the fault's Retry-After is kept, which real Salesforce does not send); `unauthorized_401` means the
integration user lost access: 401 INVALID_SESSION_ID and the next token request refused (400 invalid_grant),
so the adapter's one refresh fails as well. `revoke_sessions` only expires tokens: a refresh heals it.
"""

import base64
import binascii
import json
import mimetypes
import re
import time
from urllib.parse import parse_qs, unquote

from ..desk import WriteOutcome
from ..faults import rejection_for
from ..handler import Handler
from ..store import ValidationFailed

VERSION = r"/services/data/v(\d{2,3}\.\d)"
EXTERNAL_ID_FIELDS = ("Mailroom_Ref__c",)
STANDARD_FIELDS = (
    "Subject",
    "Description",
    "SuppliedEmail",
    "SuppliedName",
    "SuppliedPhone",
    "Origin",
    "Priority",
    "Status",
    "Type",
    "Reason",
    "RecordTypeId",
    "OwnerId",
    "ContactId",
    "AccountId",
    "ParentId",
)
RECORD_ID = r"[a-zA-Z0-9]{15}(?:[a-zA-Z0-9]{3})?"
CONTENT_VERSION_FIELDS = (
    "Title",
    "PathOnClient",
    "VersionData",
    "FirstPublishLocationId",
    "ReasonForChange",
    "Description",
)
# What SOQL can read here, per object.
QUERYABLE = {
    "Contact": ("Id", "Email", "Name", "FirstName", "LastName", "CreatedDate"),
    "Case": ("Id", "CaseNumber", "Subject", "Status", "IsClosed", "ParentId", "ContactId", "CreatedDate"),
    "ContentVersion": (
        "Id",
        "ContentDocumentId",
        "Title",
        "PathOnClient",
        "FirstPublishLocationId",
        "ContentSize",
        "IsLatest",
        "ReasonForChange",
        "Description",
        "CreatedDate",
    ),
}
SOQL = re.compile(
    r"\s*SELECT\s+(?P<fields>[\w\s,]+?)\s+FROM\s+(?P<object>\w+)(?:\s+WHERE\s+(?P<where>.+?))?"
    r"(?:\s+ORDER\s+BY\s+(?P<order>\w+)(?:\s+(?:ASC|DESC))?)?(?:\s+LIMIT\s+(?P<limit>\d+))?\s*",
    re.IGNORECASE | re.DOTALL,
)
LITERAL = r"'(?:[^'\\]|\\.)*'"
CONDITION = re.compile(
    rf"\s*(?P<field>\w+)\s*(?:=\s*(?P<value>{LITERAL}|true|false)|IN\s*\((?P<values>\s*{LITERAL}"
    rf"(?:\s*,\s*{LITERAL})*)\s*\))\s*",
    re.IGNORECASE,
)
READ_ONLY_FIELDS = ("Id", "CaseNumber", "CreatedDate")
STORE_FIELD_NAMES = {"description": "Description", "requester": "SuppliedEmail", "subject": "Subject"}


def case_id(store_id: int) -> str:
    return f"500{int(store_id):012d}AAQ"


def comment_id(store_id: int) -> str:
    return f"00a{int(store_id):012d}AAQ"


def contact_id(person_id: int) -> str:
    return f"003{int(person_id):012d}AAQ"


def version_id(attachment_id: int) -> str:
    return f"068{int(attachment_id):012d}AAQ"


def document_id(attachment_id: int) -> str:
    return f"069{int(attachment_id):012d}AAQ"


def store_id_of(record_id: str, prefix: str = "500") -> int | None:
    match = re.fullmatch(prefix + r"(\d{12})(?:AAQ)?", record_id or "")
    return int(match.group(1)) if match else None


def soql_literal(text: str):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "r": "\r"}.get(m.group(1), m.group(1)), text[1:-1])


def soql_matches(record: dict, field: str, wanted) -> bool:
    value = record.get(field)
    if isinstance(wanted, bool) or isinstance(value, bool):
        return value is wanted
    if field == "Id" or field.endswith("Id"):
        # Ids compare on their 15 case-sensitive characters (an 18-character Id only adds a checksum).
        return str(value or "")[:15] == str(wanted)[:15]
    return str(value or "").lower() == str(wanted).lower()  # SOQL compares text without case


def describe_fields() -> list[dict]:
    def field(name, kind="string", external=False, unique=False, updateable=True):
        return {
            "name": name,
            "type": kind,
            "externalId": external,
            "unique": unique,
            "idLookup": external,
            "updateable": updateable,
            "createable": updateable,
            "nillable": name != "Id",
        }

    return (
        [field("Id", "id", updateable=False), field("CaseNumber", updateable=False)]
        + [field(name, "textarea" if name == "Description" else "string") for name in STANDARD_FIELDS]
        + [field(name, external=True, unique=True) for name in EXTERNAL_ID_FIELDS]
    )


class SalesforceHandler(Handler):
    API_ROUTES = [
        ("POST", re.compile(r"/services/oauth2/token"), "sf_token", False),
        ("GET", re.compile(VERSION + r"/sobjects/Case/describe"), "sf_describe", True),
        ("PATCH", re.compile(VERSION + r"/sobjects/Case/(\w+)/([^/]+)"), "sf_upsert", True),
        ("GET", re.compile(VERSION + r"/sobjects/Case/(\w+)/([^/]+)"), "sf_get_by_external_id", True),
        ("GET", re.compile(VERSION + r"/sobjects/Case/(" + RECORD_ID + ")"), "sf_get_case", True),
        ("PATCH", re.compile(VERSION + r"/sobjects/Case/(" + RECORD_ID + ")"), "sf_update_case", True),
        ("POST", re.compile(VERSION + r"/sobjects/CaseComment"), "sf_case_comment", True),
        ("POST", re.compile(VERSION + r"/sobjects/ContentVersion"), "sf_content_version", True),
        ("POST", re.compile(VERSION + r"/sobjects/Contact"), "sf_create_contact", True),
        ("GET", re.compile(VERSION + r"/query/?"), "sf_query", True),
    ]
    CONTROL_ROUTES = Handler.CONTROL_ROUTES + [
        ("POST", re.compile(r"/_control/salesforce/cases"), "control_seed_case", False),
    ]
    IDEMPOTENCY_HEADER = None
    PAYLOAD_KEY = None
    UNAUTHENTICATED = (401, [{"message": "Session expired or invalid", "errorCode": "INVALID_SESSION_ID"}])

    def _authenticated(self) -> bool:
        if not self.desk.token:
            return True
        scheme, _, session = (self.headers.get("Authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and self.desk.session_valid(session.strip())

    def _send_errors(self, status: int, code: str, message: str, fields=()):
        self._send(status, [{"message": message, "errorCode": code, "fields": list(fields)}])

    def _send(self, status: int, body, headers: dict | None = None):
        if status != 204:
            super()._send(status, body, headers)
            return
        # 204 No Content (an update by Id): no body, and no Content-Length either.
        self.send_response(204)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()

    def rejection(self, fault):
        answer = rejection_for(fault)
        if answer is None:
            return None
        status, headers, _ = answer
        if status == 429:
            return 403, headers, [{"message": "TotalRequests Limit exceeded.", "errorCode": "REQUEST_LIMIT_EXCEEDED"}]
        if status == 401:
            # The integration user lost access: this session is refused and so is the next token request,
            # so the adapter's one refresh fails too (revoke_sessions, by contrast, a refresh heals).
            with self.desk.store.transaction():
                self.desk.__dict__["salesforce_refuse_next_token"] = True
            return 401, headers, self.UNAUTHENTICATED[1]
        if status == 422:
            return (
                400,
                headers,
                [
                    {
                        "message": "Supplied email is not allowed by a validation rule",
                        "errorCode": "FIELD_CUSTOM_VALIDATION_EXCEPTION",
                        "fields": ["SuppliedEmail"],
                    }
                ],
            )
        if status == 503:
            return 503, headers, [{"message": "Server unavailable", "errorCode": "SERVER_UNAVAILABLE"}]
        return (
            status,
            headers,
            [
                {
                    "message": "An unexpected error occurred. Please include this ErrorId if you "
                    "contact support: 1234567-89 (-1)",
                    "errorCode": "UNKNOWN_EXCEPTION",
                }
            ],
        )

    def invalid_body(self) -> tuple[int, list]:
        return 400, [{"message": "The request body is not a JSON object", "errorCode": "JSON_PARSER_ERROR"}]

    # OAuth.

    def sf_token(self):
        form = {name: values[0] for name, values in parse_qs(self.raw_body.decode(errors="replace")).items()}
        grant = form.get("grant_type")
        if grant == "client_credentials":
            secret_ok = not self.desk.token or form.get("client_secret") == self.desk.token
            accepted = bool(form.get("client_id")) and secret_ok
            error = ("invalid_client", "invalid client credentials")
        elif grant == "urn:ietf:params:oauth:grant-type:jwt-bearer":
            accepted = self._assertion_accepted(form.get("assertion") or "")
            error = ("invalid_grant", "invalid assertion")
        else:
            self._send(400, {"error": "unsupported_grant_type", "error_description": "grant type not supported"})
            return
        with self.desk.store.transaction():
            if self.desk.__dict__.pop("salesforce_refuse_next_token", False):
                accepted, error = False, ("invalid_grant", "user is not admin approved to access this app")
        if not accepted:
            self._send(400, {"error": error[0], "error_description": error[1]})
            return
        base = self._base_url()
        self._send(
            200,
            {
                "access_token": self.desk.issue_session(),
                "instance_url": base,
                "id": f"{base}/id/00D000000000001AAA/005000000000001AAA",
                "token_type": "Bearer",
                "issued_at": str(int(time.time() * 1000)),
                "signature": "fakedesk",
                "scope": "api",
            },
        )

    def _assertion_accepted(self, assertion: str) -> bool:
        parts = assertion.split(".")
        if len(parts) != 3 or not all(parts):
            return False
        try:
            header = json.loads(base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4)))
            claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        except ValueError:
            return False
        if not isinstance(header, dict) or header.get("alg") != "RS256" or not isinstance(claims, dict):
            return False
        issuer_ok = not self.desk.token or claims.get("iss") == self.desk.token
        expiry = claims.get("exp")
        return issuer_ok and bool(claims.get("sub")) and isinstance(expiry, int) and expiry > time.time()

    # Cases.

    def sf_describe(self, version):
        self._send(
            200,
            {
                "name": "Case",
                "label": "Case",
                "keyPrefix": "500",
                "createable": True,
                "updateable": True,
                "fields": describe_fields(),
            },
        )

    def _case_json(self, ticket: dict, version: str) -> dict:
        fields = ticket["fields"]
        closed = ticket["status"] == "closed"
        return {
            "attributes": {"type": "Case", "url": f"/services/data/v{version}/sobjects/Case/{fields['Id']}"},
            "CaseNumber": f"{ticket['id']:08d}",
            **fields,
            "IsClosed": closed,
            "Status": "Closed" if closed else fields.get("Status") or "New",
            "CreatedDate": ticket["created_at"],
        }

    def _references_missing(self, case: dict) -> list[str]:
        """The lookup fields of a Case write that name no record here (ContactId, ParentId)."""
        base, missing = self._base_url(), []
        contact = case.get("ContactId")
        if contact is not None:
            person_id = store_id_of(str(contact), "003")
            if person_id is None or self.desk.store.person(person_id=person_id) is None:
                missing.append("ContactId")
        parent = case.get("ParentId")
        if parent is not None:
            parent_id = store_id_of(str(parent)[:15])
            if parent_id is None or self.desk.store.ticket(parent_id, base) is None:
                missing.append("ParentId")
        return missing

    def _link_contact(self, store_id: int, case: dict) -> None:
        if case.get("ContactId"):
            person = self.desk.store.person(person_id=store_id_of(str(case["ContactId"]), "003"))
            self.desk.store.add_ticket_person(store_id, person["email"], "requester")

    def _unknown_external_id_field(self, field: str) -> bool:
        if field in EXTERNAL_ID_FIELDS:
            return False
        self._send_errors(404, "NOT_FOUND", f"Provided external ID field does not exist or is not accessible: {field}")
        return True

    def sf_upsert(self, version, field, value):
        if self._unknown_external_id_field(field):
            return
        value = unquote(value)
        self._ticket_write(
            "PATCH",
            f"/services/data/v{version}/sobjects/Case/{field}/{value}",
            lambda case: self._do_upsert(version, field, value, case),
            external_id_of=lambda case: value,
        )

    def _do_upsert(self, version: str, field: str, value: str, case: dict) -> WriteOutcome:
        refused = [
            name
            for name in case
            if name in (field, *READ_ONLY_FIELDS) or (name not in STANDARD_FIELDS and not name.endswith("__c"))
        ]
        if refused:
            return WriteOutcome(
                400,
                [
                    {
                        "message": f"No such column or not writable here: {refused[0]}",
                        "errorCode": "INVALID_FIELD",
                        "fields": refused,
                    }
                ],
            )
        missing = self._references_missing(case)
        if missing:
            return WriteOutcome(
                400,
                [
                    {
                        "message": "invalid cross reference id",
                        "errorCode": "INVALID_CROSS_REFERENCE_KEY",
                        "fields": missing,
                    }
                ],
            )
        ticket = {"subject": case.get("Subject"), "description": case.get("Description"), "external_id": value}
        if case.get("SuppliedEmail") is not None:
            ticket["requester"] = {"email": case["SuppliedEmail"]}
        existing = self.desk.store.tickets(self._base_url(), value)
        if len(existing) > 1:
            urls = [f"/services/data/v{version}/sobjects/Case/{t['fields']['Id']}" for t in existing]
            return WriteOutcome(300, urls)
        try:
            if existing:
                store_id = existing[0]["id"]
                self.desk.store.update_fields(store_id, ticket, case)
                created = False
            else:
                store_id = self.desk.store.create_ticket(ticket, fields={**case, field: value})
                self.desk.store.update_fields(store_id, {}, {"Id": case_id(store_id)})
                created = True
        except ValidationFailed as exc:
            return WriteOutcome(
                400,
                [
                    {
                        "message": "Required fields are missing or invalid",
                        "errorCode": "REQUIRED_FIELD_MISSING",
                        "fields": [STORE_FIELD_NAMES.get(k, k) for k in exc.details],
                    }
                ],
            )
        self._link_contact(store_id, case)
        body = {"id": case_id(store_id), "success": True, "errors": [], "created": created}
        return WriteOutcome(201 if created else 200, body, committed=True, ticket_id=store_id)

    def sf_get_by_external_id(self, version, field, value):
        if self._unknown_external_id_field(field):
            return
        with self.desk.store.transaction():
            found = self.desk.store.tickets(self._base_url(), unquote(value))
        if not found:
            self._send_errors(404, "NOT_FOUND", "The requested resource does not exist")
        elif len(found) > 1:
            self._send(300, [f"/services/data/v{version}/sobjects/Case/{t['fields']['Id']}" for t in found])
        else:
            self._send(200, self._case_json(found[0], version))

    def sf_case_comment(self, version):
        self._ticket_write(
            "POST",
            f"/services/data/v{version}/sobjects/CaseComment",
            self._do_case_comment,
            external_id_of=lambda comment: None,
        )

    def _do_case_comment(self, comment: dict) -> WriteOutcome:
        parent = str(comment.get("ParentId") or "")
        if not re.fullmatch(r"[a-zA-Z0-9]{15}(?:[a-zA-Z0-9]{3})?", parent):
            return WriteOutcome(
                400, [{"message": f"invalid ID field: {parent}", "errorCode": "MALFORMED_ID", "fields": ["ParentId"]}]
            )
        store_id = store_id_of(parent)
        if store_id is None or self.desk.store.ticket(store_id, self._base_url()) is None:
            return WriteOutcome(
                400,
                [
                    {
                        "message": "invalid cross reference id",
                        "errorCode": "INVALID_CROSS_REFERENCE_KEY",
                        "fields": ["ParentId"],
                    }
                ],
            )
        try:
            audit = self.desk.store.add_comment(
                store_id,
                {"comment": {"body": comment.get("CommentBody"), "public": bool(comment.get("IsPublished", False))}},
            )
        except ValidationFailed:
            return WriteOutcome(
                400,
                [
                    {
                        "message": "Required fields are missing: [CommentBody]",
                        "errorCode": "REQUIRED_FIELD_MISSING",
                        "fields": ["CommentBody"],
                    }
                ],
            )
        return WriteOutcome(
            201, {"id": comment_id(audit["id"]), "success": True, "errors": []}, committed=True, ticket_id=store_id
        )

    def _case_by_id(self, record_id: str) -> dict | None:
        store_id = store_id_of(record_id[:15])
        return None if store_id is None else self.desk.store.ticket(store_id, self._base_url())

    def sf_get_case(self, version, record_id):
        with self.desk.store.transaction():
            ticket = self._case_by_id(record_id)
        if ticket is None:
            self._send_errors(404, "NOT_FOUND", "The requested resource does not exist")
            return
        case = self._case_json(ticket, version)
        wanted = [f.strip() for f in ",".join(self.query.get("fields") or []).split(",") if f.strip()]
        unknown = [f for f in wanted if f not in case and f not in STANDARD_FIELDS]
        if unknown:
            self._send_errors(400, "INVALID_FIELD", f"No such column '{unknown[0]}' on entity 'Case'")
            return
        if wanted:
            case = {"attributes": case["attributes"], "Id": case["Id"], **{f: case.get(f) for f in wanted}}
        self._send(200, case)

    def sf_update_case(self, version, record_id):
        self._ticket_write(
            "PATCH",
            f"/services/data/v{version}/sobjects/Case/{record_id}",
            lambda case: self._do_update_case(record_id, case),
            external_id_of=lambda case: None,
        )

    def _do_update_case(self, record_id: str, case: dict) -> WriteOutcome:
        ticket = self._case_by_id(record_id)
        if ticket is None:
            return WriteOutcome(404, [{"message": "The requested resource does not exist", "errorCode": "NOT_FOUND"}])
        refused = [name for name in case if name not in STANDARD_FIELDS and not name.endswith("__c")]
        if refused:
            return WriteOutcome(
                400,
                [
                    {
                        "message": f"No such column or not writable here: {refused[0]}",
                        "errorCode": "INVALID_FIELD",
                        "fields": refused,
                    }
                ],
            )
        missing = self._references_missing(case)
        if missing:
            return WriteOutcome(
                400,
                [
                    {
                        "message": "invalid cross reference id",
                        "errorCode": "INVALID_CROSS_REFERENCE_KEY",
                        "fields": missing,
                    }
                ],
            )
        self.desk.store.update_fields(ticket["id"], {}, case)
        if "Status" in case:
            self.desk.store.set_status(ticket["id"], "closed" if case["Status"] == "Closed" else "open")
        self._link_contact(ticket["id"], case)
        return WriteOutcome(204, {}, committed=True, ticket_id=ticket["id"])

    # Files.

    def sf_content_version(self, version):
        self._ticket_write(
            "POST",
            f"/services/data/v{version}/sobjects/ContentVersion",
            self._do_content_version,
            external_id_of=lambda content: None,
        )

    def _versions(self) -> dict:
        """attachment id -> the ContentVersion's text fields as received (the store keeps the file itself)."""
        return self.desk.__dict__.setdefault("salesforce_versions", {})

    def _do_content_version(self, content: dict) -> WriteOutcome:
        refused = [name for name in content if name not in CONTENT_VERSION_FIELDS and not name.endswith("__c")]
        if refused:
            return WriteOutcome(
                400,
                [
                    {
                        "message": f"No such column '{refused[0]}' on sobject of type ContentVersion",
                        "errorCode": "INVALID_FIELD",
                        "fields": refused,
                    }
                ],
            )
        missing = [name for name in ("PathOnClient", "VersionData") if not content.get(name)]
        if missing:
            return WriteOutcome(
                400,
                [
                    {
                        "message": f"Required fields are missing: {missing}",
                        "errorCode": "REQUIRED_FIELD_MISSING",
                        "fields": missing,
                    }
                ],
            )
        try:
            data = base64.b64decode(str(content["VersionData"]), validate=True)
        except (binascii.Error, ValueError):
            return WriteOutcome(
                400,
                [{"message": "VersionData: not valid base64", "errorCode": "INVALID_FIELD", "fields": ["VersionData"]}],
            )
        ticket = self._case_by_id(str(content.get("FirstPublishLocationId") or ""))
        if ticket is None:
            # This fake keeps files on Cases only; Salesforce would also take a library or another record.
            return WriteOutcome(
                400,
                [
                    {
                        "message": "invalid cross reference id",
                        "errorCode": "INVALID_CROSS_REFERENCE_KEY",
                        "fields": ["FirstPublishLocationId"],
                    }
                ],
            )
        path = str(content["PathOnClient"])
        attachment_id = self.desk.store.attach_data(
            ticket["id"],
            path,
            mimetypes.guess_type(path)[0] or "application/octet-stream",
            data,
            marker=str(content.get("ReasonForChange") or ""),
        )
        self._versions()[attachment_id] = {k: v for k, v in content.items() if k != "VersionData"}
        return WriteOutcome(
            201,
            {"id": version_id(attachment_id), "success": True, "errors": []},
            committed=True,
            ticket_id=ticket["id"],
        )

    # Contacts (not ticket writes: no faults, not in the request log).

    def sf_create_contact(self, version):
        contact = self._parse_json()
        if contact is None:
            status, body = self.invalid_body()
            self._send(status, body)
            return
        email = str(contact.get("Email") or "").strip()
        if not contact.get("LastName"):
            self._send_errors(400, "REQUIRED_FIELD_MISSING", "Required fields are missing: [LastName]", ["LastName"])
            return
        if email and not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", email):
            self._send_errors(400, "INVALID_EMAIL_ADDRESS", f"Email: invalid email address: {email}", ["Email"])
            return
        with self.desk.store.transaction():
            if email and self.desk.store.person(email=email) is not None:
                created = None
            else:
                name = " ".join(str(contact.get(k) or "") for k in ("FirstName", "LastName")).strip()
                created, _ = self.desk.store.find_or_create_person(email or f"no-email-{time.time_ns()}", name)
        if created is None:
            self._send_errors(400, "DUPLICATES_DETECTED", "Use one of these records?")
            return
        self._send(201, {"id": contact_id(created), "success": True, "errors": []})

    # SOQL (a small part of it: what the adapter asks).

    def sf_query(self, version):
        soql = (self.query.get("q") or [""])[0]
        match = SOQL.fullmatch(soql)
        if not match:
            self._send_errors(400, "MALFORMED_QUERY", "unexpected token")
            return
        entity = next((name for name in QUERYABLE if name.lower() == match["object"].lower()), None)
        if entity is None:
            self._send_errors(400, "INVALID_TYPE", f"sObject type '{match['object']}' is not supported.")
            return
        fields = [f.strip() for f in match["fields"].split(",") if f.strip()]
        conditions = self._conditions(match["where"] or "")
        if conditions is None:
            self._send_errors(400, "MALFORMED_QUERY", "unexpected token in WHERE")
            return
        used = fields + [field for field, _ in conditions] + ([match["order"]] if match["order"] else [])
        unknown = [f for f in used if f not in QUERYABLE[entity]]
        if unknown:
            self._send_errors(400, "INVALID_FIELD", f"No such column '{unknown[0]}' on entity '{entity}'")
            return
        with self.desk.store.transaction():
            rows = [
                r
                for r in self._records(entity, version)
                if all(any(soql_matches(r, f, w) for w in wanted) for f, wanted in conditions)
            ]
        if match["limit"]:
            rows = rows[: int(match["limit"])]
        records = [{"attributes": r["attributes"], **{f: r.get(f) for f in fields}} for r in rows]
        self._send(200, {"totalSize": len(records), "done": True, "records": records})

    @staticmethod
    def _conditions(where: str) -> list[tuple[str, list]] | None:
        """[(field, [accepted values])] of `f = 'v' AND f IN ('a', 'b')`; None when it is not that."""
        conditions, position = [], 0
        while where[position:].strip():
            if conditions:
                joined = re.match(r"\s*AND\b", where[position:], re.IGNORECASE)
                if not joined:
                    return None
                position += joined.end()
            found = CONDITION.match(where, position)
            if not found:
                return None
            literals = [found["value"]] if found["value"] else re.findall(LITERAL, found["values"])
            conditions.append((found["field"], [soql_literal(v) for v in literals]))
            position = found.end()
        return conditions

    def _records(self, entity: str, version: str) -> list[dict]:
        store, base, url = self.desk.store, self._base_url(), f"/services/data/v{version}/sobjects/{entity}/"
        if entity == "Contact":
            rows = []
            for person in store.people():
                first, _, last = person["name"].rpartition(" ")
                rows.append(
                    {
                        "Id": contact_id(person["id"]),
                        "Email": person["email"],
                        "Name": person["name"],
                        "FirstName": first or None,
                        "LastName": last,
                        "CreatedDate": person["created_at"],
                    }
                )
        elif entity == "Case":
            rows = [self._case_json(t, version) for t in store.tickets(base) if t["fields"].get("Id")]
        else:
            rows = []
            for ticket in store.tickets(base):
                for attachment in store.attachments(ticket["id"]):
                    extra = self._versions().get(attachment["id"], {})
                    rows.append(
                        {
                            **extra,
                            "Id": version_id(attachment["id"]),
                            "ContentDocumentId": document_id(attachment["id"]),
                            "Title": extra.get("Title") or attachment["filename"],
                            "PathOnClient": attachment["filename"],
                            "FirstPublishLocationId": case_id(ticket["id"]),
                            "ContentSize": attachment["size"],
                            "IsLatest": True,
                            "CreatedDate": attachment["created_at"],
                        }
                    )
        return [{"attributes": {"type": entity, "url": url + row["Id"]}, **row} for row in rows]

    # Control: Cases stored as they are, without the upsert's uniqueness (two with one reference -> 300).

    def control_seed_case(self):
        case = self._json_body()
        if case is None:
            return
        with self.desk.store.transaction():
            store_id = self.desk.store.create_ticket(
                {
                    "subject": case.get("Subject"),
                    "description": case.get("Description") or "seeded",
                    "external_id": case.get(EXTERNAL_ID_FIELDS[0]),
                },
                fields=case,
            )
            self.desk.store.update_fields(store_id, {}, {"Id": case_id(store_id)})
        self._send(201, {"id": case_id(store_id), "success": True, "errors": []})

    def control_reset(self):
        with self.desk.store.transaction():
            self.desk.__dict__.pop("salesforce_refuse_next_token", None)
            self.desk.__dict__.pop("salesforce_versions", None)
        super().control_reset()

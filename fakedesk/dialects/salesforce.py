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
    POST  /services/data/vXX.X/sobjects/CaseComment  {ParentId, CommentBody, IsPublished}   (a ticket write)
            -> 201 {"id", "success": true, "errors": []}
    POST  /_control/salesforce/cases  {Case fields, the external id field among them}: store a Case as is
            (no upsert), e.g. twice with one reference to provoke a 300.

API calls need `Authorization: Bearer <access token>` from the token endpoint; `revoke_sessions` (control
API) expires every token: 401 [{"errorCode": "INVALID_SESSION_ID"}]. Without a desk token, anything goes.
Cases live in the shared store (`fields`: the Case as received, plus Id and the external id field); a
CaseComment is a store comment. Ids: Case `500` + 12 digits + `AAQ` (18 characters), CaseComment `00a`...
Faults reshape into Salesforce's answers; `rate_limit` becomes 403 REQUEST_LIMIT_EXCEEDED (the daily API
limit; the fault's Retry-After is kept, which real Salesforce does not send); `unauthorized_401` means the
integration user lost access: 401 INVALID_SESSION_ID and the next token request refused (400 invalid_grant),
so the adapter's one refresh fails as well. `revoke_sessions` only expires tokens: a refresh heals it.
"""
import base64
import json
import re
import time
from urllib.parse import parse_qs, unquote

from ..desk import WriteOutcome
from ..faults import rejection_for
from ..handler import Handler
from ..store import ValidationFailed

VERSION = r"/services/data/v(\d{2,3}\.\d)"
EXTERNAL_ID_FIELDS = ("Mailroom_Ref__c",)
STANDARD_FIELDS = ("Subject", "Description", "SuppliedEmail", "SuppliedName", "SuppliedPhone", "Origin",
                   "Priority", "Status", "Type", "Reason", "RecordTypeId", "OwnerId", "ContactId", "AccountId")
READ_ONLY_FIELDS = ("Id", "CaseNumber", "CreatedDate")
STORE_FIELD_NAMES = {"description": "Description", "requester": "SuppliedEmail", "subject": "Subject"}


def case_id(store_id: int) -> str:
    return f"500{int(store_id):012d}AAQ"


def comment_id(store_id: int) -> str:
    return f"00a{int(store_id):012d}AAQ"


def store_id_of(record_id: str, prefix: str = "500") -> int | None:
    match = re.fullmatch(prefix + r"(\d{12})(?:AAQ)?", record_id or "")
    return int(match.group(1)) if match else None


def describe_fields() -> list[dict]:
    def field(name, kind="string", external=False, unique=False, updateable=True):
        return {"name": name, "type": kind, "externalId": external, "unique": unique, "idLookup": external,
                "updateable": updateable, "createable": updateable, "nillable": name != "Id"}
    return ([field("Id", "id", updateable=False), field("CaseNumber", updateable=False)]
            + [field(name, "textarea" if name == "Description" else "string") for name in STANDARD_FIELDS]
            + [field(name, external=True, unique=True) for name in EXTERNAL_ID_FIELDS])


class SalesforceHandler(Handler):
    API_ROUTES = [
        ("POST", re.compile(r"/services/oauth2/token"), "sf_token", False),
        ("GET", re.compile(VERSION + r"/sobjects/Case/describe"), "sf_describe", True),
        ("PATCH", re.compile(VERSION + r"/sobjects/Case/(\w+)/([^/]+)"), "sf_upsert", True),
        ("GET", re.compile(VERSION + r"/sobjects/Case/(\w+)/([^/]+)"), "sf_get_by_external_id", True),
        ("POST", re.compile(VERSION + r"/sobjects/CaseComment"), "sf_case_comment", True),
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
            return 400, headers, [{"message": "Supplied email is not allowed by a validation rule",
                                   "errorCode": "FIELD_CUSTOM_VALIDATION_EXCEPTION", "fields": ["SuppliedEmail"]}]
        if status == 503:
            return 503, headers, [{"message": "Server unavailable", "errorCode": "SERVER_UNAVAILABLE"}]
        return status, headers, [{"message": "An unexpected error occurred. Please include this ErrorId if you "
                                  "contact support: 1234567-89 (-1)", "errorCode": "UNKNOWN_EXCEPTION"}]

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
        self._send(200, {"access_token": self.desk.issue_session(), "instance_url": base,
                         "id": f"{base}/id/00D000000000001AAA/005000000000001AAA", "token_type": "Bearer",
                         "issued_at": str(int(time.time() * 1000)), "signature": "fakedesk",
                         "scope": "api"})

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
        self._send(200, {"name": "Case", "label": "Case", "keyPrefix": "500", "createable": True,
                         "updateable": True, "fields": describe_fields()})

    def _case_json(self, ticket: dict, version: str) -> dict:
        fields = ticket["fields"]
        return {"attributes": {"type": "Case", "url": f"/services/data/v{version}/sobjects/Case/{fields['Id']}"},
                "CaseNumber": f"{ticket['id']:08d}", **fields}

    def _unknown_external_id_field(self, field: str) -> bool:
        if field in EXTERNAL_ID_FIELDS:
            return False
        self._send_errors(404, "NOT_FOUND", f"Provided external ID field does not exist or is not accessible: {field}")
        return True

    def sf_upsert(self, version, field, value):
        if self._unknown_external_id_field(field):
            return
        value = unquote(value)
        self._ticket_write("PATCH", f"/services/data/v{version}/sobjects/Case/{field}/{value}",
                           lambda case: self._do_upsert(version, field, value, case),
                           external_id_of=lambda case: value)

    def _do_upsert(self, version: str, field: str, value: str, case: dict) -> WriteOutcome:
        refused = [name for name in case if name in (field, *READ_ONLY_FIELDS)
                   or (name not in STANDARD_FIELDS and not name.endswith("__c"))]
        if refused:
            return WriteOutcome(400, [{"message": f"No such column or not writable here: {refused[0]}",
                                       "errorCode": "INVALID_FIELD", "fields": refused}])
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
            return WriteOutcome(400, [{"message": "Required fields are missing or invalid",
                                       "errorCode": "REQUIRED_FIELD_MISSING",
                                       "fields": [STORE_FIELD_NAMES.get(k, k) for k in exc.details]}])
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
        self._ticket_write("POST", f"/services/data/v{version}/sobjects/CaseComment", self._do_case_comment,
                           external_id_of=lambda comment: None)

    def _do_case_comment(self, comment: dict) -> WriteOutcome:
        parent = str(comment.get("ParentId") or "")
        if not re.fullmatch(r"[a-zA-Z0-9]{15}(?:[a-zA-Z0-9]{3})?", parent):
            return WriteOutcome(400, [{"message": f"invalid ID field: {parent}", "errorCode": "MALFORMED_ID",
                                       "fields": ["ParentId"]}])
        store_id = store_id_of(parent)
        if store_id is None or self.desk.store.ticket(store_id, self._base_url()) is None:
            return WriteOutcome(400, [{"message": "invalid cross reference id",
                                       "errorCode": "INVALID_CROSS_REFERENCE_KEY", "fields": ["ParentId"]}])
        try:
            audit = self.desk.store.add_comment(store_id, {"comment": {
                "body": comment.get("CommentBody"), "public": bool(comment.get("IsPublished", False))}})
        except ValidationFailed:
            return WriteOutcome(400, [{"message": "Required fields are missing: [CommentBody]",
                                       "errorCode": "REQUIRED_FIELD_MISSING", "fields": ["CommentBody"]}])
        return WriteOutcome(201, {"id": comment_id(audit["id"]), "success": True, "errors": []},
                            committed=True, ticket_id=store_id)

    # Control: Cases stored as they are, without the upsert's uniqueness (two with one reference -> 300).

    def control_seed_case(self):
        case = self._json_body()
        if case is None:
            return
        with self.desk.store.transaction():
            store_id = self.desk.store.create_ticket(
                {"subject": case.get("Subject"), "description": case.get("Description") or "seeded",
                 "external_id": case.get(EXTERNAL_ID_FIELDS[0])}, fields=case)
            self.desk.store.update_fields(store_id, {}, {"Id": case_id(store_id)})
        self._send(201, {"id": case_id(store_id), "success": True, "errors": []})

    def control_reset(self):
        with self.desk.store.transaction():
            self.desk.__dict__.pop("salesforce_refuse_next_token", None)
        super().control_reset()

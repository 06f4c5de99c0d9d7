"""Salesforce destination: Cases through the Salesforce REST API (docs/design.md §6 "The intent state machine").

The create is an upsert on an External ID field of Case (`PATCH /services/data/vXX/sobjects/Case/
<external_id_field>/<external_ref>`): 201 created, 200 updated (a retry found the one Case), 300 several
Cases carry our reference (never retried: a person decides). Sending the create again is therefore safe
(`upsert = True`): an unknown outcome is settled by a retry (`ticketing.intents.resolve_unknown`), and a
5xx after the create is transient. The same resource answers a GET (`consistent_lookup`). A comment is a
CaseComment, which Salesforce does not de-duplicate: a 5xx or a lost answer after one is ambiguous.

Authentication: OAuth 2.0, `POST <login_url>/services/oauth2/token`, either the client-credentials flow
(the connected app's "Run As" user) or the JWT bearer flow (an RS256 assertion signed with the app's
private key, iss = consumer key, sub = username, aud = login_url). The access token is cached per process
(destination + secret) and fetched again once when Salesforce answers 401 INVALID_SESSION_ID.
A 400 invalid_client / invalid_grant from the token endpoint is a credentials failure.

`Destination.base_url`: the org's My Domain URL (https://acme.my.salesforce.com); every API call goes there.
`Destination.credentials_ref` resolves to `client_id:client_secret`, or a JSON object
{"client_id": ..., "client_secret": ...} (client credentials) / {"client_id": ..., "private_key": "<PEM>"}
(JWT bearer).
`Destination.settings` (all optional but `username` for the JWT flow):
    connect_timeout (3.05 s), read_timeout (10 s), api_version ("62.0"),
    external_id_field ("Mailroom_Ref__c": a Text field of Case marked External ID, best also Unique),
    auth_flow ("client_credentials" | "jwt_bearer"), login_url (base_url), username (JWT `sub`),
    origin ("Email"), comment_public (true: a customer's CaseComment is published; false: none is),
    create_contacts (true: an unknown requester becomes a Contact), file_key_field ("ReasonForChange": the
    ContentVersion field that keeps each file's key), reopen_status ("New": closed_policy reopen).
  The route is mapped by: queues {queue slug: queue id (00G...)} -> OwnerId, owners {assignee name: user
  id (005...)} -> OwnerId (wins over the queue), priorities {low|normal|high|urgent: picklist value}
  (default Low/Medium/High/High), case_types {request type: Type value, or a record type id 012...
  -> RecordTypeId}. A value without a mapping is left out. `TicketRequest.fields` (API field names) come last.

People: the requester is a Contact, found by Email (SOQL) or created (`POST /sobjects/Contact`), and set as
Case.ContactId (SuppliedEmail/SuppliedName stay). Case has no CC: the CC'd addresses open the Description
("CC: ..."). Files go after the create, one ContentVersion each with FirstPublishLocationId = the Case
(which links it), their key in `file_key_field`; a lost answer is settled by a SOQL lookup of that key.
A reply is a CaseComment opening with a "From:" line (the API user writes it); an agent's is unpublished.
A Case that IsClosed (read before each comment; Salesforce itself would accept the comment) is reopened
(closed_policy reopen: Status = reopen_status) or refused with TicketClosed (follow_up: the new Case's
ParentId is the old one; review). Email-to-Case's Ref ID thread ("ref:_00Dxx._500xx:ref") names a Case;
Lightning threading tokens are opaque and not read.
Left out: tags (a Case has none), listing for reconciliation.

Nothing logged here contains a ticket body, a token or a full email address.
"""

import base64
import email.utils
import hashlib
import itertools
import json
import logging
import os.path
import re
import threading
import time
from urllib.parse import quote

import requests

from intake.egress import EgressRefused
from intake.http import parse_retry_after
from intake.logging import mask_address
from intake.vocabulary import ReasonCode

from .base import (
    AmbiguousOutcome,
    CommentRequest,
    OutgoingFile,
    PermanentError,
    TicketClosed,
    TicketRequest,
    TicketResult,
    TransientError,
)
from .capabilities import FILES_AFTER_WRITE, FOLLOW_UP, MB, REOPEN, REQUESTER_FIND_OR_CREATE, REVIEW, Capabilities
from .http import HttpDestination, answered_with, egress_refusal, field_errors, json_object
from .settings import HTTP_SETTINGS, Flag, Mapping, Text, Url

log = logging.getLogger(__name__)

TOKEN_PATH = "/services/oauth2/token"
JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
SALESFORCE_ID = r"[a-zA-Z0-9]{15}(?:[a-zA-Z0-9]{3})?"
RECORD_TYPE_ID = r"012[a-zA-Z0-9]{12}(?:[a-zA-Z0-9]{3})?"
DEFAULT_PRIORITIES = {"low": "Low", "normal": "Medium", "high": "High", "urgent": "High"}
# CaseComment.CommentBody takes 4,000 characters; Case.Description 32,000 (`max_description_chars`).
MAX_COMMENT_CHARS = 4000
COMMENT_CUT_NOTICE = "\n\n[Mailroom: shortened to fit Salesforce's 4,000-character comment limit.]"
# A ParentId that names no Case (deleted, or another org's): the ticket is gone, not our fields.
MISSING_PARENT_CODES = {"INVALID_CROSS_REFERENCE_KEY", "FIELD_INTEGRITY_EXCEPTION", "MALFORMED_ID", "ENTITY_IS_DELETED"}
DESCRIPTION_CUT_NOTICE = "\n\n[Mailroom: shortened to fit Salesforce's 32,000-character description limit.]"
FIELD_NAME = r"[A-Za-z][A-Za-z0-9_]*"
# A JSON (non-multipart) insert takes at most 37.5 MB of base64-encoded data (REST API, "Insert or Update
# Blob Data"); 37 MB of file leaves room for the JSON around it.
MAX_JSON_FILE_BYTES = 37 * MB
# Salesforce counts API calls per rolling 24 hours (100,000 and up per org, by edition and licences), not
# per minute: 40 a minute is 57,600 a day, under 60 % of the smallest Enterprise allocation, leaving the
# rest to the org's other integrations. A destination's `requests_per_minute` setting replaces it.
DEFAULT_REQUESTS_PER_MINUTE = 40
# Email-to-Case's Ref ID thread: "ref:_" + the org Id shortened + "._" + the Case Id shortened (the first
# five characters, the next five without their zeros, the last five). Its format is Salesforce's, not
# documented as stable; Lightning threading's "thread::...::" token is opaque and resolvable only in Apex.
REF_ID = re.compile(r"ref:(?P<ref>_00D[0-9A-Za-z]{2,12}\._500[0-9A-Za-z]{7,12}):ref")

# Access tokens per process: (destination pk, digest of secret and login settings) -> token.
_tokens: dict[tuple, str] = {}
_tokens_lock = threading.Lock()


class SalesforceDestination(HttpDestination):
    name = "salesforce"
    upsert = True
    consistent_lookup = True
    max_description_chars = 32_000

    fetched_url_settings = ("login_url",)

    capabilities = Capabilities(
        files=FILES_AFTER_WRITE,
        max_file_bytes=MAX_JSON_FILE_BYTES,
        html=False,  # Case.Description is plain
        requester=REQUESTER_FIND_OR_CREATE,
        cc_field="",
        customer_authored_comments=False,
        internal_notes=True,
        closed_policies=(FOLLOW_UP, REOPEN, REVIEW),
        # Auto-response rules answer Email-to-Case and Web-to-Case; a REST insert cannot ask for them (the
        # EmailHeader that triggers them is SOAP-only), so Salesforce does not acknowledge our Cases.
        acknowledges_requester=False,
        requests_per_minute=DEFAULT_REQUESTS_PER_MINUTE,
    )
    reference_patterns = (REF_ID,)
    reference_fields = ("subject", "body")

    SETTINGS = {
        **HTTP_SETTINGS,
        "api_version": Text(pattern=r"\d{2,3}\.0", help='REST API version ("62.0")'),
        "external_id_field": Text(
            pattern=r"[A-Za-z][A-Za-z0-9_]*",
            max_length=80,
            help="the Case External ID field holding our reference (Mailroom_Ref__c)",
        ),
        "auth_flow": Text(choices=("client_credentials", "jwt_bearer"), help="OAuth flow (client_credentials)"),
        "login_url": Url(help="where the token endpoint is (base_url); https://login.salesforce.com for JWT"),
        "username": Text(pattern=r"[^@\s]+@[^@\s]+", help="the integration user (JWT bearer flow: sub)"),
        "origin": Text(max_length=40, help='Case.Origin ("Email")'),
        "comment_public": Flag(help="a customer's CaseComment is published, IsPublished (true)"),
        "create_contacts": Flag(help="an unknown requester becomes a Contact (true)"),
        "file_key_field": Text(
            pattern=FIELD_NAME,
            max_length=80,
            help="the ContentVersion text field that keeps each file's key (ReasonForChange)",
        ),
        "reopen_status": Text(
            max_length=40, help='Case.Status a reply sets on a closed Case, closed_policy reopen ("New")'
        ),
        "queues": Mapping(values=Text(pattern=SALESFORCE_ID), help="queue slug -> queue id (OwnerId)"),
        "owners": Mapping(values=Text(pattern=SALESFORCE_ID), help="assignee name -> user id (OwnerId)"),
        "priorities": Mapping(
            keys=r"low|normal|high|urgent",
            values=Text(max_length=40),
            help="Mailroom priority -> Case.Priority picklist value",
        ),
        "case_types": Mapping(values=Text(max_length=255), help="request type -> Type value or record type id"),
    }

    def __init__(self, destination):
        super().__init__(destination)
        settings = self.settings
        self.api_version = str(settings.get("api_version") or "62.0")
        self.external_id_field = str(settings.get("external_id_field") or "Mailroom_Ref__c")
        self.auth_flow = settings.get("auth_flow") or "client_credentials"
        self.login_url = str(settings.get("login_url") or self.base_url).rstrip("/")
        self.username = settings.get("username") or ""
        self.comment_public = bool(settings.get("comment_public", True))
        self.create_contacts = bool(settings.get("create_contacts", True))
        self.file_key_field = str(settings.get("file_key_field") or "ReasonForChange")
        self.reopen_status = str(settings.get("reopen_status") or "New")
        self.closed_policy = str(settings.get("closed_policy") or self.capabilities.default_closed_policy)
        self._last_status = None
        # Which status a refusal had: only a 401 means the session is gone (see credentials_refused).
        self.session.hooks["response"].append(self._remember_status)

    @property
    def data_path(self) -> str:
        return f"/services/data/v{self.api_version}"

    def _case_path(self, external_ref: str) -> str:
        return f"{self.data_path}/sobjects/Case/{self.external_id_field}/{quote(external_ref, safe='')}"

    # --- The interface ------------------------------------------------------

    def create_ticket(self, request: TicketRequest, idempotency_key: str, external_ref: str) -> TicketResult:
        contact_id = self._requester_contact(request)
        payload = case_payload(request, self.settings, self.external_id_field, contact_id=contact_id)
        try:
            # An upsert: sent twice it updates the one Case, so a 5xx after it is transient.
            response = self.send("PATCH", self._case_path(external_ref), write=True, json_body=payload, retry_safe=True)
        except PermanentError as exc:
            if exc.reason == ReasonCode.NOT_FOUND:
                raise PermanentError(
                    ReasonCode.CONFIGURATION,
                    f"no Case field {self.external_id_field} "
                    f"usable as External ID, or API version {self.api_version} unknown",
                ) from None
            raise
        body = json_object(response, write=True)
        case_id = body.get("id")
        if not case_id or body.get("success") is False:
            # It answered 2xx: the Case probably exists; the upsert can be sent again safely.
            raise AmbiguousOutcome(ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code} without a Case id")
        log.info(
            "salesforce: %s Case %s for %s",
            "created" if body.get("created", True) else "updated (retry)",
            case_id,
            external_ref,
        )
        return TicketResult(ticket_id=str(case_id), url=self.ticket_url(case_id))

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        response = self.send(
            "GET", self._case_path(external_ref), write=False, params={"fields": "Id"}, ok_statuses=(200, 300, 404)
        )
        if response.status_code == 404:
            if "external id field" in response.text.lower():
                raise PermanentError(ReasonCode.CONFIGURATION, f"no External ID field {self.external_id_field}")
            return None
        if response.status_code == 300:
            # Several Cases carry the reference: the lowest Id is the first one made, the one to keep.
            ids = sorted(case_ids_of(response))
            if not ids:
                raise TransientError(ReasonCode.UNREADABLE_RESPONSE, "HTTP 300 without Case URLs")
            log.warning("salesforce: %d Cases carry %s; keeping the lowest Id %s", len(ids), external_ref, ids[0])
            return TicketResult(ticket_id=ids[0], url=self.ticket_url(ids[0]))
        case_id = json_object(response, write=False).get("Id")
        if not case_id:
            raise TransientError(ReasonCode.UNREADABLE_RESPONSE, "a Case without Id")
        return TicketResult(ticket_id=str(case_id), url=self.ticket_url(case_id))

    def add_comment(self, ticket_id: str, comment: CommentRequest, idempotency_key: str, external_ref: str) -> str:
        if not re.fullmatch(SALESFORCE_ID, str(ticket_id)):
            raise PermanentError(ReasonCode.NOT_FOUND, "a Salesforce Case Id is 15 or 18 letters and digits")
        self._open_for_comment(str(ticket_id))
        published = comment.public and not comment.from_agent and self.comment_public
        payload = {"ParentId": str(ticket_id), "CommentBody": comment_body(comment), "IsPublished": published}
        # A CaseComment is no upsert: a 5xx after it is ambiguous (a second POST may add it twice).
        response = self.send("POST", f"{self.data_path}/sobjects/CaseComment", write=True, json_body=payload)
        comment_id = json_object(response, write=True).get("id")
        log.info(
            "salesforce: commented on Case %s for %s (%s)",
            ticket_id,
            external_ref,
            "published" if published else "not published",
        )
        return str(comment_id or ticket_id)

    # --- Files: one ContentVersion per file, published to the Case -------------------------------

    def upload_file(self, ticket_id: str, file: OutgoingFile, file_key: str, *, public: bool = True) -> str:
        """A ContentVersion whose FirstPublishLocationId is the Case: one call inserts the file and links it
        (its ContentDocumentLink is made by Salesforce). `public` is not carried: the link's visibility is the
        org's default for files on records (internal users only where the org has a site or portal)."""
        data = file.read()
        payload = {
            "Title": os.path.splitext(file.filename)[0] or file.filename,
            "PathOnClient": file.filename,
            "VersionData": base64.b64encode(data).decode("ascii"),
            "FirstPublishLocationId": str(ticket_id),
            self.file_key_field: file_key,
        }
        # No upsert, no key: a 5xx or a lost answer after it is ambiguous; `find_file` settles it.
        response = self.send("POST", f"{self.data_path}/sobjects/ContentVersion", write=True, json_body=payload)
        version_id = json_object(response, write=True).get("id")
        if not version_id:
            raise AmbiguousOutcome(
                ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code} without a ContentVersion id"
            )
        log.info("salesforce: file %s attached to Case %s as ContentVersion %s", file.index, ticket_id, version_id)
        return str(version_id)

    def find_file(self, ticket_id: str, file: OutgoingFile, file_key: str) -> str | None:
        """The ContentVersion an earlier attempt inserted for `file_key` on this Case (SOQL sees it at once)."""
        records = self.query(
            f"SELECT Id, FirstPublishLocationId FROM ContentVersion WHERE "
            f"{self.file_key_field} = {soql_string(file_key)} ORDER BY CreatedDate LIMIT 10"
        )
        case = str(ticket_id)[:15]
        for record in records:
            if str(record.get("FirstPublishLocationId") or "")[:15] == case and record.get("Id"):
                return str(record["Id"])
        return None

    # --- The desk's own references -----------------------------------------------------------

    def resolve_reference(self, ref: str) -> str | None:
        """The Case a Ref ID thread ("_00Dxx._500xx", zeros taken out of its middle) names, read in this
        org: the zeros may have stood anywhere in those five characters, so every placement is asked for
        in one SOQL query, and only a single match counts."""
        candidates = case_ids_from_ref(ref)
        if not candidates:
            return None
        ids = ", ".join(soql_string(c) for c in candidates)
        found = [str(r["Id"]) for r in self.query(f"SELECT Id FROM Case WHERE Id IN ({ids})") if r.get("Id")]
        return found[0] if len(found) == 1 else None

    # --- SOQL, the requester, closed Cases ------------------------------------------------------

    def query(self, soql: str) -> list[dict]:
        """The records of one SOQL query (its first page: every query here asks for a handful)."""
        response = self.send("GET", f"{self.data_path}/query", write=False, params={"q": soql})
        records = json_object(response, write=False).get("records")
        return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []

    def _requester_contact(self, request: TicketRequest) -> str | None:
        """The requester's Contact Id: found by Email, else created (create_contacts). A Contact Salesforce
        refuses for good (a validation or duplicate rule) leaves the Case with SuppliedEmail only; a transient
        failure or a lost answer fails the create, whose retry looks the Contact up again first."""
        name, address = email.utils.parseaddr(request.requester)
        address = address or request.requester
        if "@" not in (address or ""):
            return None
        noted = self.journal.get("salesforce:requester_contact")
        if isinstance(noted, dict) and noted.get("email") == address.lower() and noted.get("id"):
            return str(noted["id"])
        try:
            contact_id = self._contact_by_email(address)
            if contact_id is None and self.create_contacts:
                contact_id = self._create_contact(address, request.requester_name or name)
        except PermanentError as exc:
            if exc.reason in (ReasonCode.CREDENTIALS, ReasonCode.CONFIGURATION):
                raise
            log.warning(
                "salesforce: no Contact for %s (%s); the Case keeps SuppliedEmail only",
                mask_address(address),
                exc.reason,
            )
            return None
        if contact_id:
            self.journal.put("salesforce:requester_contact", {"email": address.lower(), "id": contact_id})
        return contact_id

    def _contact_by_email(self, address: str) -> str | None:
        records = self.query(
            f"SELECT Id FROM Contact WHERE Email = {soql_string(address)} ORDER BY CreatedDate LIMIT 1"
        )
        return str(records[0]["Id"]) if records and records[0].get("Id") else None

    def _create_contact(self, address: str, name: str) -> str | None:
        first, last = contact_names(name, address)
        contact = {"LastName": last, "Email": address}
        if first:
            contact["FirstName"] = first
        try:
            response = self.send("POST", f"{self.data_path}/sobjects/Contact", write=True, json_body=contact)
        except PermanentError as exc:
            if "DUPLICATES_DETECTED" in (exc.detail or ""):
                return self._contact_by_email(address)  # made meanwhile (a duplicate rule that blocks)
            raise
        contact_id = json_object(response, write=True).get("id")
        log.info("salesforce: created Contact %s for %s", contact_id, mask_address(address))
        return str(contact_id) if contact_id else None

    def _open_for_comment(self, case_id: str) -> None:
        """Salesforce takes a CaseComment on a closed Case too; Mailroom asks first (IsClosed) and applies the
        destination's closed_policy: reopen sets Status to reopen_status, anything else raises TicketClosed."""
        response = self.send(
            "GET",
            f"{self.data_path}/sobjects/Case/{case_id}",
            write=False,
            params={"fields": "IsClosed,Status"},
            ok_statuses=(200, 404),
        )
        if response.status_code == 404:
            raise PermanentError(ReasonCode.NOT_FOUND, "the Case does not exist")
        if not json_object(response, write=False).get("IsClosed"):
            return
        if self.closed_policy != REOPEN:
            raise TicketClosed(f"Case {case_id} is closed")
        # Setting a field to a value is idempotent: sent twice, it has the effect of once.
        self.send(
            "PATCH",
            f"{self.data_path}/sobjects/Case/{case_id}",
            write=True,
            json_body={"Status": self.reopen_status},
            retry_safe=True,
        )
        log.info("salesforce: reopened Case %s for a reply (closed_policy reopen)", case_id)

    def ticket_url(self, ticket_id) -> str:
        """The Case in Lightning Experience ("" without a base URL)."""
        return f"{self.base_url}/lightning/r/Case/{ticket_id}/view" if self.base_url else ""

    def check_connection(self) -> str:
        try:
            response = self.send("GET", f"{self.data_path}/sobjects/Case/describe", write=False)
        except PermanentError as exc:
            if exc.reason == ReasonCode.NOT_FOUND:
                raise PermanentError(
                    ReasonCode.CONFIGURATION, f"API version {self.api_version} or the Case object is not available"
                ) from None
            raise
        fields = {
            f.get("name"): f for f in json_object(response, write=False).get("fields") or [] if isinstance(f, dict)
        }
        field = fields.get(self.external_id_field)
        if field is None:
            raise PermanentError(
                ReasonCode.CONFIGURATION,
                f"Case has no field {self.external_id_field} (or the user cannot see it): create a "
                "Text field marked External ID and Unique, or set external_id_field",
            )
        if not field.get("externalId"):
            raise PermanentError(
                ReasonCode.CONFIGURATION, f"Case.{self.external_id_field} is not marked External ID: upserts need it"
            )
        unique = "unique" if field.get("unique") else "NOT unique (the upsert then needs View All Data)"
        return f"signed in to Salesforce ({self.auth_flow}); Case.{self.external_id_field} is an External ID, {unique}"

    # --- Authentication -----------------------------------------------------

    def auth_for(self, secret):
        if secret is None:
            return None, {}
        key = self._token_key(secret)
        with _tokens_lock:
            token = _tokens.get(key)
        if token is None:
            token = self._request_token(secret)
            with _tokens_lock:
                _tokens[key] = token
        return None, {"Authorization": f"Bearer {token}"}

    def credentials_refused(self) -> None:
        if self._last_status != 401:
            return  # a 403 (REQUEST_LIMIT_EXCEEDED, INSUFFICIENT_ACCESS) is no session problem: keep it
        super().credentials_refused()  # the secret is read again too: it may have been rotated
        with _tokens_lock:
            for key in [k for k in _tokens if k[0] == self.destination.pk]:
                del _tokens[key]
        log.info("salesforce: session refused (401); fetching a new access token once")

    def _remember_status(self, response, *args, **kwargs):
        self._last_status = response.status_code

    def _token_key(self, secret: str) -> tuple:
        material = "\n".join((secret, self.auth_flow, self.login_url, self.username))
        return self.destination.pk, hashlib.sha256(material.encode()).hexdigest()

    def _request_token(self, secret: str) -> str:
        credentials = parse_credentials(secret)
        if self.auth_flow == "jwt_bearer":
            if not self.username:
                raise PermanentError(ReasonCode.CONFIGURATION, "the JWT bearer flow needs the username setting")
            if not credentials.get("private_key"):
                raise PermanentError(ReasonCode.CREDENTIALS, 'the JWT bearer flow needs {"client_id", "private_key"}')
            assertion = jwt_assertion(
                credentials["client_id"], self.username, self.login_url, credentials["private_key"]
            )
            form = {"grant_type": JWT_GRANT, "assertion": assertion}
        else:
            if not credentials.get("client_secret"):
                raise PermanentError(ReasonCode.CREDENTIALS, "the client credentials flow needs a client secret")
            form = {
                "grant_type": "client_credentials",
                "client_id": credentials["client_id"],
                "client_secret": credentials["client_secret"],
            }
        try:
            response = self.session.post(
                self.login_url + TOKEN_PATH, data=form, timeout=self.timeout, allow_redirects=False
            )
        except EgressRefused as exc:
            raise egress_refusal(exc) from None
        except requests.RequestException as exc:
            raise self.network_error(exc, write=False) from exc  # nothing is written by a token request
        body = {}
        try:
            body = response.json()
        except ValueError:
            pass
        body = body if isinstance(body, dict) else {}
        if response.status_code == 200 and body.get("access_token"):
            log.info(
                "salesforce: obtained an access token (%s) for destination %s",
                self.auth_flow,
                self.destination.slug or "-",
            )
            return str(body["access_token"])
        if response.status_code == 429 or response.status_code >= 500:
            raise answered_with(
                TransientError(ReasonCode.UNAVAILABLE, f"token endpoint: HTTP {response.status_code}"),
                response.status_code,
            )
        error = str(body.get("error") or f"HTTP {response.status_code}")[:100]
        raise answered_with(
            PermanentError(ReasonCode.CREDENTIALS, f"token endpoint refused: {error}"), response.status_code
        )

    # --- Error mapping ------------------------------------------------------

    def special_error(self, response, body: dict, write: bool):
        status = response.status_code
        errors = salesforce_errors(response)
        codes = {e.get("errorCode") for e in errors}
        if status == 300:
            return PermanentError(
                ReasonCode.MULTIPLE_MATCHES, f"{len(case_ids_of(response))} Cases carry this {self.external_id_field}"
            )
        if status == 403 and "REQUEST_LIMIT_EXCEEDED" in codes:
            # The org's rolling 24-hour API limit (Salesforce sends no Retry-After; the fake may).
            return TransientError(
                ReasonCode.RATE_LIMITED,
                "REQUEST_LIMIT_EXCEEDED",
                retry_after=parse_retry_after(response.headers.get("Retry-After")),
            )
        if status == 400 and any(
            e.get("errorCode") in MISSING_PARENT_CODES and "ParentId" in (e.get("fields") or []) for e in errors
        ):
            return PermanentError(ReasonCode.NOT_FOUND, "the parent Case does not exist")
        if status == 400 and errors:
            return PermanentError(ReasonCode.INVALID_FIELDS, field_errors(errors, status))
        return None


def salesforce_errors(response) -> list[dict]:
    """Salesforce's error list [{"errorCode", "message", "fields"}] ([] for anything else)."""
    try:
        body = response.json()
    except ValueError:
        return []
    return [e for e in body if isinstance(e, dict)] if isinstance(body, list) else []


def case_ids_of(response) -> list[str]:
    """The Case Ids a 300 Multiple Choices lists (its body: the records' URLs)."""
    try:
        body = response.json()
    except ValueError:
        return []
    urls = body if isinstance(body, list) else []
    return [str(u).rstrip("/").rsplit("/", 1)[-1] for u in urls if isinstance(u, str) and u.strip("/")]


def parse_credentials(secret: str) -> dict:
    """{"client_id", "client_secret"?, "private_key"?} from `client_id:client_secret` or a JSON object."""
    text = secret.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            raise PermanentError(ReasonCode.CREDENTIALS, "the secret is not valid JSON") from None
        if not isinstance(value, dict) or not value.get("client_id"):
            raise PermanentError(ReasonCode.CREDENTIALS, "the secret's JSON needs a client_id")
        return {k: str(v) for k, v in value.items() if v is not None}
    client_id, sep, client_secret = text.partition(":")
    if not sep or not client_id or not client_secret:
        raise PermanentError(ReasonCode.CREDENTIALS, "the secret must be client_id:client_secret or a JSON object")
    return {"client_id": client_id, "client_secret": client_secret}


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt_assertion(client_id: str, username: str, audience: str, private_key_pem: str, lifetime: int = 180) -> str:
    """An RS256 JWT for the OAuth 2.0 JWT bearer flow (iss = consumer key, sub = username, aud = login URL)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    try:
        key = serialization.load_pem_private_key(private_key_pem.encode(), password=None)
    except (ValueError, TypeError):
        raise PermanentError(ReasonCode.CREDENTIALS, "the private key is not an unencrypted PEM key") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise PermanentError(ReasonCode.CREDENTIALS, "the JWT bearer flow needs an RSA private key")
    header = _b64url(json.dumps({"alg": "RS256", "typ": "JWT"}).encode())
    claims = _b64url(
        json.dumps({"iss": client_id, "sub": username, "aud": audience, "exp": int(time.time()) + lifetime}).encode()
    )
    signing_input = f"{header}.{claims}".encode()
    signature = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    return f"{header}.{claims}.{_b64url(signature)}"


def route_fields(request: TicketRequest, settings: dict) -> dict:
    """Case fields for the request's route, through the destination's mappings (see the module doc)."""
    fields = {}
    owner = (settings.get("owners") or {}).get(request.assignee) if request.assignee else None
    queue = (settings.get("queues") or {}).get(request.queue) if request.queue else None
    if owner or queue:
        fields["OwnerId"] = str(owner or queue)  # a named assignee wins over the queue
    priorities = {**DEFAULT_PRIORITIES, **(settings.get("priorities") or {})}
    if request.priority in priorities:
        fields["Priority"] = priorities[request.priority]
    case_type = (settings.get("case_types") or {}).get(request.request_type) if request.request_type else None
    if case_type:
        if re.fullmatch(RECORD_TYPE_ID, str(case_type)):
            fields["RecordTypeId"] = str(case_type)
        else:
            fields["Type"] = str(case_type)
    return fields


def case_payload(request: TicketRequest, settings: dict, external_id_field: str, contact_id: str | None = None) -> dict:
    """The Case for a request. Deterministic: a retried upsert sends the very same body. The external id
    field travels in the URL only (Salesforce refuses it in the body of an upsert by that field)."""
    name, address = email.utils.parseaddr(request.requester)
    address = address or request.requester
    case = {
        "Subject": request.subject,
        "Description": description_with_cc(request.description, request.cc),
        "Origin": str(settings.get("origin") or "Email"),
    }
    if address:
        case["SuppliedEmail"] = address
        case["SuppliedName"] = request.requester_name or name or address.split("@")[0]
    if contact_id:
        case["ContactId"] = contact_id
    if request.follow_up_of and re.fullmatch(SALESFORCE_ID, request.follow_up_of):
        case["ParentId"] = request.follow_up_of  # the closed Case this one follows up
    case.update(route_fields(request, settings))
    for key, value in sorted((request.fields or {}).items(), key=lambda item: str(item[0])):
        if str(key) not in (external_id_field, "Id"):
            case[str(key)] = value
    return case


def description_with_cc(description: str, cc) -> str:
    """The Description with the CC'd addresses on its first line (a Case has no CC field), cut to 32,000."""
    if not cc:
        return description
    text = f"CC: {', '.join(cc)}\n\n{description}"
    if len(text) > 32_000:
        text = text[: 32_000 - len(DESCRIPTION_CUT_NOTICE)] + DESCRIPTION_CUT_NOTICE
    return text


def comment_body(comment: CommentRequest) -> str:
    """The CaseComment text: who wrote it (the API user is its CreatedBy), whom it copied, then the reply; cut
    the same way every time to CaseComment's 4,000 characters."""
    author = (
        email.utils.formataddr((comment.author_name, comment.author_email))
        if comment.author_name
        else comment.author_email
    )
    lines = [f"From: {author}{' (agent)' if comment.from_agent else ''}"]
    if comment.cc:
        lines.append(f"CC: {', '.join(comment.cc)}")
    body = "\n".join(lines) + "\n\n" + comment.body
    if len(body) > MAX_COMMENT_CHARS:
        body = body[: MAX_COMMENT_CHARS - len(COMMENT_CUT_NOTICE)] + COMMENT_CUT_NOTICE
    return body


def contact_names(name: str, address: str) -> tuple[str, str]:
    """(FirstName, LastName) for a new Contact: LastName is required, so the address's local part stands in."""
    words = (name or "").strip().split()
    if not words:
        return "", address.split("@")[0][:80]
    if len(words) == 1:
        return "", words[0][:80]
    return " ".join(words[:-1])[:40], words[-1][:80]


def soql_string(value: str) -> str:
    """A SOQL string literal: quotes and backslashes escaped, as Salesforce requires."""
    escaped = str(value).replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
    return f"'{escaped}'"


def shortened_id(record_id: str, keep_tail: bool) -> str:
    """One half of a Ref ID: the first five characters of the 15-character Id, then the rest (without its
    last five when `keep_tail`) with its zeros taken out, then those last five."""
    part = record_id[:15]
    if keep_tail:
        return part[:5] + part[5:10].replace("0", "") + part[10:]
    return part[:5] + part[5:].replace("0", "")


def thread_reference(org_id: str, case_id: str) -> str:
    """Email-to-Case's Ref ID thread for a Case ("ref:_00D5e1a2b._5005e0abc:ref"), as its notifications carry."""
    return f"ref:_{shortened_id(org_id, keep_tail=False)}._{shortened_id(case_id, keep_tail=True)}:ref"


def case_ids_from_ref(ref: str) -> list[str]:
    """Every 15-character Case Id the Case half of a Ref ID may stand for (the removed zeros could have been
    anywhere among its middle five characters): at most ten."""
    _, _, case_part = str(ref).partition("._")
    if not re.fullmatch(r"500[0-9A-Za-z]{7,12}", case_part):
        return []
    head, middle, tail = case_part[:5], case_part[5:-5], case_part[-5:]
    candidates = set()
    for places in itertools.combinations(range(5), len(middle)):
        chars = ["0"] * 5
        for place, char in zip(places, middle, strict=True):
            chars[place] = char
        candidates.add(head + "".join(chars) + tail)
    return sorted(candidates)

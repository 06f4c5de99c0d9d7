"""Jira Service Management destination: customer requests through the JSM REST API (docs/design.md §6).

Calls: `POST /rest/servicedeskapi/request` (create, raised on behalf of the sender's customer account,
the people copied as request participants), `POST /rest/servicedeskapi/request/{key}/comment` (a reply:
public, or internal for an agent's mail), `GET /rest/api/3/search/jql` (lookup by our reference), and, for
`check_connection` only, `GET /rest/servicedeskapi/servicedesk/{id}` and `.../requesttype/{id}/field`.

Ambiguity: Jira keeps no idempotency key and the create is no upsert, so a 5xx, a timeout or a
dropped connection after the create was sent is an `AmbiguousOutcome`. Our reference is written
into the request (`external_ref_field`, else a label), and JQL can find it, but Jira's search index
lags behind writes: `lookup_settle_seconds` (= `search_settle_seconds`) tells
`ticketing.intents.resolve_unknown` to search only after that delay; found settles the intent,
nothing found goes to review (held), never to a second create.

What a request carries (docs/destinations/jira_sm.md says it in words):
- People: the requester and each address copied are Jira customer accounts, found by
  `GET /rest/api/3/user/search?query=ADDR` (the exact address) or made by `POST /rest/servicedeskapi/customer`
  {"email", "displayName"} (an answer that the account exists is looked up again), then added to the
  service project (`POST /rest/servicedeskapi/servicedesk/{id}/customer`). The request is raised on behalf
  of the requester's accountId with the others as `requestParticipants`. The ids are noted in the journal
  before the create, so a retried create sends the very same body. An address no account can be found or
  made for is named in the description instead. A reply's copied people become participants
  (`POST /rest/servicedeskapi/request/{key}/participant`).
- Files go after the write, one by one (`upload_file`): `POST /rest/servicedeskapi/servicedesk/{id}/
  attachTemporaryFile` (multipart, X-Atlassian-Token: no-check) gives a temporaryAttachmentId, and
  `POST /rest/servicedeskapi/request/{key}/attachment` {"temporaryAttachmentIds", "public"} attaches it.
  `find_file` reads the issue's attachments (`GET /rest/api/3/issue/{key}?fields=attachment`) and matches by
  name and size: Jira keeps no key of ours on a file.
- Authorship: basic auth writes every comment as the integration account, so a comment opens with a
  "From: name <address>" line; an agent's mail is an internal comment (`public: false`).
- Closed requests: where the workflow refuses a comment or an attachment (Closed with comments denied), the
  refusal is read together with the request's status (`GET /rest/servicedeskapi/request/{key}`): status
  category Done makes it `TicketClosed`. A follow-up request (policy `follow_up`) opens its description with
  "Follow-up of SUP-12, which is closed.".
- References: Jira's notifications name the request by its key ("SUP-12") in the subject;
  `resolve_reference` reads the request and keeps it only when it belongs to this service project
  (and, with `project_key`, only keys of that project are looked for at all).

`Destination.settings`:
    service_desk_id (required): the service project's id (`/rest/servicedeskapi/servicedesk`).
    request_type_id (required): the request type used when no mapping below picks one.
    request_types {request type slug: requestTypeId}: the request type for `TicketRequest.request_type`.
    queues {queue slug: value}: JSM queues are views over request types, so by default a queue maps to a
        requestTypeId (used when `request_types` has no entry). With `queue_field` (a select custom
        field on the form, "customfield_10060") the value is that field's option instead: {"value": ...}.
    priorities {low|normal|high|urgent: priority name or id}: sent as {"name": ...} ({"id": ...} for
        digits). Nothing by default: priority is not on a request type's form unless an admin adds it.
    assignees {name: accountId} with assignee_field (a user-picker custom field on the form): the
        customer request API cannot set the Assignee itself (that needs a second call,
        `PUT /rest/api/3/issue/{key}/assignee`, which is left out); without assignee_field the
        assignee is not sent.
    external_ref_field ("customfield_10050"): a text field on every form used, holding our reference;
        unset: the reference is a label (`labels` must then be on the form).
    raise_on_behalf_of (true): raise the request for the sender's customer account (needs an agent account).
    project_key ("SUP"): the service project's key; only keys of it in a reply's subject are looked up.
    search_settle_seconds (60): how long after a lost answer the search is trusted.
    plus connect_timeout, read_timeout, max_file_bytes, closed_policy and the common retry settings.
  A route value with no mapping is left out, not an error; `TicketRequest.fields` (raw Jira field ids)
  are merged into requestFieldValues last.
`Destination.credentials_ref` resolves to `email:api_token` (basic auth), or to a bare token without
a colon (sent as a bearer token: an OAuth or personal access token).

Nothing logged here contains a ticket body or a full email address.
"""

import email.utils
import logging
import re

from urllib3 import encode_multipart_formdata

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
from .capabilities import FILES_AFTER_WRITE, FOLLOW_UP, MB, REQUESTER_FIND_OR_CREATE, REVIEW, Capabilities
from .http import HttpDestination, json_object
from .settings import HTTP_SETTINGS, Flag, Mapping, Number, Text

log = logging.getLogger(__name__)

REQUEST_PATH = "/rest/servicedeskapi/request"
CUSTOMER_PATH = "/rest/servicedeskapi/customer"
SEARCH_PATH = "/rest/api/3/search/jql"
USER_SEARCH_PATH = "/rest/api/3/user/search"
ISSUE_PATH = "/rest/api/3/issue"
# A project key: a letter, then letters, digits or underscores (2 to 10 characters by default).
PROJECT_KEY = r"[A-Z][A-Z0-9_]{1,9}"
# Jira's notification subjects name the request by its key; the key stands alone (not "X-SUP-12", "SUP-12a").
ANY_ISSUE_KEY = re.compile(rf"(?<![\w-])(?P<ref>{PROJECT_KEY}-\d{{1,9}})(?![\w-])")
DONE = "DONE"  # the status category of a resolved or closed request
PEOPLE_STEP = "people"
MEMBERS_STEP = "people:added"
CUSTOM_FIELD = r"customfield_\d+"
ISSUE_KEY = re.compile(r"[A-Z][A-Z0-9_]*-\d+|\d+")
MAX_SUMMARY_CHARS = 255  # Jira refuses a longer summary
MAX_SEARCH_PAGES = 5
DEFAULT_SETTLE_SECONDS = 60


class JiraServiceManagementDestination(HttpDestination):
    name = "jira_sm"
    honours_idempotency_key = False
    consistent_lookup = False
    upsert = False
    lookup_settle_seconds = float(DEFAULT_SETTLE_SECONDS)
    # Jira's text fields hold 32,767 characters; leave room for the truncation notice.
    max_description_chars = 32_000

    capabilities = Capabilities(
        files=FILES_AFTER_WRITE,  # a temporary file, then attached to the request
        max_file_bytes=1024 * MB,  # Jira Cloud's default attachment size (1 GB; at most 2 GB)
        html=False,  # the description is plain text (wiki markup, no HTML)
        requester=REQUESTER_FIND_OR_CREATE,  # a customer account, raised on behalf of
        cc_field="request participants",
        customer_authored_comments=False,  # basic auth writes as the integration account
        internal_notes=True,  # public: false
        closed_policies=(FOLLOW_UP, REVIEW),  # reopening is the workflow's business, not the API's
        acknowledges_requester=True,  # JSM's "Request created" notification to the customer
        requests_per_minute=None,  # API-token traffic has per-second burst limits, no quota
    )
    reference_patterns = (ANY_ISSUE_KEY,)
    reference_fields = ("subject",)

    SETTINGS = {
        **HTTP_SETTINGS,
        "service_desk_id": Text(required=True, pattern=r"\d+", help="the service project's id"),
        "request_type_id": Text(required=True, pattern=r"\d+", help="the default request type's id"),
        "request_types": Mapping(values=Text(pattern=r"\d+"), help="request type slug -> requestTypeId"),
        "queues": Mapping(values=Text(), help="queue slug -> requestTypeId (or queue_field's option)"),
        "queue_field": Text(pattern=CUSTOM_FIELD, help="a select field that receives the queue"),
        "priorities": Mapping(values=Text(), keys=r"low|normal|high|urgent", help="priority -> Jira priority"),
        "assignees": Mapping(values=Text(pattern=r"[\w:\-]+"), help="assignee name -> accountId"),
        "assignee_field": Text(pattern=CUSTOM_FIELD, help="a user-picker field that receives the assignee"),
        "external_ref_field": Text(pattern=CUSTOM_FIELD, help="text field for our reference (else a label)"),
        "raise_on_behalf_of": Flag(help="raise the request for the sender (true)"),
        "project_key": Text(pattern=PROJECT_KEY, help="the service project's key (SUP): its keys thread replies"),
        "search_settle_seconds": Number(minimum=0, maximum=86400, help="trust the search after (60 s)"),
    }

    def __init__(self, destination):
        super().__init__(destination)
        settings = self.settings
        self.lookup_settle_seconds = settle_seconds(settings.get("search_settle_seconds"))
        self.service_desk_id = str(settings.get("service_desk_id") or "")
        self.request_type_id = str(settings.get("request_type_id") or "")
        self.external_ref_field = settings.get("external_ref_field") or ""
        self.project_key = str(settings.get("project_key") or "")
        if self.project_key:
            # Only this project's keys are the desk's own references (not "ISO-9001" or another project's).
            self.reference_patterns = (
                re.compile(
                    rf"(?<![\w-])(?P<ref>{re.escape(self.project_key)}-\d{{1,9}})"
                    rf"(?![\w-])"
                ),
            )

    # --- The interface ------------------------------------------------------

    def create_ticket(self, request: TicketRequest, idempotency_key: str, external_ref: str) -> TicketResult:
        self._require_configuration()
        people = self._people(request)
        response = self.send(
            "POST",
            REQUEST_PATH,
            write=True,
            json_body=request_payload(request, external_ref, self.settings, people=people),
        )
        body = json_object(response, write=True)
        key = body.get("issueKey")
        if not isinstance(key, str) or not ISSUE_KEY.fullmatch(key):
            # It answered 2xx, so the request probably exists; only the (lagging) search can tell which.
            raise AmbiguousOutcome(ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code} without an issueKey")
        log.info("jira_sm: created %s for %s", key, external_ref)
        return TicketResult(ticket_id=key, url=self.ticket_url(key))

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        issues = self._issues_with_ref(external_ref)
        if not issues:
            return None
        # The lowest issue id is the first request a create made: the one to keep.
        first = min(issues, key=lambda issue: int(issue["id"]))
        if len(issues) > 1:
            log.warning("jira_sm: %d requests carry %s; keeping the first, %s", len(issues), external_ref, first["key"])
        return TicketResult(ticket_id=first["key"], url=self.ticket_url(first["key"]))

    def add_comment(self, ticket_id: str, comment: CommentRequest, idempotency_key: str, external_ref: str) -> str:
        if not ISSUE_KEY.fullmatch(str(ticket_id)):
            raise PermanentError(ReasonCode.NOT_FOUND, "a Jira issue key looks like SUP-12")
        if comment.cc:
            self._add_participants(ticket_id, comment.cc)
        try:
            response = self.send(
                "POST",
                f"{REQUEST_PATH}/{ticket_id}/comment",
                write=True,
                json_body={"body": authored_body(comment), "public": bool(comment.public)},
            )
        except PermanentError as exc:
            raise self._closed_or(exc, ticket_id) from None
        answer = json_object(response, write=True)
        log.info(
            "jira_sm: added a %s comment to %s for %s",
            "public" if comment.public else "internal",
            ticket_id,
            external_ref,
        )
        # The comment id when Jira reports it, else the issue: the comment is on it either way.
        return str(answer.get("id") or ticket_id)

    # --- Files after the write (ticketing.destinations.files.attach_each) ----------------------------

    def upload_file(self, ticket_id: str, file: OutgoingFile, file_key: str, *, public: bool = True) -> str:
        """A temporary file in the service project, then attached to the request. The temporary file alone is
        on no request (it expires unused), so only the attach call can double a file: `find_file` first."""
        self._require_configuration()
        if not ISSUE_KEY.fullmatch(str(ticket_id)):
            raise PermanentError(ReasonCode.NOT_FOUND, "a Jira issue key looks like SUP-12")
        body, content_type = encode_multipart_formdata(
            {"file": (file.filename, file.read(), file.content_type or "application/octet-stream")}
        )
        uploaded = self.send(
            "POST",
            f"/rest/servicedeskapi/servicedesk/{self.service_desk_id}/attachTemporaryFile",
            write=True,
            data=body,
            retry_safe=True,
            headers={"Content-Type": content_type, "X-Atlassian-Token": "no-check", "X-ExperimentalApi": "opt-in"},
        )
        temporary = [
            str(t["temporaryAttachmentId"])
            for t in json_object(uploaded, write=True).get("temporaryAttachments") or []
            if isinstance(t, dict) and t.get("temporaryAttachmentId")
        ]
        if not temporary:
            raise TransientError(ReasonCode.UNREADABLE_RESPONSE, "attachTemporaryFile answered without an id")
        try:
            attached = self.send(
                "POST",
                f"{REQUEST_PATH}/{ticket_id}/attachment",
                write=True,
                json_body={"temporaryAttachmentIds": temporary[:1], "public": bool(public)},
            )
        except PermanentError as exc:
            raise self._closed_or(exc, ticket_id) from None
        values = (json_object(attached, write=True).get("attachments") or {}).get("values") or []
        desk_id = attachment_id(values[0]) if values and isinstance(values[0], dict) else ""
        log.info("jira_sm: attached file %s to %s (%s)", file.index, ticket_id, "public" if public else "internal")
        return desk_id or self.find_file(ticket_id, file, file_key) or f"{ticket_id}:{file.index}"

    def find_file(self, ticket_id: str, file: OutgoingFile, file_key: str) -> str | None:
        body = json_object(
            self.send("GET", f"{ISSUE_PATH}/{ticket_id}", write=False, params={"fields": "attachment"}), write=False
        )
        names = {file.filename, html5_escaped(file.filename)}
        for attachment in (body.get("fields") or {}).get("attachment") or []:
            if (
                isinstance(attachment, dict)
                and attachment.get("filename") in names
                and str(attachment.get("size")) == str(file.size)
            ):
                return str(attachment.get("id") or attachment["filename"])
        return None

    # --- The desk's own references -------------------------------------------------------------------

    def resolve_reference(self, ref: str) -> str | None:
        """The request a key names, when it is one of this service project's (a read)."""
        key = str(ref).strip().upper()
        if not ISSUE_KEY.fullmatch(key) or (self.project_key and not key.startswith(f"{self.project_key}-")):
            return None
        try:
            body = json_object(self.send("GET", f"{REQUEST_PATH}/{key}", write=False), write=False)
        except PermanentError as exc:
            if exc.reason in (ReasonCode.NOT_FOUND, ReasonCode.CONFIGURATION):
                return None  # no such request, or not one this account can see
            raise
        if self.service_desk_id and str(body.get("serviceDeskId") or "") != self.service_desk_id:
            return None  # another service project's request: not this destination's ticket
        return str(body.get("issueKey") or key)

    def ticket_url(self, ticket_id) -> str:
        """The issue in Jira's agent view ("" without a base URL)."""
        return f"{self.base_url}/browse/{ticket_id}" if self.base_url else ""

    def check_connection(self) -> str:
        self._require_configuration()
        desk = json_object(
            self._read(
                f"/rest/servicedeskapi/servicedesk/{self.service_desk_id}", what=f"service desk {self.service_desk_id}"
            ),
            write=False,
        )
        form = json_object(
            self._read(
                f"/rest/servicedeskapi/servicedesk/{self.service_desk_id}/requesttype/{self.request_type_id}/field",
                what=f"request type {self.request_type_id}",
            ),
            write=False,
        )
        on_form = {f.get("fieldId") for f in form.get("requestTypeFields") or [] if isinstance(f, dict)}
        ref_field = self.external_ref_field or "labels"
        missing = [f for f in ("summary", "description", ref_field) if f not in on_form]
        if missing:
            raise PermanentError(
                ReasonCode.CONFIGURATION,
                f"request type {self.request_type_id} has no field {', '.join(missing)} on its form",
            )
        if self.settings.get("raise_on_behalf_of", True) and form.get("canRaiseOnBehalfOf") is False:
            raise PermanentError(
                ReasonCode.CREDENTIALS,
                "this account cannot raise requests on behalf of customers"
                " (it needs to be an agent of the service project)",
            )
        return (
            f"service project {desk.get('projectKey') or self.service_desk_id} "
            f"({desk.get('projectName') or 'unnamed'}), request type {self.request_type_id} "
            f"with {ref_field} on its form"
        )

    # --- Helpers --------------------------------------------------------------

    def _require_configuration(self):
        if not self.service_desk_id or not self.request_type_id:
            raise PermanentError(ReasonCode.CONFIGURATION, "service_desk_id and request_type_id are required")

    # People: customer accounts, noted in the journal before the create.

    def _people(self, request: TicketRequest) -> dict:
        """{"requester": accountId or "", "participants": [accountIds], "unresolved": [addresses]} for the
        request, found or made once and noted, so that every attempt sends the same create."""
        noted = self.journal.get(PEOPLE_STEP)
        if noted is None:
            _, address = email.utils.parseaddr(request.requester)
            address = address or request.requester
            requester, unresolved = "", []
            if self.settings.get("raise_on_behalf_of", True) and address:
                requester = self._account_for(address, request.requester_name)
                if not requester:
                    unresolved.append(address)
            participants = []
            for copied in dict.fromkeys(request.cc):
                account = self._account_for(copied, "")
                if account and account != requester:
                    participants.append(account)
                elif not account:
                    unresolved.append(copied)
            noted = {
                "requester": requester,
                "participants": list(dict.fromkeys(participants)),
                "unresolved": unresolved,
            }
            self.journal.put(PEOPLE_STEP, noted)
        if not self.journal.get(MEMBERS_STEP):
            self._add_to_service_desk([noted["requester"], *noted["participants"]])
            self.journal.put(MEMBERS_STEP, True)
        return noted

    def _account_for(self, address: str, name: str) -> str:
        """The accountId of the customer with `address`, made when Jira has none; "" when neither works
        (the account may not create customers): the address is then named in the description."""
        found = self._find_account(address)
        if found:
            return found
        try:
            # Making a customer twice is refused as "exists", never doubled: safe to try again after a 5xx.
            response = self.send(
                "POST",
                CUSTOMER_PATH,
                write=True,
                retry_safe=True,
                json_body={"email": address, "displayName": name or address},
            )
        except AmbiguousOutcome as exc:
            found = self._find_account(address)
            if found:
                return found
            raise TransientError(exc.reason, "making a customer: no answer, and none found yet") from None
        except PermanentError as exc:
            if getattr(exc, "http_status", None) in (400, 409):
                # It exists already, but the search did not show its address (a profile visibility setting).
                return self._find_account(address, sole_match=True)
            if getattr(exc, "http_status", None) in (401, 403, 404):
                log.warning(
                    "jira_sm: this account may not create customers (HTTP %s); the address goes into the description",
                    exc.http_status,
                )
                return ""
            raise
        return str(json_object(response, write=True).get("accountId") or "")

    def _find_account(self, address: str, sole_match: bool = False) -> str:
        response = self.send("GET", USER_SEARCH_PATH, write=False, params={"query": address, "maxResults": 10})
        try:
            users = response.json()
        except ValueError:
            users = None
        if not isinstance(users, list):
            raise TransientError(ReasonCode.UNREADABLE_RESPONSE, "the user search is not a JSON list")
        users = [u for u in users if isinstance(u, dict) and u.get("accountId") and u.get("active", True)]
        exact = [u for u in users if str(u.get("emailAddress") or "").lower() == address.lower()]
        if exact:
            return str(exact[0]["accountId"])
        if sole_match and len(users) == 1 and not users[0].get("emailAddress"):
            return str(users[0]["accountId"])
        return ""

    def _add_to_service_desk(self, account_ids: list[str]) -> None:
        """The people become customers of the service project (adding one twice is harmless)."""
        ids = [a for a in dict.fromkeys(account_ids) if a]
        if not ids:
            return
        try:
            self.send(
                "POST",
                f"/rest/servicedeskapi/servicedesk/{self.service_desk_id}/customer",
                write=True,
                retry_safe=True,
                json_body={"accountIds": ids},
            )
        except AmbiguousOutcome as exc:
            raise TransientError(exc.reason, "adding customers to the service project: no answer") from None
        except PermanentError as exc:
            if getattr(exc, "http_status", None) not in (400, 403, 404):
                raise
            # An open service project takes anyone; a closed one refuses the create with Jira's own message.
            log.warning(
                "jira_sm: adding customers to service desk %s refused (HTTP %s)", self.service_desk_id, exc.http_status
            )

    def _add_participants(self, ticket_id: str, addresses) -> None:
        step = f"{PEOPLE_STEP}:{ticket_id}"
        noted = self.journal.get(step)
        if noted is None:
            noted = [a for a in (self._account_for(address, "") for address in dict.fromkeys(addresses)) if a]
            self.journal.put(step, noted)
        if not noted:
            return
        try:
            # A participant added twice is still one participant.
            self.send(
                "POST",
                f"{REQUEST_PATH}/{ticket_id}/participant",
                write=True,
                retry_safe=True,
                json_body={"accountIds": noted},
            )
        except AmbiguousOutcome as exc:
            raise TransientError(exc.reason, "adding participants: no answer") from None
        except PermanentError as exc:
            if getattr(exc, "http_status", None) not in (400, 403):
                raise
            log.warning("jira_sm: participants for %s refused (HTTP %s)", ticket_id, exc.http_status)

    # Closed requests.

    def _closed_or(self, refusal: PermanentError, ticket_id: str) -> PermanentError:
        """`TicketClosed` when Jira refused a write to a request whose status category is Done, else the
        refusal itself."""
        if getattr(refusal, "http_status", None) not in (400, 403):
            return refusal
        try:
            request = json_object(self.send("GET", f"{REQUEST_PATH}/{ticket_id}", write=False), write=False)
        except (PermanentError, TransientError):
            return refusal
        status = request.get("currentStatus") or {}
        if isinstance(status, dict) and status.get("statusCategory") == DONE:
            return TicketClosed(f"Jira request {ticket_id} is {status.get('status') or 'done'} and refuses writes")
        return refusal

    def _read(self, path: str, what: str, params=None):
        try:
            return self.send("GET", path, write=False, params=params)
        except PermanentError as exc:
            if exc.reason == ReasonCode.NOT_FOUND:
                raise PermanentError(ReasonCode.CONFIGURATION, f"{what} does not exist or is not visible") from None
            raise

    def _issues_with_ref(self, external_ref: str) -> list[dict]:
        field = self.external_ref_field or "labels"
        if self.external_ref_field:
            # `~` is a text search: ask for the exact phrase, then keep only exact values below.
            clause = f"cf[{field.removeprefix('customfield_')}] ~ {jql_string(jql_string(external_ref))}"
        else:
            clause = f"labels = {jql_string(label(external_ref))}"
        params = {"jql": f"{clause} ORDER BY created ASC", "fields": f"key,{field}", "maxResults": 50}
        issues = []
        for _ in range(MAX_SEARCH_PAGES):
            body = json_object(self._read(SEARCH_PATH, what="the JQL search", params=params), write=False)
            for issue in body.get("issues") or []:
                if (
                    isinstance(issue, dict)
                    and str(issue.get("id", "")).isdigit()
                    and carries_ref(issue, field, external_ref)
                ):
                    issues.append(issue)
            token = body.get("nextPageToken")
            if body.get("isLast", True) or not token:
                break
            params = {**params, "nextPageToken": token}
        return issues

    def auth_for(self, secret):
        if secret is None:
            return None, {}
        user, sep, token = secret.partition(":")
        if sep:
            return (user, token), {}
        return None, {"Authorization": f"Bearer {secret}"}

    def special_error(self, response, body: dict, write: bool):
        if response.status_code == 400 and not write:
            # Our JQL was refused: the reference field does not exist, or is not searchable.
            return PermanentError(ReasonCode.CONFIGURATION, f"search refused: {jira_errors(body)}")
        if response.status_code == 400:
            return PermanentError(ReasonCode.INVALID_FIELDS, jira_errors(body))
        if response.status_code == 404 and write and response.request.path_url == REQUEST_PATH:
            # Creating answers 404 only for a service project that is not there (or not visible to us).
            return PermanentError(ReasonCode.CONFIGURATION, f"service desk {self.service_desk_id}: {jira_errors(body)}")
        return None


# --- The payload -------------------------------------------------------------


def label(value: str) -> str:
    """A Jira label: no whitespace allowed, so whitespace becomes underscores (the same every time)."""
    return re.sub(r"\s+", "_", str(value).strip())[:255]


def jql_string(value: str) -> str:
    """A JQL string literal."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def carries_ref(issue: dict, field: str, external_ref: str) -> bool:
    value = (issue.get("fields") or {}).get(field)
    if field == "labels":
        return isinstance(value, list) and label(external_ref) in value
    return value == external_ref


def jira_errors(body: dict) -> str:
    """Jira's error bodies, in either shape (servicedeskapi: errorMessage; platform: errorMessages/errors);
    addresses masked, size capped."""
    parts = []
    if body.get("errorMessage"):
        parts.append(str(body["errorMessage"]))
    parts += [str(m) for m in body.get("errorMessages") or []]
    errors = body.get("errors")
    if isinstance(errors, dict):
        parts += [f"{name}: {message}" for name, message in sorted(errors.items())]
    return mask_address("; ".join(parts) or "HTTP 400")[:2000]


def _option(value, key_for_text: str) -> dict:
    text = str(value)
    return {"id": text} if text.isdigit() else {key_for_text: text}


def route(request: TicketRequest, settings: dict) -> tuple[str, dict]:
    """(requestTypeId, requestFieldValues) for the request's route, through the destination's mappings."""
    request_type_id = str(settings.get("request_type_id") or "")
    queue_value = (settings.get("queues") or {}).get(request.queue) if request.queue else None
    queue_field = settings.get("queue_field")
    fields = {}
    by_type = (settings.get("request_types") or {}).get(request.request_type) if request.request_type else None
    if by_type is not None:
        request_type_id = str(by_type)
    elif queue_value is not None and not queue_field:
        request_type_id = str(queue_value)
    if queue_value is not None and queue_field:
        fields[queue_field] = {"value": str(queue_value)}
    priority = (settings.get("priorities") or {}).get(request.priority) if request.priority else None
    if priority is not None:
        fields["priority"] = _option(priority, "name")
    account_id = (settings.get("assignees") or {}).get(request.assignee) if request.assignee else None
    if account_id is not None and settings.get("assignee_field"):
        fields[settings["assignee_field"]] = {"accountId": str(account_id)}
    return request_type_id, fields


def request_payload(request: TicketRequest, external_ref: str, settings: dict, *, people: dict | None = None) -> dict:
    """The customer request. Deterministic: a retry sends the very same body (`people`: the accounts the
    journal noted; without them the request is raised on behalf of the address)."""
    request_type_id, route_fields = route(request, settings)
    # A summary is one line of at most 255 characters.
    summary = " ".join(request.subject.split())[:MAX_SUMMARY_CHARS] or "(no subject)"
    labels = [label(tag) for tag in request.tags if str(tag).strip()]
    description = request.description
    if request.follow_up_of:
        description = f"{follow_up_line(request.follow_up_of)}\n\n{description}"
    unresolved = (people or {}).get("unresolved") or []
    if unresolved:
        description += "\n\nNo Jira customer account for: " + ", ".join(unresolved)
    values = {"summary": summary, "description": description}
    ref_field = settings.get("external_ref_field")
    if ref_field:
        values[ref_field] = external_ref
    else:
        labels.append(label(external_ref))
    if labels:
        values["labels"] = list(dict.fromkeys(labels))
    values.update(route_fields)
    values.update(request.fields or {})
    payload = {
        "serviceDeskId": str(settings.get("service_desk_id") or ""),
        "requestTypeId": request_type_id,
        "requestFieldValues": values,
    }
    if people is not None:
        if people.get("requester"):
            payload["raiseOnBehalfOf"] = people["requester"]
        if people.get("participants"):
            payload["requestParticipants"] = list(people["participants"])
        return payload
    _, address = email.utils.parseaddr(request.requester)
    if settings.get("raise_on_behalf_of", True) and (address or request.requester):
        payload["raiseOnBehalfOf"] = address or request.requester
    return payload


def follow_up_line(closed_key: str) -> str:
    return f"Follow-up of {closed_key}, which is closed."


def authored_body(comment: CommentRequest) -> str:
    """The comment as the integration account writes it: a "From:" line says whose mail it is."""
    who = comment.author_email
    if comment.author_name and who:
        who = f"{' '.join(comment.author_name.split())} <{who}>"  # as people read it, never RFC 2047-encoded
    return f"From: {who}\n\n{comment.body}" if who else comment.body


def attachment_id(attachment: dict) -> str:
    """The attachment's id from the link JSM answers with (".../rest/api/2/attachment/10010")."""
    link = str((attachment.get("_links") or {}).get("jiraRest") or "")
    tail = link.rstrip("/").rpartition("/")[2]
    return tail if tail.isdigit() else ""


def html5_escaped(filename: str) -> str:
    """The name as a multipart body carries it (quotes and line breaks percent-escaped, HTML5 style)."""
    return filename.replace("\r", "%0D").replace("\n", "%0A").replace('"', "%22")


def settle_seconds(value) -> float:
    """The search's settle delay: the setting, or the default when it is not set (0 is a value)."""
    return float(DEFAULT_SETTLE_SECONDS if value is None else value)

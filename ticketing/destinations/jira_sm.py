"""Jira Service Management destination: customer requests through the JSM REST API (docs/design.md §6).

Calls: `POST /rest/servicedeskapi/request` (create, raised on behalf of the sender),
`POST /rest/servicedeskapi/request/{key}/comment` (a reply, as a public comment),
`GET /rest/api/3/search/jql` (lookup by our reference), and, for `check_connection` only,
`GET /rest/servicedeskapi/servicedesk/{id}` and `.../requesttype/{id}/field`.

Ambiguity: Jira keeps no idempotency key and the create is no upsert, so a 5xx, a timeout or a
dropped connection after the create was sent is an `AmbiguousOutcome`. Our reference is written
into the request (`external_ref_field`, else a label), and JQL can find it, but Jira's search index
lags behind writes: `lookup_settle_seconds` (= `search_settle_seconds`) tells
`ticketing.intents.resolve_unknown` to search only after that delay; found settles the intent,
nothing found goes to review (held), never to a second create.

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
    raise_on_behalf_of (true): raise the request for the sender's email (needs an agent account).
    search_settle_seconds (60): how long after a lost answer the search is trusted.
    plus connect_timeout, read_timeout and the common retry settings.
  A route value with no mapping is left out, not an error; `TicketRequest.fields` (raw Jira field ids)
  are merged into requestFieldValues last.
`Destination.credentials_ref` resolves to `email:api_token` (basic auth), or to a bare token without
a colon (sent as a bearer token: an OAuth or personal access token).

Nothing logged here contains a ticket body or a full email address.
"""
import email.utils
import logging
import re

from intake.logging import mask_address
from intake.vocabulary import ReasonCode

from .base import AmbiguousOutcome, CommentRequest, PermanentError, TicketRequest, TicketResult
from .http import HttpDestination, json_object
from .settings import HTTP_SETTINGS, Flag, Mapping, Number, Text

log = logging.getLogger(__name__)

REQUEST_PATH = "/rest/servicedeskapi/request"
SEARCH_PATH = "/rest/api/3/search/jql"
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
        "search_settle_seconds": Number(minimum=0, maximum=86400, help="trust the search after (60 s)"),
    }

    def __init__(self, destination):
        super().__init__(destination)
        settings = self.settings
        self.lookup_settle_seconds = settle_seconds(settings.get("search_settle_seconds"))
        self.service_desk_id = str(settings.get("service_desk_id") or "")
        self.request_type_id = str(settings.get("request_type_id") or "")
        self.external_ref_field = settings.get("external_ref_field") or ""

    # --- The interface ------------------------------------------------------

    def create_ticket(self, request: TicketRequest, idempotency_key: str, external_ref: str) -> TicketResult:
        self._require_configuration()
        response = self.send("POST", REQUEST_PATH, write=True,
                             json_body=request_payload(request, external_ref, self.settings))
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
        body = comment.body
        if not ISSUE_KEY.fullmatch(str(ticket_id)):
            raise PermanentError(ReasonCode.NOT_FOUND, "a Jira issue key looks like SUP-12")
        response = self.send("POST", f"{REQUEST_PATH}/{ticket_id}/comment", write=True,
                             json_body={"body": body, "public": True})
        comment = json_object(response, write=True)
        log.info("jira_sm: commented on %s for %s", ticket_id, external_ref)
        # The comment id when Jira reports it, else the issue: the comment is on it either way.
        return str(comment.get("id") or ticket_id)

    def ticket_url(self, ticket_id) -> str:
        """The issue in Jira's agent view ("" without a base URL)."""
        return f"{self.base_url}/browse/{ticket_id}" if self.base_url else ""

    def check_connection(self) -> str:
        self._require_configuration()
        desk = json_object(self._read(f"/rest/servicedeskapi/servicedesk/{self.service_desk_id}",
                                      what=f"service desk {self.service_desk_id}"), write=False)
        form = json_object(self._read(
            f"/rest/servicedeskapi/servicedesk/{self.service_desk_id}/requesttype/{self.request_type_id}/field",
            what=f"request type {self.request_type_id}"), write=False)
        on_form = {f.get("fieldId") for f in form.get("requestTypeFields") or [] if isinstance(f, dict)}
        ref_field = self.external_ref_field or "labels"
        missing = [f for f in ("summary", "description", ref_field) if f not in on_form]
        if missing:
            raise PermanentError(ReasonCode.CONFIGURATION, f"request type {self.request_type_id} has no field "
                                                           f"{', '.join(missing)} on its form")
        if self.settings.get("raise_on_behalf_of", True) and form.get("canRaiseOnBehalfOf") is False:
            raise PermanentError(ReasonCode.CREDENTIALS, "this account cannot raise requests on behalf of customers"
                                                         " (it needs to be an agent of the service project)")
        return (f"service project {desk.get('projectKey') or self.service_desk_id} "
                f"({desk.get('projectName') or 'unnamed'}), request type {self.request_type_id} "
                f"with {ref_field} on its form")

    # --- Helpers --------------------------------------------------------------

    def _require_configuration(self):
        if not self.service_desk_id or not self.request_type_id:
            raise PermanentError(ReasonCode.CONFIGURATION, "service_desk_id and request_type_id are required")

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
            clause = f'cf[{field.removeprefix("customfield_")}] ~ {jql_string(jql_string(external_ref))}'
        else:
            clause = f"labels = {jql_string(label(external_ref))}"
        params = {"jql": f"{clause} ORDER BY created ASC", "fields": f"key,{field}", "maxResults": 50}
        issues = []
        for _ in range(MAX_SEARCH_PAGES):
            body = json_object(self._read(SEARCH_PATH, what="the JQL search", params=params), write=False)
            for issue in body.get("issues") or []:
                if isinstance(issue, dict) and str(issue.get("id", "")).isdigit() and carries_ref(
                        issue, field, external_ref):
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


def request_payload(request: TicketRequest, external_ref: str, settings: dict) -> dict:
    """The customer request. Deterministic: a retry sends the very same body."""
    request_type_id, route_fields = route(request, settings)
    # A summary is one line of at most 255 characters.
    summary = " ".join(request.subject.split())[:MAX_SUMMARY_CHARS] or "(no subject)"
    labels = [label(tag) for tag in request.tags if str(tag).strip()]
    values = {"summary": summary, "description": request.description}
    ref_field = settings.get("external_ref_field")
    if ref_field:
        values[ref_field] = external_ref
    else:
        labels.append(label(external_ref))
    if labels:
        values["labels"] = list(dict.fromkeys(labels))
    values.update(route_fields)
    values.update(request.fields or {})
    payload = {"serviceDeskId": str(settings.get("service_desk_id") or ""), "requestTypeId": request_type_id,
               "requestFieldValues": values}
    _, address = email.utils.parseaddr(request.requester)
    if settings.get("raise_on_behalf_of", True) and (address or request.requester):
        payload["raiseOnBehalfOf"] = address or request.requester
    return payload


def settle_seconds(value) -> float:
    """The search's settle delay: the setting, or the default when it is not set (0 is a value)."""
    return float(DEFAULT_SETTLE_SECONDS if value is None else value)

"""FakeDesk speaking the Jira Service Management (Cloud) subset Mailroom uses.

    POST /rest/servicedeskapi/request                         create a customer request (201, fault plan)
    POST /rest/servicedeskapi/request/{issueIdOrKey}/comment  add a comment (201, fault plan)
    GET  /rest/servicedeskapi/request/{issueIdOrKey}/comment  the comments after the description
    GET  /rest/servicedeskapi/servicedesk/{id}                one service project (404 if unknown)
    GET  /rest/servicedeskapi/servicedesk/{id}/requesttype/{id}/field   a request type's form
    GET  /rest/api/3/search/jql?jql=...&fields=...            JQL search, lagging by `search_lag_seconds`

One service project, id "1" (key SUP), with request types 10 (Get help), 11 (Billing), 12 (Technical
problem), 21 (Refund), whose form holds summary, description, labels, priority, customfield_10050
(text, "Mailroom reference"), customfield_10060 (select "Queue": Billing, Technical) and
customfield_10070 (user picker "Assigned agent"); and 30 (Report a bug): summary and description only.
A field not on the request type's form is refused with 400, as Jira does. Issue n is "SUP-n" (issue id
10000 + n). The search index sees a request `search_lag_seconds` after its create; it indexes the
Mailroom reference (customfield_10050, else the label starting "mailroom-") and answers
`labels = "..."`, `cf[10050] ~ "..."` / `customfield_10050 ~ "..."` clauses (other clauses ignored).

Auth: basic `email:<token>` or `Bearer <token>` (`Desk.token`); errors in the servicedeskapi shape
({"errorMessage", "i18nErrorMessage"}), the platform API's as {"errorMessages", "errors"}.
"""
import base64
import binascii
import hmac
import re
import time

from ..desk import WriteOutcome
from ..faults import rejection_for
from ..handler import Handler
from ..store import ValidationFailed

KEY = r"([A-Z][A-Z0-9_]*-\d+|\d+)"
SERVICE_DESKS = {"1": {"id": "1", "projectId": "10000", "projectKey": "SUP", "projectName": "Customer Support"}}
FULL_FORM = ("summary", "description", "labels", "priority", "customfield_10050", "customfield_10060",
             "customfield_10070")
REQUEST_TYPES = {"10": ("Get help", FULL_FORM), "11": ("Billing question", FULL_FORM),
                 "12": ("Technical problem", FULL_FORM), "21": ("Refund", FULL_FORM),
                 "30": ("Report a bug", ("summary", "description"))}
FIELD_NAMES = {"summary": "Summary", "description": "Description", "labels": "Labels", "priority": "Priority",
               "customfield_10050": "Mailroom reference", "customfield_10060": "Queue",
               "customfield_10070": "Assigned agent"}
REFERENCE_FIELD = "customfield_10050"
PRIORITIES = ("Highest", "High", "Medium", "Low", "Lowest")
QUEUE_OPTIONS = ("Billing", "Technical")
ISSUE_ID_OFFSET = 10000
CLAUSE = re.compile(r'(labels|cf\[(\d+)\]|customfield_(\d+))\s*(=|~)\s*"((?:[^"\\]|\\.)*)"', re.IGNORECASE)


def sd_error(message: str, key: str = "sd.error") -> dict:
    """A servicedeskapi error body."""
    return {"errorMessage": message, "i18nErrorMessage": {"i18nKey": key, "parameters": []}}


def epoch_date(epoch: float) -> dict:
    iso = time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(epoch))
    return {"iso8601": iso, "jira": iso, "friendly": "Today", "epochMillis": int(epoch * 1000)}


class JiraServiceManagementHandler(Handler):
    API_ROUTES = [
        ("POST", re.compile(r"/rest/servicedeskapi/request"), "create_request", True),
        ("POST", re.compile(rf"/rest/servicedeskapi/request/{KEY}/comment"), "add_request_comment", True),
        ("GET", re.compile(rf"/rest/servicedeskapi/request/{KEY}/comment"), "list_request_comments", True),
        ("GET", re.compile(r"/rest/servicedeskapi/servicedesk/(\w+)"), "show_service_desk", True),
        ("GET", re.compile(r"/rest/servicedeskapi/servicedesk/(\w+)/requesttype/(\w+)/field"),
         "request_type_fields", True),
        ("GET", re.compile(r"/rest/api/3/search/jql"), "search_jql", True),
    ]
    IDEMPOTENCY_HEADER = None  # Jira has no idempotency key
    PAYLOAD_KEY = None
    UNAUTHENTICATED = (401, sd_error("Client must be authenticated to access this resource.", "sd.auth.required"))

    def _authenticated(self) -> bool:
        token = self.desk.token
        if not token:
            return True
        scheme, _, credentials = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer":
            return hmac.compare_digest(credentials.strip().encode(), token.encode())
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(credentials, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return "@" in user and hmac.compare_digest(password.encode(), token.encode())

    def rejection(self, fault):
        refusal = rejection_for(fault)
        if refusal is None:
            return None
        status, headers, _ = refusal
        if status == 422:  # Jira answers invalid fields with 400
            return 400, headers, sd_error("Your request could not be created. Please check the fields have been "
                                          "correctly filled in. The customer is not valid.", "sd.request.invalid")
        if status == 401:
            return self.UNAUTHENTICATED[0], headers, self.UNAUTHENTICATED[1]
        if status == 429:
            return status, headers, sd_error("Rate limit exceeded.", "sd.rate.limit")
        return status, headers, sd_error("Internal server error", "sd.server.error")

    def invalid_body(self):
        return 400, sd_error("The request body is not a JSON object.", "sd.request.body")

    # --- Writes ---------------------------------------------------------------

    def create_request(self):
        self._ticket_write("POST", "/rest/servicedeskapi/request", self._do_create,
                           external_id_of=lambda record: reference_of(record.get("requestFieldValues")))

    def _do_create(self, record: dict) -> WriteOutcome:
        desk = SERVICE_DESKS.get(str(record.get("serviceDeskId")))
        if desk is None:
            return WriteOutcome(404, sd_error("The service project does not exist.", "sd.servicedesk.missing"))
        problems = form_problems(record)
        if problems:
            return WriteOutcome(400, sd_error("Your request could not be created. Please check the fields have "
                                              "been correctly filled in. " + " ".join(problems), "sd.request.invalid"))
        values = record["requestFieldValues"]
        ticket = {"subject": values.get("summary"), "description": values.get("description") or "",
                  "external_id": reference_of(values), "tags": values.get("labels") or []}
        if record.get("raiseOnBehalfOf"):
            ticket["requester"] = {"email": str(record["raiseOnBehalfOf"])}
        try:
            number = self.desk.store.create_ticket(ticket, fields={**record})
        except ValidationFailed as exc:
            return WriteOutcome(400, sd_error("Your request could not be created. " + "; ".join(
                sorted(exc.details)) + " is invalid.", "sd.request.invalid"))
        key, issue_id = f"{desk['projectKey']}-{number}", str(ISSUE_ID_OFFSET + number)
        self.desk.store.update_fields(number, {}, {"issueKey": key, "issueId": issue_id})
        base = self._base_url()
        body = {
            "issueId": issue_id, "issueKey": key, "requestTypeId": str(record["requestTypeId"]),
            "serviceDeskId": desk["id"], "createdDate": epoch_date(time.time()),
            "reporter": {"emailAddress": ticket.get("requester", {}).get("email", "agent@fakedesk.test")},
            "requestFieldValues": [{"fieldId": f, "label": FIELD_NAMES.get(f, f), "value": v}
                                   for f, v in values.items()],
            "currentStatus": {"status": "Waiting for support", "statusCategory": "NEW"},
            "_links": {"web": f"{base}/servicedesk/customer/portal/{desk['id']}/{key}",
                       "self": f"{base}/rest/servicedeskapi/request/{issue_id}",
                       "jiraRest": f"{base}/rest/api/2/issue/{issue_id}"},
        }
        return WriteOutcome(201, body, committed=True, ticket_id=number)

    def add_request_comment(self, key):
        self._ticket_write("POST", f"/rest/servicedeskapi/request/{key}/comment",
                           lambda record: self._do_comment(key, record), external_id_of=lambda record: None)

    def _do_comment(self, key: str, record: dict) -> WriteOutcome:
        number = self._number(key)
        if number is None:
            return WriteOutcome(404, sd_error("Request does not exist or you do not have permission to see it.",
                                              "sd.request.missing"))
        body = record.get("body")
        if not isinstance(body, str) or not body.strip():
            return WriteOutcome(400, sd_error("The comment body is required.", "sd.comment.body.required"))
        public = record.get("public", True) is not False
        audit = self.desk.store.add_comment(number, {"comment": {"body": body, "public": public}})
        comment = {"id": str(audit["id"]), "body": body, "public": public,
                   "author": {"accountId": "fakedesk-agent", "displayName": "FakeDesk agent"},
                   "created": epoch_date(time.time()),
                   "_links": {"self": f"{self._base_url()}/rest/servicedeskapi/request/{key}/comment/{audit['id']}"}}
        return WriteOutcome(201, comment, committed=True, ticket_id=number)

    # --- Reads ----------------------------------------------------------------

    def _number(self, key: str) -> int | None:
        """The store id of an issue key or id, None when there is no such issue."""
        project, _, digits = key.rpartition("-")
        if project and project not in {d["projectKey"] for d in SERVICE_DESKS.values()}:
            return None
        number = int(digits) - (0 if project else ISSUE_ID_OFFSET)
        with self.desk.store.transaction():
            return number if number > 0 and self.desk.store.ticket(number, self._base_url()) else None

    def list_request_comments(self, key):
        number = self._number(key)
        if number is None:
            self._send(404, sd_error("Request does not exist or you do not have permission to see it."))
            return
        with self.desk.store.transaction():
            comments = self.desk.store.comments(number)[1:]  # the first is the description
        values = [{"id": str(c["id"]), "body": c["body"], "public": c["public"]} for c in comments]
        self._send(200, {"size": len(values), "start": 0, "limit": 50, "isLastPage": True, "values": values})

    def show_service_desk(self, desk_id):
        desk = SERVICE_DESKS.get(desk_id)
        if desk is None:
            self._send(404, sd_error("The service project does not exist or you do not have permission to see it."))
            return
        self._send(200, {**desk, "_links": {"self": f"{self._base_url()}/rest/servicedeskapi/servicedesk/{desk_id}"}})

    def request_type_fields(self, desk_id, request_type_id):
        if desk_id not in SERVICE_DESKS or request_type_id not in REQUEST_TYPES:
            self._send(404, sd_error("The request type does not exist or you do not have permission to see it."))
            return
        fields = [{"fieldId": f, "name": FIELD_NAMES[f], "required": f == "summary", "validValues": []}
                  for f in REQUEST_TYPES[request_type_id][1]]
        self._send(200, {"requestTypeFields": fields, "canRaiseOnBehalfOf": True, "canAddRequestParticipants": True})

    def search_jql(self):
        jql = (self.query.get("jql") or [""])[0]
        match = CLAUSE.search(jql)
        if match is None:
            self._send(400, {"errorMessages": ["Unbounded JQL queries are not allowed here. Please add a search "
                                               "restriction to your query."], "errors": {}})
            return
        field = "labels" if match.group(1).lower() == "labels" else f"customfield_{match.group(2) or match.group(3)}"
        if field not in FIELD_NAMES:
            self._send(400, {"errorMessages": [f"Field '{match.group(1)}' does not exist or you do not have "
                                               "permission to view it."], "errors": {}})
            return
        wanted = re.sub(r'\\(.)', r"\1", match.group(5)).strip('"')
        requested = [f for f in ",".join(self.query.get("fields") or []).split(",") if f and f != "key"]
        with self.desk.store.transaction():
            found = self.desk.store.search(self._base_url(), wanted, self.desk.search_lag_seconds)
        issues = []
        for ticket in found:
            values = ticket["fields"].get("requestFieldValues") or {}
            held = values.get(field)
            if held == wanted or (isinstance(held, list) and wanted in held):
                issues.append({"id": ticket["fields"]["issueId"], "key": ticket["fields"]["issueKey"],
                               "fields": {f: values.get(f) for f in requested}})
        self._send(200, {"issues": issues, "isLast": True})


def reference_of(values) -> str | None:
    """What the fake's search index knows a request by: the Mailroom reference field, else its label."""
    if not isinstance(values, dict):
        return None
    if isinstance(values.get(REFERENCE_FIELD), str):
        return values[REFERENCE_FIELD]
    labels = values.get("labels") if isinstance(values.get("labels"), list) else []
    return next((str(lab) for lab in labels if str(lab).startswith("mailroom-")), None)


def form_problems(record: dict) -> list[str]:
    """What Jira would refuse in a create: the request type, fields not on its form, malformed values."""
    request_type = REQUEST_TYPES.get(str(record.get("requestTypeId")))
    if request_type is None:
        return ["The request type does not exist."]
    values = record.get("requestFieldValues")
    if not isinstance(values, dict):
        return ["requestFieldValues must be an object."]
    problems = [f"Field '{f}' cannot be set. It is not on the appropriate screen, or unknown."
                for f in values if f not in request_type[1]]
    summary = values.get("summary")
    if not isinstance(summary, str) or not summary.strip():
        problems.append("Summary is required.")
    elif len(summary) > 255 or "\n" in summary:
        problems.append("Summary must be one line of at most 255 characters.")
    labels = values.get("labels", [])
    if not isinstance(labels, list) or any(not isinstance(x, str) or not x or re.search(r"\s", x) for x in labels):
        problems.append("Labels must be a list of words without spaces.")
    priority = values.get("priority")
    if priority is not None and (not isinstance(priority, dict) or priority.get("name") not in PRIORITIES
                                 and str(priority.get("id")) not in {"1", "2", "3", "4", "5"}):
        problems.append("Priority: specify a valid priority.")
    queue = values.get("customfield_10060")
    if queue is not None and (not isinstance(queue, dict) or queue.get("value") not in QUEUE_OPTIONS):
        problems.append(f"Queue: specify a valid option ({', '.join(QUEUE_OPTIONS)}).")
    agent = values.get("customfield_10070")
    if agent is not None and (not isinstance(agent, dict) or not agent.get("accountId")):
        problems.append("Assigned agent: specify an accountId.")
    return problems

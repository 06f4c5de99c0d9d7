"""FakeDesk speaking the Jira Service Management (Cloud) subset Mailroom uses.

    POST /rest/servicedeskapi/request                         create a customer request (201, fault plan):
                                                              raiseOnBehalfOf (an accountId, or an address)
                                                              is the requester, requestParticipants the CCs
    GET  /rest/servicedeskapi/request/{issueIdOrKey}          the request, its currentStatus (404 if unknown)
    POST /rest/servicedeskapi/request/{issueIdOrKey}/comment  add a comment (201, fault plan), written as the
                                                              authenticated account, public or internal
    GET  /rest/servicedeskapi/request/{issueIdOrKey}/comment  the comments after the description
    POST /rest/servicedeskapi/request/{issueIdOrKey}/attachment   {"temporaryAttachmentIds", "public"}: each
                                                              temporary file becomes an attachment of the
                                                              request (201, fault plan); a temporary id is
                                                              used once, then it is gone (400)
    GET  /rest/servicedeskapi/request/{issueIdOrKey}/attachment   the request's attachments
    POST /rest/servicedeskapi/request/{issueIdOrKey}/participant  {"accountIds"}: participants (200)
    GET  /rest/servicedeskapi/request/{issueIdOrKey}/participant  the participants
    POST /rest/servicedeskapi/servicedesk/{id}/attachTemporaryFile  multipart "file" parts (201, fault plan);
                                                              without X-Atlassian-Token: no-check, 403 (XSRF)
    POST /rest/servicedeskapi/servicedesk/{id}/customer       {"accountIds"}: customers of the project (204)
    POST /rest/servicedeskapi/customer                        {"email", "displayName"}: 201 a new customer
                                                              account; 400 when the address has one already
    GET  /rest/api/3/user/search?query=...                    accounts whose address or name contains it
    GET  /rest/api/3/issue/{issueIdOrKey}?fields=attachment   the issue's attachments (id, filename, size)
    GET  /rest/servicedeskapi/servicedesk/{id}                one service project (404 if unknown)
    GET  /rest/servicedeskapi/servicedesk/{id}/requesttype/{id}/field   a request type's form
    GET  /rest/api/3/search/jql?jql=...&fields=...            JQL search, lagging by `search_lag_seconds`

Record writes (creates, comments, temporary files, attachments) go through the fault plan and the request
log; the people endpoints (customers, service project membership, participants) do not: the plan is
about records and their files. A request closed with POST /_control/close shows status "Closed"
(category DONE) and refuses comments and attachments with 403, as a workflow that denies comments on
Closed does. Files keep the sha256 of the bytes received; their visibility is not kept.

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
import email.parser
import email.policy
import hmac
import re
import secrets
import time

from ..desk import WriteOutcome
from ..faults import rejection_for
from ..handler import Handler
from ..store import ValidationFailed

KEY = r"([A-Z][A-Z0-9_]*-\d+|\d+)"
ACCOUNT_PREFIX = "qm:fakedesk:"  # customer accounts' ids ("qm:" as JSM's portal-only customers)
CLOSED_STATUS = {"status": "Closed", "statusCategory": "DONE"}
OPEN_STATUS = {"status": "Waiting for support", "statusCategory": "NEW"}
SERVICE_DESKS = {"1": {"id": "1", "projectId": "10000", "projectKey": "SUP", "projectName": "Customer Support"}}
FULL_FORM = (
    "summary",
    "description",
    "labels",
    "priority",
    "customfield_10050",
    "customfield_10060",
    "customfield_10070",
)
REQUEST_TYPES = {
    "10": ("Get help", FULL_FORM),
    "11": ("Billing question", FULL_FORM),
    "12": ("Technical problem", FULL_FORM),
    "21": ("Refund", FULL_FORM),
    "30": ("Report a bug", ("summary", "description")),
}
FIELD_NAMES = {
    "summary": "Summary",
    "description": "Description",
    "labels": "Labels",
    "priority": "Priority",
    "customfield_10050": "Mailroom reference",
    "customfield_10060": "Queue",
    "customfield_10070": "Assigned agent",
}
REFERENCE_FIELD = "customfield_10050"
PRIORITIES = ("Highest", "High", "Medium", "Low", "Lowest")
QUEUE_OPTIONS = ("Billing", "Technical")
ISSUE_ID_OFFSET = 10000
EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
CLAUSE = re.compile(r'(labels|cf\[(\d+)\]|customfield_(\d+))\s*(=|~)\s*"((?:[^"\\]|\\.)*)"', re.IGNORECASE)


def sd_error(message: str, key: str = "sd.error") -> dict:
    """A servicedeskapi error body."""
    return {"errorMessage": message, "i18nErrorMessage": {"i18nKey": key, "parameters": []}}


def epoch_date(epoch: float) -> dict:
    iso = time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(epoch))
    return {"iso8601": iso, "jira": iso, "friendly": "Today", "epochMillis": int(epoch * 1000)}


def account_id(person: dict) -> str:
    return f"{ACCOUNT_PREFIX}{person['id']}"


def person_id(account: str) -> int | None:
    digits = str(account).removeprefix(ACCOUNT_PREFIX)
    return int(digits) if str(account).startswith(ACCOUNT_PREFIX) and digits.isdigit() else None


def multipart_files(content_type: str, body: bytes) -> list[tuple[str, str, bytes]]:
    """(filename, content type, bytes) of each "file" part of a multipart/form-data body."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        return []
    return [
        (part.get_filename() or "", part.get_content_type(), part.get_payload(decode=True) or b"")
        for part in message.iter_parts()
        if part.get_param("name", header="content-disposition") == "file"
    ]


class JiraServiceManagementHandler(Handler):
    API_ROUTES = [
        ("POST", re.compile(r"/rest/servicedeskapi/request"), "create_request", True),
        ("GET", re.compile(rf"/rest/servicedeskapi/request/{KEY}"), "show_request", True),
        ("POST", re.compile(rf"/rest/servicedeskapi/request/{KEY}/comment"), "add_request_comment", True),
        ("GET", re.compile(rf"/rest/servicedeskapi/request/{KEY}/comment"), "list_request_comments", True),
        ("POST", re.compile(rf"/rest/servicedeskapi/request/{KEY}/attachment"), "attach_to_request", True),
        ("GET", re.compile(rf"/rest/servicedeskapi/request/{KEY}/attachment"), "list_request_attachments", True),
        ("POST", re.compile(rf"/rest/servicedeskapi/request/{KEY}/participant"), "add_participants", True),
        ("GET", re.compile(rf"/rest/servicedeskapi/request/{KEY}/participant"), "list_participants", True),
        ("POST", re.compile(r"/rest/servicedeskapi/servicedesk/(\w+)/attachTemporaryFile"), "temporary_file", True),
        ("POST", re.compile(r"/rest/servicedeskapi/servicedesk/(\w+)/customer"), "add_desk_customers", True),
        ("POST", re.compile(r"/rest/servicedeskapi/customer"), "create_customer", True),
        ("GET", re.compile(r"/rest/api/[23]/user/search"), "user_search", True),
        ("GET", re.compile(rf"/rest/api/[23]/issue/{KEY}"), "show_issue", True),
        ("GET", re.compile(r"/rest/servicedeskapi/servicedesk/(\w+)"), "show_service_desk", True),
        (
            "GET",
            re.compile(r"/rest/servicedeskapi/servicedesk/(\w+)/requesttype/(\w+)/field"),
            "request_type_fields",
            True,
        ),
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
            return (
                400,
                headers,
                sd_error(
                    "Your request could not be created. Please check the fields have been "
                    "correctly filled in. The customer is not valid.",
                    "sd.request.invalid",
                ),
            )
        if status == 401:
            return self.UNAUTHENTICATED[0], headers, self.UNAUTHENTICATED[1]
        if status == 429:
            return status, headers, sd_error("Rate limit exceeded.", "sd.rate.limit")
        return status, headers, sd_error("Internal server error", "sd.server.error")

    def invalid_body(self):
        return 400, sd_error("The request body is not a JSON object.", "sd.request.body")

    # --- Writes ---------------------------------------------------------------

    def create_request(self):
        self._ticket_write(
            "POST",
            "/rest/servicedeskapi/request",
            self._do_create,
            external_id_of=lambda record: reference_of(record.get("requestFieldValues")),
        )

    def _do_create(self, record: dict) -> WriteOutcome:
        desk = SERVICE_DESKS.get(str(record.get("serviceDeskId")))
        if desk is None:
            return WriteOutcome(404, sd_error("The service project does not exist.", "sd.servicedesk.missing"))
        problems = form_problems(record)
        requester = self._person_for(record["raiseOnBehalfOf"]) if record.get("raiseOnBehalfOf") else None
        if record.get("raiseOnBehalfOf") and requester is None:
            problems.append("raiseOnBehalfOf: the customer account does not exist.")
        participants = [self._person_for(a) for a in record.get("requestParticipants") or []]
        if None in participants or not isinstance(record.get("requestParticipants", []), list):
            problems.append("requestParticipants: an account does not exist.")
        if problems:
            return WriteOutcome(
                400,
                sd_error(
                    "Your request could not be created. Please check the fields have "
                    "been correctly filled in. " + " ".join(problems),
                    "sd.request.invalid",
                ),
            )
        values = record["requestFieldValues"]
        ticket = {
            "subject": values.get("summary"),
            "description": values.get("description") or "",
            "external_id": reference_of(values),
            "tags": values.get("labels") or [],
        }
        if requester is not None:
            ticket["requester"] = {"email": requester["email"], "name": requester["name"]}
        try:
            number = self.desk.store.create_ticket(ticket, fields={**record})
        except ValidationFailed as exc:
            return WriteOutcome(
                400,
                sd_error(
                    "Your request could not be created. " + "; ".join(sorted(exc.details)) + " is invalid.",
                    "sd.request.invalid",
                ),
            )
        key, issue_id = f"{desk['projectKey']}-{number}", str(ISSUE_ID_OFFSET + number)
        self.desk.store.update_fields(number, {}, {"issueKey": key, "issueId": issue_id})
        if requester is not None:
            self.desk.store.add_ticket_person(number, requester["email"], "requester")
        for person in participants:
            self.desk.store.add_ticket_person(number, person["email"], "cc")
        return WriteOutcome(201, self._request_view(number), committed=True, ticket_id=number)

    def add_request_comment(self, key):
        self._ticket_write(
            "POST",
            f"/rest/servicedeskapi/request/{key}/comment",
            lambda record: self._do_comment(key, record),
            external_id_of=lambda record: None,
        )

    def _do_comment(self, key: str, record: dict) -> WriteOutcome:
        number = self._number(key)
        if number is None:
            return WriteOutcome(
                404, sd_error("Request does not exist or you do not have permission to see it.", "sd.request.missing")
            )
        if self._closed(number):
            return WriteOutcome(
                403, sd_error("You do not have permission to comment on this request.", "sd.request.comment.forbidden")
            )
        body = record.get("body")
        if not isinstance(body, str) or not body.strip():
            return WriteOutcome(400, sd_error("The comment body is required.", "sd.comment.body.required"))
        public = record.get("public", True) is not False
        author = self._agent()
        comment_id = self.desk.store.insert_comment(number, body, public=public, author=author)
        comment = {
            "id": str(comment_id),
            "body": body,
            "public": public,
            "author": {"accountId": "fakedesk-agent", "emailAddress": author, "displayName": "Mailroom"},
            "created": epoch_date(time.time()),
            "_links": {"self": f"{self._base_url()}/rest/servicedeskapi/request/{key}/comment/{comment_id}"},
        }
        return WriteOutcome(201, comment, committed=True, ticket_id=number)

    def temporary_file(self, desk_id):
        path = f"/rest/servicedeskapi/servicedesk/{desk_id}/attachTemporaryFile"
        fault = self._fault_before_write("POST", path)
        if fault is None:
            return
        files = multipart_files(self.headers.get("Content-Type") or "", self.raw_body)
        if desk_id not in SERVICE_DESKS:
            outcome = WriteOutcome(404, sd_error("The service project does not exist.", "sd.servicedesk.missing"))
        elif (self.headers.get("X-Atlassian-Token") or "").lower() != "no-check":
            outcome = WriteOutcome(403, sd_error("XSRF check failed", "sd.xsrf"))
        elif not files:
            outcome = WriteOutcome(400, sd_error("The multipart parameter 'file' is required.", "sd.attachment.file"))
        else:
            made = []
            with self.desk.store.transaction():
                for filename, content_type, data in files:
                    token = f"temp{secrets.randbits(62)}"
                    self.desk.store.add_upload(token, filename, content_type, data)
                    made.append({"temporaryAttachmentId": token, "fileName": filename})
            outcome = WriteOutcome(201, {"temporaryAttachments": made}, committed=True)
        self._log_write("POST", path, fault, outcome)
        self._answer_write(fault, outcome)

    def attach_to_request(self, key):
        self._ticket_write(
            "POST",
            f"/rest/servicedeskapi/request/{key}/attachment",
            lambda record: self._do_attach(key, record),
            external_id_of=lambda record: None,
        )

    def _do_attach(self, key: str, record: dict) -> WriteOutcome:
        number = self._number(key)
        if number is None:
            return WriteOutcome(
                404, sd_error("Request does not exist or you do not have permission to see it.", "sd.request.missing")
            )
        if self._closed(number):
            return WriteOutcome(
                403,
                sd_error(
                    "You do not have permission to add attachments to this request.", "sd.request.attachment.forbidden"
                ),
            )
        ids = record.get("temporaryAttachmentIds")
        if not isinstance(ids, list) or not ids:
            return WriteOutcome(400, sd_error("temporaryAttachmentIds is required.", "sd.attachment.ids"))
        store = self.desk.store
        # A temporary file is used up by the attach that takes it (the attachment keeps its id as a marker).
        used = {a["marker"] for t in store.tickets(self._base_url()) for a in store.attachments(t["id"])}
        uploads = [store.upload(str(token)) for token in ids]
        if any(upload is None for upload in uploads) or used & {str(token) for token in ids}:
            return WriteOutcome(
                400,
                sd_error("The temporary attachment does not exist or has expired.", "sd.attachment.temporary.missing"),
            )
        values = []
        for upload in uploads:
            attachment = store.add_attachment(
                number,
                filename=upload["filename"],
                content_type=upload["content_type"],
                size=upload["size"],
                sha256=upload["sha256"],
                marker=upload["token"],
            )
            values.append(self._attachment_view(attachment, upload["filename"], upload["size"], upload["content_type"]))
        return WriteOutcome(
            201,
            {"attachments": {"size": len(values), "start": 0, "limit": 50, "isLastPage": True, "values": values}},
            committed=True,
            ticket_id=number,
        )

    # --- People (outside the fault plan) --------------------------------------------------------------

    def create_customer(self):
        payload = self._parse_json()
        address = str((payload or {}).get("email") or "").strip()
        if not EMAIL.fullmatch(address):
            self._send(400, sd_error("Enter a valid email address.", "sd.customer.email.invalid"))
            return
        name = str(payload.get("displayName") or payload.get("fullName") or "")
        with self.desk.store.transaction():
            person_number, created = self.desk.store.find_or_create_person(address, name, role="customer")
            person = self.desk.store.person(person_number)
        if not created:
            self._send(
                400, sd_error("An account already exists for this email address.", "sd.customer.create.account.exists")
            )
            return
        self._send(201, self._user_view(person))

    def add_desk_customers(self, desk_id):
        payload = self._parse_json()
        accounts = (payload or {}).get("accountIds")
        if desk_id not in SERVICE_DESKS:
            self._send(404, sd_error("The service project does not exist.", "sd.servicedesk.missing"))
            return
        with self.desk.store.transaction():
            known = isinstance(accounts, list) and all(self._person_for(a, create=False) for a in accounts)
        if not known:
            self._send(400, sd_error("The accounts could not be found.", "sd.customer.missing"))
            return
        self._send_empty(204)

    def add_participants(self, key):
        number = self._number(key)
        if number is None:
            self._send(404, sd_error("Request does not exist or you do not have permission to see it."))
            return
        accounts = (self._parse_json() or {}).get("accountIds")
        with self.desk.store.transaction():
            people = [self._person_for(a, create=False) for a in accounts] if isinstance(accounts, list) else [None]
            if None not in people:
                for person in people:
                    self.desk.store.add_ticket_person(number, person["email"], "cc")
        if None in people:
            self._send(400, sd_error("The accounts could not be found.", "sd.participant.missing"))
            return
        self.list_participants(key)

    def list_participants(self, key):
        number = self._number(key)
        if number is None:
            self._send(404, sd_error("Request does not exist or you do not have permission to see it."))
            return
        with self.desk.store.transaction():
            people = [self.desk.store.person(email=e) for e in self.desk.store.ticket_people(number)["cc"]]
        values = [self._user_view(p) for p in people if p]
        self._send(200, {"size": len(values), "start": 0, "limit": 50, "isLastPage": True, "values": values})

    def user_search(self):
        query = (self.query.get("query") or [""])[0].strip().lower()
        with self.desk.store.transaction():
            people = self.desk.store.people()
        found = [p for p in people if query and (query in p["email"].lower() or query in p["name"].lower())]
        self._send(200, [self._user_view(p) for p in found])

    def _person_for(self, account, create: bool = True) -> dict | None:
        """The person an accountId names (or, as older clients send, an address: found or made). Inside the
        caller's transaction."""
        number = person_id(account)
        if number is not None:
            return self.desk.store.person(number)
        if create and isinstance(account, str) and EMAIL.fullmatch(account):
            number, _ = self.desk.store.find_or_create_person(account, role="customer")
            return self.desk.store.person(number)
        return None

    def _user_view(self, person: dict) -> dict:
        return {
            "accountId": account_id(person),
            "accountType": "customer",
            "emailAddress": person["email"],
            "displayName": person["name"],
            "active": True,
            "timeZone": "UTC",
            "self": f"{self._base_url()}/rest/api/3/user?accountId={account_id(person)}",
        }

    # --- Reads ----------------------------------------------------------------

    def _number(self, key: str) -> int | None:
        """The store id of an issue key or id, None when there is no such issue."""
        project, _, digits = key.rpartition("-")
        if project and project not in {d["projectKey"] for d in SERVICE_DESKS.values()}:
            return None
        number = int(digits) - (0 if project else ISSUE_ID_OFFSET)
        with self.desk.store.transaction():
            return number if number > 0 and self.desk.store.ticket(number, self._base_url()) else None

    def _closed(self, number: int) -> bool:
        return (self.desk.store.ticket(number, self._base_url()) or {}).get("status") == "closed"

    def _agent(self) -> str:
        """The address of the account the request authenticates as (basic auth), else the fake's agent."""
        scheme, _, credentials = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "basic":
            try:
                user = base64.b64decode(credentials, validate=True).decode().partition(":")[0]
            except (binascii.Error, UnicodeDecodeError):
                user = ""
            if "@" in user:
                return user
        return "agent@fakedesk.test"

    def _request_view(self, number: int) -> dict:
        ticket = self.desk.store.ticket(number, self._base_url())
        record = ticket["fields"]
        values = record.get("requestFieldValues") or {}
        key, issue_id, base = record["issueKey"], record["issueId"], self._base_url()
        desk = SERVICE_DESKS.get(str(record.get("serviceDeskId")), {"id": str(record.get("serviceDeskId"))})
        requester = (ticket.get("requester") or {}).get("email") or "agent@fakedesk.test"
        return {
            "issueId": issue_id,
            "issueKey": key,
            "requestTypeId": str(record.get("requestTypeId")),
            "serviceDeskId": desk["id"],
            "createdDate": epoch_date(time.time()),
            "reporter": {"emailAddress": requester},
            "requestFieldValues": [
                {"fieldId": f, "label": FIELD_NAMES.get(f, f), "value": v} for f, v in values.items()
            ],
            "currentStatus": CLOSED_STATUS if ticket["status"] == "closed" else OPEN_STATUS,
            "_links": {
                "web": f"{base}/servicedesk/customer/portal/{desk['id']}/{key}",
                "self": f"{base}/rest/servicedeskapi/request/{issue_id}",
                "jiraRest": f"{base}/rest/api/2/issue/{issue_id}",
            },
        }

    def _attachment_view(self, attachment_id: int, filename: str, size: int, content_type: str) -> dict:
        base = self._base_url()
        return {
            "filename": filename,
            "size": size,
            "mimeType": content_type,
            "created": epoch_date(time.time()),
            "author": {"emailAddress": self._agent()},
            "_links": {
                "jiraRest": f"{base}/rest/api/2/attachment/{attachment_id}",
                "content": f"{base}/secure/attachment/{attachment_id}/{filename}",
            },
        }

    def show_request(self, key):
        number = self._number(key)
        if number is None:
            self._send(
                404, sd_error("Request does not exist or you do not have permission to see it.", "sd.request.missing")
            )
            return
        with self.desk.store.transaction():
            view = self._request_view(number)
        self._send(200, view)

    def show_issue(self, key):
        number = self._number(key)
        if number is None:
            self._send(
                404, {"errorMessages": ["Issue does not exist or you do not have permission to see it."], "errors": {}}
            )
            return
        with self.desk.store.transaction():
            ticket = self.desk.store.ticket(number, self._base_url())
            files = self.desk.store.attachments(number)
        base, record = self._base_url(), ticket["fields"]
        attachments = [
            {
                "id": str(a["id"]),
                "self": f"{base}/rest/api/3/attachment/{a['id']}",
                "filename": a["filename"],
                "size": a["size"],
                "mimeType": a["content_type"],
                "created": a["created_at"],
                "content": f"{base}/secure/attachment/{a['id']}/{a['filename']}",
            }
            for a in files
        ]
        fields = {
            "attachment": attachments,
            "summary": ticket["subject"],
            "status": {"name": (CLOSED_STATUS if ticket["status"] == "closed" else OPEN_STATUS)["status"]},
        }
        wanted = [f for f in ",".join(self.query.get("fields") or []).split(",") if f]
        if wanted:
            fields = {name: fields.get(name) for name in wanted}
        self._send(
            200,
            {
                "id": record["issueId"],
                "key": record["issueKey"],
                "self": f"{base}/rest/api/3/issue/{record['issueId']}",
                "fields": fields,
            },
        )

    def list_request_attachments(self, key):
        number = self._number(key)
        if number is None:
            self._send(404, sd_error("Request does not exist or you do not have permission to see it."))
            return
        with self.desk.store.transaction():
            files = self.desk.store.attachments(number)
        values = [self._attachment_view(a["id"], a["filename"], a["size"], a["content_type"]) for a in files]
        self._send(200, {"size": len(values), "start": 0, "limit": 50, "isLastPage": True, "values": values})

    def list_request_comments(self, key):
        number = self._number(key)
        if number is None:
            self._send(404, sd_error("Request does not exist or you do not have permission to see it."))
            return
        with self.desk.store.transaction():
            comments = self.desk.store.comments(number)[1:]  # the first is the description
        values = [
            {"id": str(c["id"]), "body": c["body"], "public": c["public"], "author": {"emailAddress": c["author"]}}
            for c in comments
        ]
        self._send(200, {"size": len(values), "start": 0, "limit": 50, "isLastPage": True, "values": values})

    def _send_empty(self, status: int):
        """An answer without a body (204): no Content-Type, Content-Length 0, so the connection stays usable."""
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

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
        fields = [
            {"fieldId": f, "name": FIELD_NAMES[f], "required": f == "summary", "validValues": []}
            for f in REQUEST_TYPES[request_type_id][1]
        ]
        self._send(200, {"requestTypeFields": fields, "canRaiseOnBehalfOf": True, "canAddRequestParticipants": True})

    def search_jql(self):
        jql = (self.query.get("jql") or [""])[0]
        match = CLAUSE.search(jql)
        if match is None:
            self._send(
                400,
                {
                    "errorMessages": [
                        "Unbounded JQL queries are not allowed here. Please add a search restriction to your query."
                    ],
                    "errors": {},
                },
            )
            return
        field = "labels" if match.group(1).lower() == "labels" else f"customfield_{match.group(2) or match.group(3)}"
        if field not in FIELD_NAMES:
            self._send(
                400,
                {
                    "errorMessages": [
                        f"Field '{match.group(1)}' does not exist or you do not have permission to view it."
                    ],
                    "errors": {},
                },
            )
            return
        wanted = re.sub(r"\\(.)", r"\1", match.group(5)).strip('"')
        requested = [f for f in ",".join(self.query.get("fields") or []).split(",") if f and f != "key"]
        with self.desk.store.transaction():
            found = self.desk.store.search(self._base_url(), wanted, self.desk.search_lag_seconds)
        issues = []
        for ticket in found:
            values = ticket["fields"].get("requestFieldValues") or {}
            held = values.get(field)
            if held == wanted or (isinstance(held, list) and wanted in held):
                issues.append(
                    {
                        "id": ticket["fields"]["issueId"],
                        "key": ticket["fields"]["issueKey"],
                        "fields": {f: values.get(f) for f in requested},
                    }
                )
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
    problems = [
        f"Field '{f}' cannot be set. It is not on the appropriate screen, or unknown."
        for f in values
        if f not in request_type[1]
    ]
    summary = values.get("summary")
    if not isinstance(summary, str) or not summary.strip():
        problems.append("Summary is required.")
    elif len(summary) > 255 or "\n" in summary:
        problems.append("Summary must be one line of at most 255 characters.")
    labels = values.get("labels", [])
    if not isinstance(labels, list) or any(not isinstance(x, str) or not x or re.search(r"\s", x) for x in labels):
        problems.append("Labels must be a list of words without spaces.")
    priority = values.get("priority")
    if priority is not None and (
        not isinstance(priority, dict)
        or priority.get("name") not in PRIORITIES
        and str(priority.get("id")) not in {"1", "2", "3", "4", "5"}
    ):
        problems.append("Priority: specify a valid priority.")
    queue = values.get("customfield_10060")
    if queue is not None and (not isinstance(queue, dict) or queue.get("value") not in QUEUE_OPTIONS):
        problems.append(f"Queue: specify a valid option ({', '.join(QUEUE_OPTIONS)}).")
    agent = values.get("customfield_10070")
    if agent is not None and (not isinstance(agent, dict) or not agent.get("accountId")):
        problems.append("Assigned agent: specify an accountId.")
    return problems

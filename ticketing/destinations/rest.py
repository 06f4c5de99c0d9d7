"""Generic REST destination: any JSON API, described by its admin in the settings (docs/design.md §6).

Create: `create_method` (POST) to `create_url` with the body `body_template` renders; the ticket id
is read from the answer at `id_path`. A URL template may be absolute or relative to the base URL;
its {placeholders} are URL-quoted. The body is Django's template language, rendered by a restricted
engine (`rest_templates`) with every value escaped as JSON string content: write `"{{ subject }}"`
inside quotes. It must render valid JSON, else nothing is sent (PermanentError configuration);
`TicketRequest.fields` are merged last into a JSON object body. A render is bounded in time and output
(MAILROOM_REST_TEMPLATE_SECONDS, MAILROOM_REST_TEMPLATE_MAX_CHARS; past either: PermanentError configuration,
nothing sent), and a template that could outgrow them is refused when saved (`rest_templates`).

Every URL is called through the egress guard (`intake.egress`, via `HttpDestination`); the absolute ones
among the settings are checked when the destination is saved (`fetched_url_settings`). An id read from an
answer (`id_path`, `lookup_id_path`, `comment_id_path`) is stored and shown, so it must be at most 200
printable characters without spaces, quotes or markup (`usable_ticket_id`); anything else is refused.

How a lost answer is settled is whatever the admin declares, and nothing else:
    idempotency_header   the API keeps this header's key and answers a replay with the original
                         (a retry within idempotency_window_seconds is safe; comments send it too);
    upsert               the create is an insert-or-update on our reference (a retry updates);
    lookup_url_template + lookup_id_path
                         a GET that finds the record by our reference (nothing at the path, an empty
                         list or a 404: none); consistent, unless lookup_settle_seconds says it lags.
With nothing declared an unknown outcome is held for a person, never retried.

`Destination.settings`:
    create_url (required; {external_ref} {idempotency_key} {queue} {priority} {request_type} {assignee}),
    create_method (POST | PUT | PATCH), body_template (required), id_path (required),
    headers {name: value; "{secret}" is replaced by the resolved credentials_ref},
    ticket_url_template ({ticket_id}), idempotency_header, idempotency_window_seconds (3600), upsert (false),
    lookup_url_template ({external_ref}), lookup_id_path, lookup_settle_seconds (none: consistent),
    comment_url_template ({ticket_id} {external_ref} {idempotency_key}), comment_body_template,
    comment_method (POST), comment_id_path, check_url (a read-only GET for check_connection),
    queues / priorities / request_types / assignees {Mailroom word: value} (without a mapping the word
    itself goes; with one, a word it lacks renders empty), max_description_chars,
    connect_timeout, read_timeout and the common retry settings.
Body template context: subject, description, requester, requester_email, requester_name, tags (a list),
tags_json (a JSON array), queue, priority, request_type, assignee, external_ref, idempotency_key.
Comment template context: body, author, ticket_id, external_ref, idempotency_key.
`Destination.credentials_ref`: any secret, used only where a header says {secret}
(e.g. {"Authorization": "Bearer {secret}"}).

Nothing logged here contains a ticket body, a header value or a full email address.
"""
import email.utils
import json
import logging
import re
import uuid

from intake.vocabulary import ReasonCode

from .base import AmbiguousOutcome, CommentRequest, PermanentError, TicketRequest, TicketResult, TransientError
from .http import HttpDestination
from .rest_templates import (
    DOTTED_PATH,
    RawJson,
    TemplateProblem,
    at_path,
    fill_url,
    header_check,
    json_template_check,
    render_json,
    route_value_check,
    url_template_check,
)
from .settings import HTTP_SETTINGS, Anything, Flag, Number, Text

log = logging.getLogger(__name__)

ROUTE = ("queue", "priority", "request_type", "assignee")
ROUTE_MAPPINGS = {"queue": "queues", "priority": "priorities", "request_type": "request_types",
                  "assignee": "assignees"}
CREATE_PLACEHOLDERS = ("external_ref", "idempotency_key") + ROUTE
COMMENT_PLACEHOLDERS = ("ticket_id", "external_ref", "idempotency_key")
SAMPLE_BODY = {"subject": 'A "sample" subject', "description": "Line 1\nLine 2", "requester": "J <j@example.com>",
               "requester_email": "j@example.com", "requester_name": "J", "tags": ["email"],
               "tags_json": RawJson('["email"]'), "queue": "billing", "priority": "high", "request_type": "refund",
               "assignee": "alice", "external_ref": "mr-sample", "idempotency_key": "key-sample"}
SAMPLE_COMMENT = {"body": "A reply", "author": "j@example.com", "ticket_id": "1", "external_ref": "mr-sample",
                  "idempotency_key": "key-sample"}
METHODS = ("POST", "PUT", "PATCH")


class RestDestination(HttpDestination):
    name = "rest"
    needs_base_url = False      # every URL template may be absolute
    needs_credentials = False   # an internal API may need none
    fetched_url_settings = ("create_url", "lookup_url_template", "comment_url_template", "check_url")

    SETTINGS = {
        **HTTP_SETTINGS,
        "create_url": Anything(required=True, check=url_template_check(CREATE_PLACEHOLDERS)),
        "create_method": Text(choices=METHODS),
        "body_template": Anything(required=True, check=json_template_check(SAMPLE_BODY)),
        "id_path": Text(required=True, pattern=DOTTED_PATH, help='where the answer names the id, e.g. "data.id"'),
        "headers": Anything(check=header_check, help='e.g. {"Authorization": "Bearer {secret}"}'),
        "ticket_url_template": Anything(check=url_template_check(("ticket_id",))),
        "idempotency_header": Text(pattern=r"[A-Za-z0-9-]+", help="the API keeps this header's key"),
        "idempotency_window_seconds": Number(minimum=1, maximum=30 * 86400, integer=True),
        "upsert": Flag(help="the create inserts or updates on our reference"),
        "lookup_url_template": Anything(check=url_template_check(("external_ref",))),
        "lookup_id_path": Text(pattern=DOTTED_PATH),
        "lookup_settle_seconds": Number(minimum=0, maximum=86400, help="the lookup lags behind writes this long"),
        "comment_url_template": Anything(check=url_template_check(COMMENT_PLACEHOLDERS)),
        "comment_body_template": Anything(check=json_template_check(SAMPLE_COMMENT)),
        "comment_method": Text(choices=METHODS),
        "comment_id_path": Text(pattern=DOTTED_PATH),
        "check_url": Anything(check=url_template_check(())),
        "queues": Anything(check=route_value_check),
        "priorities": Anything(check=route_value_check),
        "request_types": Anything(check=route_value_check),
        "assignees": Anything(check=route_value_check),
        "max_description_chars": Number(minimum=100, integer=True),
    }

    def __init__(self, destination):
        super().__init__(destination)
        settings = self.settings
        self.idempotency_header = settings.get("idempotency_header") or ""
        self.honours_idempotency_key = bool(self.idempotency_header)
        self.idempotency_window_seconds = (
            int(settings.get("idempotency_window_seconds") or 3600) if self.honours_idempotency_key else None)
        self.upsert = bool(settings.get("upsert", False))
        lookup = bool(settings.get("lookup_url_template") and settings.get("lookup_id_path"))
        settle = settings.get("lookup_settle_seconds")
        self.consistent_lookup = lookup and settle is None
        self.lookup_settle_seconds = float(settle) if lookup and settle is not None else None
        self.max_description_chars = settings.get("max_description_chars")

    # --- The interface ------------------------------------------------------

    def create_ticket(self, request: TicketRequest, idempotency_key: str, external_ref: str) -> TicketResult:
        route = self._route(request)
        body = self._render("body_template", body_context(request, route, idempotency_key, external_ref))
        if request.fields:
            if not isinstance(body, dict):
                raise PermanentError(ReasonCode.CONFIGURATION, "extra fields need a body_template that is an object")
            body = {**body, **dict(sorted(request.fields.items(), key=lambda item: str(item[0])))}
        url = self._fill("create_url", {"external_ref": external_ref, "idempotency_key": idempotency_key,
                                        **{name: route[name] or "" for name in ROUTE}})
        # A declared upsert makes the create (only) safe to send twice.
        response = self._write(self.settings.get("create_method") or "POST", url, body, idempotency_key,
                               retry_safe=self.retry_safe or self.upsert)
        ticket_id = self._id_in(response, "id_path")
        if ticket_id is None:
            # It answered 2xx, so the record probably exists; only a declared lookup can tell which.
            raise AmbiguousOutcome(ReasonCode.UNREADABLE_RESPONSE,
                                   f"HTTP {response.status_code} without an id at {self.settings['id_path']}")
        log.info("rest: created %s for %s (HTTP %s)", ticket_id, external_ref, response.status_code)
        return TicketResult(ticket_id=ticket_id, url=self.ticket_url(ticket_id))

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        if not (self.consistent_lookup or self.lookup_settle_seconds is not None):
            raise NotImplementedError("this REST destination declares no lookup")
        url = self._fill("lookup_url_template", {"external_ref": external_ref})
        response = self.send("GET", url, write=False, ok_statuses=[*range(200, 300), 404])
        if response.status_code == 404:
            return None
        found = at_path(self._document(response, write=False), self.settings["lookup_id_path"])
        if found is None or found == "" or found == []:
            return None
        if isinstance(found, bool) or not isinstance(found, (str, int)):
            raise PermanentError(ReasonCode.CONFIGURATION, "lookup_id_path does not lead to an id")
        ticket_id = usable_ticket_id(found)
        if ticket_id is None:
            raise PermanentError(ReasonCode.CONFIGURATION, f"the value at lookup_id_path is not a usable ticket id "
                                                           f"({TICKET_ID_RULE})")
        return TicketResult(ticket_id=ticket_id, url=self.ticket_url(ticket_id))

    def add_comment(self, ticket_id: str, comment: CommentRequest, idempotency_key: str, external_ref: str) -> str:
        body, author = comment.body, comment.author_email
        if not (self.settings.get("comment_url_template") and self.settings.get("comment_body_template")):
            raise PermanentError(ReasonCode.CONFIGURATION, "declare comment_url_template and comment_body_template")
        context = {"body": body, "author": author, "ticket_id": str(ticket_id), "external_ref": external_ref,
                   "idempotency_key": idempotency_key}
        payload = self._render("comment_body_template", context)
        url = self._fill("comment_url_template", {k: context[k] for k in COMMENT_PLACEHOLDERS})
        # `upsert` covers the create only: a comment sent twice is two comments (unless a key is declared).
        response = self._write(self.settings.get("comment_method") or "POST", url, payload, idempotency_key)
        comment_id = self._id_in(response, "comment_id_path") if self.settings.get("comment_id_path") else None
        log.info("rest: commented on %s for %s (HTTP %s)", ticket_id, external_ref, response.status_code)
        return comment_id or str(ticket_id)

    def ticket_url(self, ticket_id) -> str:
        template = self.settings.get("ticket_url_template")
        if not template:
            return ""
        try:
            return self.url(fill_url(template, {"ticket_id": ticket_id}))
        except TemplateProblem:
            return ""

    def check_connection(self) -> str:
        if self.settings.get("check_url"):
            url = self._fill("check_url", {})
            response = self.send("GET", url, write=False)
            return f"GET {url.split('?')[0]} answered HTTP {response.status_code}"
        if self.consistent_lookup or self.lookup_settle_seconds is not None:
            made_up = f"mailroom-check-{uuid.uuid4().hex}"
            if self.find_by_external_ref(made_up) is not None:
                raise PermanentError(ReasonCode.CONFIGURATION, "the lookup found a record for a made-up reference: "
                                     "check lookup_url_template and lookup_id_path")
            return "the lookup answered 'not found' for a made-up reference"
        raise PermanentError(ReasonCode.CONFIGURATION, "declare check_url (a read-only GET) to check the connection")

    # --- Rendering ----------------------------------------------------------

    def _route(self, request: TicketRequest) -> dict:
        """Each route value through its mapping: the mapped value, "" when a mapping lacks it, the word without one."""
        route = {}
        for name in ROUTE:
            word = getattr(request, name)
            mapping = self.settings.get(ROUTE_MAPPINGS[name])
            route[name] = word if not isinstance(mapping, dict) or not word else mapping.get(word, "")
        return route

    def _render(self, setting: str, context: dict):
        source = self.settings.get(setting)
        if not source:
            raise PermanentError(ReasonCode.CONFIGURATION, f"{setting} is not set")
        try:
            return render_json(source, context)
        except TemplateProblem as exc:
            raise PermanentError(ReasonCode.CONFIGURATION, f"{setting}: {exc}") from None

    def _fill(self, setting: str, values: dict) -> str:
        try:
            return fill_url(str(self.settings.get(setting) or ""), values)
        except TemplateProblem as exc:
            raise PermanentError(ReasonCode.CONFIGURATION, f"{setting}: {exc}") from None

    # --- HTTP -------------------------------------------------------------------

    def _write(self, method: str, url: str, body, idempotency_key: str, retry_safe: bool | None = None):
        key = idempotency_key if self.idempotency_header else None
        return self.send(method, url, write=True, json_body=body, idempotency_key=key,
                         idempotency_header=self.idempotency_header or "Idempotency-Key", retry_safe=retry_safe)

    def _document(self, response, write: bool):
        try:
            return response.json()
        except ValueError:
            error = AmbiguousOutcome if write else TransientError
            raise error(ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code}, body is not JSON") from None

    def _id_in(self, response, setting: str) -> str | None:
        found = at_path(self._document(response, write=True), self.settings[setting])
        if isinstance(found, bool) or not isinstance(found, (str, int)) or found == "":
            return None
        ticket_id = usable_ticket_id(found)
        if ticket_id is None:
            # It answered 2xx, so the record probably exists; what it calls its id cannot be stored or shown.
            raise AmbiguousOutcome(ReasonCode.UNREADABLE_RESPONSE,
                                   f"HTTP {response.status_code}: the value at {self.settings[setting]} is not a "
                                   f"usable id ({TICKET_ID_RULE})")
        return ticket_id

    def auth_for(self, secret):
        headers = {}
        for name, template in (self.settings.get("headers") or {}).items():
            if "{secret}" in template:
                if secret is None:
                    raise PermanentError(ReasonCode.CREDENTIALS, f"header {name} needs {{secret}}: set credentials_ref")
                secret = secret.strip()
                if "\r" in secret or "\n" in secret:
                    raise PermanentError(ReasonCode.CREDENTIALS, "the secret spans several lines")
                template = template.replace("{secret}", secret)
            headers[name] = template
        return None, headers


# What an API's answer may give us as a ticket (or comment) id: it is stored, shown in the console and put
# into URLs, so it is short printable text without spaces, quotes or markup.
MAX_TICKET_ID_CHARS = 200
TICKET_ID = re.compile(rf"[!#$%()*+,\-./0-9:;=?@A-Z\[\]^_a-z{{|}}~]{{1,{MAX_TICKET_ID_CHARS}}}")
TICKET_ID_RULE = (f"at most {MAX_TICKET_ID_CHARS} printable ASCII characters, without spaces, quotes, "
                  "backslashes or < > &")


def usable_ticket_id(value) -> str | None:
    """`value` as a ticket id, or None when it breaks TICKET_ID_RULE."""
    text = str(value)
    return text if TICKET_ID.fullmatch(text) else None


def body_context(request: TicketRequest, route: dict, idempotency_key: str, external_ref: str) -> dict:
    """What body_template sees (the module doc lists it); the template engine escapes each value."""
    name, address = email.utils.parseaddr(request.requester)
    address = address or request.requester
    return {
        "subject": request.subject, "description": request.description, "requester": request.requester,
        "requester_email": address, "requester_name": name or address.split("@")[0],
        "tags": list(request.tags), "tags_json": RawJson(json.dumps(list(request.tags), ensure_ascii=False)),
        **route, "external_ref": external_ref, "idempotency_key": idempotency_key,
    }

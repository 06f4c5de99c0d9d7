"""Zendesk destination: tickets through the Zendesk Support API (docs/design.md §6 "The intent state machine").

Zendesk keeps our `Idempotency-Key` for two hours and answers a replay with the
original ticket (`x-idempotency-lookup: hit`); the same key with another body is
a 400 `IdempotentRequestError`. `external_id` is not unique, but listing by it
finds whatever a lost create left behind. This module only maps each HTTP
outcome to exactly one of TransientError / PermanentError / AmbiguousOutcome;
what to do about an ambiguous one is decided in `ticketing.intents.resolve_unknown`.

`Destination.settings` (all optional):
    connect_timeout (3.05 s), read_timeout (10 s),
    idempotency_supported (true), idempotency_window_seconds (7200),
    lookup_supported (true), email (the agent for a bare API token),
    comment_public (true).
  The route (queue, priority, request type, assignee: `TicketRequest`) is mapped by:
    groups {queue slug: group_id}, ticket_types {request type slug: problem|incident|question|task},
    request_type_field (a custom field id that receives the request type slug, used when
    ticket_types has no entry), assignees {name: assignee_id}. The priority goes as is
    (low/normal/high/urgent are Zendesk's words). A value with no mapping is left out, not an error.
`Destination.credentials_ref` resolves to `email/token:APITOKEN` or to the bare token.

Listing (reconciliation): `records_with_ref` reads the cursor-based incremental export
(`GET /api/v2/incremental/tickets/cursor.json?start_time=<since>`, tickets updated since, one page
per call, `after_cursor` as the resume point) and keeps tickets whose `external_id` has our
prefix; `existing_tickets` asks `GET /api/v2/tickets/show_many.json?ids=…` (100 per call; a
deleted ticket is missing).

Nothing logged here contains a ticket body or a full email address.
"""
import email.utils
import logging

from intake.vocabulary import ReasonCode

from .base import (
    AmbiguousOutcome,
    CommentRequest,
    DestinationRecord,
    PermanentError,
    RecordPage,
    TicketRequest,
    TicketResult,
)
from .http import HttpDestination, json_object
from .settings import HTTP_SETTINGS, Flag, Mapping, Number, Text

log = logging.getLogger(__name__)

TICKETS_PATH = "/api/v2/tickets.json"
MAX_LOOKUP_PAGES = 10


class ZendeskDestination(HttpDestination):
    name = "zendesk"
    honours_idempotency_key = True
    idempotency_window_seconds = 7200
    # Listing by external_id is treated as consistent: it sees a ticket once its create returned.
    consistent_lookup = True
    # Zendesk refuses a comment body over 65,535 characters; 64,000 leaves room for its own markup.
    max_description_chars = 64_000

    SETTINGS = {
        **HTTP_SETTINGS,
        "idempotency_supported": Flag(help="Zendesk keeps our Idempotency-Key (true)"),
        "idempotency_window_seconds": Number(minimum=0, maximum=86400, integer=True),
        "lookup_supported": Flag(help="list tickets by external_id to settle a lost answer (true)"),
        "email": Text(pattern=r"[^@\s]+@[^@\s]+", help="the agent whose API token credentials_ref holds"),
        "comment_public": Flag(),
        "groups": Mapping(values=Number(integer=True, minimum=1), help="queue slug -> group id"),
        "ticket_types": Mapping(values=Text(choices=("problem", "incident", "question", "task"))),
        "request_type_field": Number(integer=True, minimum=1, help="custom field id for the request type"),
        "assignees": Mapping(values=Number(integer=True, minimum=1), help="assignee name -> user id"),
    }

    def __init__(self, destination):
        super().__init__(destination)
        settings = self.settings
        self.honours_idempotency_key = bool(settings.get("idempotency_supported", True))
        self.idempotency_window_seconds = (
            int(settings.get("idempotency_window_seconds", 7200)) if self.honours_idempotency_key else None
        )
        self.consistent_lookup = bool(settings.get("lookup_supported", True))
        self.agent_email = settings.get("email") or "mailroom"
        self.comment_public = bool(settings.get("comment_public", True))

    # --- The interface ------------------------------------------------------

    def create_ticket(self, request: TicketRequest, idempotency_key: str, external_ref: str) -> TicketResult:
        response = self._send("POST", TICKETS_PATH, write=True, idempotency_key=idempotency_key,
                              json_body={"ticket": ticket_payload(request, external_ref,
                                                                  self.destination.settings or {})})
        ticket = _json(response, write=True).get("ticket") or {}
        if "id" not in ticket:
            # It answered 2xx, so the ticket probably exists; only a lookup can tell which.
            raise AmbiguousOutcome(ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code} without a ticket id")
        log.info("zendesk: created ticket %s for %s (idempotency lookup: %s)", ticket["id"], external_ref,
                 response.headers.get("x-idempotency-lookup", "none"))
        return self._result(ticket)

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        if not self.consistent_lookup:
            raise NotImplementedError("this Zendesk destination declares lookup_supported = false")
        # external_id is not unique: the lowest id is the first ticket a create made, the one to keep.
        matches = self._with_external_id(external_ref)
        if not matches:
            return None
        ticket = min(matches, key=lambda t: int(t["id"]))
        if len(matches) > 1:
            log.warning("zendesk: %d tickets carry external_id %s; keeping the lowest id %s",
                        len(matches), external_ref, ticket["id"])
        return self._result(ticket)

    def _with_external_id(self, external_ref: str) -> list[dict]:
        matches, path, params = [], TICKETS_PATH, {"external_id": external_ref}
        for _ in range(MAX_LOOKUP_PAGES):
            body = _json(self._send("GET", path, write=False, params=params), write=False)
            matches += [t for t in body.get("tickets") or [] if str(t.get("external_id")) == external_ref]
            # Follow pages only on the same desk: the credentials go with every request.
            if not str(body.get("next_page") or "").startswith(self.base_url + "/"):
                break
            path, params = body["next_page"], None
        return matches

    def add_comment(self, ticket_id: str, comment: CommentRequest, idempotency_key: str, external_ref: str) -> str:
        body, author = comment.body, comment.author_email
        if not str(ticket_id).isdigit():
            raise PermanentError(ReasonCode.NOT_FOUND, "a Zendesk ticket id is a number")
        comment = {"body": body, "public": self.comment_public}
        if str(author).isdigit():
            comment["author_id"] = int(author)  # a Zendesk user id; otherwise the API user is the author
        payload = {"ticket": {"comment": comment, "metadata": {"external_ref": external_ref}}}
        response = self._send("PUT", f"/api/v2/tickets/{ticket_id}.json", write=True,
                              idempotency_key=idempotency_key, json_body=payload)
        audit = _json(response, write=True).get("audit") or {}
        comment_ids = [e.get("id") for e in audit.get("events") or [] if e.get("type") == "Comment" and e.get("id")]
        log.info("zendesk: commented on ticket %s for %s (idempotency lookup: %s)", ticket_id, external_ref,
                 response.headers.get("x-idempotency-lookup", "none"))
        # The comment id when Zendesk reports it, else the ticket: the comment is on it either way.
        return str(comment_ids[0]) if comment_ids else str(ticket_id)

    def ticket_url(self, ticket_id) -> str:
        """The ticket in Zendesk's agent interface ("" without a base URL)."""
        return f"{self.base_url}/agent/tickets/{ticket_id}" if self.base_url else ""

    # --- Listing (reconciliation) -------------------------------------------

    supports_listing = True

    def records_with_ref(self, prefix: str, since, limit: int, resume: dict | None = None) -> RecordPage:
        path = "/api/v2/incremental/tickets/cursor.json"
        per_page = max(1, min(1000, int(limit)))
        if resume and resume.get("cursor"):
            params = {"cursor": str(resume["cursor"]), "per_page": per_page}
        else:
            params = {"start_time": int(since.timestamp()), "per_page": per_page}
        body = _json(self._send("GET", path, write=False, params=params), write=False)
        records = [DestinationRecord(str(t["id"]), str(t["external_id"]), self.ticket_url(t["id"]))
                   for t in body.get("tickets") or []
                   if isinstance(t, dict) and "id" in t and str(t.get("external_id") or "").startswith(prefix)
                   and t.get("status") != "deleted"]
        cursor = body.get("after_cursor")
        done = bool(body.get("end_of_stream", True)) or not cursor
        return RecordPage(records, None if done else {"cursor": str(cursor)})

    def existing_tickets(self, ticket_ids: list[str]) -> set[str]:
        ids = [str(t) for t in ticket_ids if str(t).isdigit()]
        found = set()
        for start in range(0, len(ids), 100):
            params = {"ids": ",".join(ids[start:start + 100])}
            body = _json(self._send("GET", "/api/v2/tickets/show_many.json", write=False, params=params), write=False)
            found |= {str(t["id"]) for t in body.get("tickets") or []
                      if isinstance(t, dict) and "id" in t and t.get("status") != "deleted"}
        return found

    def records_for_ref(self, external_ref: str) -> list[DestinationRecord]:
        tickets = sorted(self._with_external_id(external_ref), key=lambda t: int(t["id"]))
        return [DestinationRecord(str(t["id"]), external_ref, self.ticket_url(t["id"])) for t in tickets
                if t.get("status") != "deleted"]

    # --- HTTP and error mapping ---------------------------------------------

    def _result(self, ticket: dict) -> TicketResult:
        return TicketResult(ticket_id=str(ticket["id"]), url=self.ticket_url(ticket["id"]))

    def auth_for(self, secret):
        if secret is None:
            return None, {}
        user, sep, token = secret.partition(":")
        if sep and user.endswith("/token"):
            return (user, token), {}
        return (f"{self.agent_email}/token", secret), {}

    def _send(self, method: str, path: str, *, write: bool, idempotency_key: str | None = None,
              json_body=None, params=None):
        return self.send(method, path, write=write, idempotency_key=idempotency_key, json_body=json_body,
                         params=params)

    def special_error(self, response, body: dict, write: bool):
        if response.status_code == 400 and body.get("error") == "IdempotentRequestError":
            # Our key was used with another body: whether our ticket exists is for a lookup to say.
            return AmbiguousOutcome(ReasonCode.IDEMPOTENT_REQUEST_ERROR, f"HTTP {response.status_code}")
        return None

    def check_connection(self) -> str:
        body = _json(self._send("GET", "/api/v2/users/me.json", write=False), write=False)
        user = body.get("user") or {}
        if not user.get("id"):
            raise PermanentError(ReasonCode.CREDENTIALS, "the token is not an agent's (anonymous user)")
        return f"signed in as Zendesk user {user['id']} ({user.get('role') or 'unknown role'})"


ZENDESK_PRIORITIES = ("low", "normal", "high", "urgent")
ZENDESK_TYPES = ("problem", "incident", "question", "task")


def _id(value):
    """A Zendesk id from settings (a number or its digits), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, str) and value.isdigit() else None


def route_fields(request: TicketRequest, settings: dict) -> dict:
    """The ticket fields for the request's route, through the destination's mappings (see the module doc)."""
    fields = {}
    if request.queue:
        group_id = _id((settings.get("groups") or {}).get(request.queue))
        if group_id is None and request.queue.isdigit():
            group_id = int(request.queue)  # an operator may name a Zendesk group by its id
        if group_id is not None:
            fields["group_id"] = group_id
    if request.priority in ZENDESK_PRIORITIES:
        fields["priority"] = request.priority
    if request.request_type:
        ticket_type = (settings.get("ticket_types") or {}).get(request.request_type)
        field_id = _id(settings.get("request_type_field"))
        if ticket_type in ZENDESK_TYPES:
            fields["type"] = ticket_type
        elif field_id is not None:
            fields[str(field_id)] = request.request_type
    if request.assignee:
        assignee_id = _id((settings.get("assignees") or {}).get(request.assignee))
        if assignee_id is not None:
            fields["assignee_id"] = assignee_id
    return fields


def ticket_payload(request: TicketRequest, external_ref: str, settings: dict | None = None) -> dict:
    """The Zendesk ticket for a request. Deterministic: a retry must send the very same body under its key.

    `settings` (the destination's) map the route; `request.fields` (standard names or custom field ids)
    are added last and win.
    """
    ticket = {
        "subject": request.subject,
        "comment": {"body": request.description},
        "external_id": external_ref,
        "tags": list(request.tags),
    }
    name, address = email.utils.parseaddr(request.requester)
    address = address or request.requester
    if address:
        # Zendesk finds or creates the end user by email; a new one needs a name.
        ticket["requester"] = {"email": address, "name": name or address.split("@")[0]}
    custom_fields = []
    merged = {**route_fields(request, settings or {}), **(request.fields or {})}
    for key, value in sorted(merged.items(), key=lambda item: str(item[0])):
        if str(key).isdigit():
            custom_fields.append({"id": int(key), "value": value})  # a custom ticket field, by id
        else:
            ticket[key] = value  # a standard field: priority, type, group_id, ...
    if custom_fields:
        ticket["custom_fields"] = custom_fields
    return ticket


_json = json_object

"""Freshdesk destination: tickets through the Freshdesk API v2 (docs/design.md §6).

Calls: `POST /api/v2/tickets` (create), `POST /api/v2/tickets/{id}/notes` (a reply, as a public
incoming note), `GET /api/v2/search/tickets?query="..."` (lookup by our reference), and, for
`check_connection` only, `GET /api/v2/ticket_fields`.

Ambiguity: Freshdesk keeps no idempotency key and the create is no upsert, so a 5xx, a timeout or a
dropped connection after the create was sent is an `AmbiguousOutcome`. Our reference goes into a
custom text field (`external_ref_field`), which the filter API can search, but its index lags behind
writes (minutes, per Freshdesk): `lookup_settle_seconds` (= `search_settle_seconds`) tells
`ticketing.intents.resolve_unknown` to search only after that delay; found settles the intent,
nothing found goes to review (held), never to a second create.

`Destination.settings` (all optional):
    external_ref_field ("cf_mailroom_ref"): the custom text field (its API name, cf_...) for our reference;
        it must exist (`check_connection` says so when it does not). The filter query names it without
        the cf_ prefix, as Freshdesk's search does for custom fields.
    groups {queue slug: group_id}, agents {assignee name: agent id (responder_id)},
    ticket_types {request type slug: a value of the Type field, e.g. "Refund"}.
    search_settle_seconds (60): how long after a lost answer the search is trusted.
    plus connect_timeout, read_timeout and the common retry settings.
  The priority is Freshdesk's own scale (low 1, normal 2 "medium", high 3, urgent 4); status is 2 (open),
  source 1 (email). A route value with no mapping is left out, not an error; `TicketRequest.fields`
  (standard fields, or cf_... names which go into custom_fields) are merged last.
`Destination.credentials_ref` resolves to the agent's API key (sent as basic auth `key:X`), or `key:X`.

Nothing logged here contains a ticket body or a full email address.
"""
import email.utils
import html
import json
import logging
import re

from intake.logging import mask_address
from intake.vocabulary import ReasonCode

from .base import AmbiguousOutcome, CommentRequest, PermanentError, TicketRequest, TicketResult, TransientError
from .http import HttpDestination, json_object
from .settings import HTTP_SETTINGS, Mapping, Number, Text

log = logging.getLogger(__name__)

TICKETS_PATH = "/api/v2/tickets"
SEARCH_PATH = "/api/v2/search/tickets"
DEFAULT_REF_FIELD = "cf_mailroom_ref"
DEFAULT_SETTLE_SECONDS = 60
PRIORITIES = {"low": 1, "normal": 2, "high": 3, "urgent": 4}
STATUS_OPEN, SOURCE_EMAIL = 2, 1
MAX_SUBJECT_CHARS = 255
MAX_SEARCH_PAGES = 10  # Freshdesk serves at most 10 pages of 30 results


class FreshdeskDestination(HttpDestination):
    name = "freshdesk"
    honours_idempotency_key = False
    consistent_lookup = False
    upsert = False
    lookup_settle_seconds = float(DEFAULT_SETTLE_SECONDS)

    SETTINGS = {
        **HTTP_SETTINGS,
        "external_ref_field": Text(pattern=r"cf_[a-z0-9_]+", help="custom text field for our reference"),
        "groups": Mapping(values=Number(integer=True, minimum=1), help="queue slug -> group_id"),
        "agents": Mapping(values=Number(integer=True, minimum=1), help="assignee name -> agent id"),
        "ticket_types": Mapping(values=Text(), help="request type slug -> Type value"),
        "search_settle_seconds": Number(minimum=0, maximum=86400, help="trust the search after (60 s)"),
    }

    def __init__(self, destination):
        super().__init__(destination)
        self.lookup_settle_seconds = settle_seconds(self.settings.get("search_settle_seconds"))
        self.external_ref_field = self.settings.get("external_ref_field") or DEFAULT_REF_FIELD

    # --- The interface ------------------------------------------------------

    def create_ticket(self, request: TicketRequest, idempotency_key: str, external_ref: str) -> TicketResult:
        response = self.send("POST", TICKETS_PATH, write=True,
                             json_body=ticket_payload(request, external_ref, self.settings))
        ticket = json_object(response, write=True)
        if not isinstance(ticket.get("id"), int):
            # It answered 2xx, so the ticket probably exists; only the (lagging) search can tell which.
            raise AmbiguousOutcome(ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code} without a ticket id")
        log.info("freshdesk: created ticket %s for %s", ticket["id"], external_ref)
        return TicketResult(ticket_id=str(ticket["id"]), url=self.ticket_url(ticket["id"]))

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        tickets = self._with_ref(external_ref)
        if not tickets:
            return None
        first = min(tickets, key=lambda t: t["id"])  # the lowest id is the first create: the one to keep
        if len(tickets) > 1:
            log.warning("freshdesk: %d tickets carry %s; keeping the first, %s", len(tickets), external_ref,
                        first["id"])
        return TicketResult(ticket_id=str(first["id"]), url=self.ticket_url(first["id"]))

    def add_comment(self, ticket_id: str, comment: CommentRequest, idempotency_key: str, external_ref: str) -> str:
        body = comment.body
        if not str(ticket_id).isdigit():
            raise PermanentError(ReasonCode.NOT_FOUND, "a Freshdesk ticket id is a number")
        # A customer's reply: a public note marked incoming, so the agents see it as the customer's.
        note = {"body": text_to_html(body), "private": False, "incoming": True}
        response = self.send("POST", f"{TICKETS_PATH}/{ticket_id}/notes", write=True, json_body=note)
        answer = json_object(response, write=True)
        log.info("freshdesk: added a note to ticket %s for %s", ticket_id, external_ref)
        return str(answer.get("id") or ticket_id)

    def ticket_url(self, ticket_id) -> str:
        """The ticket in Freshdesk's agent view ("" without a base URL)."""
        return f"{self.base_url}/a/tickets/{ticket_id}" if self.base_url else ""

    def check_connection(self) -> str:
        response = self.send("GET", "/api/v2/ticket_fields", write=False)
        try:
            fields = response.json()
        except ValueError:
            fields = None
        if not isinstance(fields, list):
            raise TransientError(ReasonCode.UNREADABLE_RESPONSE, "ticket_fields is not a JSON list")
        names = {f.get("name") for f in fields if isinstance(f, dict)}
        if self.external_ref_field not in names:
            raise PermanentError(ReasonCode.CONFIGURATION,
                                 f"no ticket field {self.external_ref_field}: add a single-line text field "
                                 "for Mailroom's reference (Admin > Ticket Fields), or set external_ref_field")
        return f"signed in to Freshdesk; {len(names)} ticket fields, {self.external_ref_field} among them"

    # --- Helpers --------------------------------------------------------------

    def _with_ref(self, external_ref: str) -> list[dict]:
        # Freshdesk's filter names custom fields without their cf_ prefix; the value goes in single quotes.
        field = self.external_ref_field.removeprefix("cf_")
        quoted = external_ref.replace("\\", "\\\\").replace("'", "\\'")
        found = []
        for page in range(1, MAX_SEARCH_PAGES + 1):
            body = json_object(self.send("GET", SEARCH_PATH, write=False,
                                         params={"query": f"\"{field}:'{quoted}'\"", "page": page}), write=False)
            results = [t for t in body.get("results") or [] if isinstance(t, dict) and isinstance(t.get("id"), int)]
            # Keep exact matches only: the search is the index's idea of a match, not ours.
            found += [t for t in results
                      if (t.get("custom_fields") or {}).get(self.external_ref_field, external_ref) == external_ref]
            if len(results) < 30 or page * 30 >= int(body.get("total") or 0):
                break
        return found

    def auth_for(self, secret):
        if secret is None:
            return None, {}
        key, sep, password = secret.partition(":")
        return (key, password if sep else "X"), {}

    def special_error(self, response, body, write: bool):
        status = response.status_code
        if status == 400 and not write:
            # Our search was refused: the reference field is unknown or not searchable.
            return PermanentError(ReasonCode.CONFIGURATION, f"search refused: {freshdesk_errors(body)}")
        if status == 400:
            return PermanentError(ReasonCode.INVALID_FIELDS, freshdesk_errors(body))
        return None


def freshdesk_errors(body) -> str:
    """Freshdesk's "Validation failed" errors ([{field, message, code}]) for the operator; masked, capped."""
    errors = body.get("errors") if isinstance(body, dict) else None
    if isinstance(errors, list) and errors:
        text = json.dumps([{k: e.get(k) for k in ("field", "message", "code")} for e in errors if isinstance(e, dict)],
                          sort_keys=True)
    else:
        text = json.dumps(body or {"status": 400}, sort_keys=True)
    return mask_address(text)[:2000]


def text_to_html(text: str) -> str:
    """Freshdesk bodies are HTML: the text escaped, each line break a <br>."""
    return re.sub(r"\r\n|\r|\n", "<br>", html.escape(text or ""))


def ticket_payload(request: TicketRequest, external_ref: str, settings: dict) -> dict:
    """The Freshdesk ticket. Deterministic: a retry sends the very same body."""
    name, address = email.utils.parseaddr(request.requester)
    # Freshdesk refuses a tag with a comma in it.
    tags = list(dict.fromkeys(t for t in (" ".join(str(tag).replace(",", " ").split()) for tag in request.tags) if t))
    ticket = {
        "subject": " ".join(request.subject.split())[:MAX_SUBJECT_CHARS] or "(no subject)",
        "description": text_to_html(request.description),
        "email": address or request.requester,
        "status": STATUS_OPEN,
        "source": SOURCE_EMAIL,
        "tags": tags,
    }
    if name:
        ticket["name"] = name  # used when Freshdesk makes a new contact for the address
    custom_fields = {settings.get("external_ref_field") or DEFAULT_REF_FIELD: external_ref}
    if request.priority in PRIORITIES:
        ticket["priority"] = PRIORITIES[request.priority]
    group_id = (settings.get("groups") or {}).get(request.queue) if request.queue else None
    if group_id is not None:
        ticket["group_id"] = int(group_id)
    agent_id = (settings.get("agents") or {}).get(request.assignee) if request.assignee else None
    if agent_id is not None:
        ticket["responder_id"] = int(agent_id)
    ticket_type = (settings.get("ticket_types") or {}).get(request.request_type) if request.request_type else None
    if ticket_type is not None:
        ticket["type"] = str(ticket_type)
    for name, value in sorted((request.fields or {}).items()):
        if str(name).startswith("cf_"):
            custom_fields[name] = value
        else:
            ticket[name] = value
    ticket["custom_fields"] = dict(sorted(custom_fields.items()))
    return ticket


def settle_seconds(value) -> float:
    """The search's settle delay: the setting, or the default when it is not set (0 is a value)."""
    return float(DEFAULT_SETTLE_SECONDS if value is None else value)

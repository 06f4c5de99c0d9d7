"""HubSpot destination: tickets through the HubSpot CRM API v3 (docs/design.md §6 "The intent state machine").

The create is an upsert on a ticket property with unique values (`POST /crm/v3/objects/tickets/batch/upsert`,
`idProperty` = `id_property`, `id` = our external reference): a retry finds and updates the one ticket, so
sending it again is safe (`upsert = True`; a 5xx after it is transient, an unknown outcome is settled by a
retry in `ticketing.intents.resolve_unknown`). `GET /crm/v3/objects/tickets/<ref>?idProperty=...` reads it
back at once (`consistent_lookup`). A comment is a note associated with the ticket (`POST
/crm/v3/objects/notes`, association type 228 note -> ticket); HubSpot does not de-duplicate notes, so a 5xx
or a lost answer after one is ambiguous (held for a person, never re-sent blindly).

After the upsert, the sender is associated with the ticket as its contact: `POST /crm/v3/objects/contacts/
search` (email EQ) and `PUT /crm/v4/objects/tickets/<id>/associations/default/contacts/<contact id>`; with
`create_contacts`, a missing contact is first upserted by email (`POST /crm/v3/objects/contacts/batch/
upsert`, idProperty email). A failure there is logged and never fails, repeats or doubts the ticket: the
ticket exists and a retried create associates again (both calls are idempotent).

`Destination.base_url`: https://api.hubapi.com (the one API host; used when left blank).
`credentials_ref` resolves to a private app's access token (sent as `Authorization: Bearer`). Scopes:
`tickets`, `crm.objects.contacts.read` (the sender's contact) and `crm.objects.contacts.write` (HubSpot's
notes API is governed by the contacts scopes; it also covers create_contacts).
`Destination.settings` (all optional):
    connect_timeout (3.05 s), read_timeout (10 s),
    id_property ("mailroom_ref": a single-line text ticket property with unique values),
    pipeline ("0"), pipeline_stage ("1"), portal_id (the account id, for ticket_url), app_url
    (https://app.hubspot.com; https://app-eu1.hubspot.com for EU accounts), create_contacts (false),
    requester_property (a ticket property that receives the sender's address; none by default).
  The route is mapped by: queues {queue slug: pipeline id, or "pipeline id:stage id"} (overrides pipeline
  and stage), priorities {low|normal|high|urgent: LOW|MEDIUM|HIGH|URGENT} (default the same words),
  owners {assignee name: owner id} -> hubspot_owner_id, categories {request type: hs_ticket_category value}.
  A value without a mapping is left out. `TicketRequest.fields` (property names) come last.
Left out: tags, attachments, listing for reconciliation.

Nothing logged here contains a ticket body, the token or a full email address.
"""
import email.utils
import logging
from datetime import UTC, datetime
from urllib.parse import quote

from intake.logging import mask_address
from intake.vocabulary import ReasonCode

from .base import AmbiguousOutcome, CommentRequest, PermanentError, TicketRequest, TicketResult, TransientError
from .http import HttpDestination, field_errors, json_object
from .settings import HTTP_SETTINGS, Flag, Mapping, Text, Url

log = logging.getLogger(__name__)

API_URL = "https://api.hubapi.com"
UPSERT_PATH = "/crm/v3/objects/tickets/batch/upsert"
NOTE_TO_TICKET = 228  # HubSpot-defined association type: note -> ticket
PRIORITIES = {"low": "LOW", "normal": "MEDIUM", "high": "HIGH", "urgent": "URGENT"}
PROPERTY_NAME = r"[a-z][a-z0-9_]*"


class HubSpotDestination(HttpDestination):
    name = "hubspot"
    upsert = True
    consistent_lookup = True
    # Property values and note bodies take 65,536 characters; 64,000 leaves room for the cut notice.
    max_description_chars = 64_000

    SETTINGS = {
        **HTTP_SETTINGS,
        "id_property": Text(pattern=PROPERTY_NAME, max_length=100,
                            help="the ticket property with unique values that holds our reference (mailroom_ref)"),
        "pipeline": Text(pattern=r"[\w-]+", help='hs_pipeline ("0", the default pipeline)'),
        "pipeline_stage": Text(pattern=r"[\w-]+", help='hs_pipeline_stage ("1", New)'),
        "portal_id": Text(pattern=r"\d+", help="the HubSpot account id, for links to tickets"),
        "app_url": Url(help="the HubSpot app (https://app.hubspot.com)"),
        "create_contacts": Flag(help="create a contact for an unknown sender (false)"),
        "requester_property": Text(pattern=PROPERTY_NAME, max_length=100,
                                   help="a ticket property that receives the sender's address"),
        "queues": Mapping(values=Text(pattern=r"[\w-]+(?::[\w-]+)?"),
                          help="queue slug -> pipeline id, or pipeline id:stage id"),
        "priorities": Mapping(keys=r"low|normal|high|urgent", values=Text(choices=tuple(PRIORITIES.values()))),
        "owners": Mapping(values=Text(pattern=r"\d+"), help="assignee name -> HubSpot owner id"),
        "categories": Mapping(values=Text(max_length=100), help="request type -> hs_ticket_category value"),
    }

    def __init__(self, destination):
        super().__init__(destination)
        settings = self.settings
        self.base_url = self.base_url or API_URL
        self.id_property = str(settings.get("id_property") or "mailroom_ref")
        self.portal_id = str(settings.get("portal_id") or "")
        self.app_url = str(settings.get("app_url") or "https://app.hubspot.com").rstrip("/")
        self.create_contacts = bool(settings.get("create_contacts", False))

    # --- The interface ------------------------------------------------------

    def create_ticket(self, request: TicketRequest, idempotency_key: str, external_ref: str) -> TicketResult:
        payload = {"inputs": [{"idProperty": self.id_property, "id": external_ref,
                               "properties": ticket_properties(request, self.settings)}]}
        # An upsert: sent twice it updates the one ticket, so a 5xx after it is transient.
        response = self.send("POST", UPSERT_PATH, write=True, json_body=payload, retry_safe=True)
        body = json_object(response, write=True)
        results = [r for r in body.get("results") or [] if isinstance(r, dict)]
        if not results and body.get("errors"):
            # 207 Multi-Status: our one input failed; nothing was written.
            raise PermanentError(ReasonCode.INVALID_FIELDS, field_errors(body["errors"], response.status_code))
        if not results or not results[0].get("id"):
            raise AmbiguousOutcome(ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code} without a ticket id")
        ticket_id = str(results[0]["id"])
        log.info("hubspot: %s ticket %s for %s", "created" if results[0].get("new", True) else "updated (retry)",
                 ticket_id, external_ref)
        self._associate_requester(ticket_id, request.requester)
        return TicketResult(ticket_id=ticket_id, url=self.ticket_url(ticket_id))

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        # The property has unique values: one ticket at most carries the reference.
        response = self.send("GET", f"/crm/v3/objects/tickets/{_quote(external_ref)}", write=False,
                             params={"idProperty": self.id_property}, ok_statuses=(200, 404))
        if response.status_code == 404:
            return None
        ticket_id = json_object(response, write=False).get("id")
        if not ticket_id:
            raise TransientError(ReasonCode.UNREADABLE_RESPONSE, "a ticket without id")
        return TicketResult(ticket_id=str(ticket_id), url=self.ticket_url(ticket_id))

    def add_comment(self, ticket_id: str, comment: CommentRequest, idempotency_key: str, external_ref: str) -> str:
        body = comment.body
        if not str(ticket_id).isdigit():
            raise PermanentError(ReasonCode.NOT_FOUND, "a HubSpot ticket id is a number")
        note = {
            "properties": {"hs_note_body": body, "hs_timestamp": note_timestamp(idempotency_key)},
            "associations": [{"to": {"id": str(ticket_id)},
                              "types": [{"associationCategory": "HUBSPOT_DEFINED",
                                         "associationTypeId": NOTE_TO_TICKET}]}],
        }
        # A note is no upsert: a 5xx after it is ambiguous (a second POST may add it twice).
        response = self.send("POST", "/crm/v3/objects/notes", write=True, json_body=note)
        note_id = json_object(response, write=True).get("id")
        log.info("hubspot: noted on ticket %s for %s", ticket_id, external_ref)
        return str(note_id or ticket_id)

    def ticket_url(self, ticket_id) -> str:
        """The ticket's record page ("" without portal_id: the link needs the account id)."""
        if not self.portal_id:
            return ""
        return f"{self.app_url}/contacts/{self.portal_id}/record/0-5/{ticket_id}"

    def check_connection(self) -> str:
        try:
            response = self.send("GET", f"/crm/v3/properties/tickets/{_quote(self.id_property)}", write=False)
        except PermanentError as exc:
            if exc.reason == ReasonCode.NOT_FOUND:
                raise PermanentError(ReasonCode.CONFIGURATION,
                                     f"tickets have no property {self.id_property}: create a single-line text "
                                     "property with 'Require unique values' set, or set id_property") from None
            raise
        prop = json_object(response, write=False)
        if not prop.get("hasUniqueValue"):
            raise PermanentError(ReasonCode.CONFIGURATION,
                                 f"the ticket property {self.id_property} does not require unique values: "
                                 "the upsert needs a unique property")
        # A read that needs crm.objects.contacts.read (the requester association).
        self.send("GET", "/crm/v3/objects/contacts", write=False, params={"limit": 1})
        return f"HubSpot token works (tickets, contacts); ticket property {self.id_property} has unique values"

    # --- The requester --------------------------------------------------------

    def _associate_requester(self, ticket_id: str, requester: str) -> None:
        """Link the sender's contact to the ticket. Never raises: the ticket exists whatever happens here."""
        name, address = email.utils.parseaddr(requester)
        if not address or "@" not in address:
            return
        try:
            contact_id = self._contact_id(address)
            if contact_id is None and self.create_contacts:
                contact_id = self._upsert_contact(address, name)
            if contact_id is None:
                log.info("hubspot: no contact for %s; ticket %s left without one", mask_address(address), ticket_id)
                return
            self.send("PUT", f"/crm/v4/objects/tickets/{ticket_id}/associations/default/contacts/{contact_id}",
                      write=True, retry_safe=True)
        except (TransientError, PermanentError, AmbiguousOutcome) as exc:
            log.warning("hubspot: ticket %s made, but its contact %s was not associated (%s)", ticket_id,
                        mask_address(address), exc.reason)

    def _contact_id(self, address: str) -> str | None:
        search = {"filterGroups": [{"filters": [{"propertyName": "email", "operator": "EQ", "value": address}]}],
                  "properties": ["email"], "sorts": [{"propertyName": "createdate", "direction": "ASCENDING"}],
                  "limit": 1}
        response = self.send("POST", "/crm/v3/objects/contacts/search", write=False, json_body=search)
        results = json_object(response, write=False).get("results") or []
        return str(results[0]["id"]) if results and isinstance(results[0], dict) and results[0].get("id") else None

    def _upsert_contact(self, address: str, name: str) -> str | None:
        properties = {"email": address}
        if name:
            properties["firstname"] = name
        response = self.send("POST", "/crm/v3/objects/contacts/batch/upsert", write=True,
                             json_body={"inputs": [{"idProperty": "email", "id": address, "properties": properties}]},
                             retry_safe=True)
        results = json_object(response, write=True).get("results") or []
        return str(results[0]["id"]) if results and isinstance(results[0], dict) and results[0].get("id") else None

    # --- Authentication and error mapping --------------------------------------

    def auth_for(self, secret):
        return None, ({"Authorization": f"Bearer {secret.strip()}"} if secret else {})

    def special_error(self, response, body: dict, write: bool):
        status, category = response.status_code, str(body.get("category") or "")
        if status == 403 and category == "MISSING_SCOPES":
            scopes = sorted({s for e in body.get("errors") or [] if isinstance(e, dict)
                             for s in (e.get("context") or {}).get("requiredGranularScopes") or []})
            return PermanentError(ReasonCode.CREDENTIALS, "the private app lacks scopes" + (
                f": {', '.join(scopes)}" if scopes
                else " (tickets, crm.objects.contacts.read, crm.objects.contacts.write)"))
        if status == 400 and "INVALID_OBJECT_IDS" in str(body.get("subCategory") or ""):
            return PermanentError(ReasonCode.NOT_FOUND, "the ticket does not exist")
        return None


def _quote(value: str) -> str:
    return quote(str(value), safe="")


def note_timestamp(idempotency_key: str) -> str:
    """hs_timestamp (where the note sits on the timeline): when Mailroom took the reply in (its intent's
    created_at), so every attempt sends the same body; the current time outside an intent."""
    from ticketing.models import Intent

    created = Intent.objects.filter(idempotency_key=idempotency_key).values_list("created_at", flat=True).first()
    at = created or datetime.now(UTC)
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def route_properties(request: TicketRequest, settings: dict) -> dict:
    """Ticket properties for the request's route, through the destination's mappings (see the module doc)."""
    properties = {"hs_pipeline": str(settings.get("pipeline") or "0"),
                  "hs_pipeline_stage": str(settings.get("pipeline_stage") or "1")}
    queue = (settings.get("queues") or {}).get(request.queue) if request.queue else None
    if queue:
        pipeline, _, stage = str(queue).partition(":")
        properties["hs_pipeline"] = pipeline
        if stage:
            properties["hs_pipeline_stage"] = stage
    priorities = {**PRIORITIES, **(settings.get("priorities") or {})}
    if request.priority in priorities:
        properties["hs_ticket_priority"] = priorities[request.priority]
    owner = (settings.get("owners") or {}).get(request.assignee) if request.assignee else None
    if owner:
        properties["hubspot_owner_id"] = str(owner)
    category = (settings.get("categories") or {}).get(request.request_type) if request.request_type else None
    if category:
        properties["hs_ticket_category"] = str(category)
    return properties


def ticket_properties(request: TicketRequest, settings: dict) -> dict:
    """The ticket's properties. Deterministic: a retried upsert sends the very same body. Our reference is
    the upsert's `id` (HubSpot sets the unique property from it)."""
    properties = {"subject": request.subject, "content": request.description, "source_type": "EMAIL"}
    properties.update(route_properties(request, settings))
    requester_property = settings.get("requester_property")
    if requester_property:
        properties[requester_property] = email.utils.parseaddr(request.requester)[1] or request.requester
    for key, value in sorted((request.fields or {}).items(), key=lambda item: str(item[0])):
        properties[str(key)] = value
    return properties

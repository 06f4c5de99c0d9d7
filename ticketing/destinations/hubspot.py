"""HubSpot destination: tickets through the HubSpot CRM API v3 (docs/design.md §6 "The intent state machine").

The create is an upsert on a ticket property with unique values (`POST /crm/v3/objects/tickets/batch/upsert`,
`idProperty` = `id_property`, `id` = our external reference): a retry finds and updates the one ticket, so
sending it again is safe (`upsert = True`; a 5xx after it is transient, an unknown outcome is settled by a
retry in `ticketing.intents.resolve_unknown`). `GET /crm/v3/objects/tickets/<ref>?idProperty=...` reads it
back at once (`consistent_lookup`). A comment is a note associated with the ticket (`POST
/crm/v3/objects/notes`, association type 228 note -> ticket); HubSpot does not de-duplicate notes, so a 5xx
or a lost answer after one is ambiguous (held for a person, never re-sent blindly).

After the upsert, the sender is associated with the ticket as its contact: `GET /crm/v3/objects/contacts/
<email>?idProperty=email` and `PUT /crm/v4/objects/tickets/<id>/associations/default/contacts/<contact id>`;
with `create_contacts`, a missing contact is first upserted by email (`POST /crm/v3/objects/contacts/batch/
upsert`, idProperty email). A failure there is logged and never fails, repeats or doubts the ticket: the
ticket exists and a retried create associates again (both calls are idempotent).

`Destination.base_url`: https://api.hubapi.com (the one API host; used when left blank).
`credentials_ref` resolves to a private app's access token (sent as `Authorization: Bearer`). Scopes:
`tickets`, `crm.objects.contacts.read` (the sender's contact), `crm.objects.contacts.write` (HubSpot's
notes and emails APIs are governed by the contacts scopes; it also covers create_contacts), `sales-email-read`
(which the emails API asks for too) and `files` (attachments).
`Destination.settings` (all optional):
    connect_timeout (3.05 s), read_timeout (10 s),
    id_property ("mailroom_ref": a single-line text ticket property with unique values),
    pipeline ("0"), pipeline_stage ("1"), portal_id (the account id, for ticket_url), app_url
    (https://app.hubspot.com; https://app-eu1.hubspot.com for EU accounts), create_contacts (true),
    requester_property (a ticket property that receives the sender's address; none by default),
    files_folder ("/mailroom": where uploaded files go, one folder per file key), reopen_stage (the stage a
    reply moves a closed ticket to with closed_policy reopen; default: its pipeline's first open stage).
  The route is mapped by: queues {queue slug: pipeline id, or "pipeline id:stage id"} (overrides pipeline
  and stage), priorities {low|normal|high|urgent: LOW|MEDIUM|HIGH|URGENT} (default the same words),
  owners {assignee name: owner id} -> hubspot_owner_id, categories {request type: hs_ticket_category value}.
  A value without a mapping is left out. `TicketRequest.fields` (property names) come last.

People: the requester's contact is read by email (`GET /crm/v3/objects/contacts/<email>?idProperty=email`,
consistent, not the search API), created when missing (create_contacts: batch upsert by email), and
associated first; each CC'd address the same way after it (`cc_field` "associations"). All best effort.
Files go after the create: each is uploaded PRIVATE to the file manager (`POST /files/v3/files`, into
`<files_folder>/<file key>`; its id noted in the intent's journal) and attached by a note of its own
(`hs_attachment_ids`). A lost note is found again among the ticket's notes (the associations API, then a
batch read of their hs_attachment_ids): consistent reads, never the lagging search index. A customer's reply
is logged as the incoming email it is (`POST /crm/v3/objects/emails`, INCOMING_EMAIL, from the customer;
customer_replies "note" makes it a note); an agent's mail is a note, always internal in HubSpot, opening
with a "From:" line (HTML-escaped text: hs_note_body is rich text).
A reply to a ticket in a CLOSED stage (its pipeline's stage metadata ticketState; HubSpot itself would take
the note) reopens it (closed_policy reopen) or raises TicketClosed; a follow-up ticket names the closed one
first in its content and is associated with it (ticket to ticket, best effort). HubSpot's notifications
carry no ticket reference Mailroom could read: none is declared.
Left out: tags, conversations inbox threads, companies, listing for reconciliation.

Nothing logged here contains a ticket body, the token or a full email address.
"""

import email.utils
import html
import json
import logging
import re
from datetime import UTC, datetime
from urllib.parse import quote

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
from .capabilities import FILES_AFTER_WRITE, FOLLOW_UP, MB, REOPEN, REQUESTER_FIND_OR_CREATE, REVIEW, Capabilities
from .http import HttpDestination, field_errors, json_object
from .settings import HTTP_SETTINGS, Flag, Mapping, Text, Url

log = logging.getLogger(__name__)

API_URL = "https://api.hubapi.com"
UPSERT_PATH = "/crm/v3/objects/tickets/batch/upsert"
NOTE_TO_TICKET = 228  # HubSpot-defined association types: note -> ticket, email -> ticket
EMAIL_TO_TICKET = 224
PRIORITIES = {"low": "LOW", "normal": "MEDIUM", "high": "HIGH", "urgent": "URGENT"}
PROPERTY_NAME = r"[a-z][a-z0-9_]*"
MAX_NOTE_CHARS = 65_536  # hs_note_body's limit
NOTE_CUT_NOTICE = "\n\n[Mailroom: shortened to fit HubSpot's 65,536-character note limit.]"
NOTE_BATCH = 100  # the most ids a batch read takes
# Private apps: 100 requests per 10 seconds on Free and Starter accounts (190 on Professional and
# Enterprise), a daily limit besides; the search API has its own 5 per second, which Mailroom does not use.
DEFAULT_REQUESTS_PER_MINUTE = 600
# HubSpot's file manager limits files by type (its "supported file types and sizes"); 20 MB stays under
# every limit it documents for documents and images. `max_file_bytes` raises it.
MAX_FILE_BYTES = 20 * MB


class HubSpotDestination(HttpDestination):
    name = "hubspot"
    upsert = True
    consistent_lookup = True
    # Property values and note bodies take 65,536 characters; 64,000 leaves room for the cut notice.
    max_description_chars = 64_000

    capabilities = Capabilities(
        files=FILES_AFTER_WRITE,
        max_file_bytes=MAX_FILE_BYTES,
        html=False,  # the ticket's `content` is plain text (notes are rich text: see note_html)
        # A customer's reply is an incoming email engagement from the customer (customer_replies "email").
        requester=REQUESTER_FIND_OR_CREATE,
        cc_field="associations",
        customer_authored_comments=True,
        internal_notes=True,
        closed_policies=(FOLLOW_UP, REOPEN, REVIEW),
        # A ticket made through the CRM API sends the contact nothing; only HubSpot's own inbox channels
        # (email, forms) and workflows mail customers.
        acknowledges_requester=False,
        requests_per_minute=DEFAULT_REQUESTS_PER_MINUTE,
    )

    SETTINGS = {
        **HTTP_SETTINGS,
        "id_property": Text(
            pattern=PROPERTY_NAME,
            max_length=100,
            help="the ticket property with unique values that holds our reference (mailroom_ref)",
        ),
        "pipeline": Text(pattern=r"[\w-]+", help='hs_pipeline ("0", the default pipeline)'),
        "pipeline_stage": Text(pattern=r"[\w-]+", help='hs_pipeline_stage ("1", New)'),
        "portal_id": Text(pattern=r"\d+", help="the HubSpot account id, for links to tickets"),
        "app_url": Url(help="the HubSpot app (https://app.hubspot.com)"),
        "create_contacts": Flag(help="create a contact for an unknown sender or CC'd address (true)"),
        "files_folder": Text(
            pattern=r"/[\w/-]*", max_length=200, help='the file manager folder files are uploaded to ("/mailroom")'
        ),
        "customer_replies": Text(
            choices=("email", "note"),
            help="a customer's reply is logged as an incoming email (email, the default) or an internal note",
        ),
        "reopen_stage": Text(
            pattern=r"[\w-]+",
            help="the stage a reply moves a closed ticket to (closed_policy "
            "reopen; default: the pipeline's first open stage)",
        ),
        "requester_property": Text(
            pattern=PROPERTY_NAME, max_length=100, help="a ticket property that receives the sender's address"
        ),
        "queues": Mapping(
            values=Text(pattern=r"[\w-]+(?::[\w-]+)?"), help="queue slug -> pipeline id, or pipeline id:stage id"
        ),
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
        self.create_contacts = bool(settings.get("create_contacts", True))
        self.files_folder = str(settings.get("files_folder") or "/mailroom").rstrip("/")
        self.reopen_stage = str(settings.get("reopen_stage") or "")
        self.customer_replies = str(settings.get("customer_replies") or "email")
        self.closed_policy = str(settings.get("closed_policy") or self.capabilities.default_closed_policy)
        self._pipelines: dict[str, list[dict]] = {}  # pipeline id -> its stages, read once per adapter

    # --- The interface ------------------------------------------------------

    def create_ticket(self, request: TicketRequest, idempotency_key: str, external_ref: str) -> TicketResult:
        payload = {
            "inputs": [
                {
                    "idProperty": self.id_property,
                    "id": external_ref,
                    "properties": ticket_properties(request, self.settings),
                }
            ]
        }
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
        log.info(
            "hubspot: %s ticket %s for %s",
            "created" if results[0].get("new", True) else "updated (retry)",
            ticket_id,
            external_ref,
        )
        # The requester first: HubSpot keeps no roles, the first contact is the one the record shows first.
        name, _ = email.utils.parseaddr(request.requester)
        self._associate_person(ticket_id, request.requester, request.requester_name or name)
        for address in request.cc:
            self._associate_person(ticket_id, address, "")
        if request.follow_up_of and str(request.follow_up_of).isdigit():
            self._associate(ticket_id, "tickets", str(request.follow_up_of), what="the closed ticket it follows")
        return TicketResult(ticket_id=ticket_id, url=self.ticket_url(ticket_id))

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        # The property has unique values: one ticket at most carries the reference.
        response = self.send(
            "GET",
            f"/crm/v3/objects/tickets/{_quote(external_ref)}",
            write=False,
            params={"idProperty": self.id_property},
            ok_statuses=(200, 404),
        )
        if response.status_code == 404:
            return None
        ticket_id = json_object(response, write=False).get("id")
        if not ticket_id:
            raise TransientError(ReasonCode.UNREADABLE_RESPONSE, "a ticket without id")
        return TicketResult(ticket_id=str(ticket_id), url=self.ticket_url(ticket_id))

    def add_comment(self, ticket_id: str, comment: CommentRequest, idempotency_key: str, external_ref: str) -> str:
        if not str(ticket_id).isdigit():
            raise PermanentError(ReasonCode.NOT_FOUND, "a HubSpot ticket id is a number")
        self._open_for_comment(str(ticket_id))
        timestamp = note_timestamp(idempotency_key)
        if comment.public and not comment.from_agent and self.customer_replies == "email":
            # The customer's own reply, logged as the incoming email it is: from the customer, in the conversation.
            path, payload, what = "/crm/v3/objects/emails", email_payload(str(ticket_id), comment, timestamp), "email"
        else:
            path, payload, what = (
                "/crm/v3/objects/notes",
                note_payload(str(ticket_id), note_html(comment), timestamp),
                "note",
            )
        # Neither is an upsert: a 5xx after it is ambiguous (a second POST may add it twice).
        response = self.send("POST", path, write=True, json_body=payload)
        record_id = json_object(response, write=True).get("id")
        log.info("hubspot: logged a reply on ticket %s for %s (%s)", ticket_id, external_ref, what)
        for address in comment.cc:
            self._associate_person(str(ticket_id), address, "")
        return str(record_id or ticket_id)

    # --- Files: uploaded to the file manager, attached by a note each ---------------------------------

    def upload_file(self, ticket_id: str, file: OutgoingFile, file_key: str, *, public: bool = True) -> str:
        """The file's id in HubSpot once a note on the ticket carries it. The upload is made once per file key
        (its id noted in the journal before the note is written); notes are internal whatever `public`."""
        step = f"hubspot_file:{file.index}"
        noted = self.journal.get(step) or {}
        file_id = str(noted.get("id") or "") if noted.get("key") == file_key else ""
        if not file_id:
            file_id = self._upload(file, file_key)
            self.journal.put(step, {"key": file_key, "id": file_id})
        caption = f"<p>Attached to the email: {html.escape(file.filename, quote=False)}</p>"
        note = note_payload(str(ticket_id), caption, now_timestamp(), attachment_ids=file_id)
        # No key on a note: a lost answer is ambiguous, and `find_file` looks among the ticket's notes.
        response = self.send("POST", "/crm/v3/objects/notes", write=True, json_body=note)
        json_object(response, write=True)
        log.info("hubspot: file %s attached to ticket %s (file %s)", file.index, ticket_id, file_id)
        return file_id

    def find_file(self, ticket_id: str, file: OutgoingFile, file_key: str) -> str | None:
        """The file's id if a note on the ticket already carries it. Without a noted upload there is none: the
        note is written only after the upload answered (a lost upload leaves an unattached private file)."""
        noted = self.journal.get(f"hubspot_file:{file.index}") or {}
        if noted.get("key") != file_key or not noted.get("id"):
            return None
        file_id = str(noted["id"])
        note_ids = self._note_ids(str(ticket_id))
        for start in range(0, len(note_ids), NOTE_BATCH):
            batch = {
                "properties": ["hs_attachment_ids"],
                "inputs": [{"id": note_id} for note_id in note_ids[start : start + NOTE_BATCH]],
            }
            response = self.send("POST", "/crm/v3/objects/notes/batch/read", write=False, json_body=batch)
            for note in json_object(response, write=False).get("results") or []:
                ids = str(((note or {}).get("properties") or {}).get("hs_attachment_ids") or "").split(";")
                if file_id in ids:
                    return file_id
        return None

    def _upload(self, file: OutgoingFile, file_key: str) -> str:
        options = {
            "access": "PRIVATE",
            "overwrite": False,
            "duplicateValidationStrategy": "NONE",
            "duplicateValidationScope": "EXACT_FOLDER",
        }
        body, content_type = encode_multipart_formdata(
            [
                ("file", (file.filename, file.read(), file.content_type or "application/octet-stream")),
                ("fileName", file.filename),
                ("folderPath", f"{self.files_folder}/{file_key}"),
                ("options", json.dumps(options)),
            ]
        )
        response = self.send("POST", "/files/v3/files", write=True, data=body, headers={"Content-Type": content_type})
        file_id = json_object(response, write=True).get("id")
        if not file_id:
            raise AmbiguousOutcome(ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code} without a file id")
        return str(file_id)

    def _note_ids(self, ticket_id: str) -> list[str]:
        """Every note associated with the ticket (the associations API reads the record, not a search index)."""
        ids, after = [], None
        while True:
            params = {"limit": 500, **({"after": after} if after else {})}
            response = self.send(
                "GET", f"/crm/v4/objects/tickets/{ticket_id}/associations/notes", write=False, params=params
            )
            body = json_object(response, write=False)
            ids += [
                str(r["toObjectId"])
                for r in body.get("results") or []
                if isinstance(r, dict) and r.get("toObjectId") is not None
            ]
            after = ((body.get("paging") or {}).get("next") or {}).get("after")
            if not after:
                return ids

    # --- Closed tickets ------------------------------------------------------------------------

    def _open_for_comment(self, ticket_id: str) -> None:
        """HubSpot takes a note on a ticket in a closed stage; Mailroom asks first and applies closed_policy:
        reopen moves it to `reopen_stage` (else its pipeline's first open stage), anything else is TicketClosed."""
        response = self.send(
            "GET",
            f"/crm/v3/objects/tickets/{ticket_id}",
            write=False,
            params={"properties": "hs_pipeline,hs_pipeline_stage"},
            ok_statuses=(200, 404),
        )
        if response.status_code == 404:
            raise PermanentError(ReasonCode.NOT_FOUND, "the ticket does not exist")
        properties = json_object(response, write=False).get("properties") or {}
        pipeline, stage = str(properties.get("hs_pipeline") or "0"), str(properties.get("hs_pipeline_stage") or "")
        stages = self._stages(pipeline)
        if not any(s["id"] == stage and s["state"] == "CLOSED" for s in stages):
            return
        if self.closed_policy != REOPEN:
            raise TicketClosed(f"ticket {ticket_id} is in a closed stage")
        reopen = self.reopen_stage or next((s["id"] for s in stages if s["state"] != "CLOSED"), "")
        if not reopen:
            raise TicketClosed(f"ticket {ticket_id}: its pipeline has no open stage to reopen it in")
        # Setting a property to a value is idempotent: sent twice, it has the effect of once.
        self.send(
            "PATCH",
            f"/crm/v3/objects/tickets/{ticket_id}",
            write=True,
            json_body={"properties": {"hs_pipeline_stage": reopen}},
            retry_safe=True,
        )
        log.info("hubspot: moved ticket %s to stage %s for a reply (closed_policy reopen)", ticket_id, reopen)

    def _stages(self, pipeline: str) -> list[dict]:
        """[{"id", "state"}] of a ticket pipeline's stages in display order (state OPEN or CLOSED)."""
        if pipeline not in self._pipelines:
            response = self.send("GET", f"/crm/v3/pipelines/tickets/{_quote(pipeline)}", write=False)
            stages = [s for s in json_object(response, write=False).get("stages") or [] if isinstance(s, dict)]
            stages.sort(key=lambda s: s.get("displayOrder") or 0)
            self._pipelines[pipeline] = [
                {"id": str(s.get("id")), "state": str((s.get("metadata") or {}).get("ticketState") or "OPEN").upper()}
                for s in stages
            ]
        return self._pipelines[pipeline]

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
                raise PermanentError(
                    ReasonCode.CONFIGURATION,
                    f"tickets have no property {self.id_property}: create a single-line text "
                    "property with 'Require unique values' set, or set id_property",
                ) from None
            raise
        prop = json_object(response, write=False)
        if not prop.get("hasUniqueValue"):
            raise PermanentError(
                ReasonCode.CONFIGURATION,
                f"the ticket property {self.id_property} does not require unique values: "
                "the upsert needs a unique property",
            )
        # Reads that need crm.objects.contacts.read (the requester association) and files (attachments).
        self.send("GET", "/crm/v3/objects/contacts", write=False, params={"limit": 1})
        self.send("GET", "/files/v3/files/search", write=False, params={"limit": 1})
        return f"HubSpot token works (tickets, contacts, files); ticket property {self.id_property} has unique values"

    # --- People: contacts associated with the ticket -------------------------------------------

    def _associate_person(self, ticket_id: str, address_text: str, name: str) -> None:
        """Find (or, with create_contacts, make) the contact and associate it with the ticket. Never raises:
        the ticket exists whatever happens here, and a retried create associates again (both idempotent)."""
        _, address = email.utils.parseaddr(address_text)
        if not address or "@" not in address:
            return
        try:
            contact_id = self._contact_id(address)
            if contact_id is None and self.create_contacts:
                contact_id = self._upsert_contact(address, name)
        except (TransientError, PermanentError, AmbiguousOutcome) as exc:
            log.warning(
                "hubspot: ticket %s made, but its contact %s was not associated (%s)",
                ticket_id,
                mask_address(address),
                exc.reason,
            )
            return
        if contact_id is None:
            log.info("hubspot: no contact for %s; ticket %s left without it", mask_address(address), ticket_id)
            return
        self._associate(ticket_id, "contacts", contact_id, what=f"its contact {mask_address(address)}")

    def _associate(self, ticket_id: str, to_type: str, to_id: str, *, what: str) -> None:
        """The default (unlabelled) association of the ticket with a record; logged, never raised."""
        try:
            self.send(
                "PUT",
                f"/crm/v4/objects/tickets/{ticket_id}/associations/default/{to_type}/{to_id}",
                write=True,
                retry_safe=True,
            )
        except (TransientError, PermanentError, AmbiguousOutcome) as exc:
            log.warning("hubspot: ticket %s made, but %s was not associated (%s)", ticket_id, what, exc.reason)

    def _contact_id(self, address: str) -> str | None:
        # A read by the unique email property: consistent, unlike the search index (and its 5 per second).
        response = self.send(
            "GET",
            f"/crm/v3/objects/contacts/{_quote(address)}",
            write=False,
            params={"idProperty": "email"},
            ok_statuses=(200, 404),
        )
        if response.status_code == 404:
            return None
        contact_id = json_object(response, write=False).get("id")
        return str(contact_id) if contact_id else None

    def _upsert_contact(self, address: str, name: str) -> str | None:
        properties = {"email": address}
        if name:
            properties["firstname"] = name
        response = self.send(
            "POST",
            "/crm/v3/objects/contacts/batch/upsert",
            write=True,
            json_body={"inputs": [{"idProperty": "email", "id": address, "properties": properties}]},
            retry_safe=True,
        )
        results = json_object(response, write=True).get("results") or []
        return str(results[0]["id"]) if results and isinstance(results[0], dict) and results[0].get("id") else None

    # --- Authentication and error mapping --------------------------------------

    def auth_for(self, secret):
        return None, ({"Authorization": f"Bearer {secret.strip()}"} if secret else {})

    def special_error(self, response, body: dict, write: bool):
        status, category = response.status_code, str(body.get("category") or "")
        if status == 403 and category == "MISSING_SCOPES":
            scopes = sorted(
                {
                    s
                    for e in body.get("errors") or []
                    if isinstance(e, dict)
                    for s in (e.get("context") or {}).get("requiredGranularScopes") or []
                }
            )
            return PermanentError(
                ReasonCode.CREDENTIALS,
                "the private app lacks scopes"
                + (
                    f": {', '.join(scopes)}"
                    if scopes
                    else " (tickets, crm.objects.contacts.read, crm.objects.contacts.write, files)"
                ),
            )
        if status == 400 and "INVALID_OBJECT_IDS" in str(body.get("subCategory") or ""):
            return PermanentError(ReasonCode.NOT_FOUND, "the ticket does not exist")
        return None


def _quote(value: str) -> str:
    return quote(str(value), safe="")


def now_timestamp() -> str:
    at = datetime.now(UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def note_payload(ticket_id: str, body: str, timestamp: str, attachment_ids: str = "") -> dict:
    properties = {"hs_note_body": body, "hs_timestamp": timestamp}
    if attachment_ids:
        properties["hs_attachment_ids"] = attachment_ids
    return {
        "properties": properties,
        "associations": [
            {
                "to": {"id": ticket_id},
                "types": [{"associationCategory": "HUBSPOT_DEFINED", "associationTypeId": NOTE_TO_TICKET}],
            }
        ],
    }


def email_payload(ticket_id: str, comment: CommentRequest, timestamp: str) -> dict:
    """A customer's reply as a logged incoming email (hs_email_direction INCOMING_EMAIL) from the customer."""
    first, _, last = (comment.author_name or "").strip().rpartition(" ")
    sender = {"email": comment.author_email, "firstName": first or last, "lastName": last if first else ""}
    headers = {"from": sender, "to": [], "cc": [{"email": address} for address in comment.cc], "bcc": []}
    properties = {
        "hs_timestamp": timestamp,
        "hs_email_direction": "INCOMING_EMAIL",
        "hs_email_status": "SENT",
        "hs_email_text": comment.body,
        "hs_email_html": paragraphs_html(comment.body),
        "hs_email_headers": json.dumps(headers),
    }
    return {
        "properties": properties,
        "associations": [
            {
                "to": {"id": ticket_id},
                "types": [{"associationCategory": "HUBSPOT_DEFINED", "associationTypeId": EMAIL_TO_TICKET}],
            }
        ],
    }


def paragraphs_html(text: str) -> str:
    """Plain text as HTML paragraphs (a blank line between), its markup escaped, its line breaks kept."""
    paragraphs = [p for p in re.split(r"\n\s*\n", (text or "").strip()) if p.strip()]
    return "".join(f"<p>{html.escape(p, quote=False).replace(chr(10), '<br>')}</p>" for p in paragraphs)


def note_html(comment: CommentRequest) -> str:
    """The note for a reply: who wrote it and whom it copied, then the text, escaped and kept in paragraphs
    (hs_note_body is rich text); cut the same way every time to 65,536 characters."""
    author = (
        email.utils.formataddr((comment.author_name, comment.author_email))
        if comment.author_name
        else comment.author_email
    )
    head = f"<p>From: {html.escape(author, quote=False)}{' (agent)' if comment.from_agent else ''}</p>"
    if comment.cc:
        head += f"<p>CC: {html.escape(', '.join(comment.cc), quote=False)}</p>"
    text = comment.body
    while True:
        body = head + paragraphs_html(text)
        if len(body) <= MAX_NOTE_CHARS:
            return body
        text = text[: int(len(text) * 0.9) - len(NOTE_CUT_NOTICE)].rstrip() + NOTE_CUT_NOTICE


def note_timestamp(idempotency_key: str) -> str:
    """hs_timestamp (where the note sits on the timeline): when Mailroom took the reply in (its intent's
    created_at), so every attempt sends the same body; the current time outside an intent."""
    from ticketing.models import Intent

    created = Intent.objects.filter(idempotency_key=idempotency_key).values_list("created_at", flat=True).first()
    at = created or datetime.now(UTC)
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def route_properties(request: TicketRequest, settings: dict) -> dict:
    """Ticket properties for the request's route, through the destination's mappings (see the module doc)."""
    properties = {
        "hs_pipeline": str(settings.get("pipeline") or "0"),
        "hs_pipeline_stage": str(settings.get("pipeline_stage") or "1"),
    }
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
    the upsert's `id` (HubSpot sets the unique property from it). A follow-up names the closed ticket first."""
    content = request.description
    if request.follow_up_of:
        content = f"Follow-up of HubSpot ticket {request.follow_up_of}, which is closed.\n\n{content}"
    properties = {"subject": request.subject, "content": content, "source_type": "EMAIL"}
    properties.update(route_properties(request, settings))
    requester_property = settings.get("requester_property")
    if requester_property:
        properties[requester_property] = email.utils.parseaddr(request.requester)[1] or request.requester
    for key, value in sorted((request.fields or {}).items(), key=lambda item: str(item[0])):
        properties[str(key)] = value
    return properties

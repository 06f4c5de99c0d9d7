"""Freshdesk destination: tickets through the Freshdesk API v2 (docs/design.md §6, docs/destinations/freshdesk.md).

Calls: `POST /api/v2/tickets` (create: JSON, or multipart/form-data with `attachments[]` when files go),
`GET /api/v2/tickets/{id}?include=requester` (before a reply: is it closed, who is its requester),
`GET /api/v2/tickets/{id}/conversations` (before a reply with files: what the ticket's attachments weigh),
`GET /api/v2/contacts?email=` (a reply's author when not the requester), `PUT /api/v2/tickets/{id}` (reopen,
status 2), `POST /api/v2/tickets/{id}/notes` (a reply: JSON, or multipart with `attachments[]`),
`GET /api/v2/search/tickets?query="..."` (lookup by our reference), and, for `check_connection` only,
`GET /api/v2/ticket_fields`.

What goes where: the description is HTML (the message's sanitized HTML with the list of files, or the text
escaped with <br>); the requester by `email` and `name` (Freshdesk finds or makes the contact); the CC'd
people as `cc_emails`; files as `attachments[]`, up to Freshdesk's 20 MB for all of a ticket's attachments
together (the files past it are held back and listed). A customer's reply is a public note marked
`incoming`, written as the customer's contact (`user_id`); mail from the tenant's agents is a private note.
A reply to a closed ticket (status 5; the API itself takes the note, and the agents would never see it) is
refused with `TicketClosed`, or, with `closed_policy` "reopen", the ticket is reopened (status 2) first.
A reply to Freshdesk's own notification carries "[#123]" in its subject: `reference_patterns`.

Ambiguity: Freshdesk keeps no idempotency key and the create is no upsert, so a 5xx, a timeout or a
dropped connection after the create was sent is an `AmbiguousOutcome`. Our reference goes into a
custom text field (`external_ref_field`), which the filter API can search, but its index lags behind
writes (minutes, per Freshdesk): `lookup_settle_seconds` (= `search_settle_seconds`) tells
`ticketing.intents.resolve_unknown` to search only after that delay; found settles the intent,
nothing found goes to review (held), never to a second create. Every attempt sends the same bytes: the
multipart boundary is derived from the intent's key, and who a note is written as is kept in the journal.

`Destination.settings` (all optional):
    external_ref_field ("cf_mailroom_ref"): the custom text field (its API name, cf_...) for our reference;
        it must exist (`check_connection` says so when it does not). The filter query names it without
        the cf_ prefix, as Freshdesk's search does for custom fields.
    groups {queue slug: group_id}, agents {assignee name: agent id (responder_id)},
    ticket_types {request type slug: a value of the Type field, e.g. "Refund"}.
    search_settle_seconds (60): how long after a lost answer the search is trusted.
    requests_per_minute (80: the Growth plan's ticket-create limit), closed_policy (follow_up),
    plus connect_timeout, read_timeout and the common retry settings.
  The priority is Freshdesk's own scale (low 1, normal 2 "medium", high 3, urgent 4); status is 2 (open),
  source 1 (email). A route value with no mapping is left out, not an error; `TicketRequest.fields`
  (standard fields, or cf_... names which go into custom_fields) are merged last.
`Destination.credentials_ref` resolves to the agent's API key (sent as basic auth `key:X`), or `key:X`.

Nothing logged here contains a ticket body or a full email address.
"""

import email.utils
import hashlib
import html
import json
import logging
import re

from intake.logging import mask_address
from intake.vocabulary import ReasonCode

from ..rich_body import resolve_cid
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
from .capabilities import (
    FILES_WITH_WRITE,
    FOLLOW_UP,
    MB,
    REOPEN,
    REQUESTER_FIND_OR_CREATE,
    REVIEW,
    Capabilities,
)
from .http import HttpDestination, json_object
from .settings import HTTP_SETTINGS, Mapping, Number, Text

log = logging.getLogger(__name__)

TICKETS_PATH = "/api/v2/tickets"
SEARCH_PATH = "/api/v2/search/tickets"
CONTACTS_PATH = "/api/v2/contacts"
DEFAULT_REF_FIELD = "cf_mailroom_ref"
DEFAULT_SETTLE_SECONDS = 60
PRIORITIES = {"low": 1, "normal": 2, "high": 3, "urgent": 4}
STATUS_OPEN, STATUS_CLOSED, SOURCE_EMAIL = 2, 5, 1
MAX_SUBJECT_CHARS = 255
MAX_SEARCH_PAGES = 10  # Freshdesk serves at most 10 pages of 30 results
CONVERSATIONS_PER_PAGE = 100  # the most Freshdesk lists in one page
# Freshdesk's limit for the attachments of one ticket, all together (the create's and its notes').
MAX_TICKET_ATTACHMENT_BYTES = 20 * MB
# The per-minute limits of Freshdesk's plans start at the Growth plan's 200 calls, 80 of them ticket creates:
# 80 keeps every mix of calls within the smallest plan. A larger plan raises `requests_per_minute`.
DEFAULT_REQUESTS_PER_MINUTE = 80
# The journal step that remembers who a note is written as (a contact id, or None: a "From:" line).
AUTHOR_STEP = "note_author"
# Where the description's list of files (and the people listed with it) starts in the pipeline's plain text:
# `ticketing.ticket_files.file_list`'s heading, and the lines `ticketing.services` adds after it.
LISTING_HEADS = ("\n\nAttachments:\n", "\n\nCopied: ", "\n\nForwarded by ")


class FreshdeskDestination(HttpDestination):
    name = "freshdesk"
    honours_idempotency_key = False
    consistent_lookup = False
    upsert = False
    lookup_settle_seconds = float(DEFAULT_SETTLE_SECONDS)

    capabilities = Capabilities(
        files=FILES_WITH_WRITE,  # attachments[] in the create's and the note's multipart body
        max_file_bytes=MAX_TICKET_ATTACHMENT_BYTES,
        html=True,
        requester=REQUESTER_FIND_OR_CREATE,  # Freshdesk makes the contact from email and name
        cc_field="cc_emails",
        customer_authored_comments=True,  # a note's user_id: the customer's contact
        internal_notes=True,
        closed_policies=(FOLLOW_UP, REOPEN, REVIEW),
        acknowledges_requester=True,  # its "New Ticket Created" notification to the requester
        requests_per_minute=DEFAULT_REQUESTS_PER_MINUTE,
    )
    # Freshdesk's notifications name the ticket as "[#123]" in their subject.
    reference_patterns = (re.compile(r"\[#(?P<ref>\d{1,15})\]"),)
    reference_fields = ("subject",)

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
        files, over = within_total(request.files, MAX_TICKET_ATTACHMENT_BYTES)
        ticket = ticket_payload(request, external_ref, self.settings, ticket_url=self.ticket_url)
        if over:
            ticket["description"] += held_back_html(over)
        response = self._write("POST", TICKETS_PATH, ticket, files, idempotency_key)
        answer = json_object(response, write=True)
        if not isinstance(answer.get("id"), int):
            # It answered 2xx, so the ticket probably exists; only the (lagging) search can tell which.
            raise AmbiguousOutcome(ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code} without a ticket id")
        log.info(
            "freshdesk: created ticket %s for %s (%d file(s), %d held back over the total)",
            answer["id"],
            external_ref,
            len(files),
            len(over),
        )
        return TicketResult(ticket_id=str(answer["id"]), url=self.ticket_url(answer["id"]))

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        tickets = self._with_ref(external_ref)
        if not tickets:
            return None
        first = min(tickets, key=lambda t: t["id"])  # the lowest id is the first create: the one to keep
        if len(tickets) > 1:
            log.warning(
                "freshdesk: %d tickets carry %s; keeping the first, %s", len(tickets), external_ref, first["id"]
            )
        return TicketResult(ticket_id=str(first["id"]), url=self.ticket_url(first["id"]))

    def add_comment(self, ticket_id: str, comment: CommentRequest, idempotency_key: str, external_ref: str) -> str:
        if not str(ticket_id).isdigit():
            raise PermanentError(ReasonCode.NOT_FOUND, "a Freshdesk ticket id is a number")
        ticket = json_object(
            self.send("GET", f"{TICKETS_PATH}/{ticket_id}", write=False, params={"include": "requester"}), write=False
        )
        if ticket.get("status") == STATUS_CLOSED:
            if self.closed_policy() != REOPEN:
                raise TicketClosed(f"Freshdesk ticket {ticket_id} is closed (status {STATUS_CLOSED})")
            self._reopen(ticket_id)
        # The customer's own reply is an incoming public note; anything else (an agent's mail) is not incoming.
        customer = comment.public and not comment.from_agent
        user_id = self._author(ticket, comment, idempotency_key) if customer else None
        used = self._attachment_bytes(ticket_id, ticket) if comment.files else 0
        files, over = within_total(comment.files, MAX_TICKET_ATTACHMENT_BYTES - used)
        note = {
            "body": note_html(comment, written_as_author=user_id is not None) + held_back_html(over),
            "private": not comment.public,
            "incoming": customer,
        }
        if user_id is not None:
            note["user_id"] = user_id
        response = self._write("POST", f"{TICKETS_PATH}/{ticket_id}/notes", note, files, idempotency_key)
        answer = json_object(response, write=True)
        log.info(
            "freshdesk: added a %s note to ticket %s for %s (author %s, %d file(s))",
            "public" if comment.public else "private",
            ticket_id,
            external_ref,
            f"contact {user_id}" if user_id is not None else "the API user",
            len(files),
        )
        return str(answer.get("id") or ticket_id)

    def resolve_reference(self, ref: str) -> str | None:
        """ "[#123]" names Freshdesk ticket 123 (its id is what Mailroom keeps)."""
        return str(int(ref)) if str(ref).isdigit() else None

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
            raise PermanentError(
                ReasonCode.CONFIGURATION,
                f"no ticket field {self.external_ref_field}: add a single-line text field "
                "for Mailroom's reference (Admin > Ticket Fields), or set external_ref_field",
            )
        return f"signed in to Freshdesk; {len(names)} ticket fields, {self.external_ref_field} among them"

    def closed_policy(self) -> str:
        """What a reply to a closed ticket becomes here (as `ticketing.services.closed_policy` decides it)."""
        chosen = self.settings.get("closed_policy")
        if chosen in self.capabilities.closed_policies:
            return chosen
        return self.capabilities.default_closed_policy

    # --- Helpers --------------------------------------------------------------

    def _write(self, method: str, path: str, record: dict, files, idempotency_key: str):
        """A write as JSON, or, with files, as multipart/form-data (Freshdesk takes files no other way) whose
        boundary comes from the intent's key: a retry sends the very same bytes."""
        if not files:
            return self.send(method, path, write=True, json_body=record)
        body, content_type = multipart_body(form_fields(record), files, idempotency_key)
        return self.send(method, path, write=True, data=body, headers={"Content-Type": content_type})

    def _reopen(self, ticket_id: str) -> None:
        try:
            # Setting status 2 twice is the same as once: a lost answer is simply tried again.
            self.send(
                "PUT", f"{TICKETS_PATH}/{ticket_id}", write=True, json_body={"status": STATUS_OPEN}, retry_safe=True
            )
        except AmbiguousOutcome as exc:
            raise TransientError(exc.reason, f"reopening ticket {ticket_id}: {exc.detail}") from exc
        log.info("freshdesk: reopened closed ticket %s (closed_policy reopen)", ticket_id)

    def _attachment_bytes(self, ticket_id: str, ticket: dict) -> int:
        """What the ticket's attachments weigh already: its own and its conversations' (Freshdesk's 20 MB are
        for all of them)."""
        total = sum(int(a.get("size") or 0) for a in ticket.get("attachments") or [] if isinstance(a, dict))
        for page in range(1, MAX_SEARCH_PAGES + 1):
            response = self.send(
                "GET",
                f"{TICKETS_PATH}/{ticket_id}/conversations",
                write=False,
                params={"page": page, "per_page": CONVERSATIONS_PER_PAGE},
            )
            try:
                conversations = response.json()
            except ValueError:
                raise TransientError(ReasonCode.UNREADABLE_RESPONSE, "conversations is not JSON") from None
            if not isinstance(conversations, list):
                raise TransientError(ReasonCode.UNREADABLE_RESPONSE, "conversations is not a JSON list")
            total += sum(
                int(a.get("size") or 0)
                for c in conversations
                if isinstance(c, dict)
                for a in c.get("attachments") or []
                if isinstance(a, dict)
            )
            if len(conversations) < CONVERSATIONS_PER_PAGE:
                break
        return total

    def _author(self, ticket: dict, comment: CommentRequest, idempotency_key: str) -> int | None:
        """The contact a customer's note is written as: the ticket's requester when it is they, else the contact
        Freshdesk has for the address; None (a "From:" line instead) when it has none. Kept in the journal, so
        that a retry writes the same note."""
        noted = self.journal.get(AUTHOR_STEP)
        if isinstance(noted, dict) and noted.get("key") == idempotency_key:
            return noted.get("user_id")
        address = (email.utils.parseaddr(comment.author_email)[1] or comment.author_email).strip().lower()
        requester = ticket.get("requester") if isinstance(ticket.get("requester"), dict) else {}
        user_id = None
        if address and str(requester.get("email") or "").strip().lower() == address:
            user_id = ticket.get("requester_id") or requester.get("id")
        elif address and "@" in address:
            contacts = self.send("GET", CONTACTS_PATH, write=False, params={"email": address})
            try:
                found = contacts.json()
            except ValueError:
                raise TransientError(ReasonCode.UNREADABLE_RESPONSE, "contacts is not JSON") from None
            user_id = (
                next(
                    (
                        c.get("id")
                        for c in found
                        if isinstance(c, dict) and str(c.get("email") or "").strip().lower() == address
                    ),
                    None,
                )
                if isinstance(found, list)
                else None
            )
        user_id = user_id if isinstance(user_id, int) and not isinstance(user_id, bool) else None
        self.journal.put(AUTHOR_STEP, {"key": idempotency_key, "user_id": user_id})
        return user_id

    def _with_ref(self, external_ref: str) -> list[dict]:
        # Freshdesk's filter names custom fields without their cf_ prefix; the value goes in single quotes.
        field = self.external_ref_field.removeprefix("cf_")
        quoted = external_ref.replace("\\", "\\\\").replace("'", "\\'")
        found = []
        for page in range(1, MAX_SEARCH_PAGES + 1):
            body = json_object(
                self.send("GET", SEARCH_PATH, write=False, params={"query": f"\"{field}:'{quoted}'\"", "page": page}),
                write=False,
            )
            results = [t for t in body.get("results") or [] if isinstance(t, dict) and isinstance(t.get("id"), int)]
            # Keep exact matches only: the search is the index's idea of a match, not ours.
            found += [
                t
                for t in results
                if (t.get("custom_fields") or {}).get(self.external_ref_field, external_ref) == external_ref
            ]
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
        text = json.dumps(
            [{k: e.get(k) for k in ("field", "message", "code")} for e in errors if isinstance(e, dict)], sort_keys=True
        )
    else:
        text = json.dumps(body or {"status": 400}, sort_keys=True)
    return mask_address(text)[:2000]


def text_to_html(text: str) -> str:
    """Freshdesk bodies are HTML: the text escaped, each line break a <br>."""
    return re.sub(r"\r\n|\r|\n", "<br>", html.escape(text or ""))


def listing_of(text: str) -> str:
    """The end of the pipeline's plain text that lists the files and people (LISTING_HEADS), "" without one:
    what the HTML body lacks."""
    found = [at for at in (text.rfind(head) for head in LISTING_HEADS) if at >= 0]
    return text[min(found) :] if found else ""


def rich_html(text: str, html_text: str) -> str:
    """The HTML a body goes as: the sanitized HTML (inline images whose file is not on the desk yet dropped:
    the file itself is attached) with the text's list of files, or the text escaped."""
    if html_text and html_text.strip():
        return resolve_cid(html_text, {}) + text_to_html(listing_of(text))
    return text_to_html(text)


def note_html(comment: CommentRequest, *, written_as_author: bool) -> str:
    """A note's body; opened by a "From:" line unless it is written as its author's contact."""
    body = rich_html(comment.body, comment.html)
    if written_as_author:
        return body
    name, address = email.utils.parseaddr(comment.author_email)
    shown = email.utils.formataddr((comment.author_name or name, address or comment.author_email))
    who = "an agent" if comment.from_agent else "the customer"
    return f"<p>From {who}: {html.escape(shown)}</p>" + body


def within_total(files, budget: int) -> tuple[list[OutgoingFile], list[OutgoingFile]]:
    """(the files that fit in `budget` bytes all together, in order; the ones past it)."""
    sending, over, total = [], [], 0
    for file in files:
        if total + file.size <= budget:
            sending.append(file)
            total += file.size
        else:
            over.append(file)
    return sending, over


def held_back_html(files) -> str:
    if not files:
        return ""
    items = "".join(f"<li>{html.escape(f.filename)}</li>" for f in files)
    return (
        "<p>Not attached here, past Freshdesk's 20 MB for all of a ticket's attachments "
        f"(kept in Mailroom):</p><ul>{items}</ul>"
    )


def ticket_payload(request: TicketRequest, external_ref: str, settings: dict, ticket_url=None) -> dict:
    """The Freshdesk ticket. Deterministic: a retry sends the very same body. `ticket_url(id)`: where the
    closed ticket a follow-up follows is shown (a link in the description)."""
    name, address = email.utils.parseaddr(request.requester)
    # Freshdesk refuses a tag with a comma in it.
    tags = list(dict.fromkeys(t for t in (" ".join(str(tag).replace(",", " ").split()) for tag in request.tags) if t))
    description = rich_html(request.description, request.html)
    if request.follow_up_of:
        closed = html.escape(str(request.follow_up_of))
        url = ticket_url(request.follow_up_of) if ticket_url else ""
        shown = f'<a href="{html.escape(url)}">#{closed}</a>' if url else f"#{closed}"
        description = f"<p>Follow-up of ticket {shown}, which is closed.</p>" + description
    ticket = {
        "subject": " ".join(request.subject.split())[:MAX_SUBJECT_CHARS] or "(no subject)",
        "description": description,
        "email": address or request.requester,
        "status": STATUS_OPEN,
        "source": SOURCE_EMAIL,
        "tags": tags,
    }
    if request.requester_name or name:
        ticket["name"] = request.requester_name or name  # used when Freshdesk makes a new contact for the address
    if request.cc:
        ticket["cc_emails"] = list(dict.fromkeys(request.cc))
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
    for field_name, value in sorted((request.fields or {}).items()):
        if str(field_name).startswith("cf_"):
            custom_fields[field_name] = value
        else:
            ticket[field_name] = value
    ticket["custom_fields"] = dict(sorted(custom_fields.items()))
    return ticket


# --- multipart/form-data, as Freshdesk reads it (Rails' nested parameters) ---------------------------------


def form_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def form_fields(record: dict) -> list[tuple[str, str]]:
    """A JSON record as form fields: a list as `name[]` once per item, an object as `name[key]`."""
    fields = []
    for name, value in record.items():
        if isinstance(value, (list, tuple)):
            fields += [(f"{name}[]", form_value(item)) for item in value]
        elif isinstance(value, dict):
            fields += [(f"{name}[{key}]", form_value(item)) for key, item in value.items()]
        else:
            fields.append((name, form_value(value)))
    return fields


FORM_ESCAPES = {"%": "%25", '"': "%22", "\\": "%5C", "\r": "%0D", "\n": "%0A"}


def _quoted(text: str) -> str:
    """A Content-Disposition parameter value: UTF-8, with quotes, backslashes and line breaks percent-encoded as
    browsers do (RFC 7578 §4.2; Rails' multipart parser decodes them), and "%" itself, so that it reads back."""
    return "".join(FORM_ESCAPES.get(character, character) for character in text)


def multipart_body(fields: list[tuple[str, str]], files, idempotency_key: str) -> tuple[bytes, str]:
    """(the body, its Content-Type) with `fields` and each file as `attachments[]`. The boundary is derived from
    `idempotency_key` (and, should it occur in the content, a counter): the same on every attempt."""
    parts = [
        (
            f'Content-Disposition: form-data; name="{_quoted(name)}"\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n'
        ).encode()
        + value.encode()
        for name, value in fields
    ]
    for file in files:
        data = file.read()
        parts.append(
            (
                f'Content-Disposition: form-data; name="attachments[]"; filename="{_quoted(file.filename)}"'
                f"\r\nContent-Type: {file.content_type or 'application/octet-stream'}\r\n\r\n"
            ).encode()
            + data
        )
    for counter in range(100):
        seed = f"{idempotency_key}:{counter}".encode()
        boundary = f"mailroom-{hashlib.sha256(seed).hexdigest()[:40]}"
        if not any(boundary.encode() in part for part in parts):
            break
    else:  # a hash that occurs in 100 attempts' content is no accident
        raise PermanentError(ReasonCode.INVALID_FIELDS, "no multipart boundary fits the files")
    delimiter = f"--{boundary}\r\n".encode()
    body = b"".join(delimiter + part + b"\r\n" for part in parts) + f"--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def settle_seconds(value) -> float:
    """The search's settle delay: the setting, or the default when it is not set (0 is a value)."""
    return float(DEFAULT_SETTLE_SECONDS if value is None else value)

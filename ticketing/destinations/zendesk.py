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

What a ticket carries (docs/destinations/zendesk.md says it in words):
- Files: each is uploaded first (`POST /api/v2/uploads.json?filename=…`, the raw bytes), and the create or
  update comment names the tokens (`"uploads"`). Tokens are noted in the journal and reused while valid
  (`ticketing.destinations.files.reuse_upload`), so a retried write sends the very same body under its
  Idempotency-Key and Zendesk answers it with the original ticket. A lost upload answer is only transient:
  nothing is on a ticket until a write names the token, and an unused upload expires.
- The body: `html_body` (the sanitized HTML, `cid:` images pointing at their uploads' content_url, the
  attachment list appended) when the message has HTML, else `body` (the plain text).
- People: the requester by email and name (Zendesk finds or makes the end user), the CC'd addresses as
  `email_ccs`; a customer's reply is written as that customer (`author_id`, found by
  `GET /api/v2/users/search.json?query=email:…` or made by `POST /api/v2/users/create_or_update.json`), an
  agent's mail as a private note (as that agent when Zendesk knows the address as an agent, else the API
  user).
- Closed tickets: Zendesk refuses any update to one with 422 RecordInvalid "Status: closed prevents ticket
  update": `TicketClosed`; a follow-up ticket names the closed one in `via_followup_source_id`.
- Archive history (`TicketRequest.status` "closed"): `POST /api/v2/imports/tickets`, the same body made
  `status: closed` with `created_at`/`updated_at`/`solved_at` and the comment's `created_at` set to when the
  message was written; the Import API runs no trigger and sends no notification. Needs an admin's token.
- Zendesk's own references: "Request #123" / "Ticket #123" in a reply's subject and "Your request (#123)"
  (its default notification's first line) in its text; the encoded id ("[ABCD-EFGH]") is not read, since no
  public API decodes it.

Nothing logged here contains a ticket body or a full email address.
"""

import datetime
import email.utils
import functools
import html
import json
import logging
import re

from intake.vocabulary import ReasonCode

from ..rich_body import resolve_cid
from .base import (
    AmbiguousOutcome,
    CommentRequest,
    DestinationRecord,
    OutgoingFile,
    PermanentError,
    RecordPage,
    TicketClosed,
    TicketRequest,
    TicketResult,
    TransientError,
)
from .capabilities import FILES_WITH_WRITE, FOLLOW_UP, MB, REQUESTER_FIND_OR_CREATE, REVIEW, Capabilities
from .files import reuse_upload
from .http import HttpDestination, json_object
from .settings import HTTP_SETTINGS, Flag, Mapping, Number, Text

log = logging.getLogger(__name__)

TICKETS_PATH = "/api/v2/tickets.json"
# Archive history goes through the Ticket Import API: no triggers run and no notification is sent (so no
# customer hears about old mail), the ticket is made closed with its own dates. Admins only.
IMPORTS_PATH = "/api/v2/imports/tickets"
# The journal step that remembers an import was sent under this key (see `_import_ticket`).
IMPORT_STEP = "import_sent"
UPLOADS_PATH = "/api/v2/uploads.json"
USERS_SEARCH_PATH = "/api/v2/users/search.json"
USERS_UPSERT_PATH = "/api/v2/users/create_or_update.json"
MAX_LOOKUP_PAGES = 10
# Zendesk keeps an upload token for 60 minutes; one older than 45 is uploaded again, so that no write (nor a
# retry of one, waiting for its backoff) carries a token that expires on the way.
UPLOAD_VALID_SECONDS = 45 * 60
AGENT_ROLES = ("agent", "admin")
# The journal step that remembers who a comment is written as (a Zendesk user id, or None: the API user).
AUTHOR_STEP = "author_id"
# The heading `ticketing.ticket_files.file_list` opens the description's list of files with.
ATTACHMENTS_HEADING = "\n\nAttachments:\n"
CLOSED_REFUSAL = "closed prevents ticket update"


class ZendeskDestination(HttpDestination):
    name = "zendesk"
    honours_idempotency_key = True
    idempotency_window_seconds = 7200
    # Listing by external_id is treated as consistent: it sees a ticket once its create returned.
    consistent_lookup = True
    # Zendesk refuses a comment body over 65,535 characters; 64,000 leaves room for its own markup.
    max_description_chars = 64_000

    capabilities = Capabilities(
        files=FILES_WITH_WRITE,
        max_file_bytes=50 * MB,  # Zendesk's limit per attachment
        html=True,
        requester=REQUESTER_FIND_OR_CREATE,
        cc_field="email_ccs",
        customer_authored_comments=True,
        internal_notes=True,
        closed_policies=(FOLLOW_UP, REVIEW),
        acknowledges_requester=True,  # the standard trigger "Notify requester and CCs of received request"
        requests_per_minute=700,  # Support Professional/Enterprise; Team has 200, the add-on 2,500
    )
    # The ticket id as Zendesk's notifications show it: its standard triggers' text says "Your request (#123)";
    # a subject with "Request #123" / "Ticket #123" is the common customization of theirs.
    reference_patterns = (
        re.compile(r"\b(?:request|ticket)\s*#\s*(?P<ref>\d{1,12})\b", re.IGNORECASE),
        re.compile(r"\byour request\s*\(#?(?P<ref>\d{1,12})\)", re.IGNORECASE),
    )
    reference_fields = ("subject", "body")

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
        uploads = self._uploads(request.files, idempotency_key)
        ticket = ticket_payload(request, external_ref, self.destination.settings or {}, uploads=uploads)
        if request.status == "closed":
            return self._import_ticket(ticket, idempotency_key, external_ref)
        response = self._send(
            "POST", TICKETS_PATH, write=True, idempotency_key=idempotency_key, json_body={"ticket": ticket}
        )
        ticket = _json(response, write=True).get("ticket") or {}
        if "id" not in ticket:
            # It answered 2xx, so the ticket probably exists; only a lookup can tell which.
            raise AmbiguousOutcome(ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code} without a ticket id")
        log.info(
            "zendesk: created ticket %s for %s (%d file(s); idempotency lookup: %s)",
            ticket["id"],
            external_ref,
            len(request.files),
            response.headers.get("x-idempotency-lookup", "none"),
        )
        return self._result(ticket)

    def _import_ticket(self, ticket: dict, idempotency_key: str, external_ref: str) -> TicketResult:
        """Archive history, made closed through the Ticket Import API (same body, same external_id). Zendesk
        documents its Idempotency-Key for ticket creation, not for imports: the key is sent, but an import
        already sent under it is first looked up by external_id, so a lost answer never makes a second
        ticket. Not `archive_immediately`: the list by external_id does not show archived tickets."""
        if self.consistent_lookup and self.journal.get(IMPORT_STEP) == idempotency_key:
            found = self.find_by_external_ref(external_ref)
            if found is not None:
                log.info("zendesk: import for %s already made ticket %s", external_ref, found.ticket_id)
                return found
        self.journal.put(IMPORT_STEP, idempotency_key)
        response = self._send(
            "POST", IMPORTS_PATH, write=True, idempotency_key=idempotency_key, json_body={"ticket": ticket}
        )
        made = _json(response, write=True).get("ticket") or {}
        if "id" not in made:
            raise AmbiguousOutcome(ReasonCode.UNREADABLE_RESPONSE, f"HTTP {response.status_code} without a ticket id")
        log.info("zendesk: imported closed ticket %s for %s", made["id"], external_ref)
        return self._result(made)

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        if not self.consistent_lookup:
            raise NotImplementedError("this Zendesk destination declares lookup_supported = false")
        # external_id is not unique: the lowest id is the first ticket a create made, the one to keep.
        matches = self._with_external_id(external_ref)
        if not matches:
            return None
        ticket = min(matches, key=lambda t: int(t["id"]))
        if len(matches) > 1:
            log.warning(
                "zendesk: %d tickets carry external_id %s; keeping the lowest id %s",
                len(matches),
                external_ref,
                ticket["id"],
            )
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
        if not str(ticket_id).isdigit():
            raise PermanentError(ReasonCode.NOT_FOUND, "a Zendesk ticket id is a number")
        # An agent's mail is an internal note; a customer's reply is public unless this destination says not.
        public = comment.public and not comment.from_agent and self.comment_public
        author_id = self._author_id(comment, idempotency_key, public=public)
        uploads = self._uploads(comment.files, idempotency_key)
        text, rich = comment.body, comment.html
        if public and author_id is None:
            # Written as the API user: say who wrote it, as kinds without authored comments do.
            sender = (
                comment.author_email
                if "<" in comment.author_email or not comment.author_name
                else (f"{comment.author_name} <{comment.author_email}>")
            )
            text = f"From: {sender}\n\n{text}"
            rich = f"<p>From: {html.escape(sender)}</p>{rich}" if rich and rich.strip() else rich
        body = comment_body(text, rich, comment.files, uploads, self.max_description_chars)
        body["public"] = public
        if author_id is not None:
            body["author_id"] = author_id
        ticket = {"comment": body, "metadata": {"external_ref": external_ref}}
        if public and comment.cc:
            ticket["email_ccs"] = email_ccs(comment.cc)
        response = self._send(
            "PUT",
            f"/api/v2/tickets/{ticket_id}.json",
            write=True,
            idempotency_key=idempotency_key,
            json_body={"ticket": ticket},
        )
        audit = _json(response, write=True).get("audit") or {}
        comment_ids = [e.get("id") for e in audit.get("events") or [] if e.get("type") == "Comment" and e.get("id")]
        log.info(
            "zendesk: commented on ticket %s for %s (%s, author %s, %d file(s); idempotency lookup: %s)",
            ticket_id,
            external_ref,
            "public" if public else "private",
            "API user" if author_id is None else f"user {author_id}",
            len(body.get("uploads") or ()),
            response.headers.get("x-idempotency-lookup", "none"),
        )
        # The comment id when Zendesk reports it, else the ticket: the comment is on it either way.
        return str(comment_ids[0]) if comment_ids else str(ticket_id)

    # --- Files: uploaded before the write, named by their tokens ---------------

    def _uploads(self, files, idempotency_key: str) -> dict[int, dict]:
        """{file index: {"token", "content_url"} or {"refused": reason}} for `files`, each uploaded once while its
        token is valid (the journal keeps them for the next attempt of this write)."""
        uploads = {}
        for file in files:
            upload = functools.partial(self._upload, file_key=file.key(idempotency_key))
            value = reuse_upload(self, file, upload, valid_seconds=UPLOAD_VALID_SECONDS)
            if value.get("file_key") != file.key(idempotency_key):
                # Noted by another write of this adapter object (its journal is not an intent's): not this file.
                self.journal.put(f"upload:{file.index}", {})
                value = reuse_upload(self, file, upload, valid_seconds=UPLOAD_VALID_SECONDS)
            uploads[file.index] = value
        return uploads

    def _upload(self, file: OutgoingFile, file_key: str) -> dict:
        try:
            response = self._send(
                "POST",
                UPLOADS_PATH,
                write=True,
                params={"filename": file.filename},
                data=file.read(),
                headers={"Content-Type": file.content_type or "application/octet-stream"},
                retry_safe=True,
            )
        except AmbiguousOutcome as exc:
            # Nothing is on a ticket until a write names the token: an upload whose answer was lost is made
            # again, and the lost one expires unused.
            raise TransientError(exc.reason, f"upload of file {file.index}: {exc.detail}") from exc
        except PermanentError as exc:
            if getattr(exc, "http_status", None) in (401, 403) or exc.reason in ("credentials", "configuration"):
                raise
            # A type the account's "Allowed file types" bans, a size over its plan: the ticket goes without it.
            log.warning("zendesk: file %s refused by the upload API (%s)", file.index, exc.reason)
            return {"refused": str(exc.reason), "file_key": file_key}
        upload = json_object(response, write=False).get("upload") or {}
        attachment = upload.get("attachment") or next(iter(upload.get("attachments") or []), {}) or {}
        if not upload.get("token"):
            raise TransientError(ReasonCode.UNREADABLE_RESPONSE, f"upload of file {file.index}: no token")
        return {
            "token": str(upload["token"]),
            "content_url": str(attachment.get("content_url") or ""),
            "file_key": file_key,
        }

    # --- People ------------------------------------------------------------------

    def _author_id(self, comment: CommentRequest, idempotency_key: str, *, public: bool) -> int | None:
        """Who `comment` is written as: the customer (found, else made an end user) for a public reply; for a
        note, the agent when Zendesk knows the address as one, else None (the API user). Noted in the journal
        so that a retry sends the same body."""
        noted = self.journal.get(AUTHOR_STEP)
        if isinstance(noted, dict) and noted.get("key") == idempotency_key:
            return noted.get("user_id")
        name, address = email.utils.parseaddr(comment.author_email)
        address = address or comment.author_email
        author_id = None
        if address and "@" in address:
            user = self._find_user(address)
            if public:
                user = user or self._create_end_user(address, comment.author_name or name)
                author_id = (user or {}).get("id")
            elif user and user.get("role") in AGENT_ROLES:
                author_id = user.get("id")
        author_id = int(author_id) if isinstance(author_id, int) or str(author_id or "").isdigit() else None
        self.journal.put(AUTHOR_STEP, {"user_id": author_id, "key": idempotency_key})
        return author_id

    def _find_user(self, address: str) -> dict | None:
        body = _json(
            self._send("GET", USERS_SEARCH_PATH, write=False, params={"query": f"email:{address}"}), write=False
        )
        return next(
            (
                user
                for user in body.get("users") or []
                if isinstance(user, dict) and str(user.get("email") or "").lower() == address.lower()
            ),
            None,
        )

    def _create_end_user(self, address: str, name: str) -> dict | None:
        """The end user made (or found) for `address`; None when the agent's role may not manage end users."""
        payload = {"user": {"email": address, "name": name or address.split("@")[0], "role": "end-user"}}
        try:
            # An upsert on the address: sending it again finds the one user, so a lost answer is retried.
            response = self._send("POST", USERS_UPSERT_PATH, write=True, json_body=payload, retry_safe=True)
        except AmbiguousOutcome as exc:
            raise TransientError(exc.reason, f"making the comment's author: {exc.detail}") from exc
        except PermanentError as exc:
            if getattr(exc, "http_status", None) != 403:
                raise
            # The token works (the search answered) but its role may not make users: the API user writes it.
            log.warning("zendesk: this agent may not make end users (HTTP 403); the comment is the API user's")
            return None
        user = json_object(response, write=False).get("user") or {}
        if not user.get("id"):
            raise TransientError(ReasonCode.UNREADABLE_RESPONSE, "the user upsert answered without an id")
        log.info("zendesk: comment author is user %s", user["id"])
        return user

    # --- The desk's own references ---------------------------------------------

    def resolve_reference(self, ref: str) -> str | None:
        """The ticket `ref` (a number from a notification) names, when Zendesk has it."""
        if not str(ref).isdigit():
            return None
        try:
            body = _json(self._send("GET", f"/api/v2/tickets/{int(ref)}.json", write=False), write=False)
        except PermanentError as exc:
            if exc.reason == ReasonCode.NOT_FOUND:
                return None
            raise
        ticket = body.get("ticket") or {}
        return str(ticket["id"]) if ticket.get("id") and ticket.get("status") != "deleted" else None

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
        records = [
            DestinationRecord(str(t["id"]), str(t["external_id"]), self.ticket_url(t["id"]))
            for t in body.get("tickets") or []
            if isinstance(t, dict)
            and "id" in t
            and str(t.get("external_id") or "").startswith(prefix)
            and t.get("status") != "deleted"
        ]
        cursor = body.get("after_cursor")
        done = bool(body.get("end_of_stream", True)) or not cursor
        return RecordPage(records, None if done else {"cursor": str(cursor)})

    def existing_tickets(self, ticket_ids: list[str]) -> set[str]:
        ids = [str(t) for t in ticket_ids if str(t).isdigit()]
        found = set()
        for start in range(0, len(ids), 100):
            params = {"ids": ",".join(ids[start : start + 100])}
            body = _json(self._send("GET", "/api/v2/tickets/show_many.json", write=False, params=params), write=False)
            found |= {
                str(t["id"])
                for t in body.get("tickets") or []
                if isinstance(t, dict) and "id" in t and t.get("status") != "deleted"
            }
        return found

    def records_for_ref(self, external_ref: str) -> list[DestinationRecord]:
        tickets = sorted(self._with_external_id(external_ref), key=lambda t: int(t["id"]))
        return [
            DestinationRecord(str(t["id"]), external_ref, self.ticket_url(t["id"]))
            for t in tickets
            if t.get("status") != "deleted"
        ]

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

    def _send(
        self,
        method: str,
        path: str,
        *,
        write: bool,
        idempotency_key: str | None = None,
        json_body=None,
        params=None,
        data=None,
        headers=None,
        retry_safe: bool | None = None,
    ):
        return self.send(
            method,
            path,
            write=write,
            idempotency_key=idempotency_key,
            json_body=json_body,
            params=params,
            data=data,
            headers=headers,
            retry_safe=retry_safe,
        )

    def special_error(self, response, body: dict, write: bool):
        if response.status_code == 400 and body.get("error") == "IdempotentRequestError":
            # Our key was used with another body: whether our ticket exists is for a lookup to say.
            return AmbiguousOutcome(ReasonCode.IDEMPOTENT_REQUEST_ERROR, f"HTTP {response.status_code}")
        if response.status_code == 422 and closed_refusal(body):
            return TicketClosed(f"HTTP {response.status_code}: Zendesk says the ticket is closed")
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


def ticket_payload(
    request: TicketRequest, external_ref: str, settings: dict | None = None, uploads: dict[int, dict] | None = None
) -> dict:
    """The Zendesk ticket for a request. Deterministic: a retry must send the very same body under its key.

    `settings` (the destination's) map the route; `request.fields` (standard names or custom field ids)
    are added last and win. `uploads`: what `_uploads` made of `request.files` ({index: token and URL}).
    """
    ticket = {
        "subject": request.subject,
        "comment": comment_body(
            request.description, request.html, request.files, uploads or {}, ZendeskDestination.max_description_chars
        ),
        "external_id": external_ref,
        "tags": list(request.tags),
    }
    name, address = email.utils.parseaddr(request.requester)
    address = address or request.requester
    if address:
        # Zendesk finds or creates the end user by email; a new one needs a name.
        ticket["requester"] = {"email": address, "name": request.requester_name or name or address.split("@")[0]}
    if request.cc:
        ticket["email_ccs"] = email_ccs(request.cc)
    if str(request.follow_up_of).isdigit():
        ticket["via_followup_source_id"] = int(request.follow_up_of)  # a follow-up of that closed ticket
    if request.status == "closed":
        # Archive history, for the Ticket Import API (`_import_ticket`): closed, dated when it was written.
        ticket["status"] = "closed"
        if request.created_at is not None:
            at = zendesk_time(request.created_at)
            ticket.update(created_at=at, updated_at=at, solved_at=at)
            ticket["comment"]["created_at"] = at
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


def zendesk_time(moment) -> str:
    """A time as Zendesk writes one: ISO 8601 in UTC, to the second."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def email_ccs(addresses) -> list[dict]:
    """Zendesk's email_ccs for addresses: each user found, or made, by address and added ("put")."""
    return [{"user_email": address, "action": "put"} for address in addresses if address]


def comment_body(text: str, html_text: str, files, uploads: dict[int, dict], max_chars: int | None = None) -> dict:
    """A Zendesk comment: `html_body` (images resolved, the file list appended) when there is HTML that fits,
    else `body`; `uploads` the tokens of the files uploaded for it."""
    tokens = [uploads[f.index]["token"] for f in files if (uploads.get(f.index) or {}).get("token")]
    refused = [f.filename for f in files if (uploads.get(f.index) or {}).get("refused")]
    refused_line = f"\n\nZendesk refused these files (kept in Mailroom): {', '.join(refused)}" if refused else ""
    comment = {"body": text + refused_line}
    if html_text and html_text.strip():
        urls = {
            f.content_id.strip("<>"): uploads[f.index]["content_url"]
            for f in files
            if f.content_id and (uploads.get(f.index) or {}).get("content_url")
        }
        rich = (
            resolve_cid(html_text, urls)
            + listing_html(text)
            + (f"<p>{html.escape(refused_line.strip())}</p>" if refused else "")
        )
        if max_chars is None or len(rich) <= max_chars:
            comment = {"html_body": rich}
    if tokens:
        comment["uploads"] = tokens
    return comment


def listing_html(text: str) -> str:
    """The list of files the plain text ends with (`ticketing.ticket_files.file_list`), as escaped HTML."""
    at = (text or "").rfind(ATTACHMENTS_HEADING)
    if at < 0:
        return ""
    lines = [line for line in text[at + len(ATTACHMENTS_HEADING) :].splitlines() if line.strip()]
    items = "".join(f"<li>{html.escape(line.removeprefix('- '))}</li>" for line in lines)
    return f"<p>Attachments:</p><ul>{items}</ul>" if items else ""


def closed_refusal(body: dict) -> bool:
    """Is this 422 Zendesk's refusal of an update to a closed ticket (details naming "closed prevents ticket
    update", under `status` or `base`)?"""
    details = body.get("details") if isinstance(body, dict) else None
    return bool(details) and CLOSED_REFUSAL in json.dumps(details).lower()


_json = json_object

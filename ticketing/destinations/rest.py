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
    files ("none" | "inline" | "per_file"), attachment_url_template ({ticket_id} {file_key}), attachment_method
    (POST), attachment_body_template, attachment_id_path, attachment_lookup_url_template ({ticket_id}
    {file_key}) + attachment_lookup_id_path, closed_status (the HTTP status a write to a closed record gets),
    reference_template (how the API's notifications name a record in their subject, e.g. "[REC-{ticket_id}]").
Body template context: subject, description, requester, requester_email, requester_name, tags (a list),
tags_json (a JSON array), cc (a list), cc_json, html (sanitized HTML, "" for plain mail), files (a list of
{filename, content_type, size, sha256, content_base64}), files_json, follow_up_of (the closed record this one
follows up, ""), queue, priority, request_type, assignee, external_ref, idempotency_key.
Comment template context: body, author (the address), author_name, public, from_agent (true/false), html, cc,
cc_json, files, files_json, ticket_id, external_ref, idempotency_key.
Attachment template context: filename, content_type, size, sha256, content_base64, file_key, ticket_id, public.

Files go one of two declared ways (`files`): "inline", in the create (and comment) body where the template writes
`files_json` or loops over `files` (capabilities.files "with_write": under the create's key, a retry sends the
same body); or "per_file", one `attachment_*` call per file on the record after it exists ("after_write", an
`attach_files` intent), declared only with a way to settle a lost answer: the idempotency header (each file has
its own key) or the attachment lookup. `capabilities` follows the settings: html only where a template writes
{{ html }}, CCs on the record where the body writes cc, comments authored where the comment template writes the
author (else the body opens with a "From:" line), follow-ups where `closed_status` is declared.
`Destination.credentials_ref`: any secret, used only where a header says {secret}
(e.g. {"Authorization": "Bearer {secret}"}).

Nothing logged here contains a ticket body, a header value or a full email address.
"""

import base64
import email.utils
import json
import logging
import re
import uuid

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
from .capabilities import (
    FILES_AFTER_WRITE,
    FILES_NONE,
    FILES_WITH_WRITE,
    FOLLOW_UP,
    MB,
    REQUESTER_ADDRESS,
    REVIEW,
    Capabilities,
)
from .http import HttpDestination
from .rest_templates import (
    DOTTED_PATH,
    PLACEHOLDER,
    RawJson,
    TemplateProblem,
    at_path,
    fill_url,
    header_check,
    json_template_check,
    mentions,
    render_json,
    route_value_check,
    url_template_check,
)
from .settings import HTTP_SETTINGS, Anything, Flag, Number, Text

log = logging.getLogger(__name__)

ROUTE = ("queue", "priority", "request_type", "assignee")
ROUTE_MAPPINGS = {"queue": "queues", "priority": "priorities", "request_type": "request_types", "assignee": "assignees"}
CREATE_PLACEHOLDERS = ("external_ref", "idempotency_key") + ROUTE
COMMENT_PLACEHOLDERS = ("ticket_id", "external_ref", "idempotency_key")
ATTACHMENT_PLACEHOLDERS = ("ticket_id", "file_key")
FILES_INLINE, FILES_PER_FILE = "inline", "per_file"
# Inline files travel as base64 inside JSON (a third larger, and held in memory while rendered): 10 MB each
# unless the destination's `max_file_bytes` says what its API takes.
DEFAULT_MAX_FILE_BYTES = 10 * MB
SAMPLE_FILE = {
    "filename": "screenshot.png",
    "content_type": "image/png",
    "size": 3,
    "sha256": "709e80c88487a2411e1ee4dfb9f22a861492d20c4765150c0c794abd70f8147c",
    "content_base64": "AAAA",
}
SAMPLE_BODY = {
    "subject": 'A "sample" subject',
    "description": "Line 1\nLine 2",
    "requester": "J <j@example.com>",
    "requester_email": "j@example.com",
    "requester_name": "J",
    "tags": ["email"],
    "tags_json": RawJson('["email"]'),
    "cc": ["c@example.com"],
    "cc_json": RawJson('["c@example.com"]'),
    "html": "<p>Line 1</p>",
    "files": [SAMPLE_FILE],
    "files_json": RawJson(json.dumps([SAMPLE_FILE])),
    "follow_up_of": "41",
    "queue": "billing",
    "priority": "high",
    "request_type": "refund",
    "assignee": "alice",
    "external_ref": "mr-sample",
    "idempotency_key": "key-sample",
}
SAMPLE_COMMENT = {
    "body": "A reply",
    "author": "j@example.com",
    "author_name": "J",
    "public": True,
    "from_agent": False,
    "html": "<p>A reply</p>",
    "cc": ["c@example.com"],
    "cc_json": RawJson('["c@example.com"]'),
    "files": [SAMPLE_FILE],
    "files_json": RawJson(json.dumps([SAMPLE_FILE])),
    "ticket_id": "1",
    "external_ref": "mr-sample",
    "idempotency_key": "key-sample",
}
SAMPLE_ATTACHMENT = {**SAMPLE_FILE, "file_key": "key-sample-f0", "ticket_id": "1", "public": True}
METHODS = ("POST", "PUT", "PATCH")
# What a record id in a notification's subject may look like (reference_template's {ticket_id}).
REFERENCE_ID = r"(?P<ref>[A-Za-z0-9][A-Za-z0-9_.:/-]{0,63})"


def reference_template_check(value) -> list[str]:
    if not isinstance(value, str):
        return ["must be text, e.g. [REC-{ticket_id}]"]
    names = PLACEHOLDER.findall(value)
    if names != ["ticket_id"]:
        return ["must hold {ticket_id} once and no other placeholder"]
    if len(value) > 100 or len(value.replace("{ticket_id}", "").strip()) < 2:
        return ["must be at most 100 characters, with at least 2 around {ticket_id}"]
    return []


def reference_pattern(template: str):
    """A reference_template as the pattern that finds it (its text literal, the id a printable token)."""
    before, _, after = template.partition("{ticket_id}")
    return re.compile(re.escape(before) + REFERENCE_ID + re.escape(after))


def files_mode(settings: dict) -> str:
    """How files reach this API (Capabilities.files), from what the settings declare; "none" when the declaration
    is incomplete (a body that does not write them, a per-file call without a way to settle a lost answer)."""
    mode, body = settings.get("files"), settings.get("body_template")
    if mode == FILES_INLINE and (mentions(body, "files") or mentions(body, "files_json")):
        return FILES_WITH_WRITE
    settles = settings.get("idempotency_header") or (
        settings.get("attachment_lookup_url_template") and settings.get("attachment_lookup_id_path")
    )
    if (
        mode == FILES_PER_FILE
        and settings.get("attachment_url_template")
        and settings.get("attachment_body_template")
        and settles
    ):
        return FILES_AFTER_WRITE
    return FILES_NONE


def declared_capabilities(settings: dict) -> Capabilities:
    """What a REST destination so configured does with files, HTML, people, authorship and closed records."""
    body, comment = settings.get("body_template"), settings.get("comment_body_template")
    quota = settings.get("requests_per_minute")
    return Capabilities(
        files=files_mode(settings),
        max_file_bytes=int(settings.get("max_file_bytes") or DEFAULT_MAX_FILE_BYTES),
        html=mentions(body, "html") or mentions(comment, "html"),
        requester=REQUESTER_ADDRESS,
        cc_field="cc" if mentions(body, "cc") or mentions(body, "cc_json") else "",
        customer_authored_comments=mentions(comment, "author") or mentions(comment, "author_name"),
        internal_notes=mentions(comment, "public") or mentions(comment, "from_agent"),
        closed_policies=(FOLLOW_UP, REVIEW) if settings.get("closed_status") else (REVIEW,),
        acknowledges_requester=False,
        requests_per_minute=int(quota) if quota else None,
    )


class DeclaredCapabilities:
    """`RestDestination.capabilities`: a property of each destination (its settings declare them); read on the
    class, what a REST destination declaring nothing does."""

    def __get__(self, adapter, owner=None) -> Capabilities:
        return declared_capabilities({} if adapter is None else adapter.settings)


class RestDestination(HttpDestination):
    name = "rest"
    needs_base_url = False  # every URL template may be absolute
    needs_credentials = False  # an internal API may need none
    fetched_url_settings = (
        "create_url",
        "lookup_url_template",
        "comment_url_template",
        "check_url",
        "attachment_url_template",
        "attachment_lookup_url_template",
    )
    capabilities = DeclaredCapabilities()

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
        "files": Text(
            choices=("none", FILES_INLINE, FILES_PER_FILE),
            help="inline: files_json in the bodies; per_file: one attachment call per file",
        ),
        "attachment_url_template": Anything(check=url_template_check(ATTACHMENT_PLACEHOLDERS)),
        "attachment_method": Text(choices=METHODS),
        "attachment_body_template": Anything(check=json_template_check(SAMPLE_ATTACHMENT)),
        "attachment_id_path": Text(pattern=DOTTED_PATH),
        "attachment_lookup_url_template": Anything(check=url_template_check(ATTACHMENT_PLACEHOLDERS)),
        "attachment_lookup_id_path": Text(pattern=DOTTED_PATH, help='where the lookup names the file, "data.0.id"'),
        "closed_status": Number(
            minimum=400,
            maximum=499,
            integer=True,
            help="the status a comment on a closed record is answered with (e.g. 409)",
        ),
        "reference_template": Anything(
            check=reference_template_check, help="the record as the API's notifications name it, e.g. [REC-{ticket_id}]"
        ),
    }

    def __init__(self, destination):
        super().__init__(destination)
        settings = self.settings
        self.idempotency_header = settings.get("idempotency_header") or ""
        self.honours_idempotency_key = bool(self.idempotency_header)
        self.idempotency_window_seconds = (
            int(settings.get("idempotency_window_seconds") or 3600) if self.honours_idempotency_key else None
        )
        self.upsert = bool(settings.get("upsert", False))
        lookup = bool(settings.get("lookup_url_template") and settings.get("lookup_id_path"))
        settle = settings.get("lookup_settle_seconds")
        self.consistent_lookup = lookup and settle is None
        self.lookup_settle_seconds = float(settle) if lookup and settle is not None else None
        self.max_description_chars = settings.get("max_description_chars")
        reference = settings.get("reference_template")
        if isinstance(reference, str) and not reference_template_check(reference):
            self.reference_patterns = (reference_pattern(reference),)

    # --- The interface ------------------------------------------------------

    def create_ticket(self, request: TicketRequest, idempotency_key: str, external_ref: str) -> TicketResult:
        route = self._route(request)
        context = body_context(
            request,
            route,
            idempotency_key,
            external_ref,
            files=request.files if self.capabilities.files == FILES_WITH_WRITE else (),
        )
        if request.follow_up_of and not mentions(self.settings.get("body_template"), "follow_up_of"):
            context["description"] = (
                f"Follow-up of record {request.follow_up_of}, which is closed.\n\n" + context["description"]
            )
        body = self._render("body_template", context)
        if request.fields:
            if not isinstance(body, dict):
                raise PermanentError(ReasonCode.CONFIGURATION, "extra fields need a body_template that is an object")
            body = {**body, **dict(sorted(request.fields.items(), key=lambda item: str(item[0])))}
        url = self._fill(
            "create_url",
            {
                "external_ref": external_ref,
                "idempotency_key": idempotency_key,
                **{name: route[name] or "" for name in ROUTE},
            },
        )
        # A declared upsert makes the create (only) safe to send twice.
        response = self._write(
            self.settings.get("create_method") or "POST",
            url,
            body,
            idempotency_key,
            retry_safe=self.retry_safe or self.upsert,
        )
        ticket_id = self._id_in(response, "id_path")
        if ticket_id is None:
            # It answered 2xx, so the record probably exists; only a declared lookup can tell which.
            raise AmbiguousOutcome(
                ReasonCode.UNREADABLE_RESPONSE,
                f"HTTP {response.status_code} without an id at {self.settings['id_path']}",
            )
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
            raise PermanentError(
                ReasonCode.CONFIGURATION, f"the value at lookup_id_path is not a usable ticket id ({TICKET_ID_RULE})"
            )
        return TicketResult(ticket_id=ticket_id, url=self.ticket_url(ticket_id))

    def add_comment(self, ticket_id: str, comment: CommentRequest, idempotency_key: str, external_ref: str) -> str:
        if not (self.settings.get("comment_url_template") and self.settings.get("comment_body_template")):
            raise PermanentError(ReasonCode.CONFIGURATION, "declare comment_url_template and comment_body_template")
        capabilities = self.capabilities
        body = comment.body
        if not capabilities.customer_authored_comments:
            # The API is not told who wrote it: the text says so.
            name, address = email.utils.parseaddr(comment.author_email)
            shown = email.utils.formataddr((comment.author_name or name, address or comment.author_email))
            body = f"From: {shown}\n\n{body}"
        files = comment.files if capabilities.files == FILES_WITH_WRITE else ()
        template = self.settings.get("comment_body_template")
        if files and not (mentions(template, "files") or mentions(template, "files_json")):
            log.warning(
                "rest: comment_body_template writes no files: %d file(s) of a comment on %s not sent",
                len(files),
                ticket_id,
            )
        context = {
            "body": body,
            "author": comment.author_email,
            "author_name": comment.author_name,
            "public": comment.public,
            "from_agent": comment.from_agent,
            "html": comment.html,
            **people_context(comment.cc),
            **files_context(files),
            "ticket_id": str(ticket_id),
            "external_ref": external_ref,
            "idempotency_key": idempotency_key,
        }
        payload = self._render("comment_body_template", context)
        url = self._fill("comment_url_template", {k: context[k] for k in COMMENT_PLACEHOLDERS})
        # `upsert` covers the create only: a comment sent twice is two comments (unless a key is declared).
        response = self._write(
            self.settings.get("comment_method") or "POST", url, payload, idempotency_key, closed_too=True
        )
        self._refuse_if_closed(response, ticket_id)
        comment_id = self._id_in(response, "comment_id_path") if self.settings.get("comment_id_path") else None
        log.info(
            "rest: commented on %s for %s (HTTP %s, %s, %d file(s))",
            ticket_id,
            external_ref,
            response.status_code,
            "public" if comment.public else "private",
            len(files),
        )
        return comment_id or str(ticket_id)

    # --- files after the write (files "per_file") ------------------------------------------------

    def upload_file(self, ticket_id: str, file: OutgoingFile, file_key: str, *, public: bool = True) -> str:
        if self.capabilities.files != FILES_AFTER_WRITE:
            raise PermanentError(ReasonCode.CONFIGURATION, "this REST destination declares no per-file call")
        context = {**file_record(file), "file_key": file_key, "ticket_id": str(ticket_id), "public": public}
        payload = self._render("attachment_body_template", context)
        url = self._fill("attachment_url_template", {"ticket_id": ticket_id, "file_key": file_key})
        # Under the file's own key where the API keeps one: sent again, it answers the first call's file.
        response = self._write(
            self.settings.get("attachment_method") or "POST", url, payload, file_key, closed_too=True
        )
        self._refuse_if_closed(response, ticket_id)
        file_id = self._id_in(response, "attachment_id_path") if self.settings.get("attachment_id_path") else None
        log.info("rest: attached file %s to %s (HTTP %s)", file.index, ticket_id, response.status_code)
        return file_id or file_key

    def find_file(self, ticket_id: str, file: OutgoingFile, file_key: str) -> str | None:
        if not (self.settings.get("attachment_lookup_url_template") and self.settings.get("attachment_lookup_id_path")):
            # Declared with the idempotency header instead: the next call under the file's key is the lookup.
            return None
        url = self._fill("attachment_lookup_url_template", {"ticket_id": ticket_id, "file_key": file_key})
        response = self.send("GET", url, write=False, ok_statuses=[*range(200, 300), 404])
        if response.status_code == 404:
            return None
        found = at_path(self._document(response, write=False), self.settings["attachment_lookup_id_path"])
        if found is None or found == "" or found == []:
            return None
        file_id = usable_ticket_id(found) if isinstance(found, (str, int)) and not isinstance(found, bool) else None
        if file_id is None:
            raise PermanentError(
                ReasonCode.CONFIGURATION,
                f"the value at attachment_lookup_id_path is not a usable id ({TICKET_ID_RULE})",
            )
        return file_id

    def resolve_reference(self, ref: str) -> str | None:
        """A reference_template's id is the record's id (as the create's answer named it)."""
        return usable_ticket_id(ref)

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
                raise PermanentError(
                    ReasonCode.CONFIGURATION,
                    "the lookup found a record for a made-up reference: check lookup_url_template and lookup_id_path",
                )
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

    def _write(
        self,
        method: str,
        url: str,
        body,
        idempotency_key: str,
        retry_safe: bool | None = None,
        closed_too: bool = False,
    ):
        """One write; `closed_too`: the declared closed_status is an answer to read (`_refuse_if_closed`)."""
        key = idempotency_key if self.idempotency_header else None
        closed = self.settings.get("closed_status")
        ok = [*range(200, 300), int(closed)] if closed_too and closed else range(200, 300)
        return self.send(
            method,
            url,
            write=True,
            json_body=body,
            idempotency_key=key,
            idempotency_header=self.idempotency_header or "Idempotency-Key",
            retry_safe=retry_safe,
            ok_statuses=ok,
        )

    def _refuse_if_closed(self, response, ticket_id) -> None:
        closed = self.settings.get("closed_status")
        if closed and response.status_code == int(closed):
            raise TicketClosed(f"HTTP {response.status_code}: record {ticket_id} is closed (closed_status)")

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
            raise AmbiguousOutcome(
                ReasonCode.UNREADABLE_RESPONSE,
                f"HTTP {response.status_code}: the value at {self.settings[setting]} is not a "
                f"usable id ({TICKET_ID_RULE})",
            )
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
TICKET_ID_RULE = (
    f"at most {MAX_TICKET_ID_CHARS} printable ASCII characters, without spaces, quotes, backslashes or < > &"
)


def usable_ticket_id(value) -> str | None:
    """`value` as a ticket id, or None when it breaks TICKET_ID_RULE."""
    text = str(value)
    return text if TICKET_ID.fullmatch(text) else None


def people_context(cc) -> dict:
    return {"cc": list(cc), "cc_json": RawJson(json.dumps(list(cc), ensure_ascii=False))}


def file_record(file: OutgoingFile) -> dict:
    """A file as the templates see it."""
    return {
        "filename": file.filename,
        "content_type": file.content_type or "application/octet-stream",
        "size": file.size,
        "sha256": file.sha256,
        "content_base64": base64.b64encode(file.read()).decode(),
    }


def files_context(files) -> dict:
    records = [file_record(file) for file in files]
    return {"files": records, "files_json": RawJson(json.dumps(records, ensure_ascii=False))}


def body_context(request: TicketRequest, route: dict, idempotency_key: str, external_ref: str, files=()) -> dict:
    """What body_template sees (the module doc lists it); the template engine escapes each value."""
    name, address = email.utils.parseaddr(request.requester)
    address = address or request.requester
    return {
        "subject": request.subject,
        "description": request.description,
        "requester": request.requester,
        "requester_email": address,
        "requester_name": request.requester_name or name or address.split("@")[0],
        "tags": list(request.tags),
        "tags_json": RawJson(json.dumps(list(request.tags), ensure_ascii=False)),
        **people_context(request.cc),
        "html": request.html,
        **files_context(files),
        "follow_up_of": request.follow_up_of,
        **route,
        "external_ref": external_ref,
        "idempotency_key": idempotency_key,
    }

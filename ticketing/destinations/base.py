"""The one interface every destination adapter implements (docs/design.md §6 "The intent state machine").

Adapters raise only `TransientError`, `PermanentError` or `AmbiguousOutcome`;
what each capability flag allows when an outcome is unknown is decided in
`ticketing.intents.resolve_unknown`, not here.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from intake.failures import AmbiguousOutcome, PermanentError, TransientError
from intake.vocabulary import ReasonCode

from .capabilities import Capabilities
from .journal import Journal, MemoryJournal

if TYPE_CHECKING:
    from ..models import Destination
    from .settings import Setting

__all__ = [
    "AmbiguousOutcome",
    "Capabilities",
    "CommentRequest",
    "HeldFile",
    "Journal",
    "OutgoingFile",
    "TicketClosed",
    "DestinationAdapter",
    "DestinationRecord",
    "PermanentError",
    "RecordPage",
    "TicketRequest",
    "TicketResult",
    "TransientError",
]


@dataclass(frozen=True)
class OutgoingFile:
    """One attachment or inline image of the message that passed the type policy and the scanner and fits the
    kind's limits (`ticketing.ticket_files`). `read()` decodes it from the stored message (never kept twice)."""

    index: int  # its place among the message's attachments: part of its per-file key
    filename: str  # never empty ("attachment-<n>.<ext>" when the message gave no name)
    content_type: str  # what the bytes are (sniffed), e.g. "image/png"
    size: int
    sha256: str
    content_id: str = ""  # for inline images: what `cid:` in the HTML points at
    inline: bool = False  # shown in the body (an image the HTML refers to), not listed as a file
    payload: Callable[[], bytes] | None = field(default=None, repr=False, compare=False)

    def read(self) -> bytes:
        if self.payload is None:
            raise PermanentError(ReasonCode.INVALID_FIELDS, f"{self.filename}: no payload")
        return self.payload()

    def key(self, idempotency_key: str) -> str:
        """This file's own key under the intent's: the same on every attempt (uploads, lookups, markers)."""
        return f"{idempotency_key}-f{self.index}"


@dataclass(frozen=True)
class HeldFile:
    """A file of the message that is not sent: listed in the ticket with why and where it is (the console)."""

    filename: str
    size: int
    reason: str  # in words: "blocked type (application/x-dosexec)", "over this desk's 20 MB limit"
    index: int = -1  # its place among the message's attachments (the console's link to it)


@dataclass(frozen=True)
class TicketRequest:
    subject: str
    description: str  # plain text; ends with the list of attachments when there are any
    requester: str  # the requester's address
    tags: tuple[str, ...] = ()
    fields: dict[str, Any] = field(default_factory=dict)  # destination-specific extra fields (Zendesk custom field ids)
    # The route classification chose, in Mailroom's words; each adapter maps them (its settings say how).
    queue: str = ""
    priority: str = ""  # one of ticketing.models.PRIORITIES, or ""
    request_type: str = ""
    assignee: str = ""
    requester_name: str = ""  # the display name, "" when the message gave none
    cc: tuple[str, ...] = ()  # addresses copied on the message, the tenant's own mailboxes left out
    html: str = ""  # sanitized HTML (`ticketing.rich_body`), "" for plain mail; `cid:` refs kept
    files: tuple[OutgoingFile, ...] = ()
    held_files: tuple[HeldFile, ...] = ()
    # The desk's ticket this one follows up (a reply to a closed ticket, policy `follow_up`); "" otherwise.
    follow_up_of: str = ""
    # "closed": made closed (archive import history, intake.archive) where the desk supports it; "": its default.
    status: str = ""
    # When the message was written (archive history: its Date header, else when it was stored); None: now.
    # A desk that can date a record (Zendesk's Ticket Import API) gives the ticket and its comment this time.
    created_at: datetime | None = None


@dataclass(frozen=True)
class CommentRequest:
    """What a reply adds to its ticket. `public`: the customer sees it; an agent's mail is an internal note."""

    body: str
    author_email: str
    author_name: str = ""
    public: bool = True
    from_agent: bool = False  # written by one of the tenant's agents (then `public` is False)
    html: str = ""
    files: tuple[OutgoingFile, ...] = ()
    held_files: tuple[HeldFile, ...] = ()
    cc: tuple[str, ...] = ()


class TicketClosed(PermanentError):
    """The desk refused the write because the ticket is closed (archived, resolved for good): the pipeline's
    `closed_policy` decides (a follow-up ticket, reopen or review), never an invalid-fields failure."""

    def __init__(self, detail: str = ""):
        super().__init__(ReasonCode.TICKET_CLOSED, detail or "the ticket is closed")


@dataclass(frozen=True)
class TicketResult:
    ticket_id: str
    url: str = ""


@dataclass(frozen=True)
class DestinationRecord:
    """A record of the destination that carries one of our external references (reconciliation)."""

    ticket_id: str
    external_ref: str
    url: str = ""


@dataclass
class RecordPage:
    """One bounded page of `records_with_ref`; `resume` is where the next starts (None: done)."""

    records: list[DestinationRecord]
    resume: dict[str, Any] | None = None


class DestinationAdapter:
    # The destination keeps our Idempotency-Key and answers a replay with the original record.
    honours_idempotency_key = False
    # How long it keeps that key, in seconds (None: not at all).
    idempotency_window_seconds: int | None = None
    # find_by_external_ref sees a record as soon as its create returned.
    consistent_lookup = False
    # find_by_external_ref works, but a search index lags behind writes (Jira's JQL, Freshdesk's filter):
    # ask only this many seconds after the ambiguous attempt. What it finds settles the intent; finding
    # nothing is doubt, and doubt goes to review (held), never to a blind retry. None: no such lookup.
    lookup_settle_seconds: float | None = None
    # The create is an insert-or-update on our key (Salesforce external-id upsert, HubSpot idProperty,
    # ServiceNow import-set coalesce): sending it again updates the one record, so a retry is safe.
    upsert = False
    # The create runs inside our own database transaction (the built-in store):
    # it commits or rolls back together with the mapping, so it is never ambiguous.
    transactional = False
    # The longest description or comment body the destination accepts, in characters (None: no limit).
    # Longer text is cut by `ticketing.services.Work` at a paragraph boundary, with a notice.
    max_description_chars: int | None = None

    # The settings this kind reads (`Destination.settings`), checked in the admin field by field:
    # {name: ticketing.destinations.settings.Setting}. Unknown names are refused (a typo is a bug).
    SETTINGS: "dict[str, Setting]" = {}
    # The kind needs a base URL / a credentials reference to work (the admin says so when missing).
    needs_base_url = True
    needs_credentials = True
    # The settings that hold an absolute URL (or URL template) the adapter calls: checked by the egress guard
    # when the destination is saved (`ticketing.destinations.egress_errors`), and again at connect time.
    fetched_url_settings: tuple[str, ...] = ()

    # What the desk does with files, HTML, people, authorship, closed tickets, its own acknowledgments and
    # quota (ticketing.destinations.capabilities); docs/destinations/<kind>.md says the same in words.
    capabilities: Capabilities = Capabilities()

    def __init__(self, destination: "Destination") -> None:
        self.destination = destination
        # Where a multi-step write notes what is done (an upload's token, the created record, each file),
        # so that the next attempt goes on instead of starting over. The pipeline gives the intent's own
        # (`ticketing.intents.progress`); alone, an adapter remembers in memory.
        self.journal: Journal = MemoryJournal()

    def check_connection(self) -> str:
        """Prove the credentials and the settings work without writing anything; a line saying what was
        checked. Raises TransientError / PermanentError like any call.

        Subclasses of DestinationAdapter must provide this method."""
        raise NotImplementedError

    def create_ticket(self, request: TicketRequest, idempotency_key: str, external_ref: str) -> TicketResult:
        """Create the desk's record for `request`, carrying `external_ref` (and `idempotency_key` where the desk
        keeps one), and return its id and URL. Raises only TransientError, PermanentError or AmbiguousOutcome.

        Subclasses of DestinationAdapter must provide this method."""
        raise NotImplementedError

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        """The record carrying `external_ref`, None when there is none: how an unknown outcome is settled
        (`consistent_lookup`, `lookup_settle_seconds`). Raises TransientError / PermanentError like any call.

        Subclasses of DestinationAdapter must provide this method; one whose destination offers no such lookup
        raises NotImplementedError."""
        raise NotImplementedError

    def add_comment(self, ticket_id: str, comment: CommentRequest, idempotency_key: str, external_ref: str) -> str:
        """Add `comment` (with its files where the kind sends them with the comment) to `ticket_id`; raises
        `TicketClosed` when the desk says the ticket is closed. Returns the comment's id (or the ticket's).

        Subclasses of DestinationAdapter must provide this method."""
        raise NotImplementedError

    # --- files after the write (capabilities.files == "after_write"); see ticketing.destinations.files ----

    def upload_file(self, ticket_id: str, file: OutgoingFile, file_key: str, *, public: bool = True) -> str:
        """Attach `file` to record `ticket_id`; the desk's id for it. `file_key` is the file's own key: send it
        where the desk keeps one (a marker field, a header), so that `find_file` can see it.

        Subclasses of DestinationAdapter whose `capabilities.files` is "after_write" must provide this method."""
        raise NotImplementedError

    def find_file(self, ticket_id: str, file: OutgoingFile, file_key: str) -> str | None:
        """The desk's id of `file` on `ticket_id` if an earlier attempt attached it (by its key where the desk
        keeps one, else by name and size), else None. Asked before sending a file again.

        Subclasses of DestinationAdapter whose `capabilities.files` is "after_write" must provide this method."""
        raise NotImplementedError

    # --- the desk's own references (threading a reply to the desk's own notification) ----------------
    # Compiled patterns, each with a named group `ref`, that find the desk's ticket reference in a reply's
    # subject or in its text (a JSM key "SUP-12", a ServiceNow "INC0010001" or "Ref:MSG0000123" watermark,
    # Freshdesk's "[#123]"). Searched by `ticketing.threads` for the tenant's destinations of this kind.
    reference_patterns: tuple[re.Pattern[str], ...] = ()
    # Where each pattern is looked for: "subject", "body" (the first lines of the text) or both.
    reference_fields: tuple[str, ...] = ("subject",)

    def resolve_reference(self, ref: str) -> str | None:
        """The ticket id (as `TicketMapping.ticket_id` holds it) that reference `ref` names; None when the desk
        has no such ticket. The default: the reference is the id. May ask the desk (a read)."""
        return ref

    def ticket_url(self, ticket_id: str | int) -> str:
        """Where a person opens the ticket (`TicketMapping.ticket_url`); "" when the destination has no such page."""
        return ""

    # --- listing (reconciliation.reconcilers); optional ---------------------------------------------
    # The destination can list what it holds: `records_with_ref` and `existing_tickets` work.
    supports_listing = False

    def records_with_ref(
        self, prefix: str, since: datetime, limit: int, resume: dict[str, Any] | None = None
    ) -> RecordPage:
        """At most `limit` records created (or, where that is what the API offers, updated) since `since`
        whose external reference starts with `prefix`; a bounded page, resumable.

        Subclasses of DestinationAdapter that set `supports_listing` must provide this method."""
        raise NotImplementedError

    def existing_tickets(self, ticket_ids: list[str]) -> set[str]:
        """Which of `ticket_ids` still exist (deleted ones do not).

        Subclasses of DestinationAdapter that set `supports_listing` must provide this method."""
        raise NotImplementedError

    def records_for_ref(self, external_ref: str) -> list[DestinationRecord]:
        """Every record carrying exactly `external_ref`, lowest id first.

        Subclasses of DestinationAdapter that set `supports_listing` must provide this method."""
        raise NotImplementedError

"""The one interface every destination adapter implements (docs/design.md §6 "The intent state machine").

Adapters raise only `TransientError`, `PermanentError` or `AmbiguousOutcome`;
what each capability flag allows when an outcome is unknown is decided in
`ticketing.intents.resolve_unknown`, not here.
"""
from dataclasses import dataclass, field

from intake.failures import AmbiguousOutcome, PermanentError, TransientError

__all__ = [
    "AmbiguousOutcome",
    "DestinationAdapter",
    "DestinationRecord",
    "PermanentError",
    "RecordPage",
    "TicketRequest",
    "TicketResult",
    "TransientError",
]


@dataclass(frozen=True)
class TicketRequest:
    subject: str
    description: str
    requester: str
    tags: tuple[str, ...] = ()
    fields: dict = field(default_factory=dict)   # destination-specific extra fields (Zendesk custom field ids)
    # The route classification chose, in Mailroom's words; each adapter maps them (its settings say how).
    queue: str = ""
    priority: str = ""          # one of ticketing.models.PRIORITIES, or ""
    request_type: str = ""
    assignee: str = ""


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
    resume: dict | None = None


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
    SETTINGS: dict = {}
    # The kind needs a base URL / a credentials reference to work (the admin says so when missing).
    needs_base_url = True
    needs_credentials = True
    # The settings that hold an absolute URL (or URL template) the adapter calls: checked by the egress guard
    # when the destination is saved (`ticketing.destinations.egress_errors`), and again at connect time.
    fetched_url_settings: tuple[str, ...] = ()

    def __init__(self, destination):
        self.destination = destination

    def check_connection(self) -> str:
        """Prove the credentials and the settings work without writing anything; a line saying what was
        checked. Raises TransientError / PermanentError like any call."""
        raise NotImplementedError

    def create_ticket(self, request: TicketRequest, idempotency_key: str, external_ref: str) -> TicketResult:
        raise NotImplementedError

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        raise NotImplementedError

    def add_comment(self, ticket_id: str, body: str, author: str, idempotency_key: str, external_ref: str) -> str:
        raise NotImplementedError

    def ticket_url(self, ticket_id) -> str:
        """Where a person opens the ticket (`TicketMapping.ticket_url`); "" when the destination has no such page."""
        return ""

    # --- listing (reconciliation.reconcilers); optional ---------------------------------------------
    # The destination can list what it holds: `records_with_ref` and `existing_tickets` work.
    supports_listing = False

    def records_with_ref(self, prefix: str, since, limit: int, resume: dict | None = None) -> RecordPage:
        """At most `limit` records created (or, where that is what the API offers, updated) since `since`
        whose external reference starts with `prefix`; a bounded page, resumable."""
        raise NotImplementedError

    def existing_tickets(self, ticket_ids: list[str]) -> set[str]:
        """Which of `ticket_ids` still exist (deleted ones do not)."""
        raise NotImplementedError

    def records_for_ref(self, external_ref: str) -> list[DestinationRecord]:
        """Every record carrying exactly `external_ref`, lowest id first."""
        raise NotImplementedError

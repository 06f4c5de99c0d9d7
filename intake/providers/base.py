"""The one interface every mail provider implements (one module per provider).

A provider turns what it receives or fetches into `FetchedMessage`s — the
provider message id (docs/design.md §4 "Message identity": the same whether the message came by webhook
or by polling) and the raw RFC 5322 bytes — and everything ends in
`intake.services.ingest`. Network and API failures are mapped to the failure
kinds of `intake.failures`; a refused signature or token to `WebhookRejected`.

Listing (optional, `supports_listing`; used by the reconcilers, `reconciliation.reconcilers`):
`list_recent(since, until, limit, resume)` names the messages the provider holds that arrived in
[since, until], a bounded page at a time, by the same provider message id polling and webhooks
use; `fetch_listed(listed)` fetches the ones the caller wants. IMAP, Gmail, Graph and Mailgun
(stored events) list; raw, Postmark and SendGrid do not (nothing to ask: a raw webhook has no
server side, SendGrid Inbound Parse keeps nothing, and Postmark's inbound search returns its own
ids, not the Message-ID, so matching would take one details call per message).
"""

from dataclasses import dataclass, field

from django.http import HttpRequest, HttpResponse

from intake.failures import AmbiguousOutcome, PermanentError, TransientError

__all__ = [
    "AmbiguousOutcome",
    "FetchedMessage",
    "ListedMessage",
    "Listing",
    "PermanentError",
    "PollBatch",
    "Provider",
    "TransientError",
    "WebhookRejected",
    "WebhookResult",
]


class WebhookRejected(Exception):
    """Signature, token, timestamp or replay check failed: answer 401 and store nothing."""


@dataclass(frozen=True)
class FetchedMessage:
    provider_message_id: str
    raw: bytes
    metadata: dict = field(default_factory=dict)
    # Received before the mailbox's archive cut-off (`Mailbox.archive_before`, intake.archive): stored as history.
    history: bool = False
    # `intake.keys.thread_key_for_raw(raw)`, when the provider read it with the id (None: ingest reads it).
    thread_key: str | None = None


@dataclass
class WebhookResult:
    """What a verified webhook carried.

    `messages` are ingested before the answer. `poll` asks for a durable poll of
    the mailbox (written to the outbox in the same transaction), for pushes that
    only say "something changed" (Gmail, Graph). `response`, when set, is sent
    as is (for example Graph's validation handshake) and nothing is ingested.
    """

    messages: list[FetchedMessage] = field(default_factory=list)
    poll: bool = False
    response: HttpResponse | None = None


@dataclass
class PollBatch:
    """One bounded batch: the messages, the cursor to store once they are committed, whether more wait."""

    messages: list[FetchedMessage]
    cursor: dict
    more: bool = False
    # An archive import is running and this batch fetched the last of the mail before the cut-off.
    archive_done: bool = False


@dataclass(frozen=True)
class ListedMessage:
    """A message the provider holds: its provider message id, and what `fetch_listed` needs to fetch it."""

    provider_message_id: str
    handle: object = None  # an IMAP UID, a Gmail or Graph id, a Mailgun storage URL
    raw: bytes | None = None  # when listing already had to read the whole message (IMAP without a Message-ID)


@dataclass
class Listing:
    """One bounded page of a listing; `resume` is where the next page starts (None: the window is done)."""

    messages: list[ListedMessage]
    resume: dict | None = None


class Provider:
    """A mailbox's provider. A subclass sets `name` and the `supports_*` flags it keeps, and provides the
    methods of each: a webhook provider `handle_webhook`; a polling one `poll`; a listing one (reconciliation,
    archive import) `list_recent` and `fetch_listed`. The rest raise NotImplementedError, which says the
    provider was asked for what its flags do not claim."""

    name = ""
    supports_webhook = False
    supports_polling = False
    supports_listing = False

    def __init__(self, mailbox):
        self.mailbox = mailbox

    def handle_webhook(self, request: HttpRequest, body: bytes) -> WebhookResult:
        """Verify (raise WebhookRejected) and parse a webhook request.

        Subclasses of Provider with `supports_webhook` must provide this method. Verify before parsing (an
        unverified body is never read for content), and raise TransientError when the answer should be a 5xx
        the provider retries."""
        raise NotImplementedError("subclasses of Provider with supports_webhook must provide handle_webhook()")

    def poll(self, cursor: dict) -> PollBatch:
        """Fetch the next bounded batch after `cursor` (an empty dict the first time).

        Subclasses of Provider with `supports_polling` must provide this method. The batch's cursor is stored
        only after its messages are committed, so a batch fetched twice must yield the same provider ids."""
        raise NotImplementedError("subclasses of Provider with supports_polling must provide poll()")

    def list_recent(self, since, until, limit: int, resume: dict | None = None) -> Listing:
        """At most `limit` messages that arrived in [since, until] (aware datetimes), from `resume` on.

        Subclasses of Provider with `supports_listing` must provide this method (and `fetch_listed`)."""
        raise NotImplementedError("subclasses of Provider with supports_listing must provide list_recent()")

    def fetch_listed(self, listed: list[ListedMessage]) -> list[FetchedMessage]:
        """The raw messages of `listed` (one deleted meanwhile is left out).

        Subclasses of Provider with `supports_listing` must provide this method."""
        raise NotImplementedError("subclasses of Provider with supports_listing must provide fetch_listed()")

    def close(self) -> None:
        """Release connections (a no-op unless the provider keeps one)."""

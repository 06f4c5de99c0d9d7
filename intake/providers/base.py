"""The one interface every mail provider implements (one module per provider).

A provider turns what it receives or fetches into `FetchedMessage`s — the
provider message id (docs/design.md §4 "Message identity": the same whether the message came by webhook
or by polling) and the raw RFC 5322 bytes — and everything ends in
`intake.services.ingest`. Network and API failures are mapped to the failure
kinds of `intake.failures`; a refused signature or token to `WebhookRejected`.
"""
from dataclasses import dataclass, field

from django.http import HttpRequest, HttpResponse

from intake.failures import AmbiguousOutcome, PermanentError, TransientError

__all__ = [
    "AmbiguousOutcome", "FetchedMessage", "PermanentError", "PollBatch", "Provider", "TransientError",
    "WebhookRejected", "WebhookResult",
]


class WebhookRejected(Exception):
    """Signature, token, timestamp or replay check failed: answer 401 and store nothing."""


@dataclass(frozen=True)
class FetchedMessage:
    provider_message_id: str
    raw: bytes
    metadata: dict = field(default_factory=dict)


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


class Provider:
    name = ""
    supports_webhook = False
    supports_polling = False

    def __init__(self, mailbox):
        self.mailbox = mailbox

    def handle_webhook(self, request: HttpRequest, body: bytes) -> WebhookResult:
        """Verify (raise WebhookRejected) and parse a webhook request."""
        raise NotImplementedError

    def poll(self, cursor: dict) -> PollBatch:
        """Fetch the next bounded batch after `cursor` (an empty dict the first time)."""
        raise NotImplementedError

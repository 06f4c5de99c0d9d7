"""The generic provider webhook: `POST /webhooks/<provider>/<mailbox_slug>/` (docs/design.md §2, step 1).

Provider-agnostic: the mailbox's adapter (`intake.providers.provider_for`)
verifies and parses the request; this view enforces the size limit, turns a
refusal into 401, and stores what the adapter returned in one transaction —
every message through `intake.services.ingest`, plus a durable poll request in
the outbox when the push only said "something changed". The answer (2xx) is
sent only after that transaction committed, so a provider never gets an
acknowledgment for something we could still lose.

The adapter's `handle_webhook` runs inside the same transaction: whatever it
writes (for example Mailgun's one-time token in `WebhookNonce`) commits
together with the messages or not at all. A rejected or failed request thus
leaves nothing behind (but its count in `WebhookRejectionCount`, written after the
rollback), and a token is never burnt by a delivery we did not
store. Adapters should make no slow network calls while holding database rows
they wrote (reads before writes are fine: PostgreSQL opens the transaction at
the first query).
"""

import logging

from django.conf import settings
from django.db import transaction
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .. import services
from ..failures import ExternalCallError, PermanentError, TransientError
from ..models import Mailbox
from ..providers import provider_for
from ..providers.base import WebhookRejected
from ..secrets import SecretUnavailable
from ..views import error_response, read_body, reject_request, webhook_json
from ..vocabulary import AuditKind, WebhookRejection

logger = logging.getLogger(__name__)


class _Rejected(Exception):
    """A request refused inside the transaction (which then rolls back): what to answer, and why."""

    def __init__(self, status: int, reason: WebhookRejection, message: str):
        super().__init__("rejected")
        self.status, self.reason, self.message = status, reason, message


@csrf_exempt
@require_POST
def provider_webhook(request, provider: str, mailbox_slug: str):
    mailbox = Mailbox.objects.filter(slug=mailbox_slug).select_related("tenant").first()
    if mailbox is None or mailbox.provider != provider:
        # A mailbox of another provider is "unknown" here: never verify one scheme with another's secret.
        return reject_request(provider, WebhookRejection.UNKNOWN_MAILBOX, 404, "unknown mailbox")
    try:
        adapter = provider_for(mailbox)
    except (LookupError, ImportError):
        return reject_request(provider, WebhookRejection.NO_WEBHOOK, 404, "no webhook for this provider")
    if not adapter.supports_webhook:
        return reject_request(provider, WebhookRejection.NO_WEBHOOK, 404, "no webhook for this provider")
    body = read_body(request, settings.MAILROOM_MAX_MESSAGE_BYTES)
    if body is None:
        return reject_request(
            provider,
            WebhookRejection.TOO_LARGE,
            413,
            f"message larger than {settings.MAILROOM_MAX_MESSAGE_BYTES} bytes",
        )

    stored = []
    try:
        with transaction.atomic():
            try:
                result = adapter.handle_webhook(request, body)
            except WebhookRejected as exc:
                logger.warning("rejected %s webhook for mailbox %s: %s", provider, mailbox.slug, exc)
                raise _Rejected(401, WebhookRejection.BAD_SIGNATURE, "webhook verification failed") from None
            except SecretUnavailable as exc:
                # Fail closed: without a secret nothing can be verified, so nothing is stored.
                logger.error("mailbox %s has no usable webhook secret: %s", mailbox.slug, exc)
                raise _Rejected(401, WebhookRejection.NO_SECRET, "webhook cannot be verified") from None
            if result.response is not None:
                # A handshake (for example Graph's validation token): answered as is, nothing ingested.
                return result.response
            for message in result.messages:
                outcome = services.ingest(mailbox, message.provider_message_id, message.raw, source=provider)
                if message.metadata and not outcome.duplicate:
                    # What the provider said about the message (its own id, envelope…): kept as evidence.
                    services.record_audit(
                        outcome.inbox_event_id,
                        kind=AuditKind.PROVIDER_METADATA,
                        actor=f"provider:{provider}",
                        detail=message.metadata,
                    )
                stored.append(outcome)
            if result.poll:
                services.enqueue_outbox(services.POLL_TOPIC, {"mailbox_id": mailbox.pk})
    except _Rejected as rejected:
        # Counted after the rollback, in its own statement: the refusal leaves only this number behind.
        return reject_request(provider, rejected.reason, rejected.status, rejected.message)
    except TransientError as exc:
        logger.warning("%s webhook for mailbox %s failed transiently: %s", provider, mailbox.slug, exc.reason)
        response = error_response(503, "temporarily unavailable, retry later")
        if exc.retry_after:
            response["Retry-After"] = str(int(exc.retry_after))
        return response
    except PermanentError as exc:
        logger.warning("%s webhook for mailbox %s is unusable: %s", provider, mailbox.slug, exc.reason)
        return reject_request(provider, WebhookRejection.UNPROCESSABLE, 400, f"unprocessable webhook: {exc}")
    except ExternalCallError as exc:  # ambiguous: nothing was stored, the provider should retry
        logger.warning("%s webhook for mailbox %s: %s", provider, mailbox.slug, exc.reason)
        return error_response(503, "temporarily unavailable, retry later")

    # Committed: now, and only now, acknowledge.
    any_new = any(not outcome.duplicate for outcome in stored)
    return webhook_json(
        {
            "inbox_events": [{"inbox_event_id": o.inbox_event_id, "duplicate": o.duplicate} for o in stored],
            "poll": bool(result.poll),
        },
        status=202 if any_new or result.poll else 200,
    )

"""Mailgun inbound routes (`forward()` to `/webhooks/mailgun/<slug>/mime`).

Verification (Mailgun's scheme): `signature` = hex HMAC-SHA256 of
`timestamp + token` with the webhook signing key (`Mailbox.webhook_secret_ref`),
`timestamp` within MAILROOM_SIGNATURE_TOLERANCE_SECONDS of now, and `token` never
seen before (kept in `WebhookNonce`; recorded in the webhook view's transaction,
so a delivery that fails to store does not burn its token). The raw MIME comes
from `body-mime`, which Mailgun sends when the forward URL ends in "mime".
"""
import hashlib
import hmac
import time

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from intake.keys import provider_message_id_for_raw
from intake.models import WebhookNonce
from intake.secrets import resolve_secret

from .base import FetchedMessage, PermanentError, Provider, WebhookRejected, WebhookResult
from .inbound import FormError, parse_form


def mailgun_signature(signing_key: str, timestamp: str, token: str) -> str:
    return hmac.new(signing_key.encode(), f"{timestamp}{token}".encode(), hashlib.sha256).hexdigest()


class MailgunProvider(Provider):
    name = "mailgun"
    supports_webhook = True
    supports_polling = False

    def handle_webhook(self, request, body: bytes) -> WebhookResult:
        try:
            fields = parse_form(request.META.get("CONTENT_TYPE", ""), body)
        except FormError as exc:
            raise WebhookRejected(f"unreadable form: {exc}") from None
        timestamp = fields.get("timestamp", b"").decode("ascii", "replace").strip()
        token = fields.get("token", b"").decode("ascii", "replace").strip()
        signature = fields.get("signature", b"").decode("ascii", "replace").strip()
        if not (timestamp and token and signature):
            raise WebhookRejected("missing timestamp, token or signature")
        signing_key = resolve_secret(self.mailbox.webhook_secret_ref)  # SecretUnavailable: the view fails closed
        if not hmac.compare_digest(mailgun_signature(signing_key, timestamp, token), signature.lower()):
            raise WebhookRejected("signature mismatch")
        try:
            sent_at = float(timestamp)
        except ValueError:
            raise WebhookRejected("timestamp is not a number") from None
        if abs(time.time() - sent_at) > settings.MAILROOM_SIGNATURE_TOLERANCE_SECONDS:
            raise WebhookRejected("stale timestamp")
        if len(token) > 200:
            raise WebhookRejected("token too long")
        try:
            with transaction.atomic():
                WebhookNonce.objects.create(mailbox=self.mailbox, provider=self.name, nonce=token,
                                            seen_at=timezone.now())
        except IntegrityError:
            raise WebhookRejected("token seen before (replay)") from None

        raw = fields.get("body-mime")
        if not raw:
            raise PermanentError("malformed", "no body-mime field: the forward URL must end in 'mime'")
        return WebhookResult(messages=[FetchedMessage(provider_message_id_for_raw(raw), raw)])

"""Amazon SES inbound mail, delivered by SNS to `POST /webhooks/ses/<slug>/`.

An SES receipt rule publishes each received message to an SNS topic, either inside the notification
(the SNS action, `content`, for messages up to 150 KB) or as an object in S3 with a notification
naming it (the S3 action, for anything larger). SNS posts that notification to this webhook.

`Mailbox.settings`:
    topic_arn          required: only this topic's messages are accepted (anyone's topic is SNS-signed)
    s3_bucket          the bucket of the S3 action; a notification naming another bucket is refused
    s3_prefix          optional: the object key must start with it
    s3_region          optional: defaults to the topic's region
    s3_endpoint_url    optional: an S3-compatible stand-in (tests, MinIO); the egress guard checks it
                       when the mailbox is saved and, resolved, right before each S3 client is made
    s3_access_key_id   the access key id; its secret key is `Mailbox.credentials_ref`
No `webhook_secret_ref`: SNS signs with its own certificate (`intake.providers.sns`).

Answers (through `intake.channels.webhooks.provider_webhook`; SNS retries 5xx and connection failures, never
4xx): a verified confirmation → the SubscribeURL is visited, 200; a stored message → 202 (200 for a
duplicate) only after the commit; a forged, stale or foreign-topic message → 401, nothing stored; a
certificate, S3 object or credential we cannot get now → 503, SNS retries; a notification that
can never give a message (no content, another bucket, larger than MAILROOM_MAX_MESSAGE_BYTES) → 400.

The provider message id is the RFC 5322 Message-ID (`provider_message_id_for_raw`), as for every
inbound-parse channel, not SES's `mail.messageId`: a retried notification carries the same
message, and so does the same message reaching the mailbox by another channel (the raw webhook, a
migration through IMAP); both must meet at one event. SES's id is kept as evidence (an audit row).
"""

import base64
import binascii
import json
import logging

from django.conf import settings
from django.http import JsonResponse

from intake.egress import EgressRefused, check_url
from intake.keys import provider_message_id_for_raw
from intake.secrets import SecretUnavailable, resolve_secret

from . import sns
from .base import FetchedMessage, PermanentError, Provider, TransientError, WebhookRejected, WebhookResult

logger = logging.getLogger(__name__)

RECEIVED = "Received"
SETUP_NOTIFICATION = "AMAZON_SES_SETUP_NOTIFICATION"
S3_CONNECT_TIMEOUT_SECONDS = 5
S3_READ_TIMEOUT_SECONDS = 60


def _text(value, limit: int = 300) -> str:
    return str(value or "")[:limit]


class SesProvider(Provider):
    name = "ses"
    supports_webhook = True
    supports_polling = False

    @property
    def settings(self) -> dict:
        return self.mailbox.settings or {}

    def handle_webhook(self, request, body: bytes) -> WebhookResult:
        try:
            message = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            raise WebhookRejected("body is not an SNS message (JSON); is raw message delivery on?") from None
        topic_arn = str(self.settings.get("topic_arn") or "")
        if not topic_arn:
            raise WebhookRejected("the mailbox has no topic_arn setting")
        sns.verify(message, topic_arn)
        kind = message["Type"]
        if kind == sns.SUBSCRIPTION_CONFIRMATION:
            sns.confirm_subscription(message)
            logger.info("confirmed the SNS subscription of mailbox %s", self.mailbox.slug)
            return WebhookResult(response=JsonResponse({"subscription": "confirmed"}))
        if kind == sns.UNSUBSCRIBE_CONFIRMATION:
            logger.warning("SNS unsubscribed mailbox %s from its topic", self.mailbox.slug)
            return WebhookResult(response=JsonResponse({"subscription": "ended"}))
        return self._notification(message)

    def _notification(self, message: dict) -> WebhookResult:
        try:
            notification = json.loads(message["Message"])
        except (TypeError, ValueError):
            raise PermanentError("malformed", "the SNS Message is not an SES notification") from None
        if not isinstance(notification, dict):
            raise PermanentError("malformed", "the SNS Message is not an SES notification")
        kind = notification.get("notificationType") or notification.get("eventType")
        if kind != RECEIVED:
            # The setup test SES sends when a rule is saved, or sending feedback on the same topic: no mail.
            logger.info("SES %s notification for mailbox %s: nothing to store", _text(kind, 60), self.mailbox.slug)
            return WebhookResult(response=JsonResponse({"ignored": _text(kind, 60)}))
        mail = notification.get("mail") if isinstance(notification.get("mail"), dict) else {}
        receipt = notification.get("receipt") if isinstance(notification.get("receipt"), dict) else {}
        action = receipt.get("action") if isinstance(receipt.get("action"), dict) else {}
        action_type = action.get("type")
        metadata = {
            "ses_message_id": _text(mail.get("messageId")),
            "sns_message_id": _text(message.get("MessageId")),
            "action": _text(action_type, 20),
        }
        for verdict in ("spamVerdict", "virusVerdict", "spfVerdict", "dkimVerdict", "dmarcVerdict"):
            if isinstance(receipt.get(verdict), dict):
                metadata[verdict] = _text(receipt[verdict].get("status"), 40)
        if action_type == "SNS":
            raw = self._content(notification, action)
        elif action_type == "S3":
            raw = self._fetch_from_s3(action, topic_arn=str(message.get("TopicArn")))
            metadata["s3_object"] = _text(f"s3://{action.get('bucketName')}/{action.get('objectKey')}", 1200)
        else:
            raise PermanentError("malformed", f"SES action {_text(action_type, 20)!r} carries no message")
        if len(raw) > settings.MAILROOM_MAX_MESSAGE_BYTES:
            raise PermanentError("too_large", f"message larger than {settings.MAILROOM_MAX_MESSAGE_BYTES} bytes")
        logger.info(
            "SES message %s for mailbox %s: %d bytes by the %s action",
            metadata["ses_message_id"],
            self.mailbox.slug,
            len(raw),
            action_type,
        )
        return WebhookResult(messages=[FetchedMessage(provider_message_id_for_raw(raw), raw, metadata)])

    def _content(self, notification: dict, action: dict) -> bytes:
        content = notification.get("content")
        if not isinstance(content, str) or not content:
            raise PermanentError("malformed", "SNS action notification without content")
        if str(action.get("encoding") or "").upper() == "BASE64":
            try:
                return base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError):
                raise PermanentError("malformed", "content is not base64") from None
        # Encoding UTF8: SES already replaced what was not UTF-8 (configure BASE64 to keep every byte).
        return content.encode("utf-8", "replace")

    # --- the S3 action ----------------------------------------------------------------------------

    def _fetch_from_s3(self, action: dict, topic_arn: str) -> bytes:
        bucket, key = str(action.get("bucketName") or ""), str(action.get("objectKey") or "")
        configured = str(self.settings.get("s3_bucket") or "")
        if not configured:
            raise PermanentError("configuration", "an S3 action notification, but the mailbox has no s3_bucket")
        if bucket != configured:
            raise PermanentError("configuration", "the notification names another bucket than the mailbox's")
        prefix = str(self.settings.get("s3_prefix") or "")
        if not key or not key.startswith(prefix):
            raise PermanentError("configuration", "the object key is outside the mailbox's s3_prefix")
        client = self._s3_client(topic_arn)
        limit = settings.MAILROOM_MAX_MESSAGE_BYTES
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = client.get_object(Bucket=bucket, Key=key)
            if int(response.get("ContentLength") or 0) > limit:
                response["Body"].close()
                raise PermanentError("too_large", f"S3 object larger than {limit} bytes")
            with response["Body"] as stream:
                return stream.read(limit + 1)
        except ClientError as exc:
            # Missing object, refused credentials, throttling: all worth SNS's retries (the object stays in S3).
            code = _text((exc.response.get("Error") or {}).get("Code"), 60)
            raise TransientError("s3", f"S3 GetObject: {code}") from None
        except BotoCoreError as exc:
            raise TransientError("s3", f"S3 GetObject: {type(exc).__name__}") from None

    def _s3_client(self, topic_arn: str):
        import boto3
        from botocore.config import Config

        access_key_id = str(self.settings.get("s3_access_key_id") or "")
        if not access_key_id or not self.mailbox.credentials_ref:
            # Never the platform's default AWS credentials: a mailbox reads only what its own key may read.
            raise PermanentError("configuration", "the mailbox needs s3_access_key_id and credentials_ref for S3")
        try:
            secret_key = resolve_secret(self.mailbox.credentials_ref, tenant=self.mailbox.tenant, owner=self.mailbox)
        except SecretUnavailable as exc:
            raise TransientError("credentials", f"S3 secret key: {exc}") from None
        region = str(self.settings.get("s3_region") or "") or _region_of(topic_arn) or "us-east-1"
        endpoint_url = str(self.settings.get("s3_endpoint_url") or "") or None
        if endpoint_url:
            # The mailbox's own endpoint: the egress guard checks it (resolved) right before boto3 connects.
            try:
                check_url(endpoint_url, purpose="s3_endpoint_url")
            except EgressRefused as exc:
                raise PermanentError("configuration", str(exc)) from None
            except OSError as exc:  # the name does not resolve (now)
                raise TransientError("s3", f"s3_endpoint_url: {type(exc).__name__}") from None
        return boto3.session.Session().client(
            "s3",
            region_name=region,
            endpoint_url=endpoint_url,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_key,
            config=Config(
                connect_timeout=S3_CONNECT_TIMEOUT_SECONDS,
                read_timeout=S3_READ_TIMEOUT_SECONDS,
                retries={"max_attempts": 2, "mode": "standard"},
            ),
        )


def _region_of(arn: str) -> str:
    """The region of `arn:aws:sns:<region>:<account>:<topic>`."""
    parts = arn.split(":")
    return parts[3] if len(parts) > 5 else ""

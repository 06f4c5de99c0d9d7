"""Postmark inbound webhooks (JSON), verified by HTTP basic auth.

Give Postmark the URL `https://<user>:<password>@<host>/webhooks/postmark/<slug>/`;
`Mailbox.webhook_secret_ref` resolves to `<user>:<password>`. With "Include raw
email content in JSON payload" turned on, `RawEmail` is the message as
received and is what we store; without it the message is rebuilt from the
parsed fields (headers, text and HTML bodies, attachments), deterministically,
so a retried delivery yields the same bytes. Postmark's own `MessageID` is kept
as metadata (an audit row); the provider message id is the RFC 5322 Message-ID,
as for every inbound-parse channel, so a message that also arrives by IMAP or
the raw webhook is one event.
"""

import base64
import binascii
import hashlib
import json
from email import policy
from email.message import EmailMessage

from intake.keys import provider_message_id_for_raw
from intake.secrets import resolve_secret

from .base import FetchedMessage, PermanentError, Provider, WebhookResult
from .inbound import check_basic_auth

# Rebuilt from the payload's own fields, or produced by the MIME structure we build.
_SKIPPED_HEADERS = {
    "from",
    "to",
    "cc",
    "bcc",
    "subject",
    "date",
    "reply-to",
    "content-type",
    "content-transfer-encoding",
    "mime-version",
}


def _clean(value) -> str:
    return " ".join(str(value or "").splitlines()).strip()


def rebuild_message(payload: dict) -> bytes:
    """An RFC 5322 message from Postmark's parsed fields; the same payload always gives the same bytes."""
    message = EmailMessage(policy=policy.default)
    for header, key in (
        ("From", "From"),
        ("To", "To"),
        ("Cc", "Cc"),
        ("Subject", "Subject"),
        ("Date", "Date"),
        ("Reply-To", "ReplyTo"),
    ):
        value = _clean(payload.get(key))
        if value:
            try:
                message[header] = value
            except (ValueError, TypeError, IndexError):
                message[header] = value.encode("ascii", "replace").decode()
    for item in payload.get("Headers") or []:
        if not isinstance(item, dict):
            continue
        name, value = _clean(item.get("Name")), _clean(item.get("Value"))
        if not name or name.lower() in _SKIPPED_HEADERS:
            continue
        try:
            message[name] = value
        except (ValueError, TypeError, IndexError):
            continue  # a header the email package refuses is not worth losing the message for
    text, html = payload.get("TextBody") or "", payload.get("HtmlBody") or ""
    message.set_content(text or ("" if html else "\n"))
    if html:
        message.add_alternative(html, subtype="html")
    for attachment in payload.get("Attachments") or []:
        if not isinstance(attachment, dict):
            raise PermanentError("malformed", "an attachment is not an object")
        try:
            content = base64.b64decode(attachment.get("Content") or "")
        except (binascii.Error, ValueError):
            raise PermanentError("malformed", "attachment content is not base64") from None
        maintype, _, subtype = (attachment.get("ContentType") or "application/octet-stream").partition("/")
        message.add_attachment(
            content,
            maintype=maintype or "application",
            subtype=subtype or "octet-stream",
            filename=_clean(attachment.get("Name")) or "attachment",
            cid=_clean(attachment.get("ContentID")) or None,
        )
    seed = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:24]
    for number, part in enumerate(p for p in message.walk() if p.is_multipart()):
        part.set_boundary(f"=_mailroom_{seed}_{number}")
    return message.as_bytes()


class PostmarkProvider(Provider):
    name = "postmark"
    supports_webhook = True
    supports_polling = False

    def handle_webhook(self, request, body: bytes) -> WebhookResult:
        check_basic_auth(
            request, resolve_secret(self.mailbox.webhook_secret_ref, tenant=self.mailbox.tenant, owner=self.mailbox)
        )
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            raise PermanentError("malformed", "body is not JSON") from None
        if not isinstance(payload, dict):
            raise PermanentError("malformed", "body is not a JSON object")
        raw_email = payload.get("RawEmail")
        if raw_email:
            if not isinstance(raw_email, str):
                raise PermanentError("malformed", "RawEmail is not a string")
            raw = raw_email.encode("utf-8", "replace")
        else:
            raw = rebuild_message(payload)
        metadata = {"rebuilt": not raw_email}
        if payload.get("MessageID"):
            metadata["postmark_message_id"] = str(payload["MessageID"])[:200]
        if payload.get("MessageStream"):
            metadata["message_stream"] = str(payload["MessageStream"])[:100]
        return WebhookResult(messages=[FetchedMessage(provider_message_id_for_raw(raw), raw, metadata)])

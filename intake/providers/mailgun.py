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

import requests
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from intake.egress import EgressRefused, guarded_session
from intake.http import json_or_empty, parse_retry_after
from intake.keys import provider_message_id_for_raw
from intake.models import WebhookNonce
from intake.secrets import SecretUnavailable, resolve_secret

from .base import (
    FetchedMessage,
    ListedMessage,
    Listing,
    PermanentError,
    Provider,
    TransientError,
    WebhookRejected,
    WebhookResult,
)
from .inbound import FormError, parse_form


def _host(url: str) -> str:
    """The host a request to `url` would reach (urllib3's parser, what makes the request); "" for a URL with
    user information or a backslash."""
    try:
        parts = parse_url(str(url))
    except LocationParseError:
        return ""
    return "" if parts.auth is not None or "\\" in str(url) else (parts.host or "")


def mailgun_signature(signing_key: str, timestamp: str, token: str) -> str:
    return hmac.new(signing_key.encode(), f"{timestamp}{token}".encode(), hashlib.sha256).hexdigest()


DEFAULT_API_BASE = "https://api.mailgun.net"
EVENTS_PAGE_LIMIT = 300  # the Events API's largest page


class MailgunProvider(Provider):
    name = "mailgun"
    supports_webhook = True
    supports_polling = False

    def __init__(self, mailbox):
        super().__init__(mailbox)
        self._session = None

    def close(self) -> None:
        if self._session is not None:
            self._session.close()

    @property
    def supports_listing(self) -> bool:
        return bool((self.mailbox.settings or {}).get("domain") and self.mailbox.credentials_ref)

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
        # SecretUnavailable: the view fails closed
        signing_key = resolve_secret(self.mailbox.webhook_secret_ref, tenant=self.mailbox.tenant, owner=self.mailbox)
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
                WebhookNonce.objects.create(
                    mailbox=self.mailbox, provider=self.name, nonce=token, seen_at=timezone.now()
                )
        except IntegrityError:
            raise WebhookRejected("token seen before (replay)") from None

        raw = fields.get("body-mime")
        if not raw:
            raise PermanentError("malformed", "no body-mime field: the forward URL must end in 'mime'")
        return WebhookResult(messages=[FetchedMessage(provider_message_id_for_raw(raw), raw)])

    # --- listing (reconciliation) ---------------------------------------------------------------

    def _api(self, url: str, params=None, accept: str = "application/json") -> dict:
        settings = self.mailbox.settings or {}
        base = str(settings.get("api_base") or DEFAULT_API_BASE).rstrip("/")
        if not url.startswith(("http://", "https://")):
            url = base + url
        else:
            host = _host(url)
            if not host or (host != _host(base) and not host.endswith(".mailgun.net")):
                # The API key goes with the request: paging and storage links only to Mailgun.
                raise PermanentError("configuration", "mailgun: refusing a link to another host")
        try:
            key = resolve_secret(self.mailbox.credentials_ref, tenant=self.mailbox.tenant, owner=self.mailbox)
        except SecretUnavailable as exc:
            raise PermanentError("credentials", f"mailgun API key: {exc}") from None
        if self._session is None:
            # api_base and the links are the mailbox's: through the egress guard (intake.egress).
            self._session = guarded_session(purpose="mailgun api_base")
        try:
            response = self._session.get(
                url,
                params=params,
                auth=("api", key),
                headers={"Accept": accept},
                timeout=(3.05, float(settings.get("timeout") or 30)),
            )
        except EgressRefused as exc:
            raise PermanentError("configuration", str(exc)) from None
        except requests.RequestException as exc:
            raise TransientError("connection", type(exc).__name__) from None
        if response.status_code in (401, 403):
            raise PermanentError("credentials", f"mailgun HTTP {response.status_code}")
        if response.status_code == 429 or response.status_code >= 500:
            raise TransientError(
                "unavailable",
                f"mailgun HTTP {response.status_code}",
                retry_after=parse_retry_after(response.headers.get("Retry-After")),
            )
        if response.status_code == 404:
            return {}
        if response.status_code >= 400:
            raise PermanentError("rejected", f"mailgun HTTP {response.status_code}")
        return json_or_empty(response)

    def list_recent(self, since, until, limit: int, resume: dict | None = None) -> Listing:
        domain = str((self.mailbox.settings or {}).get("domain") or "")
        if resume and resume.get("next"):
            body = self._api(str(resume["next"]))
        else:
            body = self._api(
                f"/v3/{domain}/events",
                params={
                    "event": "stored",
                    "recipient": self.mailbox.address,
                    "begin": f"{since.timestamp():.0f}",
                    "end": f"{until.timestamp():.0f}",
                    "ascending": "yes",
                    "limit": max(1, min(EVENTS_PAGE_LIMIT, int(limit))),
                },
            )
        items = [item for item in body.get("items") or [] if isinstance(item, dict)]
        listed = []
        for item in items:
            storage = item.get("storage") or {}
            url = storage.get("url")
            if not url:
                continue  # expired from storage: nothing to fetch
            headers = (item.get("message") or {}).get("headers") or {}
            message_id = str(headers.get("message-id") or "").strip().strip("<>")
            if message_id:
                listed.append(ListedMessage(provider_message_id_for_raw(b"", message_id=message_id), url))
            else:
                raw = self._stored_mime(url)
                if raw is not None:
                    listed.append(ListedMessage(provider_message_id_for_raw(raw), url, raw))
        next_page = (body.get("paging") or {}).get("next")
        # Mailgun always offers a next page; an empty page is the end.
        return Listing(listed, {"next": str(next_page)} if items and next_page else None)

    def _stored_mime(self, url: str) -> bytes | None:
        mime = self._api(url, accept="message/rfc2822").get("body-mime")
        return mime.encode("utf-8", "surrogateescape") if isinstance(mime, str) and mime else None

    def fetch_listed(self, listed: list[ListedMessage]) -> list[FetchedMessage]:
        messages = []
        for message in listed:
            raw = message.raw if message.raw is not None else self._stored_mime(str(message.handle))
            if raw is not None:
                messages.append(FetchedMessage(provider_message_id_for_raw(raw), raw, {"storage_url": message.handle}))
        return messages

"""Gmail: Pub/Sub push notifications and polling, both through the Gmail API history.

Push (`POST /webhooks/gmail/<mailbox_slug>/`): a Pub/Sub push request whose
base64 `message.data` is `{"emailAddress": ..., "historyId": ...}`. It is
authenticated, then answered with `WebhookResult(poll=True)`: the push only says
"something changed", and the durable poll fetches from the stored cursor. The
push's own historyId is not trusted as a cursor. Authentication
(`settings["push_auth"]`):
  - "oidc" (default): the `Authorization: Bearer` OIDC token Pub/Sub attaches,
    verified against `jwks_url` (RS256 signature), `push_issuer` and
    `push_audience` (required: without it every push is refused), and, when
    `push_service_account` is set, its verified `email` claim;
  - "url_token": a `?token=` in the push URL, compared in constant time with the
    secret `Mailbox.webhook_secret_ref` resolves to.

Polling (`poll(cursor)`), one bounded batch per call:
  - `{}`: window sync. The mailbox's current historyId is read first
    (`users.getProfile`), then `messages.list` (q=`newer_than:<resync_days>d`,
    the label) page by page; when the last page is done the cursor becomes
    `{"history_id": <that id>}`, so whatever arrived during the sync is found by
    the history walk that follows (duplicates are absorbed by `ingest`).
  - `{"history_id": H}`: `users.history.list` from H (messageAdded and
    labelAdded for the label), page by page; after the last page the cursor is
    the mailbox's current historyId. A 404 (H is older than Gmail keeps) starts
    a window sync.
  - `{"history_id": H, "history_page_token": P}` / `{"history_id": H,
    "sync_page_token": P}`: a walk in progress. A page token Gmail no longer
    accepts restarts that walk from H.
  Each listed message is fetched with `messages.get?format=raw` unless this
  mailbox already stored it; one deleted in between (404) is skipped.

`provider_message_id` is Gmail's message id as Gmail gives it, without a prefix
(uniqueness is per mailbox, and a mailbox has one provider): the same for a
message whether a push or a scheduled poll brought it, since both go through
this code.

`Mailbox.settings`: user_id ("me"), api_base (https://gmail.googleapis.com),
token_url (https://oauth2.googleapis.com/token), client_id, label_id ("INBOX";
"" for all mail but drafts, sent, spam and trash), resync_days (7; 0 = start
from now, no backfill; keep it longer than the longest outage you want covered),
page_size (100, at most 500; `batch_size` overrides it), push_auth, push_audience,
push_issuer (https://accounts.google.com), jwks_url
(https://www.googleapis.com/oauth2/v3/certs), push_service_account,
push_topic (for `watch()`). `credentials_ref`: see `intake.providers.oauth`.
Listing (reconciliation, `list_recent`): `messages.list` with
q=`after:<since> before:<until>` (epoch seconds) and the label, one page of at most
`limit` (500) ids per call, `pageToken` as the resume point; `fetch_listed` is the poll's
`messages.get?format=raw`.

Archive import (`Mailbox.archive_before` set, `archive_done_at` not yet; intake.archive): once the live walk
has nothing more, `messages.list` with q=`before:<cut-off>` (epoch seconds) and the label, a page per
call (`"archive": {"before", "page_token"}` in the cursor), every message fetched unless stored; the last
page says `archive_done`. While a cut-off is set, a fetched message whose `internalDate` is before it is
`history`.

Nothing logged here holds a token, a body or a full address.
"""

import base64
import binascii
import hmac
import json
import logging
from datetime import UTC, datetime
from urllib.parse import quote

from intake.http import json_or_empty, parse_retry_after
from intake.logging import mask_address
from intake.secrets import SecretUnavailable, resolve_secret

from .base import (
    FetchedMessage,
    ListedMessage,
    Listing,
    PermanentError,
    PollBatch,
    TransientError,
    WebhookRejected,
    WebhookResult,
)
from .common import ApiProvider
from .oauth import ApiClient, error_code
from .oidc import TokenInvalid, verify_id_token

log = logging.getLogger(__name__)

DEFAULT_API_BASE = "https://gmail.googleapis.com"
DEFAULT_TOKEN_URL = "https://oauth2.googleapis.com/token"
DEFAULT_ISSUER = "https://accounts.google.com"
DEFAULT_JWKS_URL = "https://www.googleapis.com/oauth2/v3/certs"
DEFAULT_PAGE_SIZE = 100
DEFAULT_RESYNC_DAYS = 7
UNWANTED_WITHOUT_LABEL = {"DRAFT", "SPAM", "TRASH"}
# Gmail answers some quota errors with 403 rather than 429.
RATE_LIMIT_REASONS = {"rateLimitExceeded", "userRateLimitExceeded", "quotaExceeded", "dailyLimitExceeded"}


class GmailClient(ApiClient):
    label = "gmail"

    def http_error(self, response):
        if response.status_code == 403:
            code = error_code(response)
            if code in RATE_LIMIT_REASONS:
                return TransientError(
                    "rate_limited",
                    f"gmail HTTP 403 {code}",
                    retry_after=parse_retry_after(response.headers.get("Retry-After")),
                )
        return super().http_error(response)


class GmailProvider(ApiProvider):
    name = "gmail"
    supports_webhook = True
    supports_polling = True
    supports_listing = True
    default_page_size = DEFAULT_PAGE_SIZE
    largest_page_size = 500
    default_resync_days = DEFAULT_RESYNC_DAYS

    def __init__(self, mailbox):
        super().__init__(mailbox)
        self.user_id = str(self.settings.get("user_id") or "me")
        self.label_id = str(self.settings.get("label_id", "INBOX") or "")

    # --- Push -----------------------------------------------------------------

    def handle_webhook(self, request, body: bytes) -> WebhookResult:
        self._authenticate(request)
        notice = parse_push(body)
        if notice is None:
            # Authenticated, so it came through our subscription: a poll is always safe.
            log.warning("gmail: unreadable push for mailbox %s; polling anyway", self.mailbox.slug)
        else:
            address = str(notice.get("emailAddress") or "")
            if address and self.mailbox.address and address.lower() != self.mailbox.address.lower():
                log.warning(
                    "gmail: push for mailbox %s names %s, not the mailbox address; polling anyway",
                    self.mailbox.slug,
                    mask_address(address),
                )
            log.info("gmail: push for mailbox %s (historyId %s)", self.mailbox.slug, notice.get("historyId"))
        return WebhookResult(poll=True)

    def _authenticate(self, request) -> None:
        mode = self.settings.get("push_auth") or "oidc"
        if mode == "url_token":
            try:
                secret = resolve_secret(self.mailbox.webhook_secret_ref, tenant=self.mailbox.tenant, owner=self.mailbox)
            except SecretUnavailable as exc:
                log.error("gmail: mailbox %s has no usable push token: %s", self.mailbox.slug, exc)
                raise WebhookRejected("push token cannot be verified") from None
            supplied = request.GET.get("token", "")
            if not secret or not hmac.compare_digest(supplied.encode(), secret.encode()):
                raise WebhookRejected("bad push token")
            return
        if mode != "oidc":
            raise WebhookRejected(f"unknown push_auth {mode!r}")
        scheme, _, token = (request.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer":
            raise WebhookRejected("no bearer token")
        issuer = self.settings.get("push_issuer") or DEFAULT_ISSUER
        issuers = {issuer, "accounts.google.com"} if issuer == DEFAULT_ISSUER else {issuer}
        try:
            verify_id_token(
                token.strip(),
                jwks_url=self.settings.get("jwks_url") or DEFAULT_JWKS_URL,
                audience=str(self.settings.get("push_audience") or ""),
                issuers=issuers,
                email=str(self.settings.get("push_service_account") or ""),
            )
        except TokenInvalid as exc:
            raise WebhookRejected(str(exc)) from None

    # --- Polling ----------------------------------------------------------------

    @property
    def client(self) -> GmailClient:
        if self._client is None:
            tokens = self.token_source(self.settings.get("token_url") or DEFAULT_TOKEN_URL)
            self._client = GmailClient(self.settings.get("api_base") or DEFAULT_API_BASE, tokens)
        return self._client

    def _path(self, suffix: str) -> str:
        return f"/gmail/v1/users/{quote(self.user_id, safe='')}{suffix}"

    def poll(self, cursor: dict) -> PollBatch:
        batch = self._poll_live(cursor or {})
        return self.with_archive(batch, cursor or {})

    def archive_page(self, state: dict) -> tuple[list[FetchedMessage], dict, bool]:
        before = self.mailbox.archive_before
        query = f"before:{int(before.timestamp())}"
        params = {"maxResults": self.page_size, "q": query if self.label_id else f"{query} -in:sent -in:drafts"}
        if self.label_id:
            params["labelIds"] = self.label_id
        token = state.get("page_token")
        if token:
            params["pageToken"] = str(token)
        response = self.client.get(self._path("/messages"), params=params, handle=(400,) if token else ())
        if response.status_code == 400:  # a page token Gmail no longer accepts: scan again (stored ones are skipped)
            return [], {"before": before.isoformat()}, False
        body = _json(response)
        messages = self._fetch([str(m["id"]) for m in body.get("messages") or [] if m.get("id")])
        next_page = body.get("nextPageToken")
        if next_page:
            return messages, {"before": before.isoformat(), "page_token": str(next_page)}, False
        return messages, {"before": before.isoformat()}, True

    def _is_history(self, body: dict) -> bool:
        before = self.mailbox.archive_before
        internal = str(body.get("internalDate") or "")
        return before is not None and internal.isdigit() and int(internal) < before.timestamp() * 1000

    def _poll_live(self, cursor: dict) -> PollBatch:
        history_id = str(cursor.get("history_id") or "")
        if not history_id:
            return self._sync(None, None)
        if cursor.get("sync_page_token"):
            return self._sync(history_id, str(cursor["sync_page_token"]))
        return self._history(history_id, str(cursor.get("history_page_token") or ""))

    def _history(self, history_id: str, page_token: str) -> PollBatch:
        params = {
            "startHistoryId": history_id,
            "maxResults": self.page_size,
            "historyTypes": ["messageAdded", "labelAdded"],
        }
        if self.label_id:
            params["labelId"] = self.label_id
        if page_token:
            params["pageToken"] = page_token
        response = self.client.get(self._path("/history"), params=params, handle=(400, 404))
        if response.status_code == 404:
            log.warning(
                "gmail: mailbox %s: historyId %s is no longer available; syncing the last %d days",
                self.mailbox.slug,
                history_id,
                self.resync_days,
            )
            return self._sync(None, None)
        if response.status_code == 400:
            if page_token:
                log.warning(
                    "gmail: mailbox %s: history page token refused; walking again from %s",
                    self.mailbox.slug,
                    history_id,
                )
                return self._history(history_id, "")
            log.warning(
                "gmail: mailbox %s: historyId %s refused; syncing the last %d days",
                self.mailbox.slug,
                history_id,
                self.resync_days,
            )
            return self._sync(None, None)
        body = _json(response)
        ids = []
        for record in body.get("history") or []:
            for added in record.get("messagesAdded") or []:
                message = added.get("message") or {}
                if message.get("id") and self._wanted(message.get("labelIds")):
                    ids.append(str(message["id"]))
            for added in record.get("labelsAdded") or []:
                # A message labelled into the inbox later (moved out of spam, un-archived).
                message = added.get("message") or {}
                if message.get("id") and (self.label_id or "INBOX") in (added.get("labelIds") or []):
                    ids.append(str(message["id"]))
        messages = self._fetch(ids)
        next_page = body.get("nextPageToken")
        if next_page:
            return PollBatch(messages, {"history_id": history_id, "history_page_token": str(next_page)}, more=True)
        latest = body.get("historyId") or max(
            [int(r["id"]) for r in body.get("history") or [] if str(r.get("id", "")).isdigit()] + [int(history_id)]
        )
        return PollBatch(messages, {"history_id": str(latest)}, more=False)

    def _sync(self, history_id: str | None, page_token: str | None) -> PollBatch:
        if history_id is None:
            profile = _json(self.client.get(self._path("/profile")))
            if not profile.get("historyId"):
                raise TransientError("unreadable_response", "gmail profile without historyId")
            history_id = str(profile["historyId"])
            log.info(
                "gmail: mailbox %s: window sync of %d days from historyId %s",
                self.mailbox.slug,
                self.resync_days,
                history_id,
            )
        if self.resync_days == 0:
            return PollBatch([], {"history_id": history_id}, more=False)
        params = {"maxResults": self.page_size, "q": f"newer_than:{self.resync_days}d"}
        if self.label_id:
            params["labelIds"] = self.label_id
        if page_token:
            params["pageToken"] = page_token
        response = self.client.get(self._path("/messages"), params=params, handle=(400,) if page_token else ())
        if response.status_code == 400:
            log.warning("gmail: mailbox %s: list page token refused; restarting the window sync", self.mailbox.slug)
            return self._sync(history_id, None)
        body = _json(response)
        ids = [str(m["id"]) for m in body.get("messages") or [] if m.get("id")]
        messages = self._fetch(ids)
        next_page = body.get("nextPageToken")
        if next_page:
            return PollBatch(messages, {"history_id": history_id, "sync_page_token": str(next_page)}, more=True)
        return PollBatch(messages, {"history_id": history_id}, more=False)

    def _wanted(self, labels) -> bool:
        if labels is None:
            return True
        if self.label_id:
            return self.label_id in labels
        return not (UNWANTED_WITHOUT_LABEL & set(labels)) and not ("SENT" in labels and "INBOX" not in labels)

    def _fetch(self, ids: list[str]) -> list[FetchedMessage]:
        fetched = []
        for message_id in self.not_yet_stored(ids):
            response = self.client.get(
                self._path(f"/messages/{quote(message_id, safe='')}"), params={"format": "raw"}, handle=(404,)
            )
            if response.status_code == 404:
                log.info(
                    "gmail: mailbox %s: message %s was deleted before it could be fetched",
                    self.mailbox.slug,
                    message_id,
                )
                continue
            body = _json(response)
            raw = decode_raw(body.get("raw"))
            fetched.append(
                FetchedMessage(
                    provider_message_id=message_id,
                    raw=raw,
                    metadata={"thread_id": body.get("threadId", ""), "label_ids": body.get("labelIds") or []},
                    history=self._is_history(body),
                )
            )
        return fetched

    # --- Listing (reconciliation) ------------------------------------------------------

    def list_recent(self, since: datetime, until: datetime, limit: int, resume: dict | None = None) -> Listing:
        params = {
            "maxResults": max(1, min(500, int(limit))),
            "q": f"after:{int(since.timestamp())} before:{int(until.timestamp()) + 1}",
        }
        if self.label_id:
            params["labelIds"] = self.label_id
        if resume and resume.get("page_token"):
            params["pageToken"] = str(resume["page_token"])
        body = _json(self.client.get(self._path("/messages"), params=params))
        listed = [ListedMessage(str(m["id"]), str(m["id"])) for m in body.get("messages") or [] if m.get("id")]
        next_page = body.get("nextPageToken")
        return Listing(listed, {"page_token": str(next_page)} if next_page else None)

    def fetch_listed(self, listed: list[ListedMessage]) -> list[FetchedMessage]:
        return self._fetch([m.provider_message_id for m in listed])

    # --- Watch (push subscription) ------------------------------------------------

    def watch(self) -> tuple[str, datetime]:
        """Start or renew `users.watch` on `settings["push_topic"]`; returns (historyId, expiry)."""
        topic = self.settings.get("push_topic")
        if not topic:
            raise PermanentError("configuration", "gmail watch needs settings.push_topic")
        request = {"topicName": topic}
        if self.label_id:
            request.update(labelIds=[self.label_id], labelFilterBehavior="INCLUDE")
        body = _json(self.client.request("POST", self._path("/watch"), json_body=request))
        try:
            expires_at = datetime.fromtimestamp(int(body["expiration"]) / 1000, tz=UTC)
        except (KeyError, TypeError, ValueError):
            raise TransientError("unreadable_response", "gmail watch without an expiration") from None
        return str(body.get("historyId") or ""), expires_at


def parse_push(body: bytes) -> dict | None:
    """`{"emailAddress", "historyId"}` from a Pub/Sub push (wrapped, or unwrapped payload), else None."""
    try:
        envelope = json.loads(body or b"{}")
    except ValueError:
        return None
    if not isinstance(envelope, dict):
        return None
    if "message" not in envelope:
        return envelope if "historyId" in envelope else None
    message = envelope.get("message")
    if not isinstance(message, dict):
        return None
    try:
        notice = json.loads(base64.b64decode(str(message.get("data") or ""), validate=False))
    except (ValueError, binascii.Error):
        return None
    return notice if isinstance(notice, dict) else None


def decode_raw(value) -> bytes:
    if not isinstance(value, str) or not value:
        raise TransientError("unreadable_response", "gmail message without raw content")
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (ValueError, binascii.Error):
        raise TransientError("unreadable_response", "gmail raw content is not base64url") from None


def _json(response) -> dict:
    body = json_or_empty(response)
    if not body and response.content.strip() not in (b"{}",):
        raise TransientError("unreadable_response", f"gmail HTTP {response.status_code}, body is not JSON")
    return body

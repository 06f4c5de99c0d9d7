"""Microsoft Graph (Exchange Online / Outlook): change notifications and delta polling.

Webhook (`POST /webhooks/graph/<mailbox_slug>/`):
  - `?validationToken=...` (sent when a subscription is created): answered with
    the token as `text/plain`, 200, nothing else done;
  - a notification batch `{"value": [...]}`: every notification's `clientState`
    must equal the secret `Mailbox.webhook_secret_ref` resolves to (constant-time
    compare); one mismatch or a missing secret rejects the whole request
    (WebhookRejected -> 401, nothing stored). A verified batch returns
    `WebhookResult(poll=True)`: the durable poll runs the delta query. Lifecycle
    notifications (`reauthorizationRequired`, `subscriptionRemoved`) mark the
    stored subscription due, so the renewal beat renews or recreates it at once.

Polling (`poll(cursor)`), one page of the folder's message delta per call,
always with `Prefer: IdType="ImmutableId"` so ids survive moves between folders:
  - `{}`: a new delta round over the folder, limited to messages received in the
    last `resync_days` (`$filter=receivedDateTime ge ...`);
  - `{"next_link": L}`: the next page of a round in progress (`more=True`);
  - `{"delta_link": L}`: what changed since the round that produced L.
  410 Gone, or an error code `syncStateNotFound`/`syncStateInvalid`/
  `resyncRequired`, starts a new round (resync); messages this mailbox already
  stored are not fetched again, and `ingest` absorbs any other duplicate.
  Removed items (`@removed`) are skipped. MIME comes from `/messages/{id}/$value`;
  a message deleted before the fetch (404) is skipped. Links are followed only
  on the `api_base` origin: the bearer token goes with them.

`provider_message_id` is the message's immutable id, the same whether a
notification or a scheduled poll led to it (both run this delta).

`Mailbox.settings`: api_base (https://graph.microsoft.com/v1.0), user (the
mailbox's user id or UPN; empty means `/me` with delegated tokens), folder
("inbox", a well-known name or a folder id), tenant_id, client_id, token_url
(https://login.microsoftonline.com/<tenant_id>/oauth2/v2.0/token), scope,
resync_days (7; a resync only sees that window: keep it longer than the longest
outage you want covered), page_size (50; `batch_size` overrides it),
notification_url and subscription_minutes (for `intake.channels.graph_subscriptions`).
`credentials_ref`: see `intake.providers.oauth` (client credentials, app-only,
or a delegated refresh token).

Listing (reconciliation, `list_recent`): `GET .../mailFolders/{folder}/messages` with
`$filter=receivedDateTime ge <since> and receivedDateTime le <until>`, `$select=id`, `$top=<limit>`
(immutable ids), `@odata.nextLink` as the resume point; `fetch_listed` is the poll's `$value` fetch.

Archive import (`Mailbox.archive_before` set, `archive_done_at` not yet; intake.archive): once the delta has
nothing more, `GET .../mailFolders/{folder}/messages` with `$filter=receivedDateTime lt <cut-off>`, a page
per call (`"archive": {"before", "next_link"}` in the cursor), every message fetched unless stored; the
last page says `archive_done`. While a cut-off is set, a message whose receivedDateTime (from the delta,
the listing or the scan) is before it is `history`.
"""

import hmac
import json
import logging
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

from django.http import HttpResponse
from django.utils import timezone

from intake.http import json_or_empty
from intake.models import ProviderSubscription
from intake.secrets import SecretUnavailable, resolve_secret

from .base import FetchedMessage, ListedMessage, Listing, PollBatch, TransientError, WebhookRejected, WebhookResult
from .common import ApiProvider
from .oauth import ApiClient, error_code

log = logging.getLogger(__name__)

DEFAULT_API_BASE = "https://graph.microsoft.com/v1.0"
DEFAULT_SCOPE = "https://graph.microsoft.com/.default"
DEFAULT_PAGE_SIZE = 50
DEFAULT_RESYNC_DAYS = 7
IMMUTABLE_IDS = 'IdType="ImmutableId"'
SYNC_RESET_CODES = {"syncstatenotfound", "syncstateinvalid", "resyncrequired"}
LIFECYCLE_RENEW = {"reauthorizationRequired", "subscriptionRemoved"}


class GraphClient(ApiClient):
    label = "graph"


class GraphProvider(ApiProvider):
    name = "graph"
    supports_webhook = True
    supports_polling = True
    supports_listing = True
    default_page_size = DEFAULT_PAGE_SIZE
    largest_page_size = 1000
    default_resync_days = DEFAULT_RESYNC_DAYS

    def __init__(self, mailbox):
        super().__init__(mailbox)
        self.user = str(self.settings.get("user") or "")
        self.folder = str(self.settings.get("folder") or "inbox")
        self._listed_dates: dict[str, str] = {}  # id -> receivedDateTime of what list_recent named

    # --- Webhook ------------------------------------------------------------------

    def handle_webhook(self, request, body: bytes) -> WebhookResult:
        token = request.GET.get("validationToken")
        if token is not None:
            # Graph checks that we echo the token, as text/plain, within 10 seconds.
            log.info("graph: validation handshake for mailbox %s", self.mailbox.slug)
            return WebhookResult(response=HttpResponse(token, content_type="text/plain", status=200))
        try:
            payload = json.loads(body or b"")
        except ValueError:
            raise WebhookRejected("notification is not JSON") from None
        notifications = payload.get("value") if isinstance(payload, dict) else None
        if (
            not isinstance(notifications, list)
            or not notifications
            or not all(isinstance(n, dict) for n in notifications)
        ):
            raise WebhookRejected("no notifications to verify")
        try:
            secret = resolve_secret(self.mailbox.webhook_secret_ref, tenant=self.mailbox.tenant, owner=self.mailbox)
        except SecretUnavailable as exc:
            log.error("graph: mailbox %s has no usable clientState secret: %s", self.mailbox.slug, exc)
            raise WebhookRejected("clientState cannot be verified") from None
        for notification in notifications:
            supplied = str(notification.get("clientState") or "")
            if not secret or not hmac.compare_digest(supplied.encode(), secret.encode()):
                raise WebhookRejected("clientState mismatch")
        lifecycle = {str(n.get("lifecycleEvent")) for n in notifications if n.get("lifecycleEvent")}
        if lifecycle & LIFECYCLE_RENEW:
            # Let the renewal beat renew (or recreate) the subscription on its next run.
            ProviderSubscription.objects.filter(mailbox=self.mailbox, provider=self.name).update(
                expires_at=timezone.now()
            )
            log.warning(
                "graph: mailbox %s: lifecycle %s; subscription marked due",
                self.mailbox.slug,
                ",".join(sorted(lifecycle)),
            )
        log.info("graph: %d notification(s) for mailbox %s", len(notifications), self.mailbox.slug)
        return WebhookResult(poll=True)

    # --- Polling --------------------------------------------------------------------

    @property
    def client(self) -> GraphClient:
        if self._client is None:
            tenant = str(self.settings.get("tenant_id") or "organizations")
            scope = str(self.settings.get("scope") or DEFAULT_SCOPE)
            tokens = self.token_source(
                self.settings.get("token_url")
                or f"https://login.microsoftonline.com/{quote(tenant, safe='')}/oauth2/v2.0/token",
                scope=scope,
                refresh_scope=f"{scope} offline_access",
            )
            self._client = GraphClient(self.settings.get("api_base") or DEFAULT_API_BASE, tokens)
        return self._client

    @property
    def user_path(self) -> str:
        return f"/users/{quote(self.user, safe='')}" if self.user else "/me"

    @property
    def resource(self) -> str:
        """The subscription resource: new messages in the folder."""
        owner = f"users/{self.user}" if self.user else "me"
        return f"{owner}/mailFolders('{self.folder}')/messages"

    def _headers(self) -> dict:
        return {"Prefer": f"{IMMUTABLE_IDS}, odata.maxpagesize={self.page_size}"}

    def poll(self, cursor: dict) -> PollBatch:
        cursor = cursor or {}
        link = cursor.get("next_link") or cursor.get("delta_link")
        batch = self._page(str(link) if link else None)
        return self.with_archive(batch, cursor)

    def archive_page(self, state: dict) -> tuple[list[FetchedMessage], dict, bool]:
        before = self.mailbox.archive_before
        fresh = {"before": before.isoformat()}
        if state.get("next_link"):
            response = self.client.get(str(state["next_link"]), headers=self._headers(), handle=(400, 404, 410))
            if response.status_code != 200:  # a page link no longer served: scan again (stored ones are skipped)
                return [], fresh, False
        else:
            params = {
                "$filter": f"receivedDateTime lt {before.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}",
                "$select": "id,receivedDateTime",
                "$top": self.page_size,
            }
            path = f"{self.user_path}/mailFolders/{quote(self.folder, safe='')}/messages"
            response = self.client.get(path, params=params, headers=self._headers())
        body = json_or_empty(response)
        if not isinstance(body.get("value"), list):
            raise TransientError("unreadable_response", f"graph HTTP {response.status_code}, no message page")
        messages = self._fetch(*self._ids_and_dates(body["value"]))
        next_link = body.get("@odata.nextLink")
        if next_link:
            return messages, {**fresh, "next_link": str(next_link)}, False
        return messages, fresh, True

    @staticmethod
    def _ids_and_dates(items) -> tuple[list[str], dict[str, str]]:
        items = [item for item in items if isinstance(item, dict) and item.get("id") and "@removed" not in item]
        return [str(item["id"]) for item in items], {
            str(item["id"]): str(item.get("receivedDateTime") or "") for item in items
        }

    def _is_history(self, received: str) -> bool:
        before = self.mailbox.archive_before
        if before is None or not received:
            return False
        try:
            return datetime.fromisoformat(received.replace("Z", "+00:00")) < before
        except ValueError:
            return False

    def _page(self, link: str | None) -> PollBatch:
        if link is None:
            params = {"$select": "id,receivedDateTime"}
            since = timezone.now() - timedelta(days=self.resync_days)
            params["$filter"] = f"receivedDateTime ge {since.strftime('%Y-%m-%dT%H:%M:%SZ')}"
            path = f"{self.user_path}/mailFolders/{quote(self.folder, safe='')}/messages/delta"
            log.info("graph: mailbox %s: new delta round over the last %d days", self.mailbox.slug, self.resync_days)
            response = self.client.get(path, params=params, headers=self._headers())
        else:
            response = self.client.get(link, headers=self._headers(), handle=(400, 404, 410))
            if response.status_code != 200:
                if response.status_code == 410 or error_code(response).lower() in SYNC_RESET_CODES:
                    log.warning(
                        "graph: mailbox %s: sync state gone (HTTP %s); resyncing",
                        self.mailbox.slug,
                        response.status_code,
                    )
                    return self._page(None)
                raise self.client.http_error(response)
        body = json_or_empty(response)
        if not isinstance(body.get("value"), list):
            raise TransientError("unreadable_response", f"graph HTTP {response.status_code}, no delta page")
        messages = self._fetch(*self._ids_and_dates(body["value"]))
        if body.get("@odata.nextLink"):
            return PollBatch(messages, {"next_link": str(body["@odata.nextLink"])}, more=True)
        if body.get("@odata.deltaLink"):
            return PollBatch(messages, {"delta_link": str(body["@odata.deltaLink"])}, more=False)
        raise TransientError("unreadable_response", "graph delta page without nextLink or deltaLink")

    # --- Listing (reconciliation) ------------------------------------------------------

    def list_recent(self, since, until, limit: int, resume: dict | None = None) -> Listing:
        top = max(1, min(self.largest_page_size, int(limit)))
        headers = {"Prefer": f"{IMMUTABLE_IDS}, odata.maxpagesize={top}"}
        if resume and resume.get("next_link"):
            response = self.client.get(str(resume["next_link"]), headers=headers)
        else:
            window = (
                f"receivedDateTime ge {since.strftime('%Y-%m-%dT%H:%M:%SZ')} and "
                f"receivedDateTime le {until.strftime('%Y-%m-%dT%H:%M:%SZ')}"
            )
            params = {"$filter": window, "$select": "id,receivedDateTime", "$top": top}
            path = f"{self.user_path}/mailFolders/{quote(self.folder, safe='')}/messages"
            response = self.client.get(path, params=params, headers=headers)
        body = json_or_empty(response)
        if not isinstance(body.get("value"), list):
            raise TransientError("unreadable_response", f"graph HTTP {response.status_code}, no message page")
        listed = [
            ListedMessage(str(item["id"]), str(item["id"]))
            for item in body["value"]
            if isinstance(item, dict) and item.get("id")
        ]
        self._listed_dates.update(self._ids_and_dates(body["value"])[1])  # for fetch_listed: history or not
        next_link = body.get("@odata.nextLink")
        return Listing(listed, {"next_link": str(next_link)} if next_link else None)

    def fetch_listed(self, listed: list[ListedMessage]) -> list[FetchedMessage]:
        return self._fetch([m.provider_message_id for m in listed], self._listed_dates)

    def _fetch(self, ids: list[str], received: dict[str, str] | None = None) -> list[FetchedMessage]:
        fetched = []
        for message_id in self.not_yet_stored(ids):
            response = self.client.get(
                f"{self.user_path}/messages/{quote(message_id, safe='')}/$value",
                headers={"Prefer": IMMUTABLE_IDS},
                handle=(404,),
            )
            if response.status_code == 404:
                log.info("graph: mailbox %s: a message was deleted before it could be fetched", self.mailbox.slug)
                continue
            if not response.content:
                raise TransientError("unreadable_response", "graph returned an empty MIME body")
            fetched.append(
                FetchedMessage(
                    provider_message_id=message_id,
                    raw=response.content,
                    metadata={"folder": self.folder},
                    history=self._is_history((received or {}).get(message_id, "")),
                )
            )
        return fetched

"""OAuth access tokens and an authorized JSON client for the API providers (Gmail, Microsoft Graph).

`Mailbox.credentials_ref` resolves to a JSON object (the secret never enters the
database), for example

    {"refresh_token": "...", "client_secret": "...", "client_id": "..."}   # refresh-token grant
    {"client_secret": "...", "client_id": "..."}                           # client credentials (Graph, app-only)

`client_id` may also come from `Mailbox.settings["client_id"]`. Access tokens are
obtained from the token endpoint when missing or about to expire and kept in
process memory only (never in the database, never in a log line). The cache key
includes a hash of the credentials, so rotating the secret takes effect at once.

When the token endpoint answers a refresh with a `refresh_token` other than the one sent (Microsoft rotates
them; a discarded one stops the mailbox after about 90 days), the credentials blob is written back with it
(intake.secret_store: the file replaced atomically, or the Vault key) and audited REFRESH_TOKEN_ROTATED before
the new access token is used. A reference that cannot be written (`env:`) keeps the new token in this
process's memory only (warned, audited); a write that fails keeps it in memory too and fails the poll as
transient, so the next attempt sends the new token and writes again.

`ApiClient` makes one HTTP call without automatic retries and maps every outcome
to the failure kinds of `intake.failures`:
  - connection refused / reset / timeout, 429, 5xx  -> TransientError (retry_after from Retry-After)
  - 401 (after one refresh and retry), invalid_grant -> PermanentError("credentials")
  - anything else                                    -> PermanentError(reason)
All calls here are reads or idempotent, so a failure after sending is still transient.
"""

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass

import requests
from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from intake.egress import EgressRefused, guarded_session
from intake.failures import PermanentError, TransientError
from intake.http import json_or_empty, parse_retry_after
from intake.secret_store import SecretWriteFailed, keep_rotated_refresh_token
from intake.secrets import SecretUnavailable, resolve_secret

log = logging.getLogger(__name__)

# Refresh a little before the provider says the token expires: clocks drift, requests take time.
EXPIRY_SKEW_SECONDS = 60
DEFAULT_TIMEOUT = (3.05, 20.0)
MAX_DETAIL_CHARS = 300

_cache: dict[str, tuple[str, float]] = {}
_cache_lock = threading.Lock()
# credentials_ref -> (refresh token in the stored blob, the rotated one that replaced it but is not stored yet)
_unstored: dict[str, tuple[str, str]] = {}


def clear_token_cache() -> None:
    with _cache_lock:
        _cache.clear()
        _unstored.clear()


def current_refresh_token(ref: str, stored: str) -> str:
    """The refresh token to send: a rotated one this process could not store yet wins over the stored one."""
    with _cache_lock:
        pending = _unstored.get(ref)
    return pending[1] if pending and pending[0] == stored else stored


def keep_rotation(mailbox, *, ref: str, blob: dict, sent: str, received: str, provider: str) -> None:
    """The provider replaced refresh token `sent` by `received`: store it (before its access token is used).
    Raises TransientError when a writable reference could not be written (the new token is kept in memory)."""
    if not received or received == sent:
        return
    stored = str(blob.get("refresh_token") or "")
    if not hasattr(mailbox, "_meta"):
        log.warning("oauth: a rotated refresh token for %s has no mailbox to be stored for", ref)
        with _cache_lock:
            _unstored[ref] = (stored, received)
        return
    try:
        kept = keep_rotated_refresh_token(
            mailbox=mailbox, blob=blob, new_refresh_token=received, actor=f"provider:{provider}", provider=provider
        )
    except (SecretWriteFailed, SecretUnavailable) as exc:
        with _cache_lock:
            _unstored[ref] = (stored, received)
        log.error(
            "oauth: mailbox %s: the rotated refresh token could not be stored (%s); kept in memory",
            getattr(mailbox, "slug", "-"),
            exc,
        )
        raise TransientError("secret_store", f"the rotated refresh token could not be stored: {exc}") from None
    with _cache_lock:
        if kept:
            _unstored.pop(ref, None)
        else:  # env: cannot be written; this process keeps using the new one
            _unstored[ref] = (stored, received)


def load_credentials(ref: str, tenant, owner=None) -> dict:
    """The JSON credentials blob a `credentials_ref` points at; PermanentError("credentials") if unusable."""
    try:
        secret = resolve_secret(ref, tenant=tenant, owner=owner)
    except SecretUnavailable as exc:
        raise PermanentError("credentials", str(exc)) from None
    try:
        blob = json.loads(secret)
    except ValueError:
        raise PermanentError("credentials", "the credentials secret is not a JSON object") from None
    if not isinstance(blob, dict):
        raise PermanentError("credentials", "the credentials secret is not a JSON object")
    return blob


def client_secret_for(blob: dict, tenant, owner=None) -> str:
    """The client secret: the credentials blob's own, else the mailbox's `client_secret_ref` (a platform
    reference bound to the mailbox, which the consent flow never copies into the tenant's blob). Never
    added to the blob: a rotated blob written back must not carry a platform secret into the tenant's file."""
    if blob.get("client_secret"):
        return str(blob["client_secret"])
    ref = str(((getattr(owner, "settings", None) or {}).get("client_secret_ref")) or "")
    if not ref:
        return ""
    try:
        return resolve_secret(ref, tenant=tenant, owner=owner)
    except SecretUnavailable as exc:
        raise PermanentError("credentials", f"client_secret_ref: {exc}") from None


@dataclass
class TokenSource:
    """Access tokens for one set of credentials, refreshed when expired."""

    token_url: str
    credentials_ref: str
    client_id: str = ""
    scope: str = ""
    refresh_scope: str = ""
    timeout: tuple = DEFAULT_TIMEOUT
    session: requests.Session | None = None
    tenant: object = None  # the mailbox's tenant and the mailbox: the scope of credentials_ref
    owner: object = None

    # Whether the last `token()` came from the endpoint just now (True) or from the cache: a fresh token the
    # server refuses means the credentials are refused; a cached one may merely have expired early.
    last_fresh: bool = False
    provider_label: str = ""  # for the audit row; default: the owner's provider

    def _grant(self) -> tuple[str, dict, dict]:
        blob = load_credentials(self.credentials_ref, self.tenant, self.owner)
        client_id = str(blob.get("client_id") or self.client_id or "")
        client_secret = client_secret_for(blob, self.tenant, self.owner)
        refresh_token = blob.get("refresh_token")
        if refresh_token:
            refresh_token = current_refresh_token(self.credentials_ref, str(refresh_token))
            form = {"grant_type": "refresh_token", "refresh_token": refresh_token}
            if self.refresh_scope:
                form["scope"] = self.refresh_scope
        elif client_secret:
            form = {"grant_type": "client_credentials"}
            if self.scope:
                form["scope"] = self.scope
        else:
            raise PermanentError("credentials", "credentials hold neither refresh_token nor client_secret")
        if not client_id:
            raise PermanentError("credentials", "no client_id in the credentials or the mailbox settings")
        form["client_id"] = client_id
        if client_secret:
            form["client_secret"] = str(client_secret)
        return self._key(form), form, blob

    def _key(self, form: dict) -> str:
        return hashlib.sha256(json.dumps([self.token_url, form], sort_keys=True).encode()).hexdigest()

    def token(self) -> str:
        key, form, blob = self._grant()
        with _cache_lock:
            cached = _cache.get(key)
        if cached and cached[1] - EXPIRY_SKEW_SECONDS > time.time():
            self.last_fresh = False
            return cached[0]
        access_token, expires_at, rotated = self._refresh(form)
        if rotated:
            # Stored before the new access token is used: the old refresh token may be void already.
            keep_rotation(
                self.owner,
                ref=self.credentials_ref,
                blob=blob,
                sent=form["refresh_token"],
                received=rotated,
                provider=self.provider_label or getattr(self.owner, "provider", "oauth"),
            )
            key = self._key({**form, "refresh_token": rotated})  # what the next `_grant()` will compute
        with _cache_lock:
            _cache[key] = (access_token, expires_at)
        self.last_fresh = True
        return access_token

    def invalidate(self) -> None:
        """Forget the cached token (the API refused it): the next `token()` refreshes."""
        try:
            key, _, _ = self._grant()
        except PermanentError:
            return
        with _cache_lock:
            _cache.pop(key, None)

    def _refresh(self, form: dict) -> tuple[str, float, str]:
        """(access token, expiry, the new refresh token when the endpoint rotated it, else "")."""
        if self.session is None:
            # The token URL is the mailbox's setting: through the egress guard, like the API it unlocks.
            self.session = guarded_session(purpose="token_url")
        try:
            response = self.session.post(
                self.token_url,
                data=form,
                timeout=self.timeout,
                allow_redirects=False,
                headers={"Accept": "application/json"},
            )
        except EgressRefused as exc:
            raise PermanentError("configuration", str(exc)) from None
        except requests.RequestException as exc:
            raise network_error(exc, "token endpoint") from None
        body = json_or_empty(response)
        if response.status_code == 200 and body.get("access_token"):
            try:
                lifetime = float(body.get("expires_in") or 3600)
            except (TypeError, ValueError):
                lifetime = 3600.0
            log.info("oauth: refreshed an access token at %s (valid %.0f s)", _origin(self.token_url), lifetime)
            sent, received = form.get("refresh_token"), str(body.get("refresh_token") or "")
            rotated = received if sent and received and received != sent else ""
            return str(body["access_token"]), time.time() + lifetime, rotated
        error = str(body.get("error") or "")
        if response.status_code == 429 or response.status_code >= 500:
            raise TransientError(
                "token_endpoint",
                f"HTTP {response.status_code}",
                retry_after=parse_retry_after(response.headers.get("Retry-After")),
            )
        if response.status_code == 200 or error == "temporarily_unavailable":  # RFC 6749 §4.1.2.1: try later
            raise TransientError("token_endpoint", f"HTTP {response.status_code} {error or 'without an access_token'}")
        # 400 invalid_grant / invalid_client / unauthorized_client, 401: the credentials are refused.
        detail = f"token endpoint HTTP {response.status_code} {error}".strip()
        raise PermanentError("credentials", detail[:MAX_DETAIL_CHARS])


class ApiClient:
    """Bearer-authorized calls to one API, no automatic retries; errors mapped to the failure kinds."""

    label = "api"

    def __init__(self, api_base: str, tokens: TokenSource, *, timeout=DEFAULT_TIMEOUT, headers: dict | None = None):
        self.api_base = api_base.rstrip("/")
        self.origin = _origin(self.api_base)
        self.tokens = tokens
        self.timeout = timeout
        # The API base and the token URL are the mailbox's settings: every call through the egress guard
        # (intake.egress), checked at connect time; no automatic retries.
        self.session = guarded_session(purpose="api_base", max_retries=0)
        self.session.headers.update({"User-Agent": "mailroom/1", **(headers or {})})

    def url(self, path_or_url: str) -> str:
        if path_or_url.startswith(("http://", "https://")):
            # The bearer token goes with every request: follow links only on the API's own origin.
            if not self.origin or _origin(path_or_url) != self.origin:
                raise PermanentError("configuration", f"{self.label}: refusing a link to another origin")
            return path_or_url
        return self.api_base + path_or_url

    def get(self, path_or_url: str, *, params=None, headers=None, handle: tuple[int, ...] = ()) -> requests.Response:
        return self.request("GET", path_or_url, params=params, headers=headers, handle=handle)

    def request(
        self, method: str, path_or_url: str, *, params=None, json_body=None, headers=None, handle: tuple[int, ...] = ()
    ) -> requests.Response:
        """Returns a 2xx response, or one whose status is in `handle`; otherwise raises a failure kind."""
        url = self.url(path_or_url)
        for attempt in (1, 2):
            request_headers = {"Authorization": f"Bearer {self.tokens.token()}", **(headers or {})}
            started = time.monotonic()
            try:
                response = self.session.request(
                    method,
                    url,
                    params=params,
                    json=json_body,
                    headers=request_headers,
                    timeout=self.timeout,
                    allow_redirects=False,
                )
            except EgressRefused as exc:
                raise PermanentError("configuration", str(exc)) from None
            except requests.RequestException as exc:
                raise network_error(exc, self.label) from None
            log.debug(
                "%s: %s %s -> %s in %.0f ms",
                self.label,
                method,
                _path(url),
                response.status_code,
                (time.monotonic() - started) * 1000,
            )
            if response.status_code == 401 and attempt == 1:
                # Revoked or expired early: refresh once; a second 401 means the credentials are refused.
                self.tokens.invalidate()
                continue
            break
        status = response.status_code
        if 200 <= status < 300 or status in handle:
            return response
        raise self.http_error(response)

    def http_error(self, response: requests.Response):
        status = response.status_code
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        code = error_code(response)
        if status == 429:
            return TransientError("rate_limited", f"{self.label} HTTP 429 {code}".strip(), retry_after=retry_after)
        if status >= 500:
            return TransientError("server_error", f"{self.label} HTTP {status} {code}".strip(), retry_after=retry_after)
        if status in (401, 403):
            return PermanentError("credentials", f"{self.label} HTTP {status} {code}".strip())
        if status == 404:
            return PermanentError("not_found", f"{self.label} HTTP 404 {code}".strip())
        return PermanentError("rejected", f"{self.label} HTTP {status} {code}".strip())


def network_error(exc: requests.RequestException, label: str):
    if isinstance(
        exc, (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema)
    ):
        return PermanentError("configuration", f"{label}: bad URL ({type(exc).__name__})")
    reason = "timeout" if isinstance(exc, requests.exceptions.Timeout) else "connection"
    return TransientError(reason, f"{label}: {type(exc).__name__}")


def error_code(response: requests.Response) -> str:
    """The API's own error code (Google: error.status / errors[].reason; Graph: error.code), for details."""
    error = json_or_empty(response).get("error")
    if isinstance(error, dict):
        reasons = [e.get("reason") for e in error.get("errors") or [] if isinstance(e, dict) and e.get("reason")]
        return str((reasons[0] if reasons else None) or error.get("code") or error.get("status") or "")[:100]
    return str(error or "")[:100]


def _origin(url: str) -> str:
    """scheme://host:port as the request would reach it (urllib3's parser: what makes the request); "" for a
    URL with user information or a backslash (the egress guard refuses those when it is sent)."""
    try:
        parts = parse_url(str(url))
    except LocationParseError:
        return ""
    if parts.auth is not None or "\\" in str(url) or not parts.host:
        return ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{parts.host}:{port}".lower()


def _path(url: str) -> str:
    return url.split("?", 1)[0].split("://", 1)[-1].partition("/")[2]

"""Access tokens for IMAP with OAuth 2.0 (`Mailbox.settings["auth"] = "xoauth2"`; intake.providers.imap logs in
with SASL XOAUTH2, or OAUTHBEARER with `sasl: "oauthbearer"`).

`oauth_flavor` says who issues the tokens; `credentials_ref` resolves to a JSON object, as for Graph and Gmail:

    generic    `token_url`, `client_id`, `scope`: the refresh-token or client-credentials grant of
               intake.providers.oauth.TokenSource (any RFC 6749 token endpoint)
    microsoft  `authority` (https://login.microsoftonline.com/<tenant id>), `client_id`, with `msal`:
               {"client_id", "client_secret"}                   client credentials, app-only (shared mailboxes),
                                                                scope https://outlook.office365.com/.default
               {"client_id", "client_secret"?, "refresh_token"} delegated (authorization code, connected by an
                                                                admin), scope IMAP.AccessAsUser.All
    google     with `google-auth`:
               {"type": "service_account", ...key file...}      domain-wide delegation: a token for the mailbox
                                                                user (`username`, else the address)
               {"client_id", "client_secret", "refresh_token"}  delegated
               scope https://mail.google.com/; `token_url` overrides the token endpoint

Every token request goes through the egress guard (intake.egress.guarded_session: msal's `http_client`,
google-auth's transport). A refresh token the provider rotates is stored before its access token is used
(intake.providers.oauth.keep_rotation). Access tokens stay in process memory, keyed by a hash of the
credentials. A source says whether its last token was fetched just now (`last_fresh`): the IMAP login
refreshes a cached token that the server refuses once, and calls a refused fresh token a credentials problem.
"""

import functools
import hashlib
import json
import logging
import threading
import time
from datetime import UTC

import requests

from intake.egress import EgressRefused, guarded_session
from intake.failures import PermanentError, TransientError

from .oauth import (
    EXPIRY_SKEW_SECONDS,
    TokenSource,
    client_secret_for,
    current_refresh_token,
    keep_rotation,
    load_credentials,
    network_error,
)

log = logging.getLogger(__name__)

KEY_SETTINGS = ("authority", "token_url", "client_id", "scope", "username", "oauth_flavor")
MICROSOFT_APP_SCOPE = "https://outlook.office365.com/.default"
MICROSOFT_DELEGATED_SCOPE = "https://outlook.office.com/IMAP.AccessAsUser.All"
GOOGLE_SCOPE = "https://mail.google.com/"
GOOGLE_TOKEN_URL = "https://oauth2.googleapis.com/token"
# What a token endpoint says when the grant itself is refused (RFC 6749 §5.2): an admin must reconnect.
# Token-endpoint errors only a person fixes (RFC 6749 §5.2; Microsoft's interaction_required and consent_required:
# the user or an admin must sign in or consent again).
REFUSED = (
    "invalid_grant",
    "invalid_client",
    "unauthorized_client",
    "invalid_scope",
    "access_denied",
    "interaction_required",
    "consent_required",
)
TIMEOUT = (3.05, 20.0)

_cache: dict[str, tuple[str, float]] = {}
_lock = threading.Lock()


def clear_cache() -> None:
    with _lock:
        _cache.clear()


def token_source(mailbox):
    """The token source `mailbox`'s settings ask for (each has `token()`, `invalidate()`, `last_fresh`, `session`)."""
    options = mailbox.settings or {}
    flavor = options.get("oauth_flavor") or "generic"
    if flavor == "microsoft":
        return MicrosoftTokens(mailbox)
    if flavor == "google":
        return GoogleTokens(mailbox)
    if flavor != "generic":
        raise PermanentError("settings", f"unknown oauth_flavor {flavor!r}")
    if not options.get("token_url"):
        raise PermanentError("settings", "auth xoauth2 needs a token_url")
    return TokenSource(
        token_url=options["token_url"],
        credentials_ref=mailbox.credentials_ref,
        client_id=str(options.get("client_id") or ""),
        scope=str(options.get("scope") or ""),
        refresh_scope=str(options.get("scope") or ""),  # Microsoft v2 wants it on a refresh
        tenant=mailbox.tenant,
        owner=mailbox,
        provider_label="imap",
        timeout=TIMEOUT,
    )


class _CachedTokens:
    """The shared part: credentials read per call, access tokens cached by a hash of them."""

    def __init__(self, mailbox):
        self.mailbox = mailbox
        self.options = mailbox.settings or {}
        self.session: requests.Session | None = None
        self.last_fresh = False

    def _blob(self) -> dict:
        blob = load_credentials(self.mailbox.credentials_ref, self.mailbox.tenant, self.mailbox)
        if blob.get("refresh_token"):
            pending = current_refresh_token(self.mailbox.credentials_ref, str(blob["refresh_token"]))
            return {**blob, "refresh_token": pending}
        return blob

    def _key(self, blob: dict) -> str:
        # Per mailbox, and by everything that decides what the token grants: two mailboxes never share one
        # (another tenant's blob may look the same while only its client_secret_ref, or the subject, differs).
        secret = hashlib.sha256(client_secret_for(blob, self.mailbox.tenant, self.mailbox).encode()).hexdigest()
        material = [
            type(self).__name__,
            self.mailbox.pk,
            secret,
            blob,
            {name: self.options.get(name) for name in KEY_SETTINGS},
            self.mailbox.address,
        ]
        return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()

    def _session(self) -> requests.Session:
        if self.session is None:
            self.session = guarded_session(purpose="token_url")
            # requests has no session-wide timeout and msal passes none (msal's own advice: this partial);
            # google-auth passes its own, which wins.
            self.session.request = functools.partial(self.session.request, timeout=TIMEOUT)
        return self.session

    def token(self) -> str:
        blob = self._blob()
        key = self._key(blob)
        with _lock:
            cached = _cache.get(key)
        if cached and cached[1] - EXPIRY_SKEW_SECONDS > time.time():
            self.last_fresh = False
            return cached[0]
        try:
            access_token, expires_at, rotated = self._fetch(blob)
        except EgressRefused as exc:
            raise PermanentError("configuration", str(exc)) from None
        except requests.RequestException as exc:
            raise network_error(exc, "token endpoint") from None
        if rotated and rotated != blob.get("refresh_token"):
            stored = load_credentials(self.mailbox.credentials_ref, self.mailbox.tenant, self.mailbox)
            keep_rotation(
                self.mailbox,
                ref=self.mailbox.credentials_ref,
                blob=stored,
                sent=str(blob["refresh_token"]),
                received=rotated,
                provider="imap",
            )
            key = self._key({**blob, "refresh_token": rotated})
        with _lock:
            _cache[key] = (access_token, expires_at)
        self.last_fresh = True
        return access_token

    def invalidate(self) -> None:
        try:
            key = self._key(self._blob())
        except PermanentError:
            return
        with _lock:
            _cache.pop(key, None)

    def _fetch(self, blob: dict) -> tuple[str, float, str]:
        """Subclasses of _CachedTokens must provide this method: a fresh token for the credentials in `blob`,
        as (access token, its expiry in epoch seconds, a refresh token to keep or '')."""
        raise NotImplementedError


class MicrosoftTokens(_CachedTokens):
    """Microsoft identity platform tokens with msal: client credentials (app-only) or a delegated refresh token."""

    def _fetch(self, blob: dict) -> tuple[str, float, str]:
        import msal

        authority = str(self.options.get("authority") or "")
        client_id = str(blob.get("client_id") or self.options.get("client_id") or "")
        if not authority or not client_id:
            raise PermanentError("settings", "oauth_flavor microsoft needs an authority and a client_id")
        secret = client_secret_for(blob, self.mailbox.tenant, self.mailbox)
        refresh_token = blob.get("refresh_token")
        if not (secret or refresh_token):
            raise PermanentError("credentials", "credentials hold neither refresh_token nor client_secret")
        # Our own cache keys the tokens by the credentials; msal's is per call (nothing kept across polls).
        # instance_discovery off: the authority is the admin's setting (egress-checked), and login.microsoftonline.com
        # is known to msal anyway; discovery would ask login.microsoftonline.com about any other host.
        common = {
            "authority": authority,
            "http_client": self._session(),
            "token_cache": msal.TokenCache(),
            "instance_discovery": False,
        }
        try:
            app = (
                msal.ConfidentialClientApplication(client_id, client_credential=str(secret), **common)
                if secret
                else msal.PublicClientApplication(client_id, **common)
            )
            if refresh_token:
                scopes = str(self.options.get("scope") or MICROSOFT_DELEGATED_SCOPE).split()
                result = app.acquire_token_by_refresh_token(str(refresh_token), scopes=scopes)
            else:
                result = app.acquire_token_for_client(scopes=[str(self.options.get("scope") or MICROSOFT_APP_SCOPE)])
        except ValueError as exc:  # an authority msal cannot use (EgressRefused is a ValueError too: re-raised)
            if isinstance(exc, EgressRefused):
                raise
            raise PermanentError("settings", f"msal: {exc}") from None
        return _result(result or {}, "microsoft")


class GoogleTokens(_CachedTokens):
    """Google tokens with google-auth: a service account with domain-wide delegation, or a refresh token."""

    def _fetch(self, blob: dict) -> tuple[str, float, str]:
        import google.auth.exceptions
        from google.auth.transport.requests import Request
        from google.oauth2 import credentials as user_credentials, service_account

        scopes = str(self.options.get("scope") or GOOGLE_SCOPE).split()
        token_url = self.options.get("token_url")
        subject = self.options.get("username") or self.mailbox.address
        try:
            if blob.get("type") == "service_account":
                creds = service_account.Credentials.from_service_account_info(blob, scopes=scopes, subject=subject)
                if token_url:
                    creds = creds.with_token_uri(token_url)
            elif blob.get("refresh_token"):
                creds = user_credentials.Credentials(
                    token=None,
                    refresh_token=str(blob["refresh_token"]),
                    client_id=blob.get("client_id"),
                    client_secret=client_secret_for(blob, self.mailbox.tenant, self.mailbox) or None,
                    token_uri=token_url or GOOGLE_TOKEN_URL,
                )
            else:
                raise PermanentError("credentials", "google: a service account key or a refresh token is needed")
        except (ValueError, KeyError) as exc:  # a malformed key file
            raise PermanentError("credentials", f"google: unusable credentials ({type(exc).__name__})") from None
        try:
            creds.refresh(Request(session=self._session()))
        except google.auth.exceptions.RefreshError as exc:
            text = str(exc)
            if getattr(exc, "retryable", False) or "HTTP 5" in text:
                raise TransientError("token_endpoint", f"google: {text[:200]}") from None
            raise PermanentError("credentials", f"google token endpoint: {_refusal(text)}") from None
        except google.auth.exceptions.TransportError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, EgressRefused):
                raise cause from None
            raise TransientError("connection", f"google token endpoint: {type(cause or exc).__name__}") from None
        # google-auth's expiry is a naive UTC datetime.
        expires_at = creds.expiry.replace(tzinfo=UTC).timestamp() if creds.expiry else time.time() + 3600
        rotated = getattr(creds, "refresh_token", None) or ""
        return str(creds.token), expires_at, rotated if blob.get("refresh_token") else ""


def _refusal(text: str) -> str:
    """The RFC 6749 error code in a refusal, not the whole text (which may echo a request)."""
    return next((code for code in REFUSED if code in text), "refused")


def _result(result: dict, label: str) -> tuple[str, float, str]:
    """msal's answer as (access token, expiry, rotated refresh token), or the failure kind."""
    if result.get("access_token"):
        try:
            lifetime = float(result.get("expires_in") or 3600)
        except (TypeError, ValueError):
            lifetime = 3600.0
        log.info("oauth: %s issued an IMAP access token (valid %.0f s)", label, lifetime)
        return str(result["access_token"]), time.time() + lifetime, str(result.get("refresh_token") or "")
    error = str(result.get("error") or "")
    if error in REFUSED:
        raise PermanentError("credentials", f"{label} token endpoint: {error}")
    raise TransientError("token_endpoint", f"{label} token endpoint: {error or 'no access token'}"[:300])

"""The consent flow's writes: start (a PKCE pair and a state kept in the admin's session) and complete (the state
checked and spent, the code exchanged at the token endpoint with the verifier, the tokens stored through
intake.secret_store.store_oauth_tokens).

Who may: a superuser, or an active member of the mailbox's tenant who may change mailboxes (the tenant's admins:
the `mailroom-admin` group grants `intake.change_mailbox`). Checked here, at both ends, whatever the view did:
another tenant's mailbox is "not found" (404), a state from another session or user is unknown.

The state lives in the server-side session only, bound to the mailbox, the user and an expiry, and is removed on
the first answer that names it, whatever the outcome: a replayed or tampered answer finds nothing.
"""

import base64
import hashlib
import json
import logging
import secrets
import time
from datetime import timedelta
from urllib.parse import urlencode

import requests
from django.utils import timezone

from intake import secret_store
from intake.egress import EgressRefused, guarded_session, url_problem
from intake.http import json_or_empty
from intake.models import Mailbox
from intake.providers.settings_schema import https_problem
from intake.secrets import SecretUnavailable, is_platform_ref, platform_bindings, resolve_secret, scope_problem
from intake.selectors import visible_tenants

from .endpoints import DEFAULT_REFRESH_LIFETIME, ConsentEndpoints, endpoints_for, supports_consent

logger = logging.getLogger(__name__)

SESSION_KEY = "mailroom_oauth_consent"
STATE_SECONDS = 600  # the admin signs in at the provider within ten minutes
MAX_PENDING = 5  # consents started in other tabs stay valid, a few of them
TOKEN_TIMEOUT = (3.05, 20.0)
WRITABLE_SCHEMES = ("file:", "vault:")


class ConsentRefused(Exception):
    """The flow cannot start or complete; `str()` is the sentence the admin sees, `status` the HTTP status."""

    def __init__(self, message: str, *, status: int = 400):
        super().__init__(message)
        self.status = status


# --- who and what -----------------------------------------------------------------------------------


def may_connect(*, user, mailbox: Mailbox) -> bool:
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    if user.is_superuser:
        return True
    return user.has_perm("intake.change_mailbox") and mailbox.tenant.members.filter(pk=user.pk).exists()


def connectable_mailbox(*, user, mailbox_id) -> Mailbox:
    """The mailbox, if `user` may connect it: another tenant's mailbox is not found (it is not theirs to see)."""
    try:
        mailbox = Mailbox.objects.select_related("tenant").get(
            pk=int(mailbox_id), tenant__in=visible_tenants(user).values("pk")
        )
    except (Mailbox.DoesNotExist, TypeError, ValueError):
        raise ConsentRefused("No such mailbox.", status=404) from None
    if not may_connect(user=user, mailbox=mailbox):
        raise ConsentRefused("Only an admin of the mailbox's tenant may connect it.", status=403)
    return mailbox


def consent_problem(*, mailbox: Mailbox, check_urls: bool = True) -> str:
    """Why `mailbox` cannot be connected now (a sentence naming the setting to fix), or "" when it can.
    `check_urls=False` at completion: the token URL is the one pinned in the state, and the egress guard judges
    it when the code is exchanged (with DNS, at connect time)."""
    if not supports_consent(mailbox):
        return (
            "Only Microsoft Graph and Gmail mailboxes, and IMAP mailboxes with the setting auth: xoauth2, "
            "are connected by consent."
        )
    ends = endpoints_for(mailbox)
    if not ends.authorize_url or not ends.token_url:
        return "Neither Microsoft nor Google can be told from the settings: set authorize_url and token_url."
    for name in ("authorize_url", "token_url") if check_urls else ():
        url = getattr(ends, name)
        if problem := url_problem(url, purpose=name):
            return f"The setting {problem}"
        if problem := https_problem(url):
            return f"The setting {name} {problem}"
    if not ends.client_id:
        return "Set client_id in the mailbox settings: the application registered with the provider."
    ref = mailbox.credentials_ref
    if not ref.startswith(WRITABLE_SCHEMES):
        kind = (
            "an environment variable cannot take tokens that rotate"
            if ref.startswith("env:")
            else "it is empty"
            if not ref
            else "it is neither"
        )
        return (
            f"The credentials reference must be a file: or vault: reference of the tenant ({kind}); the "
            f"tokens are written there."
        )
    if problem := scope_problem(ref, mailbox.tenant, mailbox):
        return f"The credentials reference cannot be written: {problem}."
    secret_ref = ends.client_secret_ref
    if secret_ref and is_platform_ref(secret_ref) and secret_ref in platform_bindings().unbound:
        # Unbound platform references serve any row a superuser points at one; a setting is not such a pointer.
        return (
            "The client_secret_ref setting names a platform reference bound to no row: a platform operator "
            "binds it to this mailbox or tenant in MAILROOM_PLATFORM_SECRET_REFS."
        )
    return ""


# --- start ------------------------------------------------------------------------------------------


def pkce_pair() -> tuple[str, str]:
    """(code_verifier, S256 code_challenge), RFC 7636: 64 unreserved characters and their base64url SHA-256."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode("ascii")).digest()).rstrip(b"=").decode()
    return verifier, challenge


def _pending(session, now: float) -> dict:
    entries = session.get(SESSION_KEY)
    if not isinstance(entries, dict):
        return {}
    return {
        state: entry
        for state, entry in entries.items()
        if isinstance(entry, dict) and float(entry.get("expires", 0)) > now
    }


def start_consent(*, user, mailbox_id, session, redirect_uri: str) -> str:
    """The provider's authorization URL for `mailbox_id`; the state and verifier are kept in `session`."""
    mailbox = connectable_mailbox(user=user, mailbox_id=mailbox_id)
    if problem := consent_problem(mailbox=mailbox):
        raise ConsentRefused(problem)
    ends = endpoints_for(mailbox)
    verifier, challenge = pkce_pair()
    state = secrets.token_urlsafe(32)
    now = time.time()
    pending = _pending(session, now)
    for stale in sorted(pending, key=lambda s: pending[s]["expires"])[: max(0, len(pending) - MAX_PENDING + 1)]:
        del pending[stale]
    pending[state] = {
        "mailbox": mailbox.pk,
        "user": user.pk,
        "verifier": verifier,
        "redirect_uri": redirect_uri,
        "token_url": ends.token_url,
        "client_id": ends.client_id,
        "expires": now + STATE_SECONDS,
    }
    session[SESSION_KEY] = pending
    params = {
        "response_type": "code",
        "client_id": ends.client_id,
        "redirect_uri": redirect_uri,
        "scope": ends.scope,
        "state": state,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        **ends.extra,
    }
    logger.info("consent: %s started for mailbox %s", user.get_username(), mailbox.slug)
    separator = "&" if "?" in ends.authorize_url else "?"
    return f"{ends.authorize_url}{separator}{urlencode(params)}"


# --- complete ---------------------------------------------------------------------------------------


def take_state(*, session, state: str) -> dict:
    """The pending consent `state` names, removed from the session (single use); ConsentRefused if none."""
    entries = session.get(SESSION_KEY) if isinstance(session.get(SESSION_KEY), dict) else {}
    entry = entries.pop(state, None) if state else None
    session[SESSION_KEY] = entries
    if not isinstance(entry, dict):
        raise ConsentRefused(
            "This answer from the sign-in page does not match a consent started in this browser "
            "session (the state is missing, wrong or already used). Nothing was stored: start "
            "again from the mailbox page."
        )
    if float(entry.get("expires", 0)) <= time.time():
        raise ConsentRefused(
            "The consent took longer than ten minutes and expired. Nothing was stored: start again "
            "from the mailbox page."
        )
    return entry


def complete_consent(*, user, session, state: str, code: str, error: str = "", error_description: str = "") -> Mailbox:
    """Check and spend `state`, exchange `code`, store the tokens. Returns the connected mailbox."""
    entry = take_state(session=session, state=state)
    if entry.get("user") != user.pk:
        raise ConsentRefused("This consent was started by someone else. Nothing was stored.", status=403)
    mailbox = connectable_mailbox(user=user, mailbox_id=entry.get("mailbox"))
    ends = endpoints_for(mailbox)
    if error:
        said = f"{error}: {error_description}" if error_description else error
        raise ConsentRefused(f"{ends.name} did not grant access ({said[:300]}). Nothing was stored.")
    if not code:
        raise ConsentRefused("The sign-in page sent no authorization code. Nothing was stored.")
    if problem := consent_problem(mailbox=mailbox, check_urls=False):
        raise ConsentRefused(problem)
    if (ends.token_url, ends.client_id) != (entry.get("token_url"), entry.get("client_id")):
        raise ConsentRefused(
            "The mailbox's OAuth settings changed during the consent. Nothing was stored: start again."
        )
    client_secret = _client_secret(mailbox, ends)
    tokens = exchange_code(
        ends=ends,
        code=code,
        verifier=entry["verifier"],
        redirect_uri=entry["redirect_uri"],
        client_secret=client_secret,
    )
    blob = {"client_id": ends.client_id, "refresh_token": tokens["refresh_token"]}
    if client_secret and not is_platform_ref(ends.client_secret_ref):
        # The tenant's own secret may sit beside its tokens; a platform secret never goes into a tenant's file.
        blob["client_secret"] = client_secret
    try:
        secret_store.store_oauth_tokens(
            mailbox, blob=blob, actor=user.get_username(), scopes=tokens["scope"], expires_at=tokens["expires_at"]
        )
    except (secret_store.SecretWriteFailed, SecretUnavailable) as exc:
        raise ConsentRefused(f"The tokens could not be written to the credentials reference: {exc}") from None
    logger.info("consent: %s connected mailbox %s (%s)", user.get_username(), mailbox.slug, ends.family)
    return mailbox


def _client_secret(mailbox: Mailbox, ends: ConsentEndpoints) -> str:
    if not ends.client_secret_ref:
        # The tenant may have put the app's secret beside the tokens (the blob Graph and Gmail read): reconnecting
        # keeps it. None there: a public client, PKCE alone.
        return _stored_client_secret(mailbox)
    try:
        return resolve_secret(ends.client_secret_ref, tenant=mailbox.tenant, owner=mailbox)
    except SecretUnavailable as exc:
        raise ConsentRefused(f"The client secret (client_secret_ref) is unavailable: {exc}") from None


def _stored_client_secret(mailbox: Mailbox) -> str:
    try:
        blob = json.loads(resolve_secret(mailbox.credentials_ref, tenant=mailbox.tenant, owner=mailbox))
    except (SecretUnavailable, ValueError):
        return ""  # nothing stored yet (a first connection), or not a JSON blob: nothing to keep
    return str(blob.get("client_secret") or "") if isinstance(blob, dict) else ""


def exchange_code(*, ends: ConsentEndpoints, code: str, verifier: str, redirect_uri: str, client_secret: str) -> dict:
    """{"refresh_token", "scope", "expires_at"} from the token endpoint, or ConsentRefused."""
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": redirect_uri,
        "client_id": ends.client_id,
        "code_verifier": verifier,
    }
    if client_secret:
        form["client_secret"] = client_secret
    http = guarded_session(purpose="token_url")  # the tenant's setting: through the egress guard
    try:
        response = http.post(
            ends.token_url,
            data=form,
            timeout=TOKEN_TIMEOUT,
            allow_redirects=False,
            headers={"Accept": "application/json"},
        )
    except EgressRefused as exc:
        raise ConsentRefused(f"The token endpoint may not be reached: {exc}") from None
    except requests.RequestException as exc:
        raise ConsentRefused(
            f"The token endpoint could not be reached ({type(exc).__name__}). Nothing was stored: try again."
        ) from None
    finally:
        http.close()
    body = json_or_empty(response)
    if response.status_code != 200 or not body.get("access_token"):
        said = str(body.get("error") or "")[:100]
        raise ConsentRefused(
            f"{ends.name} refused the authorization code (HTTP {response.status_code}"
            f"{', ' + said if said else ''}). Nothing was stored: start again."
        )
    if not body.get("refresh_token"):
        raise ConsentRefused(
            f"{ends.name} granted no refresh token (offline access), so polling would stop within "
            f"the hour. Nothing was stored."
        )
    return {
        "refresh_token": str(body["refresh_token"]),
        "scope": str(body.get("scope") or ends.scope),
        "expires_at": refresh_expiry(ends.family, body.get("refresh_token_expires_in")),
    }


def refresh_expiry(family: str, seconds):
    """When the refresh token lapses: the provider's word when it gives one, else its documented default."""
    try:
        if seconds is not None and float(seconds) > 0:
            return timezone.now() + timedelta(seconds=float(seconds))
    except (TypeError, ValueError):
        pass
    lifetime = DEFAULT_REFRESH_LIFETIME.get(family)
    return timezone.now() + lifetime if lifetime else None

"""Where a mailbox's consent goes: the authorization and token endpoints, client id, scopes and extra
parameters of its provider family (Microsoft or Google), each overridable by `Mailbox.settings`
(`authorize_url`, `token_url`, `client_id`, `scope`, `client_secret_ref`) so tests point at a stub."""

from dataclasses import dataclass, field
from datetime import timedelta

MICROSOFT, GOOGLE = "microsoft", "google"
FAMILY_NAMES = {MICROSOFT: "Microsoft 365", GOOGLE: "Google"}
MS_LOGIN = "https://login.microsoftonline.com"
GOOGLE_AUTHORIZE = "https://accounts.google.com/o/oauth2/v2/auth"
GOOGLE_TOKEN = "https://oauth2.googleapis.com/token"
DEFAULT_SCOPES = {
    ("graph", MICROSOFT): "offline_access https://graph.microsoft.com/Mail.Read",
    ("imap", MICROSOFT): "offline_access https://outlook.office.com/IMAP.AccessAsUser.All",
    ("gmail", GOOGLE): "https://www.googleapis.com/auth/gmail.readonly",
    ("imap", GOOGLE): "https://mail.google.com/",
}
# Microsoft's refresh tokens lapse after 90 days unused (each refresh extends them); Google's do not expire
# by age. A token response's own `refresh_token_expires_in` wins over this.
DEFAULT_REFRESH_LIFETIME = {MICROSOFT: timedelta(days=90), GOOGLE: None}


@dataclass(frozen=True)
class ConsentEndpoints:
    family: str
    authorize_url: str
    token_url: str
    client_id: str
    scope: str
    client_secret_ref: str = ""
    extra: dict = field(default_factory=dict)  # provider-specific authorization parameters

    @property
    def name(self) -> str:
        return FAMILY_NAMES.get(self.family, "the provider")


def supports_consent(mailbox) -> bool:
    settings = mailbox.settings if isinstance(mailbox.settings, dict) else {}
    if mailbox.provider in ("graph", "gmail"):
        return True
    return mailbox.provider == "imap" and settings.get("auth") == "xoauth2"


def family_of(mailbox) -> str:
    """Microsoft or Google: Graph and Gmail say it; IMAP by its token URL or host ("" when neither tells)."""
    if mailbox.provider == "graph":
        return MICROSOFT
    if mailbox.provider == "gmail":
        return GOOGLE
    settings = mailbox.settings if isinstance(mailbox.settings, dict) else {}
    if settings.get("oauth_flavor") in (MICROSOFT, GOOGLE):  # intake.providers.imap_oauth's own word
        return settings["oauth_flavor"]
    hints = f"{settings.get('token_url', '')} {settings.get('host', '')}".lower()
    if any(word in hints for word in ("microsoftonline", "office365", "outlook")):
        return MICROSOFT
    if any(word in hints for word in ("google", "gmail")):
        return GOOGLE
    return ""


def with_offline_access(scope: str) -> str:
    """Microsoft issues a refresh token only for `offline_access`: added when a configured scope lacks it."""
    return scope if "offline_access" in scope.split() else f"offline_access {scope}".strip()


def endpoints_for(mailbox) -> ConsentEndpoints:
    settings = mailbox.settings if isinstance(mailbox.settings, dict) else {}
    family = family_of(mailbox)
    scope = str(settings.get("scope") or DEFAULT_SCOPES.get((mailbox.provider, family), ""))
    if family == MICROSOFT:
        authority = str(settings.get("authority") or f"{MS_LOGIN}/{settings.get('tenant_id') or 'organizations'}")
        authority = f"{authority.rstrip('/')}/oauth2/v2.0"
        authorize, token = f"{authority}/authorize", f"{authority}/token"
        configured = str(settings.get("token_url") or "")
        if configured.endswith("/oauth2/v2.0/token"):  # an IMAP mailbox names its authority by its token URL
            authorize = configured[: -len("token")] + "authorize"
        scope, extra = with_offline_access(scope), {"response_mode": "query"}
    elif family == GOOGLE:
        # offline + consent: Google returns a refresh token only then (and again on every new consent).
        authorize, token, extra = GOOGLE_AUTHORIZE, GOOGLE_TOKEN, {"access_type": "offline", "prompt": "consent"}
    else:
        authorize, token, extra = "", "", {}
    return ConsentEndpoints(
        family=family,
        authorize_url=str(settings.get("authorize_url") or authorize),
        token_url=str(settings.get("token_url") or token),
        client_id=str(settings.get("client_id") or ""),
        scope=scope,
        client_secret_ref=str(settings.get("client_secret_ref") or ""),
        extra=extra,
    )

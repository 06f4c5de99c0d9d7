"""What each provider reads from `Mailbox.settings`, key by key, so that nonsense is refused when it is typed
(the admin form and the API), not when the first poll fails.

    settings_errors("imap", {"port": "abc", "colour": "blue"})
    -> {"colour": ["is not a setting of imap (known: ...)"], "port": ["must be a whole number"]}

`errors_by_field(provider, settings)` gives the same as {"settings": ["port: must be ...", ...]}, the shape
`Mailbox.clean()`'s other checks use. Only writes are checked: a stored row that would fail now still loads,
lists and polls as before (its next save asks for a fix). The egress guard (`endpoint_errors`) judges hosts and
URLs; this module judges types, ranges and names. Mirrors `ticketing.destinations.settings` for mailboxes
(intake sits below ticketing, so it cannot import that module).
"""

import re
from dataclasses import dataclass, field

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from intake.egress import is_allow_listed, literal_address, url_problem

HEADER_NAME = r"[!-9;-~]+"


@dataclass(frozen=True)
class Setting:
    help: str = ""

    def errors(self, value) -> list[str]:
        """Subclasses of Setting must provide this method: what is wrong with `value`, one short phrase per
        problem, as the console shows it after the setting's name ([] when it is valid)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Whole(Setting):
    minimum: int | None = None
    maximum: int | None = None

    def errors(self, value) -> list[str]:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
            return ["must be a whole number" + self._range()]
        if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
            return ["must be a whole number" + self._range()]
        return []

    def _range(self) -> str:
        if self.minimum is not None and self.maximum is not None:
            return f" from {self.minimum} to {self.maximum}"
        if self.minimum is not None:
            return f" of at least {self.minimum}"
        return ""


@dataclass(frozen=True)
class Seconds(Setting):
    minimum: float = 0.1
    maximum: float = 600

    def errors(self, value) -> list[str]:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not self.minimum <= value <= self.maximum:
            return [f"must be a number of seconds from {self.minimum:g} to {self.maximum:g}"]
        return []


@dataclass(frozen=True)
class Number(Setting):
    """A number, fractions allowed (a spam score threshold: 5.0, 7.5)."""

    minimum: float = 0
    maximum: float = 1000

    def errors(self, value) -> list[str]:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not self.minimum <= value <= self.maximum:
            return [f"must be a number from {self.minimum:g} to {self.maximum:g}"]
        return []


@dataclass(frozen=True)
class Flag(Setting):
    def errors(self, value) -> list[str]:
        return [] if isinstance(value, bool) else ["must be true or false"]


@dataclass(frozen=True)
class Text(Setting):
    choices: tuple = ()
    pattern: str | None = None
    max_length: int = 500

    def errors(self, value) -> list[str]:
        if not isinstance(value, str):
            return ["must be text" + (f": one of {', '.join(self.choices)}" if self.choices else "")]
        if len(value) > self.max_length:
            return [f"must be at most {self.max_length} characters"]
        if self.choices and value not in self.choices:
            return [f"must be one of {', '.join(self.choices)}"]
        if self.pattern and value and not re.fullmatch(self.pattern, value):
            return [f"{value!r} is not {self.help or 'valid here'}"]
        return []


@dataclass(frozen=True)
class Url(Text):
    def errors(self, value) -> list[str]:
        messages = super().errors(value)
        if messages or not value:
            return messages
        problem = https_problem(value)
        return [problem] if problem else []


def plain_http_allowed(url: str) -> bool:
    """An http:// URL is acceptable only to a host of the egress allow-list (MAILROOM_EGRESS_ALLOWED_NETWORKS:
    a test double, an in-house stand-in), written as an address or as localhost; never decided by DNS."""
    try:
        host = (parse_url(url).host or "").strip("[]").lower()
    except LocationParseError:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        host = "127.0.0.1"
    address = literal_address(host) if host else None
    return address is not None and is_allow_listed(address)


def https_problem(url: str) -> str | None:
    """Why `url` may not be used for an external service, or None. A URL the egress guard refuses is left to it
    (one message per mistake); a public host must be spoken to over TLS: the calls carry tokens."""
    text = str(url or "")
    if url_problem(text, purpose="url") is not None:
        return None
    if text.lower().startswith("https://"):
        return None
    if text.lower().startswith("http://") and plain_http_allowed(text):
        return None
    return (
        "must start with https:// (plain http:// only to a host of the egress allow-list, "
        "MAILROOM_EGRESS_ALLOWED_NETWORKS)"
    )


@dataclass(frozen=True)
class TextList(Setting):
    pattern: str | None = None
    what: str = "text"

    def errors(self, value) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            return [f"must be a list of {self.what}"]
        bad = [item for item in value if self.pattern and not re.fullmatch(self.pattern, item)]
        return [f"{item!r} is not {self.what}" for item in bad[:5]]


@dataclass(frozen=True)
class Group(Setting):
    """An object with its own known keys."""

    keys: dict = field(default_factory=dict)

    def errors(self, value) -> list[str]:
        if not isinstance(value, dict):
            return [f"must be an object with the keys {', '.join(sorted(self.keys))}"]
        return [
            f"{name}: {message}"
            for name, messages in check(self.keys, value, "this object").items()
            for message in messages
        ]


WHOLE_BYTES = Whole(minimum=0)

COMMON = {
    # intake.validation.policy
    "max_message_bytes": Whole(minimum=1, help="can only lower MAILROOM_MAX_MESSAGE_BYTES"),
    "loop_header": Text(pattern=HEADER_NAME, help="a header name"),
    "trusted_authserv_id": Text(help="our own MTA's authserv-id in Authentication-Results"),
    "spam_headers": TextList(pattern=rf"\s*{HEADER_NAME}\s*:\s*\S.*", what="'Header: value' lines"),
    # intake.validation.spamscore: at or above it, no acknowledgment (the ticket is still made)
    "spam_score_threshold": Number(minimum=-100, maximum=1000, help="a spam score, default 5.0"),
    "attachment_policy": Group(
        keys={
            "allowed_types": TextList(pattern=r"[\w.+-]+/[\w.+*-]+", what="MIME types such as image/*"),
            "extra_allowed_types": TextList(pattern=r"[\w.+-]+/[\w.+*-]+", what="MIME types such as image/*"),
            "blocked_extensions": TextList(pattern=r"\.?[\w-]+", what="file extensions such as exe"),
            "max_bytes": WHOLE_BYTES,
            "max_attachments": Whole(minimum=0),
        }
    ),
    # intake.normalize
    "sender_rate_limit": Group(
        keys={"count": Whole(minimum=1), "seconds": Whole(minimum=1), "action": Text(choices=("review", "suppress"))}
    ),
    # ticketing.acknowledgments
    "acknowledge": Flag(),
    "ack_policy": Text(choices=("authenticated", "always", "never")),
    # intake.quiet: the quiet-mailbox alarm (after_hours: a fixed threshold instead of the traffic's)
    "quiet_alarm": Group(keys={"enabled": Flag(), "after_hours": Number(minimum=0.25, maximum=24 * 90)}),
}
POLLING = {
    # intake.channels.schedules, intake.channels.polling
    "poll_seconds": Whole(minimum=10, maximum=86400),
    "max_batches": Whole(minimum=1, maximum=10000),
    "batch_size": Whole(minimum=1, maximum=5000),
}
HOST = r"\[?[A-Za-z0-9_.:-]+\]?"
API = {
    # intake.providers.common
    "page_size": Whole(minimum=1, maximum=1000),
    "resync_days": Whole(minimum=0, maximum=3650),
    "client_id": Text(),
    "token_url": Url(),
    "api_base": Url(),
}

SCHEMAS = {
    "raw": COMMON,
    "postmark": COMMON,
    "sendgrid": COMMON,
    "imap": {
        **COMMON,
        **POLLING,
        "host": Text(pattern=HOST, max_length=253, help="a host name or IP address"),
        "port": Whole(minimum=1, maximum=65535),
        "ssl": Flag(),
        "starttls": Flag(),
        "username": Text(),
        "folder": Text(max_length=1000),
        "max_batch_bytes": Whole(minimum=1),
        "overlap": Whole(minimum=0, maximum=100000),
        "sync_days": Whole(minimum=0, maximum=3650),
        "timeout": Seconds(maximum=600),
        # OAuth (docs: Mailbox.settings.auth = "xoauth2")
        "auth": Text(choices=("password", "xoauth2")),
        "token_url": Url(),
        "client_id": Text(),
        "scope": Text(),
        # intake.providers.imap_oauth: who issues the tokens, and the SASL mechanism
        "oauth_flavor": Text(choices=("generic", "microsoft", "google")),
        "authority": Url(),
        "sasl": Text(choices=("xoauth2", "oauthbearer")),
        # intake.oauth_consent: the consent flow's sign-in page and client secret (a reference)
        "authorize_url": Url(),
        "client_secret_ref": Text(max_length=300),
    },
    "gmail": {
        **COMMON,
        **POLLING,
        **API,
        "page_size": Whole(minimum=1, maximum=500),
        "user_id": Text(),
        "label_id": Text(),
        "push_auth": Text(choices=("oidc", "url_token")),
        "push_audience": Text(),
        "push_issuer": Text(),
        "jwks_url": Url(),
        "push_service_account": Text(),
        "push_topic": Text(),
        "scope": Text(),
        "authorize_url": Url(),
        "client_secret_ref": Text(max_length=300),
    },
    "graph": {
        **COMMON,
        **POLLING,
        **API,
        "user": Text(),
        "folder": Text(),
        "tenant_id": Text(),
        "scope": Text(),
        "authorize_url": Url(),
        "client_secret_ref": Text(max_length=300),
        "notification_url": Url(),
        "subscription_minutes": Whole(minimum=45, maximum=10080),
    },
    "mailgun": {
        **COMMON,
        "domain": Text(pattern=r"[A-Za-z0-9.-]+", help="a domain"),
        "api_base": Url(),
        "timeout": Seconds(maximum=300),
    },
    "ses": {
        **COMMON,
        "topic_arn": Text(pattern=r"arn:[\w-]+:sns:[\w-]+:\d{12}:[\w-]+", help="an SNS topic ARN"),
        "s3_bucket": Text(),
        "s3_prefix": Text(),
        "s3_region": Text(pattern=r"[a-z0-9-]+", help="a region"),
        "s3_endpoint_url": Url(),
        "s3_access_key_id": Text(),
    },
}


def check(spec: dict, settings: dict, owner: str) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for name, value in settings.items():
        setting = spec.get(name)
        if setting is None:
            errors[name] = [f"is not a setting of {owner} (known: {', '.join(sorted(spec)) or 'none'})"]
        elif value is not None and (messages := setting.errors(value)):
            errors[name] = messages
    return errors


def settings_errors(provider: str, settings) -> dict[str, list[str]]:
    """{key: [messages]} for `settings` of a mailbox of `provider`; {} when every key is known and well typed."""
    if settings in (None, ""):
        return {}
    if not isinstance(settings, dict):
        return {"settings": ["must be a JSON object of name: value"]}
    spec = SCHEMAS.get(provider)
    if spec is None:
        return {}  # an unknown provider is the provider field's error
    errors = check(spec, settings, provider)
    if provider == "imap":
        if not settings.get("host"):
            errors.setdefault("host", []).append("is required for IMAP (the server to poll)")
        if settings.get("ssl", True) is True and settings.get("starttls") is True:
            errors.setdefault("starttls", []).append("needs ssl: false (STARTTLS upgrades a plain connection)")
        flavor = settings.get("oauth_flavor") or "generic"
        if settings.get("auth") == "xoauth2" and flavor == "generic" and not settings.get("token_url"):
            errors.setdefault("token_url", []).append("is required with auth xoauth2")
        if settings.get("auth") == "xoauth2" and flavor == "microsoft" and not settings.get("authority"):
            errors.setdefault("authority", []).append(
                "is required with oauth_flavor microsoft (https://login.microsoftonline.com/<tenant id>)"
            )
    return errors


def errors_by_field(provider: str, settings) -> dict[str, list[str]]:
    """The same as {"settings": ["key: message", ...]}, for a form field or the API's problem+json."""
    problems = settings_errors(provider, settings)
    messages = [
        message if name == "settings" else f"{name}: {message}"
        for name, items in sorted(problems.items())
        for message in items
    ]
    return {"settings": messages} if messages else {}


def known_settings(provider: str) -> list[str]:
    return sorted(SCHEMAS.get(provider, {}))

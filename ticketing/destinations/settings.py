"""Field-level checks of `Destination.settings`, declared by each adapter (`SETTINGS`).

    SETTINGS = {"read_timeout": Number(minimum=0.1, maximum=120, default=10),
                "project": Text(required=True, pattern=r"[A-Z][A-Z0-9_]+"),
                "priorities": Mapping(values=Text())}

`validate(spec, settings)` returns {setting name: [messages]}; the admin shows each under the
settings field (`ticketing.admin`). The shared HTTP settings are in `HTTP_SETTINGS`.
"""

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Setting:
    help: str = ""
    required: bool = False

    def errors(self, value) -> list[str]:
        raise NotImplementedError


@dataclass(frozen=True)
class Number(Setting):
    minimum: float | None = None
    maximum: float | None = None
    integer: bool = False

    def errors(self, value) -> list[str]:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return ["must be a number"]
        if self.integer and not float(value).is_integer():
            return ["must be a whole number"]
        if self.minimum is not None and value < self.minimum:
            return [f"must be at least {self.minimum:g}"]
        if self.maximum is not None and value > self.maximum:
            return [f"must be at most {self.maximum:g}"]
        return []


@dataclass(frozen=True)
class Flag(Setting):
    def errors(self, value) -> list[str]:
        return [] if isinstance(value, bool) else ["must be true or false"]


@dataclass(frozen=True)
class Text(Setting):
    pattern: str | None = None
    choices: tuple = ()
    max_length: int = 500

    def errors(self, value) -> list[str]:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            return ["must be text"]
        value = str(value)
        if self.required and not value.strip():
            return ["must not be empty"]
        if len(value) > self.max_length:
            return [f"must be at most {self.max_length} characters"]
        if self.choices and value not in self.choices:
            return [f"must be one of {', '.join(map(str, self.choices))}"]
        if self.pattern and value and not re.fullmatch(self.pattern, value):
            return [f"must match {self.pattern}"]
        return []


@dataclass(frozen=True)
class Mapping(Setting):
    """An object of name -> value; `values` checks each value, `keys` (a pattern) each name."""

    values: Setting = field(default_factory=Text)
    keys: str | None = None

    def errors(self, value) -> list[str]:
        if not isinstance(value, dict):
            return ["must be an object of name: value"]
        messages = []
        for key, item in value.items():
            if self.keys and not re.fullmatch(self.keys, str(key)):
                messages.append(f"{key!r}: the name must match {self.keys}")
            messages += [f"{key!r}: {m}" for m in self.values.errors(item)]
        return messages


@dataclass(frozen=True)
class Url(Text):
    """An http(s) URL, or a URL template with {placeholders} (the generic REST destination)."""

    def errors(self, value) -> list[str]:
        messages = super().errors(value)
        if messages:
            return messages
        if value and not re.match(r"https?://[^\s/]+", str(value)) and not str(value).startswith("/"):
            return ["must be an http(s) URL or a path starting with /"]
        return []


@dataclass(frozen=True)
class Anything(Setting):
    check: object = None  # a callable value -> list[str], for what the simple kinds cannot say

    def errors(self, value) -> list[str]:
        return list(self.check(value)) if self.check else []


def _breaker_errors(value) -> list[str]:
    if not isinstance(value, dict):
        return ['must be an object, e.g. {"enabled": false}']
    known = {
        "enabled": Flag(),
        "credential_failures": Number(minimum=1, integer=True),
        "failure_rate": Number(minimum=0, maximum=1),
        "min_attempts": Number(minimum=1, integer=True),
        "window_seconds": Number(minimum=1),
    }
    return [f"{name}: {message}" for name, messages in validate(known, value).items() for message in messages]


# Read for every kind: by the worker (ticketing.intents), the breaker and the acknowledgment.
COMMON_SETTINGS = {
    "max_attempts": Number(minimum=1, maximum=100, integer=True, help="transient failures before failed (8)"),
    "retry_base_seconds": Number(minimum=0, maximum=3600, help="first backoff (2)"),
    "retry_cap_seconds": Number(minimum=0, maximum=86400, help="longest backoff (600)"),
    "breaker": Anything(check=_breaker_errors, help="circuit breaker overrides (ticketing.breaker)"),
    "sla_hours": Number(minimum=0, maximum=10000, help="promised in the acknowledgment"),
    # What the ticket carries and who is told (ticketing.destinations.capabilities gives each kind's default).
    "acknowledge": Flag(help="Mailroom acknowledges the requester (default: off where the desk acknowledges)"),
    "closed_policy": Text(
        choices=("follow_up", "reopen", "review"),
        help="a reply to a closed ticket: follow_up (a new linked ticket), reopen, or review",
    ),
    "max_file_bytes": Number(
        minimum=1, maximum=2 * 1024**3, integer=True, help="largest file sent to the desk (the kind's documented limit)"
    ),
    "agent_notes": Flag(help="mail from the tenant's agents becomes an internal note (true)"),
}
# Read by every HTTP destination as well (ticketing.destinations.http).
HTTP_SETTINGS = {
    **COMMON_SETTINGS,
    "connect_timeout": Number(minimum=0.1, maximum=60, help="seconds to open a connection (3.05)"),
    "read_timeout": Number(minimum=0.1, maximum=300, help="seconds to wait for an answer (10)"),
    "max_concurrency": Number(
        minimum=0,
        maximum=1000,
        integer=True,
        help="calls in flight at once, across workers (ticketing.bulkhead; 8); 0: no cap",
    ),
    "requests_per_minute": Number(
        minimum=0,
        maximum=100000,
        integer=True,
        help="the desk's API quota shared by all workers (ticketing.budget); 0: none",
    ),
}


def validate(spec: dict, settings) -> dict[str, list[str]]:
    """{name: [messages]} for `settings` against `spec`; {} when they are fine."""
    if not isinstance(settings, dict):
        return {"settings": ["must be a JSON object"]}
    errors: dict[str, list[str]] = {}
    for name, setting in spec.items():
        if setting.required and settings.get(name) in (None, ""):
            errors[name] = ["is required"]
    for name, value in settings.items():
        if name not in spec:
            known = ", ".join(sorted(spec)) or "none"
            errors[name] = [f"is not a setting of this kind (known: {known})"]
            continue
        if value is None:
            continue
        messages = spec[name].errors(value)
        if messages:
            errors[name] = messages
    return errors

"""Destination adapters, one module per kind. `adapter_for` picks the one a destination needs;
`ticket_url_for` asks it where a person opens one of its tickets; `egress_errors` checks its URLs against
the egress guard when it is saved; `connection_report` is "test connection" in words safe to show."""

import re
from dataclasses import dataclass
from importlib import import_module

from intake.egress import url_problem
from intake.providers.settings_schema import https_problem

from .base import AmbiguousOutcome, DestinationAdapter, PermanentError, TransientError

# The one list of destination kinds and their adapters (DestinationKind, FakeDesk's dialects, the contract
# suite's kits and docs/destinations/ follow it: tests/test_registries.py).
ADAPTERS = {
    "builtin": "ticketing.destinations.builtin.BuiltinDestination",
    "zendesk": "ticketing.destinations.zendesk.ZendeskDestination",
    "jira_sm": "ticketing.destinations.jira_sm.JiraServiceManagementDestination",
    "servicenow": "ticketing.destinations.servicenow.ServiceNowDestination",
    "salesforce": "ticketing.destinations.salesforce.SalesforceDestination",
    "hubspot": "ticketing.destinations.hubspot.HubSpotDestination",
    "freshdesk": "ticketing.destinations.freshdesk.FreshdeskDestination",
    "rest": "ticketing.destinations.rest.RestDestination",
}


def adapter_class(kind: str) -> type[DestinationAdapter]:
    path = ADAPTERS.get(kind)
    if path is None:
        raise LookupError(f"no adapter for destination kind {kind!r}")
    module_name, class_name = path.rsplit(".", 1)
    return getattr(import_module(module_name), class_name)


def adapter_for(destination) -> DestinationAdapter:
    return adapter_class(destination.kind)(destination)


def configuration_errors(kind: str, base_url: str, credentials_ref: str, settings) -> dict[str, list[str]]:
    """{field: [messages]} for a destination of `kind` so configured (the admin and the API show them);
    {} when it can work. Settings are named one by one: "read_timeout: must be a number"."""
    from .settings import validate

    try:
        adapter = adapter_class(kind)
    except LookupError:
        return {"kind": [f"no adapter for {kind!r}"]}
    errors: dict[str, list[str]] = {}
    if adapter.needs_base_url and not base_url:
        errors["base_url"] = ["This kind needs its base URL."]
    elif base_url and kind != "builtin" and (problem := https_problem(base_url)):
        # An external desk gets our credentials and customers' mail: TLS, unless the platform allow-lists the host.
        errors["base_url"] = [f"The base URL {problem}."]
    if adapter.needs_credentials and not credentials_ref:
        errors["credentials_ref"] = ["This kind needs credentials: a secret reference."]
    problems = validate(adapter.SETTINGS, settings if settings is not None else {})
    if problems:
        errors["settings"] = [
            f"{name}: {message}" for name, messages in sorted(problems.items()) for message in messages
        ]
    return errors


def ticket_url_for(destination, ticket_id) -> str:
    """Where a person opens ticket `ticket_id` of `destination`; "" for a kind without an adapter or such a page."""
    try:
        adapter = adapter_for(destination)
    except LookupError:
        return ""
    return adapter.ticket_url(ticket_id)


def egress_errors(kind: str, base_url: str, settings) -> dict[str, list[str]]:
    """{field: [messages]} for the URLs of a destination the egress guard refuses (intake.egress), checked
    without DNS (saving never waits on a resolver; each connection is checked again when it is made)."""
    try:
        adapter = adapter_class(kind)
    except LookupError:
        return {}
    errors: dict[str, list[str]] = {}
    if base_url:
        problem = url_problem(base_url, purpose="base_url")
        if problem:
            errors["base_url"] = [problem]
    settings = settings if isinstance(settings, dict) else {}
    for name in adapter.fetched_url_settings:
        value = settings.get(name)
        if not isinstance(value, str) or not value.startswith(("http://", "https://")):
            continue  # a path is relative to base_url, checked above
        # A URL template: each {placeholder} stands for a URL-quoted value, never an authority of its own.
        problem = url_problem(re.sub(r"\{[A-Za-z_]*\}", "x", value), purpose=name)
        if problem:
            errors.setdefault("settings", []).append(problem)
    return errors


MAX_REPORT_CHARS = 300


@dataclass(frozen=True)
class ConnectionReport:
    ok: bool
    text: str
    tested: bool = True  # False: the kind has no way to test its connection


def connection_report(destination) -> ConnectionReport:
    """ "Test connection" (the adapter's `check_connection`), in words safe to show to whoever asked: an answer
    the destination gave is named by its status and our reason only, never by its body (which an internal
    service could fill with anything); our own findings (a refused URL, a missing field) are shown."""
    try:
        said = adapter_for(destination).check_connection()
    except (TransientError, PermanentError, AmbiguousOutcome) as exc:
        status = getattr(exc, "http_status", None)
        if status is not None:
            return ConnectionReport(False, f"failed ({exc.kind}: {exc.reason}), the destination answered HTTP {status}")
        return ConnectionReport(False, _shown(f"failed ({exc.kind}: {exc.reason}) {exc.detail}".strip()))
    except (LookupError, NotImplementedError):
        return ConnectionReport(False, "this kind cannot test its connection", tested=False)
    return ConnectionReport(True, _shown(f"OK, {said}"))


def _shown(text: str) -> str:
    """One line of printable text, capped."""
    return re.sub(r"[\x00-\x1f\x7f<>]+", " ", str(text))[:MAX_REPORT_CHARS]

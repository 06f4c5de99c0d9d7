"""Destination adapters, one module per kind. `adapter_for` picks the one a destination needs;
`ticket_url_for` asks it where a person opens one of its tickets."""
from importlib import import_module

from .base import DestinationAdapter

_ADAPTERS = {
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
    path = _ADAPTERS.get(kind)
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
    if adapter.needs_credentials and not credentials_ref:
        errors["credentials_ref"] = ["This kind needs credentials: a secret reference."]
    problems = validate(adapter.SETTINGS, settings if settings is not None else {})
    if problems:
        errors["settings"] = [f"{name}: {message}" for name, messages in sorted(problems.items())
                              for message in messages]
    return errors


def ticket_url_for(destination, ticket_id) -> str:
    """Where a person opens ticket `ticket_id` of `destination`; "" for a kind without an adapter or such a page."""
    try:
        adapter = adapter_for(destination)
    except LookupError:
        return ""
    return adapter.ticket_url(ticket_id)

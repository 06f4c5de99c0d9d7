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


def ticket_url_for(destination, ticket_id) -> str:
    """Where a person opens ticket `ticket_id` of `destination`; "" for a kind without an adapter or such a page."""
    try:
        adapter = adapter_for(destination)
    except LookupError:
        return ""
    return adapter.ticket_url(ticket_id)

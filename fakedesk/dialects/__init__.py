"""The APIs FakeDesk can speak, one module per destination kind (Mailroom's `Destination.kind`).

Each dialect is a `fakedesk.handler.Handler` subclass: its own routes, authentication and error
bodies over the shared store, fault plan, idempotency memory, search lag and request hooks.
`handler_for(name)` imports only the one asked for.
"""

from importlib import import_module

DIALECTS = {
    "zendesk": "fakedesk.handler:Handler",
    "jira_sm": "fakedesk.dialects.jira_sm:JiraServiceManagementHandler",
    "servicenow": "fakedesk.dialects.servicenow:ServiceNowHandler",
    "salesforce": "fakedesk.dialects.salesforce:SalesforceHandler",
    "hubspot": "fakedesk.dialects.hubspot:HubSpotHandler",
    "freshdesk": "fakedesk.dialects.freshdesk:FreshdeskHandler",
    "rest": "fakedesk.dialects.rest:RestHandler",
}


def handler_for(name: str):
    if name not in DIALECTS:
        raise ValueError(f"unknown dialect {name!r}; known: {', '.join(DIALECTS)}")
    module, _, attribute = DIALECTS[name].partition(":")
    return getattr(import_module(module), attribute)

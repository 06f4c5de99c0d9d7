"""Destination adapters, one module per kind. `adapter_for` picks the one a destination needs;
`ticket_url_for` asks it where a person opens one of its tickets."""
from importlib import import_module

from .base import DestinationAdapter

_ADAPTERS = {
    "builtin": "ticketing.destinations.builtin.BuiltinDestination",
    "zendesk": "ticketing.destinations.zendesk.ZendeskDestination",
}


def adapter_for(destination) -> DestinationAdapter:
    path = _ADAPTERS.get(destination.kind)
    if path is None:
        raise LookupError(f"no adapter for destination kind {destination.kind!r}")
    module_name, class_name = path.rsplit(".", 1)
    return getattr(import_module(module_name), class_name)(destination)


def ticket_url_for(destination, ticket_id) -> str:
    """Where a person opens ticket `ticket_id` of `destination`; "" for a kind without an adapter or such a page."""
    try:
        adapter = adapter_for(destination)
    except LookupError:
        return ""
    return adapter.ticket_url(ticket_id)

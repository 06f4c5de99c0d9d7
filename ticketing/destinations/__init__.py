"""Destination adapters, one module per kind. `adapter_for` picks the one a destination needs."""
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

"""Reads of ticketing: an event's current intent, a tenant's destinations, what a destination holds.

Services write, selectors read: nothing here changes a row. Used by the worker
path (`ticketing.services`), the operator writes (`ticketing.replay`) and the
console (`reconciliation`).

    current_intent(event_id)              the event's ticket work (create_ticket or add_comment),
    current_intent(event_id, action)      or one action, at its highest action_version
    stuck_acknowledgment(event_id)        a held or failed notify_requester intent
    default_destination(tenant_id)        the tenant's default (at most one, by a database constraint)
    tenant_destination(tenant_id, id)     a destination, only if it is that tenant's
    override_destination(event)           the destination an operator chose (`route_override`)
    tenant_destinations(tenant_id)        every destination of a tenant, by slug
    lookup_existing(intent) -> Lookup     ask the destination for the record carrying the intent's external_ref
"""

from dataclasses import dataclass

from django.db.models import QuerySet

from intake.models import InboxEvent

from .destinations import adapter_for
from .destinations.base import AmbiguousOutcome, PermanentError, TicketResult, TransientError
from .intents import REPLAYABLE_STATES
from .models import Destination, Intent

# The intents that carry an event's ticket work (an acknowledgment is its own business).
WORK_ACTIONS = (Intent.Action.CREATE_TICKET, Intent.Action.ADD_COMMENT)


# --- intents ---------------------------------------------------------------------


def current_intent(event_id: int, actions: str | tuple | list = WORK_ACTIONS) -> Intent | None:
    """The intent to carry out for this event: the highest action_version of `actions`.

    `actions` is one action (the worker, which knows what it is doing) or several
    (default: the ticket work, create_ticket or add_comment in a thread). The
    highest version wins because a reviewer may have added one.
    """
    actions = [actions] if isinstance(actions, str) else list(actions)
    return (
        Intent.objects.select_related("destination")
        .filter(inbox_event_id=event_id, action__in=actions)
        .order_by("-action_version", "-pk")
        .first()
    )


def stuck_acknowledgment(event_id: int) -> Intent | None:
    """A completed event's acknowledgment that a person must decide on (held or failed)."""
    return (
        Intent.objects.filter(
            inbox_event_id=event_id, action=Intent.Action.NOTIFY_REQUESTER, state__in=REPLAYABLE_STATES
        )
        .order_by("-action_version", "-pk")
        .first()
    )


# --- destinations ----------------------------------------------------------------


def default_destination(tenant_id: int) -> Destination | None:
    """The tenant's default destination (`destination_one_default_per_tenant`), or None."""
    return Destination.objects.filter(tenant_id=tenant_id, is_default=True).first()


def tenant_destination(tenant_id: int, destination_id) -> Destination | None:
    """The destination with this id if it belongs to the tenant; None otherwise (never another tenant's)."""
    return Destination.objects.filter(pk=destination_id, tenant_id=tenant_id).first()


def override_destination(event: InboxEvent) -> Destination | None:
    """The destination an operator chose for this event (`route_override`), if it is still the tenant's."""
    destination_id = (event.route_override or {}).get("destination_id")
    if not destination_id:
        return None
    return tenant_destination(event.tenant_id, destination_id)


def tenant_destinations(tenant_id: int) -> QuerySet:
    """Every destination of the tenant, by slug (the console's choices)."""
    return Destination.objects.filter(tenant_id=tenant_id).order_by("slug")


# --- what a destination already holds ------------------------------------------------


@dataclass(frozen=True)
class Lookup:
    status: str  # "found", "not_found", "unsupported", "no_intent", "error"
    ticket: TicketResult | None = None
    detail: str = ""


def lookup_existing(intent: Intent | None) -> Lookup:
    """Ask the intent's destination for the record carrying its external_ref. A read: nothing is written."""
    if intent is None:
        return Lookup("no_intent", detail="never sent to a destination")
    adapter = adapter_for(intent.destination)
    if not adapter.consistent_lookup:
        return Lookup("unsupported", detail=f"{intent.destination.slug} offers no consistent lookup")
    try:
        found = adapter.find_by_external_ref(intent.external_ref)
    except NotImplementedError:
        return Lookup("unsupported", detail=f"{intent.destination.slug} offers no lookup")
    except (TransientError, PermanentError, AmbiguousOutcome) as exc:
        return Lookup("error", detail=f"{exc.kind}:{exc.reason}")
    if found is None:
        return Lookup("not_found", detail=f"no record with external_id {intent.external_ref}")
    return Lookup("found", ticket=found)


def follow_up_intent(event_id: int) -> Intent | None:
    """The create_ticket intent that follows up a closed ticket for this event (`intents.follow_up_instead`),
    while it is not done; None otherwise."""
    return (
        Intent.objects.select_related("destination")
        .filter(inbox_event_id=event_id, action=Intent.Action.CREATE_TICKET, progress__has_key="follow_up_of")
        .exclude(state=Intent.State.SUCCEEDED)
        .order_by("-action_version")
        .first()
    )

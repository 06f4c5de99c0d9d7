"""Mailroom's ticket number, `MR-n`: one number per ticket, the same everywhere a person reads it.

The number is the id of the `TicketMapping` that created the ticket (action `create_ticket`): the
acknowledgment names it (`[#MR-n]` in its subject), a reply's token finds the ticket by it
(`ticketing.threads`), and the console's ticket list, the mapping list and the API show and search it.
It is the mapping's and not the built-in `Ticket`'s own id because every destination has mappings and
only the built-in store has `Ticket` rows: one sequence, whatever desk the ticket went to, and the
tokens already sent keep their meaning. Comments and linked copies have mappings of their own; their
ticket's number is still its creating mapping's (`number_of`).
"""
import re

from django.db.models import OuterRef, QuerySet, Subquery

from .models import TICKET_NUMBER_PREFIX, Intent, TicketMapping

PREFIX = TICKET_NUMBER_PREFIX
# What a person types into a search box: "MR-5", "mr-5", "#MR-5", "[#MR-5]".
SEARCH_PATTERN = re.compile(rf"^\s*\[?\s*#?\s*{PREFIX}\s*-\s*(\d{{1,18}})\s*\]?\s*$", re.IGNORECASE)


def format_number(number: int) -> str:
    return f"{PREFIX}-{number}"


def parse_number(text: str) -> int | None:
    """The n of a typed `MR-n` (any case, with or without `#` and brackets); None for anything else."""
    match = SEARCH_PATTERN.match(text or "")
    return int(match.group(1)) if match else None


def number_of(mapping: TicketMapping) -> int:
    """The number of the ticket `mapping` points at: its own id for a create, else the creating mapping's."""
    if mapping.action == Intent.Action.CREATE_TICKET:
        return mapping.pk
    creating = (TicketMapping.objects.filter(destination_id=mapping.destination_id, ticket_id=mapping.ticket_id,
                                             action=Intent.Action.CREATE_TICKET)
                .order_by("pk").values_list("pk", flat=True).first())
    return creating or mapping.pk


def with_numbers(mappings: QuerySet) -> QuerySet:
    """Mappings annotated with `ticket_number`: the number of the ticket each one points at."""
    return mappings.annotate(ticket_number=Subquery(
        TicketMapping.objects.filter(destination_id=OuterRef("destination_id"), ticket_id=OuterRef("ticket_id"),
                                     action=Intent.Action.CREATE_TICKET)
        .order_by("pk").values("pk")[:1]))


def tickets_of_number(mappings: QuerySet, number: int) -> QuerySet:
    """Those of `mappings` that point at ticket `number` (its creating mapping, its comments, its copies)."""
    creating = TicketMapping.objects.filter(pk=number, action=Intent.Action.CREATE_TICKET).values(
        "destination_id", "ticket_id").first()
    if creating is None:
        return mappings.none()
    return mappings.filter(destination_id=creating["destination_id"], ticket_id=creating["ticket_id"])

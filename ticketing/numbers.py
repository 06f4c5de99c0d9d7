"""Mailroom's ticket number, `MR-n`: one number per ticket, the same everywhere a person reads it.

The number is the id of the ticket's first `TicketMapping` of action `create_ticket`: the
acknowledgment names it (`[#MR-n]` in its subject), a reply's token finds the ticket by it
(`ticketing.threads`), and the console's ticket list, the mapping list and the API show and search it.
It is the mapping's and not the built-in `Ticket`'s own id because every destination has mappings and
only the built-in store has `Ticket` rows: one sequence, whatever desk the ticket went to, and the
tokens already sent keep their meaning. Comments, linked copies and events an operator confirmed onto an
existing ticket have mappings of their own; their ticket's number is still its first create mapping's
(`number_of`), and a number that names any create mapping of a ticket finds that ticket.
"""

import re

from django.db.models import OuterRef, QuerySet

from .models import TICKET_NUMBER_PREFIX, Intent, TicketMapping, first_create_mapping

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
    """The number of the ticket `mapping` points at: the id of the earliest create mapping of that ticket.

    Usually the mapping's own id; not when a later event was linked to an existing ticket (an operator's
    confirm, a lookup, an adoption), whose create mapping is not the ticket's first."""
    first = with_numbers(TicketMapping.objects.filter(pk=mapping.pk)).values_list("ticket_number", flat=True).first()
    return first or mapping.pk


def with_numbers(mappings: QuerySet) -> QuerySet:
    """Mappings annotated with `ticket_number`: the number of the ticket each one points at."""
    return mappings.annotate(ticket_number=first_create_mapping(OuterRef("destination_id"), OuterRef("ticket_id")))


def ticket_of_number(number: int) -> tuple[int, str] | None:
    """(destination id, desk ticket id) of the ticket numbered `number`, or of the ticket any other create
    mapping `number` points at (a token sent before a later link still finds its ticket); None: no such."""
    found = (
        TicketMapping.objects.filter(pk=number, action=Intent.Action.CREATE_TICKET)
        .values_list("destination_id", "ticket_id")
        .first()
    )
    return tuple(found) if found else None


def tickets_of_number(mappings: QuerySet, number: int) -> QuerySet:
    """Those of `mappings` that point at ticket `number` (its creates, its comments, its copies)."""
    ticket = ticket_of_number(number)
    if ticket is None:
        return mappings.none()
    return mappings.filter(destination_id=ticket[0], ticket_id=ticket[1])


def builtin_tickets_of_number(tickets: QuerySet, number: int) -> QuerySet:
    """Those of the built-in `tickets` numbered `number` (one at most): found through the mapping, by key."""
    ticket = ticket_of_number(number)
    if ticket is None or not ticket[1].isdigit():
        return tickets.none()
    return tickets.filter(destination_id=ticket[0], pk=int(ticket[1]))

"""Which ticket a message belongs to: a reply in a known thread becomes a comment on that ticket.

A thread is `(mailbox, thread_key)`, the key being the root of References (or
In-Reply-To, or the message's own Message-ID); a copy linked to another mailbox's ticket
(`ticketing.copies`) is that thread's ticket too. A ticket token in the subject
(`[#MR-12]`, added to every acknowledgment) also points at a ticket. Either way a
reply joins the ticket only from a participant of it (`participants`), or from one of
the tenant's agents (`ticketing.people.is_agent`: their reply is an internal note): anyone can
type a token or copy a Message-ID into In-Reply-To, and neither may attach their
mail to a stranger's ticket. A non-participant's reply becomes a new ticket,
flagged (`untrusted_ticket_token`, `untrusted_thread_reply`: an audit row and a
`mailroom-…` tag on the ticket).

A help desk's own references thread a reply too (a reply to the desk's notification, not to our mail):
each adapter class declares `reference_patterns` (named group `ref`), where they are looked for
(`reference_fields`: "subject", "body" = the first `REFERENCE_BODY_LINES` lines of the text, "headers" =
In-Reply-To and References) and `resolve_reference`. `is_thread_work` checks every kind's patterns
without the database; `plan` then reads only the tenant's destinations, resolves at most one
reference by asking a desk (an adapter that keeps the default `resolve_reference` asks nobody), and
threads the reply to the tenant's ticket of that destination, with the same participant check. Used only
when our own headers and token found no ticket.
"""

import logging
import re
from dataclasses import dataclass, field

from django.db.models import Q, QuerySet
from django.db.models.fields.json import KT

from intake.mime import ParsedMessage
from intake.models import InboxEvent
from intake.validation.threading import subject_ticket_token

from .copies import LINK_COPY
from .destinations import adapter_class, adapter_for
from .destinations.base import DestinationAdapter
from .models import Destination, DestinationKind, Intent, TicketMapping
from .numbers import PREFIX as TOKEN_PREFIX
from .people import FORWARDED_REQUESTER, is_agent

logger = logging.getLogger(__name__)

UNTRUSTED_TOKEN = "untrusted_ticket_token"
# In-Reply-To/References name a thread whose ticket the sender does not take part in.
UNTRUSTED_THREAD = "untrusted_thread_reply"
# One thread root, several tickets: a sender reused a Message-ID for different messages.
AMBIGUOUS_THREAD = "ambiguous_thread"
MAX_THREAD_TICKETS = 50
# Where a desk's references are looked for in a reply: its subject, the first lines of its text, its
# In-Reply-To and References.
REFERENCE_FIELDS = ("subject", "body", "headers")
REFERENCE_BODY_LINES = 40
REFERENCE_BODY_CHARS = 8_000
MAX_REFERENCE_CANDIDATES = 10


@dataclass
class ThreadPlan:
    target: TicketMapping | None = None  # the ticket to comment on; None: a new ticket
    wait_for_earlier: bool = False  # an earlier message of this thread is still open
    needs_lease: bool = False  # thread work: serialize it under the thread's lease
    flags: list[str] = field(default_factory=list)


def is_thread_work(parsed: ParsedMessage) -> bool:
    return bool(
        parsed.in_reply_to
        or parsed.references
        or subject_ticket_token(parsed.subject, TOKEN_PREFIX)
        or may_carry_desk_reference(parsed)
    )


def participants(mapping: TicketMapping) -> set[str]:
    """The requester and everyone whose mail was already added to that ticket (the ticket's creating mail's
    sender, and the customer an agent's forward made its requester)."""
    rows = InboxEvent.objects.filter(
        Q(pk=mapping.inbox_event_id)
        | Q(
            mappings__destination_id=mapping.destination_id,
            mappings__ticket_id=mapping.ticket_id,
            mappings__action=Intent.Action.ADD_COMMENT,
        )
    ).values_list("sender", KT(f"details__{FORWARDED_REQUESTER}"))
    return {address.lower() for row in rows for address in row if isinstance(address, str) and address}


# --- the desk's own references ---------------------------------------------------------------------------


def _reference_texts(parsed: ParsedMessage) -> dict[str, str]:
    """What each reference field holds, bounded."""
    body = (parsed.text or "")[:REFERENCE_BODY_CHARS]
    return {
        "subject": (parsed.subject or "")[:998],
        "body": "\n".join(body.split("\n", REFERENCE_BODY_LINES)[:REFERENCE_BODY_LINES]),
        "headers": " ".join([parsed.in_reply_to or "", *(parsed.references or [])])[:REFERENCE_BODY_CHARS],
    }


def _declared_patterns(
    adapter: DestinationAdapter | type[DestinationAdapter],
) -> dict[str, tuple[re.Pattern[str], ...]]:
    """{field: the compiled patterns an adapter (its class: the kind's; an instance: the destination's) looks
    for there}."""
    patterns = tuple(
        p
        for p in (getattr(adapter, "reference_patterns", ()) or ())
        if isinstance(p, re.Pattern) and isinstance(p.pattern, str) and "ref" in p.groupindex
    )
    fields = getattr(adapter, "reference_fields", ()) or ()
    return {name: patterns for name in REFERENCE_FIELDS if name in fields and patterns}


_kind_classes: list[type[DestinationAdapter]] = []  # every kind's adapter class, looked up once
# The classes' declared patterns and fields -> {field: patterns}, rebuilt when they change.
_kind_patterns: dict[
    tuple[tuple[tuple[re.Pattern[str], ...], tuple[str, ...]], ...], dict[str, tuple[re.Pattern[str], ...]]
] = {}


def _all_kinds_patterns() -> dict[str, tuple[re.Pattern[str], ...]]:
    """{field: every kind's patterns for it, each once}. Rebuilt only when a class's declaration changes."""
    if not _kind_classes:
        classes = []
        for kind in DestinationKind.values:
            try:
                classes.append(adapter_class(kind))
            except LookupError:
                continue
        _kind_classes[:] = classes
    declared = tuple(
        (tuple(adapter.reference_patterns or ()), tuple(adapter.reference_fields or ())) for adapter in _kind_classes
    )
    patterns = _kind_patterns.get(declared)
    if patterns is None:
        by_field: dict[str, dict[re.Pattern[str], None]] = {}
        for adapter in _kind_classes:
            for name, found in _declared_patterns(adapter).items():
                by_field.setdefault(name, {}).update(dict.fromkeys(found))
        patterns = {name: tuple(found) for name, found in by_field.items()}
        _kind_patterns.clear()
        _kind_patterns[declared] = patterns
    return patterns


def may_carry_desk_reference(parsed: ParsedMessage) -> bool:
    """Does any kind's reference pattern match the message (whatever the tenant's destinations)? No query.

    Reads the patterns each kind declares on its class: a kind whose destinations narrow them (a Jira
    project's key) declares the wider pattern there. Each pattern is searched on its own: CPython's regex
    engine has no prefix scan for an alternation, and one combined pattern measured about twice as slow as
    the separate searches (some 0.1-0.2 ms for 40 lines of text and the kinds' patterns).
    """
    patterns = _all_kinds_patterns()
    if not patterns:
        return False
    texts = _reference_texts(parsed)
    return any(pattern.search(texts[name]) for name, found in patterns.items() if texts[name] for pattern in found)


def _reference_candidates(event: InboxEvent, parsed: ParsedMessage) -> list[tuple[DestinationAdapter, str]]:
    """(adapter of the destination, reference) found in the message for each of the tenant's destinations, with
    the patterns that destination declares (an adapter may narrow its kind's: a Jira project's key), in the
    order looked for: the default destination first, the subject before the text; each pair once."""
    texts = _reference_texts(parsed)
    found: dict[tuple[int, str], tuple[DestinationAdapter, str]] = {}
    for destination in Destination.objects.filter(tenant_id=event.tenant_id).order_by("-is_default", "pk"):
        try:
            adapter = adapter_for(destination)
        except Exception as exc:  # no adapter, or settings it cannot read: that destination names nothing
            logger.info(
                "event %s: destination %s has no usable adapter (%s)", event.pk, destination.pk, type(exc).__name__
            )
            continue
        declared = _declared_patterns(adapter)
        for name in REFERENCE_FIELDS:
            for pattern in declared.get(name, ()):
                for match in pattern.finditer(texts[name]):
                    ref = (match.group("ref") or "").strip()
                    if ref:
                        found.setdefault((destination.pk, ref), (adapter, ref))
                    if len(found) >= MAX_REFERENCE_CANDIDATES:
                        return list(found.values())
    return list(found.values())


def desk_reference_ticket(event: InboxEvent, parsed: ParsedMessage) -> TicketMapping | None:
    """The tenant's ticket that a desk reference in the message names (its creating mapping), or None.

    References are read only for the tenant's own destinations and resolve only to the tenant's mappings,
    so a reference to another tenant's ticket names nothing. At most one desk is asked (a reference an
    adapter resolves without the desk costs nothing); a failure to resolve counts as no reference.
    A reply to a desk's notification nearly always names the notification in In-Reply-To, so this also runs
    for references only a destination's own settings describe (a REST API's reference_template).
    """
    asked_a_desk = False
    for adapter, ref in _reference_candidates(event, parsed):
        destination = adapter.destination
        if type(adapter).resolve_reference is not DestinationAdapter.resolve_reference:
            if asked_a_desk:
                continue
            asked_a_desk = True
        try:
            ticket_id = adapter.resolve_reference(ref)
        except Exception as exc:
            logger.info(
                "event %s: destination %s could not resolve a desk reference (%s)",
                event.pk,
                destination.pk,
                type(exc).__name__,
            )
            continue
        if not ticket_id:
            continue
        mapping = (
            TicketMapping.objects.select_related("destination")
            .filter(
                destination=destination,
                ticket_id=str(ticket_id)[:200],
                action=Intent.Action.CREATE_TICKET,
                inbox_event__tenant_id=event.tenant_id,
            )
            .order_by("created_at", "pk")
            .first()
        )
        if mapping is not None:
            return mapping
    return None


def _is_participant(event: InboxEvent, parsed: ParsedMessage, mapping: TicketMapping) -> bool:
    """The sender takes part in the ticket, or is one of the tenant's agents (whose reply is an internal note)."""
    if not parsed.sender:
        return False
    return is_agent(event.tenant, parsed.sender) or parsed.sender.lower() in participants(mapping)


def _earlier_in_thread(event: InboxEvent) -> QuerySet[InboxEvent]:
    return InboxEvent.objects.filter(mailbox_id=event.mailbox_id, thread_key=event.thread_key).filter(
        Q(received_at__lt=event.received_at) | Q(received_at=event.received_at, pk__lt=event.pk)
    )


def _choose_ticket(tickets: list[TicketMapping], parsed: ParsedMessage, flags: list[str]) -> TicketMapping:
    """The earliest ticket of the thread, unless the thread has several and the subject names one of them.

    Several tickets under one root happen when a sender reuses a Message-ID for
    different messages (each became its own ticket): the reply is flagged so a
    person can check it landed on the right one.
    """
    if len({(t.destination_id, t.ticket_id) for t in tickets}) == 1:
        return tickets[0]
    flags.append(AMBIGUOUS_THREAD)
    token = subject_ticket_token(parsed.subject, TOKEN_PREFIX)
    named = token and next((t for t in tickets if str(t.pk) == token.rsplit("-", 1)[1]), None)
    return named or tickets[0]


def plan(event: InboxEvent, parsed: ParsedMessage) -> ThreadPlan:
    if not is_thread_work(parsed):
        return ThreadPlan()
    result = ThreadPlan(needs_lease=True)
    if parsed.in_reply_to or parsed.references:
        earlier = _earlier_in_thread(event)
        if earlier.filter(state__in=InboxEvent.OPEN_STATES).exists():
            result.wait_for_earlier = True  # arrival order: the earlier one goes first
            return result
        tickets = list(
            TicketMapping.objects.select_related("destination")
            .filter(inbox_event__in=earlier, action__in=(Intent.Action.CREATE_TICKET, LINK_COPY))
            .order_by("created_at", "pk")[:MAX_THREAD_TICKETS]
        )
        if tickets:
            # Only the thread's tickets the sender takes part in (a stranger's reply made its own, flagged one).
            theirs = [t for t in tickets if _is_participant(event, parsed, t)]
            if theirs:
                result.target = _choose_ticket(theirs, parsed, result.flags)
            else:
                # (A desk's reference may still name the sender's own ticket: a reply to its notification.)
                desk_ticket = desk_reference_ticket(event, parsed)
                if desk_ticket is not None and _is_participant(event, parsed, desk_ticket):
                    result.target = desk_ticket
                else:
                    result.flags.append(UNTRUSTED_THREAD)
            return result
    token = subject_ticket_token(parsed.subject, TOKEN_PREFIX)
    if token:
        number = token.rsplit("-", 1)[1]
        mapping = (
            TicketMapping.objects.select_related("destination")
            .filter(pk=int(number), action=Intent.Action.CREATE_TICKET, inbox_event__tenant_id=event.tenant_id)
            .first()
        )
        if mapping is not None and _is_participant(event, parsed, mapping):
            result.target = mapping
        elif mapping is not None:
            result.flags.append(UNTRUSTED_TOKEN)
        if mapping is not None:
            return result
    desk_ticket = desk_reference_ticket(event, parsed)
    if desk_ticket is not None and _is_participant(event, parsed, desk_ticket):
        result.target = desk_ticket
    elif desk_ticket is not None:
        result.flags.append(UNTRUSTED_THREAD)
    return result

"""Which ticket a message belongs to: a reply in a known thread becomes a comment on that ticket.

A thread is `(mailbox, thread_key)`, the key being the root of References (or
In-Reply-To, or the message's own Message-ID); a copy linked to another mailbox's ticket
(`ticketing.copies`) is that thread's ticket too. A ticket token in the subject
(`[#MR-12]`, added to every acknowledgment) also points at a ticket. Either way a
reply joins the ticket only from a participant of it (`participants`): anyone can
type a token or copy a Message-ID into In-Reply-To, and neither may attach their
mail to a stranger's ticket. A non-participant's reply becomes a new ticket,
flagged (`untrusted_ticket_token`, `untrusted_thread_reply`: an audit row and a
`mailroom-…` tag on the ticket).
"""
from dataclasses import dataclass, field

from django.db.models import Q

from intake.mime import ParsedMessage
from intake.models import InboxEvent
from intake.validation import subject_ticket_token

from .copies import LINK_COPY
from .models import Intent, TicketMapping
from .numbers import PREFIX as TOKEN_PREFIX

UNTRUSTED_TOKEN = "untrusted_ticket_token"
# In-Reply-To/References name a thread whose ticket the sender does not take part in.
UNTRUSTED_THREAD = "untrusted_thread_reply"
# One thread root, several tickets: a sender reused a Message-ID for different messages.
AMBIGUOUS_THREAD = "ambiguous_thread"
MAX_THREAD_TICKETS = 50


@dataclass
class ThreadPlan:
    target: TicketMapping | None = None     # the ticket to comment on; None: a new ticket
    wait_for_earlier: bool = False          # an earlier message of this thread is still open
    needs_lease: bool = False               # thread work: serialize it under the thread's lease
    flags: list[str] = field(default_factory=list)


def is_thread_work(parsed: ParsedMessage) -> bool:
    return bool(parsed.in_reply_to or parsed.references or subject_ticket_token(parsed.subject, TOKEN_PREFIX))


def participants(mapping: TicketMapping) -> set[str]:
    """The requester and everyone whose mail was already added to that ticket."""
    senders = InboxEvent.objects.filter(
        Q(pk=mapping.inbox_event_id)
        | Q(mappings__destination_id=mapping.destination_id, mappings__ticket_id=mapping.ticket_id,
            mappings__action=Intent.Action.ADD_COMMENT)
    ).values_list("sender", flat=True)
    return {s.lower() for s in senders if s}


def _is_participant(parsed: ParsedMessage, mapping: TicketMapping) -> bool:
    return bool(parsed.sender) and parsed.sender.lower() in participants(mapping)


def _earlier_in_thread(event: InboxEvent):
    return InboxEvent.objects.filter(mailbox_id=event.mailbox_id, thread_key=event.thread_key).filter(
        Q(received_at__lt=event.received_at) | Q(received_at=event.received_at, pk__lt=event.pk))


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
            theirs = [t for t in tickets if _is_participant(parsed, t)]
            if theirs:
                result.target = _choose_ticket(theirs, parsed, result.flags)
            else:
                result.flags.append(UNTRUSTED_THREAD)
            return result
    token = subject_ticket_token(parsed.subject, TOKEN_PREFIX)
    if token:
        number = token.rsplit("-", 1)[1]
        mapping = (TicketMapping.objects.select_related("destination")
                   .filter(pk=int(number), action=Intent.Action.CREATE_TICKET, inbox_event__tenant_id=event.tenant_id)
                   .first())
        if mapping is not None and _is_participant(parsed, mapping):
            result.target = mapping
        elif mapping is not None:
            result.flags.append(UNTRUSTED_TOKEN)
    return result

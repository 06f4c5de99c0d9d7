"""The built-in ticket store: tickets are rows in our own database (docs/destinations/builtin.md).

Nothing leaves Mailroom: the message, its files and its people stay where the console shows them. A ticket's
event is found through its mapping (`TicketMapping`, ticket_id = the row's id), which the admin links; the
description lists every file with its console link (`ticketing.ticket_files`, files "none"), the CC'd people
and a forward's agent (`ticketing.services`). A comment keeps its author's address; an agent's mail is an
internal note, marked as such on its first line (TicketComment has no public flag of its own). A reply to a
solved ticket reopens it (closed_policy "reopen", the default here), or, with "review", goes to a person.
"""

from dataclasses import dataclass

from django.utils import timezone

from ..models import Ticket, TicketComment
from .base import (
    CommentRequest,
    DestinationAdapter,
    DestinationRecord,
    RecordPage,
    TicketClosed,
    TicketRequest,
    TicketResult,
)
from .capabilities import FILES_NONE, REOPEN, REQUESTER_ADDRESS, REVIEW, Capabilities
from .settings import COMMON_SETTINGS

# The first line of a comment that is an internal note (mail from one of the tenant's agents).
INTERNAL_NOTE_LINE = "[Internal note: written by one of the tenant's agents, not by the customer]"


@dataclass(frozen=True)
class BuiltinCapabilities(Capabilities):
    @property
    def default_closed_policy(self) -> str:
        # A reply to a solved ticket of our own reopens it, as every desk's solved tickets do.
        return REOPEN


class BuiltinDestination(DestinationAdapter):
    honours_idempotency_key = True
    consistent_lookup = True
    transactional = True
    SETTINGS = COMMON_SETTINGS
    needs_base_url = False
    needs_credentials = False

    capabilities = BuiltinCapabilities(
        files=FILES_NONE,  # they stay in Mailroom; the description links each in the console
        html=False,
        requester=REQUESTER_ADDRESS,
        cc_field="",  # the CC'd people are listed in the description
        customer_authored_comments=True,  # TicketComment.author: the reply's sender
        internal_notes=True,  # marked by INTERNAL_NOTE_LINE
        closed_policies=(REOPEN, REVIEW),
        acknowledges_requester=False,  # Mailroom's own acknowledgment is the only one
    )

    def check_connection(self) -> str:
        return f"{Ticket.objects.filter(destination=self.destination).count()} tickets in Mailroom's own database"

    def create_ticket(self, request: TicketRequest, idempotency_key: str, external_ref: str) -> TicketResult:
        # Called inside the caller's transaction; the unique idempotency key makes
        # a second create for the same intent impossible.
        ticket = Ticket.objects.create(
            destination=self.destination,
            idempotency_key=idempotency_key,
            external_ref=external_ref,
            subject=request.subject[:998],
            requester=request.requester[:320],
            description=request.description,
            tags=list(request.tags),
            queue=request.queue[:100],
            priority=request.priority[:10],
            request_type=request.request_type[:100],
            assignee=request.assignee[:200],
            created_at=timezone.now(),
            status=Ticket.Status.SOLVED if request.status == "closed" else Ticket.Status.NEW,
        )
        return TicketResult(ticket_id=str(ticket.pk), url=self.ticket_url(ticket.pk))

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        ticket = Ticket.objects.filter(destination=self.destination, external_ref=external_ref).first()
        if ticket is None:
            return None
        return TicketResult(ticket_id=str(ticket.pk), url=self.ticket_url(ticket.pk))

    def add_comment(self, ticket_id: str, comment: CommentRequest, idempotency_key: str, external_ref: str) -> str:
        # Called inside the caller's transaction, like the create: the reopening commits with the comment.
        solved = Ticket.objects.filter(pk=int(ticket_id), destination=self.destination, status=Ticket.Status.SOLVED)
        if self.closed_policy() == REOPEN:
            solved.update(status=Ticket.Status.OPEN)
        elif solved.exists():
            raise TicketClosed(f"built-in ticket {ticket_id} is solved")
        body = comment.body if comment.public else f"{INTERNAL_NOTE_LINE}\n\n{comment.body}"
        created = TicketComment.objects.create(
            ticket_id=int(ticket_id),
            idempotency_key=idempotency_key,
            external_ref=external_ref,
            author=comment.author_email[:320],
            body=body,
            created_at=timezone.now(),
        )
        return str(created.pk)

    def closed_policy(self) -> str:
        """What a reply to a solved ticket becomes (as `ticketing.services.closed_policy` decides it)."""
        chosen = (self.destination.settings or {}).get("closed_policy")
        if chosen in self.capabilities.closed_policies:
            return chosen
        return self.capabilities.default_closed_policy

    def ticket_url(self, ticket_id) -> str:
        """The ticket's page in our own admin."""
        return f"/admin/ticketing/ticket/{ticket_id}/change/"

    # --- listing (reconciliation) -----------------------------------------------------------------
    supports_listing = True

    def records_with_ref(self, prefix: str, since, limit: int, resume: dict | None = None) -> RecordPage:
        """Newest first down the primary key, stopping at the window's start: the cost is the window's.

        Every destination's tickets share the table; filtering by destination in Python keeps the
        plan a backward scan of the primary key whatever the table's size.
        """
        rows = Ticket.objects.order_by("-pk")
        if resume and resume.get("before_pk"):
            rows = rows.filter(pk__lt=int(resume["before_pk"]))
        chunk = list(rows.values_list("pk", "destination_id", "external_ref", "created_at")[: max(1, int(limit))])
        records = [
            DestinationRecord(str(pk), ref, self.ticket_url(pk))
            for pk, destination_id, ref, created in chunk
            if destination_id == self.destination.pk and created >= since and ref.startswith(prefix)
        ]
        done = len(chunk) < limit or chunk[-1][3] < since
        return RecordPage(records, None if done else {"before_pk": chunk[-1][0]})

    def existing_tickets(self, ticket_ids: list[str]) -> set[str]:
        ids = [int(t) for t in ticket_ids if str(t).isdigit()]
        return {
            str(pk)
            for pk in Ticket.objects.filter(destination=self.destination, pk__in=ids).values_list("pk", flat=True)
        }

    def records_for_ref(self, external_ref: str) -> list[DestinationRecord]:
        return [
            DestinationRecord(str(pk), external_ref, self.ticket_url(pk))
            for pk in Ticket.objects.filter(destination=self.destination, external_ref=external_ref)
            .order_by("pk")
            .values_list("pk", flat=True)
        ]

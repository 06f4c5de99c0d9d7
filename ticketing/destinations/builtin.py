"""The built-in ticket store: tickets are rows in our own database."""
from django.utils import timezone

from ..models import Ticket, TicketComment
from .base import DestinationAdapter, TicketRequest, TicketResult


class BuiltinDestination(DestinationAdapter):
    honours_idempotency_key = True
    consistent_lookup = True
    transactional = True

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
        )
        return TicketResult(ticket_id=str(ticket.pk), url=self.ticket_url(ticket.pk))

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        ticket = Ticket.objects.filter(destination=self.destination, external_ref=external_ref).first()
        if ticket is None:
            return None
        return TicketResult(ticket_id=str(ticket.pk), url=self.ticket_url(ticket.pk))

    def add_comment(self, ticket_id: str, body: str, author: str, idempotency_key: str, external_ref: str) -> str:
        comment = TicketComment.objects.create(
            ticket_id=int(ticket_id), idempotency_key=idempotency_key, external_ref=external_ref,
            author=author[:320], body=body, created_at=timezone.now(),
        )
        return str(comment.pk)

    def ticket_url(self, ticket_id) -> str:
        """The ticket's page in our own admin."""
        return f"/admin/ticketing/ticket/{ticket_id}/change/"

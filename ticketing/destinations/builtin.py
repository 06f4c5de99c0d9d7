"""The built-in ticket store: tickets are rows in our own database."""
from django.utils import timezone

from ..models import Ticket, TicketComment
from .base import CommentRequest, DestinationAdapter, DestinationRecord, RecordPage, TicketRequest, TicketResult
from .settings import COMMON_SETTINGS


class BuiltinDestination(DestinationAdapter):
    honours_idempotency_key = True
    consistent_lookup = True
    transactional = True
    SETTINGS = COMMON_SETTINGS
    needs_base_url = False
    needs_credentials = False

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
        )
        return TicketResult(ticket_id=str(ticket.pk), url=self.ticket_url(ticket.pk))

    def find_by_external_ref(self, external_ref: str) -> TicketResult | None:
        ticket = Ticket.objects.filter(destination=self.destination, external_ref=external_ref).first()
        if ticket is None:
            return None
        return TicketResult(ticket_id=str(ticket.pk), url=self.ticket_url(ticket.pk))

    def add_comment(self, ticket_id: str, comment: CommentRequest, idempotency_key: str, external_ref: str) -> str:
        body, author = comment.body, comment.author_email
        comment = TicketComment.objects.create(
            ticket_id=int(ticket_id), idempotency_key=idempotency_key, external_ref=external_ref,
            author=author[:320], body=body, created_at=timezone.now(),
        )
        return str(comment.pk)

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
        chunk = list(rows.values_list("pk", "destination_id", "external_ref", "created_at")[:max(1, int(limit))])
        records = [DestinationRecord(str(pk), ref, self.ticket_url(pk)) for pk, destination_id, ref, created in chunk
                   if destination_id == self.destination.pk and created >= since and ref.startswith(prefix)]
        done = len(chunk) < limit or chunk[-1][3] < since
        return RecordPage(records, None if done else {"before_pk": chunk[-1][0]})

    def existing_tickets(self, ticket_ids: list[str]) -> set[str]:
        ids = [int(t) for t in ticket_ids if str(t).isdigit()]
        return {str(pk) for pk in Ticket.objects.filter(destination=self.destination, pk__in=ids)
                .values_list("pk", flat=True)}

    def records_for_ref(self, external_ref: str) -> list[DestinationRecord]:
        return [DestinationRecord(str(pk), external_ref, self.ticket_url(pk)) for pk in
                Ticket.objects.filter(destination=self.destination, external_ref=external_ref)
                .order_by("pk").values_list("pk", flat=True)]

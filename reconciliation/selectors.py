"""Reads for operators: the recovery queue and what it shows."""
from django.db.models import Exists, OuterRef, Q, QuerySet

from intake.models import InboxEvent
from ticketing.models import Intent


def recovery_queue() -> QuerySet:
    """Every event that needs a person: a recovery state, or an intent held for investigation. Oldest first."""
    held = Intent.objects.filter(inbox_event=OuterRef("pk"), state=Intent.State.HELD)
    return (
        InboxEvent.objects.filter(Q(state__in=InboxEvent.RECOVERY_STATES) | Q(Exists(held)))
        .select_related("mailbox", "owner")
        .order_by("received_at", "pk")
    )

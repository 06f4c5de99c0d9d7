"""One message delivered to several mailboxes of a tenant (To support@, Cc sales@): one ticket by default.

Ingest stores every delivery as its own event (the dedupe key is per mailbox). The copies of a message
are the tenant's events with the same content fingerprint, which covers the Message-ID, Date, From,
To, Cc, Subject and body (`intake.keys.content_fingerprint`). With `RoutingPolicy.one_ticket_per_message`
(the default) one of them, the primary, does the ticket work and the others follow it:

    primary open (received/ready/write_pending) -> the copy waits (`wait_event`), as thread work waits
    primary completed                           -> the copy completes as a link: a `link_copy`
                                                   TicketMapping to the primary's ticket, `copy_of` set,
                                                   audit `linked_copy` naming the primary
    primary in a recovery state                 -> the copy goes to review (`copy_of_unresolved`);
                                                   replayed once the primary is settled, it links
    primary suppressed (closed by a reviewer)   -> the copy takes over as the primary

Who is primary is decided once, by the database: the first copy that reaches this point inserts the
`CopiedMessage` row of (tenant, fingerprint) (`INSERT ... ON CONFLICT DO NOTHING`), and every other
copy finds it taken. Two workers racing on two copies cannot both be primary, and a copy whose ingest
committed late finds the row as well. With the setting off, every mailbox's event makes its own ticket.
"""

from collections.abc import Hashable
from typing import Any, cast

from django.db import transaction
from django.utils import timezone

from intake.models import InboxEvent
from intake.services import transition_event, wait_event
from intake.vocabulary import AuditKind, ReasonCode

from .models import CopiedMessage, Intent, RoutingPolicy, TicketMapping
from .outcomes import Outcome
from .selectors import WORK_ACTIONS

State = InboxEvent.State
# The mapping of a copy: the same destination and ticket as its primary's (TicketMapping.action).
LINK_COPY = "link_copy"
COPY_RETRY_SECONDS = 2
# The primary's mappings a copy can link to (a copy of a reply links to the ticket it commented on).
LINKABLE_ACTIONS = (*WORK_ACTIONS, LINK_COPY)


def one_ticket_per_message(tenant_id: int, cache: dict[Hashable, Any]) -> bool:
    key = ("one_ticket_per_message", tenant_id)
    if key not in cache:
        value = (
            RoutingPolicy.objects.filter(tenant_id=tenant_id).values_list("one_ticket_per_message", flat=True).first()
        )
        cache[key] = True if value is None else bool(value)
    return cast(bool, cache[key])  # stored just above, a bool


def claim(event: InboxEvent) -> int:
    """The primary event of this message: this one if it is the first copy to ask."""
    rows = CopiedMessage.objects.filter(tenant_id=event.tenant_id, fingerprint=event.fingerprint)
    CopiedMessage.objects.bulk_create(
        [
            CopiedMessage(
                tenant_id=event.tenant_id, fingerprint=event.fingerprint, primary_id=event.pk, created_at=timezone.now()
            )
        ],
        ignore_conflicts=True,
    )
    return rows.values_list("primary_id", flat=True).get()


def follow_primary(event: InboxEvent, worker: str, cache: dict[Hashable, Any]) -> str | None:
    """None when this event does its own ticket work; otherwise what it did as a copy
    (WAITING_FOR_COPY, LINKED, AWAITING_REVIEW or DONE, of `Outcome`)."""
    if not event.fingerprint or not one_ticket_per_message(event.tenant_id, cache):
        return None
    primary_id = claim(event)
    if primary_id == event.pk:
        return None
    if Intent.objects.filter(inbox_event_id=event.pk, action__in=WORK_ACTIONS).exists():
        return None  # it went its own way before (one ticket per mailbox at the time): it finishes that
    primary = InboxEvent.objects.filter(pk=primary_id).values_list("state", flat=True).first()
    if primary in InboxEvent.OPEN_STATES:
        wait_event(event.pk, COPY_RETRY_SECONDS)
        return Outcome.WAITING_FOR_COPY
    if primary == State.SUPPRESSED:
        # A reviewer closed the primary; this delivery is sent on: it becomes the primary.
        CopiedMessage.objects.filter(
            tenant_id=event.tenant_id, fingerprint=event.fingerprint, primary_id=primary_id
        ).update(primary_id=event.pk)
        return follow_primary(event, worker, cache)
    mapping = None
    if primary == State.COMPLETED:
        mapping = (
            TicketMapping.objects.filter(inbox_event_id=primary_id, action__in=LINKABLE_ACTIONS).order_by("pk").first()
        )
    if mapping is not None:
        return _link(event, primary_id, mapping, worker)
    return _to_review(event, primary_id, primary, worker)


def _link(event: InboxEvent, primary_id: int, mapping: TicketMapping, worker: str) -> str:
    now = timezone.now()
    with transaction.atomic():
        if not transition_event(
            event.pk,
            InboxEvent.OPEN_STATES,
            State.COMPLETED,
            actor=f"worker:{worker}",
            kind=AuditKind.LINKED_COPY,
            now=now,
            extra={"copy_of_id": primary_id, "retry_at": None},
            audit_detail={
                "primary_event": primary_id,
                "destination": mapping.destination_id,
                "ticket_id": mapping.ticket_id,
            },
        ):
            return Outcome.DONE
        TicketMapping.objects.create(
            inbox_event_id=event.pk,
            action=LINK_COPY,
            destination_id=mapping.destination_id,
            ticket_id=mapping.ticket_id,
            ticket_url=mapping.ticket_url,
            created_at=now,
        )
    return Outcome.LINKED


def _to_review(event: InboxEvent, primary_id: int, primary_state: str | None, worker: str) -> str:
    transition_event(
        event.pk,
        InboxEvent.OPEN_STATES,
        State.AWAITING_REVIEW,
        actor=f"worker:{worker}",
        kind=AuditKind.AWAITING_REVIEW,
        reason_code=ReasonCode.COPY_OF_UNRESOLVED,
        reason_detail=f"a copy of event {primary_id}, which is {primary_state}: settle that one, "
        "then replay this one to link it to its ticket",
        detail={"primary_event": primary_id, "primary_state": primary_state},
        extra={"copy_of_id": primary_id, "retry_at": None},
    )
    return Outcome.AWAITING_REVIEW

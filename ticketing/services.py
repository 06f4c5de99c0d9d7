"""Turning an inbox event into exactly one ticket, through a durable intent.

The state machine itself lives in `ticketing.intents`; this module decides
what an event needs (normalize, route) and carries out one attempt.
"""
import logging
import os
import socket

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from intake.mime import parse_message
from intake.models import InboxEvent
from intake.selectors import global_pause_on
from intake.services import transition_event, wait_event

from . import intents
from .destinations import adapter_for
from .destinations.base import AmbiguousOutcome, PermanentError, TicketRequest, TransientError
from .models import Destination, Intent
from .testhooks import pause_point

logger = logging.getLogger(__name__)

State = InboxEvent.State


def worker_identity() -> str:
    # Computed per call: a prefork child has its own pid.
    return f"{socket.gethostname()}:{os.getpid()}"


def default_destination(tenant_id: int) -> Destination | None:
    return Destination.objects.filter(tenant_id=tenant_id, is_default=True).first()


def route(event: InboxEvent, cache: dict) -> Destination | None:
    """An operator's corrected route wins; otherwise the tenant's default (cached per task group)."""
    override = (event.route_override or {}).get("destination_id")
    if override:
        return Destination.objects.filter(pk=override, tenant_id=event.tenant_id).first()
    if event.tenant_id not in cache:
        cache[event.tenant_id] = default_destination(event.tenant_id)
    return cache[event.tenant_id]


def _normalize(event: InboxEvent, parsed) -> None:
    """Store what routing needs and mark the event `ready` (once)."""
    if event.state == State.RECEIVED:
        InboxEvent.objects.filter(pk=event.pk, state=State.RECEIVED).update(
            state=State.READY,
            message_id_header=parsed.message_id[:998],
            sender=parsed.sender[:320],
            subject=parsed.subject[:998],
            updated_at=timezone.now(),
        )
        event.state = State.READY


def _wait_for_resume(event: InboxEvent) -> str:
    """Paused: no destination write. The event waits; a resume (or the recheck) enqueues it again."""
    wait_event(event.pk, settings.MAILROOM_PAUSE_RECHECK_SECONDS)
    return "paused"


def _ticket_request(parsed) -> TicketRequest:
    # Built only from the stored message, so every attempt sends the same body
    # (a destination that keeps our key rejects the same key with another body).
    return TicketRequest(subject=parsed.subject or "(no subject)", description=parsed.text, requester=parsed.sender)


def process_inbox_event(event_id: int, worker: str | None = None, destinations: dict | None = None) -> str:
    """Carry one event as far as it can go now. Safe to run any number of times, concurrently.

    Returns a short word saying what happened, for logs and tests.
    """
    worker = worker or worker_identity()
    event = InboxEvent.objects.select_related("mailbox").filter(pk=event_id).first()
    if event is None:
        return "missing"
    if event.state not in InboxEvent.OPEN_STATES:
        return "done"
    if event.mailbox.paused or global_pause_on():
        return _wait_for_resume(event)

    parsed = parse_message(bytes(event.raw or b""))

    destination = route(event, destinations if destinations is not None else {})
    if destination is None:
        _normalize(event, parsed)
        transition_event(event.pk, InboxEvent.OPEN_STATES, State.AWAITING_REVIEW, actor=f"worker:{worker}",
                         kind="routed_to_review", reason_code="no_destination",
                         reason_detail="the tenant has no default destination and no rule matched")
        return "review"
    if destination.paused:
        return _wait_for_resume(event)

    request = _ticket_request(parsed)
    with transaction.atomic():
        _normalize(event, parsed)
        intent = intents.ensure_intent(event, Intent.Action.CREATE_TICKET, destination)
        if intent.state == Intent.State.SUCCEEDED:
            return "done"
        # An existing intent keeps its own destination (a reviewer may have corrected it).
        adapter = adapter_for(intent.destination)
        if adapter.transactional:
            # The built-in store: normalize, claim, create and record commit
            # together or not at all, in one transaction.
            return _attempt_in_transaction(adapter, intent, request, worker)
    return execute_intent(intent, request, worker, adapter)


def _attempt_in_transaction(adapter, intent: Intent, request: TicketRequest, worker: str) -> str:
    if not intents.claim(intent.pk, worker):
        return "busy"
    result = adapter.create_ticket(request, intent.idempotency_key, intent.external_ref)
    intents.record_success(intent, result, f"worker:{worker}")
    return "created"


def execute_intent(intent: Intent, request: TicketRequest, worker: str, adapter=None) -> str:
    """One attempt: claim, call the destination, record what happened."""
    adapter = adapter or adapter_for(intent.destination)
    if adapter.transactional:
        with transaction.atomic():
            return _attempt_in_transaction(adapter, intent, request, worker)

    if not intents.claim(intent.pk, worker):
        return "busy"
    InboxEvent.objects.filter(pk=intent.inbox_event_id, state__in=[State.RECEIVED, State.READY]).update(
        state=State.WRITE_PENDING, updated_at=timezone.now())
    pause_point("before_destination_call")
    # The claim must still be ours, with room for a whole request, right before the side effect.
    read_timeout = getattr(adapter, "timeout", (0, 0))[1]
    if not intents.still_claimed(intent.pk, worker, margin_seconds=read_timeout):
        logger.warning("intent %s: claim lost before the call; no request sent", intent.pk)
        return "claim_lost"
    try:
        result = adapter.create_ticket(request, intent.idempotency_key, intent.external_ref)
    except (TransientError, PermanentError, AmbiguousOutcome) as exc:
        return intents.record_failure(intent, exc, worker) or "claim_lost"
    pause_point("after_destination_success")
    # A claim that expired meanwhile was moved to `unknown`; the success we hold settles it.
    if intents.record_success(intent, result, f"worker:{worker}", (Intent.State.IN_FLIGHT, Intent.State.UNKNOWN)):
        return "created"
    logger.error("intent %s: success for ticket %s could not be recorded; reconciliation will look",
                 intent.pk, result.ticket_id)
    return "late_success"

"""Turning an inbox event into exactly one ticket, through a durable intent.

An `Intent` moves between states only by conditional UPDATEs (`WHERE state =
<expected>`): zero rows updated means someone else moved it, and we stop.
The ticket id, the mapping, the event's new state and the audit row are
stored in one transaction.
"""
import logging
import os
import socket
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from intake.keys import stable_key
from intake.mime import parse_message
from intake.models import InboxEvent
from intake.services import record_audit, transition_event

from .destinations import adapter_for
from .destinations.base import AmbiguousOutcome, PermanentError, TicketRequest, TicketResult, TransientError
from .models import Destination, Intent, TicketMapping

logger = logging.getLogger(__name__)

State = InboxEvent.State


def worker_identity() -> str:
    # Computed per call: a prefork child has its own pid.
    return f"{socket.gethostname()}:{os.getpid()}"


def intent_key(event: InboxEvent, action: str, action_version: int) -> str:
    return stable_key(event.tenant_id, event.mailbox_id, event.provider_message_id, action, action_version)


def ensure_intent(event: InboxEvent, action: str, destination: Destination, action_version: int = 1) -> Intent:
    """The intent for this event and action, created once whoever asks first."""
    key = intent_key(event, action, action_version)
    try:
        with transaction.atomic():
            return Intent.objects.create(
                idempotency_key=key,
                inbox_event=event,
                action=action,
                action_version=action_version,
                destination=destination,
                external_ref=f"mailroom-{key[:40]}",
                created_at=timezone.now(),
            )
    except IntegrityError:
        return Intent.objects.get(idempotency_key=key)


def claim_intent(intent_id: int, worker: str, from_states=(Intent.State.PENDING, Intent.State.RETRY_WAIT)) -> bool:
    now = timezone.now()
    claimed = Intent.objects.filter(pk=intent_id, state__in=list(from_states)).exclude(next_attempt_at__gt=now).update(
        state=Intent.State.IN_FLIGHT,
        claimed_by=worker,
        claimed_until=now + timedelta(seconds=settings.MAILROOM_CLAIM_SECONDS),
        attempts=F("attempts") + 1,
    )
    return bool(claimed)


def store_success(intent: Intent, result: TicketResult, worker: str, from_state=Intent.State.IN_FLIGHT) -> bool:
    """Record the ticket: intent, mapping, event state and audit in one transaction."""
    now = timezone.now()
    with transaction.atomic():
        moved = Intent.objects.filter(pk=intent.pk, state=from_state).update(
            state=Intent.State.SUCCEEDED, result_ref=result.ticket_id, completed_at=now,
            claimed_until=None, last_error_kind="", last_error="",
        )
        if not moved:
            return False
        TicketMapping.objects.create(
            inbox_event_id=intent.inbox_event_id, action=intent.action, destination_id=intent.destination_id,
            ticket_id=result.ticket_id, ticket_url=result.url, created_at=now,
        )
        InboxEvent.objects.filter(pk=intent.inbox_event_id).exclude(state=State.COMPLETED).update(
            state=State.COMPLETED, reason_code="", reason_detail="", updated_at=now
        )
        record_audit(intent.inbox_event_id, "ticket_created", actor=f"worker:{worker}", at=now, detail={
            "intent": intent.pk, "destination": intent.destination_id, "ticket_id": result.ticket_id,
            "attempt": intent.attempts + 1,
        })
    return True


def _ticket_request(event: InboxEvent, parsed) -> TicketRequest:
    return TicketRequest(
        subject=parsed.subject or "(no subject)",
        description=parsed.text,
        requester=parsed.sender,
    )


def default_destination(tenant_id: int) -> Destination | None:
    return Destination.objects.filter(tenant_id=tenant_id, is_default=True).first()


def _normalize(event: InboxEvent):
    """Parse what routing needs and mark the event `ready` (once)."""
    parsed = parse_message(bytes(event.raw or b""))
    if event.state == State.RECEIVED:
        InboxEvent.objects.filter(pk=event.pk, state=State.RECEIVED).update(
            state=State.READY,
            message_id_header=parsed.message_id[:998],
            sender=parsed.sender[:320],
            subject=parsed.subject[:998],
            updated_at=timezone.now(),
        )
        event.state = State.READY
    return parsed


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
    if event.mailbox.paused:
        return "paused"

    parsed = _normalize(event)

    cache = destinations if destinations is not None else {}
    if event.tenant_id not in cache:
        cache[event.tenant_id] = default_destination(event.tenant_id)
    destination = cache[event.tenant_id]
    if destination is None:
        transition_event(event.pk, InboxEvent.OPEN_STATES, State.AWAITING_REVIEW, actor=f"worker:{worker}",
                         kind="routed_to_review", reason_code="no_destination",
                         reason_detail="the tenant has no default destination and no rule matched")
        return "review"
    if destination.paused:
        return "paused"

    intent = ensure_intent(event, Intent.Action.CREATE_TICKET, destination)
    if intent.state == Intent.State.SUCCEEDED:
        return "done"
    return execute_intent(intent, _ticket_request(event, parsed), worker)


def execute_intent(intent: Intent, request: TicketRequest, worker: str) -> str:
    adapter = adapter_for(intent.destination)
    if adapter.transactional:
        # The built-in store: claim, create and record commit together or not at all.
        with transaction.atomic():
            if not claim_intent(intent.pk, worker):
                return "busy"
            result = adapter.create_ticket(request, intent.idempotency_key, intent.external_ref)
            store_success(intent, result, worker)
        return "created"

    if not claim_intent(intent.pk, worker):
        return "busy"
    InboxEvent.objects.filter(pk=intent.inbox_event_id, state__in=[State.RECEIVED, State.READY]).update(
        state=State.WRITE_PENDING, updated_at=timezone.now()
    )
    try:
        result = adapter.create_ticket(request, intent.idempotency_key, intent.external_ref)
    except TransientError as exc:
        return record_failure(intent, exc, worker)
    except PermanentError as exc:
        return record_failure(intent, exc, worker)
    except AmbiguousOutcome as exc:
        return record_failure(intent, exc, worker)
    store_success(intent, result, worker)
    return "created"


def record_failure(intent: Intent, exc, worker: str) -> str:
    """Map a failure kind to the intent's next state (DESIGN.md §5)."""
    now = timezone.now()
    if isinstance(exc, TransientError):
        delay = exc.retry_after if exc.retry_after is not None else 5
        to_state, event_state = Intent.State.RETRY_WAIT, None
        extra = {"next_attempt_at": now + timedelta(seconds=delay)}
    elif isinstance(exc, PermanentError):
        to_state, event_state, extra = Intent.State.FAILED, State.FAILED, {"completed_at": now}
    else:
        to_state, event_state, extra = Intent.State.UNKNOWN, State.UNKNOWN, {}
    with transaction.atomic():
        moved = Intent.objects.filter(pk=intent.pk, state=Intent.State.IN_FLIGHT, claimed_by=worker).update(
            state=to_state, last_error_kind=exc.kind, last_error=str(exc)[:2000], claimed_until=None, **extra
        )
        if moved and event_state:
            transition_event(intent.inbox_event_id, InboxEvent.OPEN_STATES, event_state, actor=f"worker:{worker}",
                             kind=f"intent_{to_state}", reason_code=exc.reason, reason_detail=exc.detail)
        elif moved:
            record_audit(intent.inbox_event_id, f"intent_{to_state}", actor=f"worker:{worker}",
                         detail={"reason": exc.reason}, at=now)
    return to_state

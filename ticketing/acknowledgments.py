"""Telling the requester we have their request: one email per ticket, only once the mapping exists.

The acknowledgment is its own `notify_requester` intent with its own key, so a
task run twice sends one email. It carries `Auto-Submitted: auto-replied` and
our loop header, so our own mail coming back is recognised and suppressed.
"""
import logging
from email.utils import make_msgid

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.db import transaction
from django.utils import timezone

from intake.failures import AmbiguousOutcome, TransientError
from intake.models import InboxEvent
from intake.services import enqueue_outbox, record_audit

from . import intents
from .models import Intent, TicketMapping

logger = logging.getLogger(__name__)



def ticket_token(mapping: TicketMapping) -> str:
    return f"MR-{mapping.pk}"


def wants_acknowledgment(event: InboxEvent) -> bool:
    return bool(event.sender) and bool((event.mailbox.settings or {}).get("acknowledge", True))


def plan(event: InboxEvent, destination) -> Intent | None:
    """Inside the transaction that stores the ticket mapping: the intent and its outbox row."""
    if not wants_acknowledgment(event):
        return None
    # Planned once: the mapping just inserted in this transaction is unique per event.
    intent = intents.create_intent(event, Intent.Action.NOTIFY_REQUESTER, destination)
    enqueue_outbox(intents.NOTIFY_TOPIC, {"intent_id": intent.pk})
    return intent


def _compose(event: InboxEvent, mapping: TicketMapping, intent: Intent) -> EmailMessage:
    token = ticket_token(mapping)
    subject = " ".join((event.subject or "your request").split())[:200]
    sla_hours = (mapping.destination.settings or {}).get("sla_hours")
    promise = f"We aim to answer within {int(sla_hours)} hours.\n\n" if sla_hours else ""
    body = (
        f"Hello,\n\nwe have received your request and opened ticket {token}.\n\n{promise}"
        f"Reply to this email to add to it; keep [#{token}] in the subject.\n\n-- \n{event.mailbox.address}\n"
    )
    headers = {
        "Auto-Submitted": "auto-replied",
        settings.MAILROOM_LOOP_HEADER: settings.MAILROOM_INSTANCE_ID,
        # The key makes our Message-ID stable across attempts.
        "Message-ID": make_msgid(idstring=intent.idempotency_key[:16], domain="mailroom.invalid"),
    }
    if event.message_id_header:
        headers["In-Reply-To"] = f"<{event.message_id_header}>"
        headers["References"] = f"<{event.message_id_header}>"
    return EmailMessage(subject=f"[#{token}] Re: {subject}", body=body, from_email=event.mailbox.address,
                        to=[event.sender], headers=headers)


def send(intent_id: int, worker: str) -> str:
    """One attempt at the acknowledgment of `intent_id`; safe to run twice."""
    intent = Intent.objects.select_related("destination", "inbox_event__mailbox").filter(
        pk=intent_id, action=Intent.Action.NOTIFY_REQUESTER).first()
    if intent is None:
        return "missing"
    event = intent.inbox_event
    mapping = TicketMapping.objects.select_related("destination").filter(
        inbox_event=event, action=Intent.Action.CREATE_TICKET).first()
    if mapping is None or event.state != InboxEvent.State.COMPLETED:
        return "no_ticket"  # never acknowledge what is not a ticket
    if not intents.claim(intent.pk, worker):
        return "busy"
    message = _compose(event, mapping, intent)
    try:
        with get_connection(timeout=settings.MAILROOM_SMTP_TIMEOUT) as connection:
            message.connection = connection
            message.send()
    except (ConnectionError, TimeoutError, OSError) as exc:
        # Refused or unreachable before anything was accepted: safe to try again.
        failure = TransientError("smtp_unavailable", type(exc).__name__)
        if not isinstance(exc, ConnectionRefusedError) and "timed out" in str(exc):
            failure = AmbiguousOutcome("smtp_timeout", type(exc).__name__)
        return intents.record_failure(intent, failure, worker) or "claim_lost"
    now = timezone.now()
    with transaction.atomic():
        if not Intent.objects.filter(pk=intent.pk, state=Intent.State.IN_FLIGHT).update(
                state=Intent.State.SUCCEEDED, result_ref=message.extra_headers["Message-ID"][:200],
                completed_at=now, claimed_until=None):
            return "claim_lost"
        record_audit(event.pk, "acknowledged", actor=f"worker:{worker}", at=now,
                     detail={"intent": intent.pk, "token": ticket_token(mapping)})
    logger.info("acknowledged event %s (ticket %s)", event.pk, ticket_token(mapping))
    return "sent"

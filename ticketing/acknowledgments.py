"""Telling the requester we have their request: one email per ticket, only once the mapping exists.

The acknowledgment is its own `notify_requester` intent with its own key, so a
task run twice sends one email. It carries `Auto-Submitted: auto-replied` and
our loop header, so our own mail coming back is recognised and suppressed.

No backscatter: the ticket is made for every accepted message, but it is only
acknowledged when a person is likely to be on the other end and the address
is likely to be theirs (`acknowledgment_skip_reason`). A skipped
acknowledgment is audited (`acknowledgment_skipped`, with the reason) in the
transaction that stores the mapping, so it is written exactly once.
"""
import logging
from email.utils import make_msgid

from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from intake.failures import AmbiguousOutcome, TransientError
from intake.mime.addresses import is_valid_address
from intake.models import InboxEvent
from intake.services import enqueue_outbox, record_audit
from intake.vocabulary import AuditKind, ReasonCode

from . import intents
from .models import Intent, TicketMapping

logger = logging.getLogger(__name__)



def ticket_token(mapping: TicketMapping) -> str:
    return f"MR-{mapping.pk}"


# Local parts that no person reads: automated senders and bounce addresses.
NOREPLY_LOCAL_PARTS = frozenset({
    "noreply", "no-reply", "no_reply", "donotreply", "do-not-reply", "do_not_reply",
    "mailer-daemon", "postmaster", "bounce", "bounces",
})
NOREPLY_PREFIXES = ("noreply", "no-reply")
SKIP_AUDIT_KIND = AuditKind.ACKNOWLEDGMENT_SKIPPED


def _is_noreply(address: str) -> bool:
    local = address.rpartition("@")[0].strip().strip('"').lower()
    base = local.split("+", 1)[0]  # bounces+1234=x@..., noreply+tag@...
    return local in NOREPLY_LOCAL_PARTS or base in NOREPLY_LOCAL_PARTS or local.startswith(NOREPLY_PREFIXES)


def acknowledgment_skip_reason(event: InboxEvent) -> str | None:
    """Why `event` must not be acknowledged, or None when it may be.

    Reads the event as normalization stored it: `sender`, `details["spam_flagged"]`
    (a trusted spam header said so) and `auth_results` (only our own MTA's
    Authentication-Results, see `intake.validation.authentication_results`).
    """
    if not (event.mailbox.settings or {}).get("acknowledge", True):
        return ReasonCode.ACK_DISABLED
    sender = (event.sender or "").strip()
    if not sender:
        return ReasonCode.NO_SENDER
    if (event.details or {}).get("spam_flagged") is True:
        return ReasonCode.SPAM_FLAGGED
    if _is_noreply(sender):
        return ReasonCode.NOREPLY_SENDER
    if (event.auth_results or {}).get("dmarc") == "fail":
        return ReasonCode.DMARC_FAIL
    if not is_valid_address(sender):
        return ReasonCode.INVALID_SENDER
    return None


def wants_acknowledgment(event: InboxEvent) -> bool:
    return acknowledgment_skip_reason(event) is None


def plan(event: InboxEvent, destination) -> Intent | None:
    """Inside the transaction that stores the ticket mapping: the intent and its outbox row,
    or the audit row saying why there is none."""
    # As stored: the caller's copy may predate normalization's sender, details and auth results.
    stored = InboxEvent.objects.select_related("mailbox").filter(pk=event.pk).first() or event
    reason = acknowledgment_skip_reason(stored)
    if reason is not None:
        # Planned once (the mapping just inserted is unique per event), so audited once.
        record_audit(event.pk, SKIP_AUDIT_KIND, actor="system:acknowledgments", detail={"reason": reason})
        logger.info("event %s: no acknowledgment (%s)", event.pk, reason)
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
        failure = TransientError(ReasonCode.SMTP_UNAVAILABLE, type(exc).__name__)
        if not isinstance(exc, ConnectionRefusedError) and "timed out" in str(exc):
            failure = AmbiguousOutcome(ReasonCode.SMTP_TIMEOUT, type(exc).__name__)
        return intents.record_failure(intent, failure, worker) or "claim_lost"
    if not intents.record_acknowledgment_sent(intent, message.extra_headers["Message-ID"], worker,
                                              detail={"token": ticket_token(mapping)}):
        return "claim_lost"
    logger.info("acknowledged event %s (ticket %s)", event.pk, ticket_token(mapping))
    return "sent"

"""What follows a ticket-making success, planned in the transaction that records it: the acknowledgment
(a `notify_requester` intent, or the audit row saying why there is none: ticketing.ack_policy) and, where
the desk takes files one call each after the write, the `attach_files` intent. Each with its outbox row.
"""

import logging

from intake.models import InboxEvent
from intake.services import (
    enqueue_outbox,
    record_audit,
)
from intake.vocabulary import ReasonCode, SystemActor

from .. import ack_policy
from ..destinations import adapter_for
from ..destinations.capabilities import FILES_AFTER_WRITE
from ..models import Destination, Intent
from .creation import ATTACH_TOPIC, NOTIFY_TOPIC, create_intent

logger = logging.getLogger(__name__)


def plan_acknowledgment(event: InboxEvent, destination: Destination) -> Intent | None:
    """Inside the transaction that stores the ticket mapping: the intent and its outbox row,
    or the audit row saying why there is none."""
    # As stored: the caller's copy may predate normalization's sender, details and auth results.
    stored = InboxEvent.objects.select_related("mailbox").defer("raw").filter(pk=event.pk).first() or event
    skipped = (
        {"reason": ReasonCode.DESK_ACKNOWLEDGES}
        if not ack_policy.mailroom_acknowledges(destination)
        else ack_policy.skip_audit_detail(stored, ack_policy.AcknowledgmentBudget())
    )
    if skipped is not None:
        # Planned once (the mapping just inserted is unique per event), so audited once.
        record_audit(event.pk, kind=ack_policy.SKIP_AUDIT_KIND, actor=SystemActor.ACKNOWLEDGMENTS, detail=skipped)
        logger.info("event %s: no acknowledgment (%s)", event.pk, skipped["reason"])
        return None
    # Planned once: the mapping just inserted in this transaction is unique per event.
    intent = create_intent(event, Intent.Action.NOTIFY_REQUESTER, destination)
    enqueue_outbox(NOTIFY_TOPIC, {"intent_id": intent.pk})
    return intent


def sends_files_after(destination: Destination) -> bool:
    """Does `destination` take files one call each after the write? (A REST destination says so in its
    settings: the adapter's capabilities, not its class's.)"""
    try:
        return adapter_for(destination).capabilities.files == FILES_AFTER_WRITE
    except LookupError:
        return False


def plan_file_delivery(event: InboxEvent, destination: Destination) -> Intent | None:
    """Inside the transaction that records a ticket-making action's success: the `attach_files` intent and
    its outbox row when the desk takes files after the write and the message has any."""
    details = InboxEvent.objects.filter(pk=event.pk).values_list("details", flat=True).first() or {}
    if not details.get("attachment_count") or not sends_files_after(destination):
        return None
    if Intent.objects.filter(inbox_event_id=event.pk, action=Intent.Action.ATTACH_FILES).exists():
        return None  # a follow-up ticket after a refused comment: the first plan stands
    intent = create_intent(event, Intent.Action.ATTACH_FILES, destination)
    # Due now, so the due-intent sweep hands it over again if its published task is ever lost.
    Intent.objects.filter(pk=intent.pk, state=Intent.State.PENDING).update(next_attempt_at=intent.created_at)
    enqueue_outbox(ATTACH_TOPIC, {"intent_id": intent.pk})
    return intent

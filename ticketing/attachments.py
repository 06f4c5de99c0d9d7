"""Files a desk takes only on an existing record (`Capabilities.files == "after_write"`): one
`attach_files` intent per ticket-making action, planned in the transaction that records its success
(`intents.record_success`, whichever way the ticket was found: the create's answer, a lookup, the
reconciler, an operator's confirmation), carried out by `deliver`.

Each file has its own key (`OutgoingFile.key`) and its own step in the intent's journal: marked sent
before its call, done after; a file marked sent is looked up on the record before it is sent again
(`ticketing.destinations.files.attach_each`). So a lost answer, a killed worker or a retry never
doubles a file, and what is done stays done across attempts.

Which files: `ticketing.ticket_files.select_files`. A file listed inside another (`Attachment.nested`: the
files of an attached message, of an archive, of an Outlook .msg) is never sent on its own: the holder goes
whole, and its files were judged and scanned as part of it. `attachment_count` counts them all, so a
message whose only file is an archive still plans the intent for that archive.
"""
import logging

from intake.mime import parse_message
from intake.models import InboxEvent
from intake.rawload import load_raw, with_small_raw
from intake.services import enqueue_outbox

from . import intents, people
from .destinations import adapter_for
from .destinations.base import AmbiguousOutcome, PermanentError, TransientError
from .destinations.capabilities import FILES_AFTER_WRITE
from .destinations.files import attach_each
from .intents.progress import ClaimLost, IntentJournal
from .models import Intent, TicketMapping
from .ticket_files import effective_capabilities, select_files

logger = logging.getLogger(__name__)

TICKET_MAKING = (Intent.Action.CREATE_TICKET, Intent.Action.ADD_COMMENT)


def sends_files_after(destination) -> bool:
    """Does `destination` take files one call each after the write? (A REST destination says so in its
    settings: the adapter's capabilities, not its class's.)"""
    try:
        return adapter_for(destination).capabilities.files == FILES_AFTER_WRITE
    except LookupError:
        return False


def plan(event: InboxEvent, destination) -> Intent | None:
    """Inside the transaction that records a ticket-making action's success: the `attach_files` intent and
    its outbox row when the desk takes files after the write and the message has any."""
    details = InboxEvent.objects.filter(pk=event.pk).values_list("details", flat=True).first() or {}
    if not details.get("attachment_count") or not sends_files_after(destination):
        return None
    if Intent.objects.filter(inbox_event_id=event.pk, action=Intent.Action.ATTACH_FILES).exists():
        return None  # a follow-up ticket after a refused comment: the first plan stands
    intent = intents.create_intent(event, Intent.Action.ATTACH_FILES, destination)
    # Due now, so the due-intent sweep hands it over again if its published task is ever lost.
    Intent.objects.filter(pk=intent.pk, state=Intent.State.PENDING).update(next_attempt_at=intent.created_at)
    enqueue_outbox(intents.ATTACH_TOPIC, {"intent_id": intent.pk})
    return intent


def deliver(intent_id: int, worker: str) -> str:
    """One attempt at an `attach_files` intent; safe to run twice, concurrently."""
    intent = Intent.objects.select_related("destination").filter(
        pk=intent_id, action=Intent.Action.ATTACH_FILES).first()
    if intent is None:
        return "missing"
    mapping = TicketMapping.objects.filter(inbox_event_id=intent.inbox_event_id, action__in=TICKET_MAKING) \
        .order_by("-pk").first()
    if mapping is None:
        return "no_ticket"
    if not intents.claim(intent.pk, worker):
        return "busy"
    event = with_small_raw(InboxEvent.objects.select_related("mailbox", "tenant")).get(pk=intent.inbox_event_id)
    adapter = adapter_for(intent.destination)
    adapter.journal = IntentJournal(intent, worker)
    load_raw(event)  # a large message a MiB at a time: one copy of it (intake.rawload)
    parsed = parse_message(event.raw or b"")
    files, held = select_files(event, parsed, effective_capabilities(adapter))
    public = True
    if mapping.action == Intent.Action.ADD_COMMENT:
        public, _ = people.comment_kind(event, parsed)
    try:
        result = attach_each(adapter, mapping.ticket_id, files, intent.idempotency_key, public=public)
    except (TransientError, PermanentError, AmbiguousOutcome) as exc:
        return intents.record_failure(intent, exc, worker) or "claim_lost"
    except ClaimLost:
        return "claim_lost"
    detail = {"attached": len(result["done"]), "refused": result["refused"][:20], "held": len(held),
              "ticket_id": mapping.ticket_id}
    if not intents.record_files_attached(intent, worker, detail):
        return "claim_lost"
    logger.info("event %s: %d files attached to ticket %s (%d refused, %d held)", event.pk, len(result["done"]),
                mapping.ticket_id, len(result["refused"]), len(held))
    return "attached"

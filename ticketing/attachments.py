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

from . import intents, people
from .destinations import adapter_for
from .destinations.base import AmbiguousOutcome, PermanentError, TransientError
from .destinations.files import attach_each
from .intents.progress import ClaimLost, IntentJournal
from .models import Intent, TicketMapping
from .outcomes import Outcome
from .ticket_files import effective_capabilities, select_files

logger = logging.getLogger(__name__)

TICKET_MAKING = (Intent.Action.CREATE_TICKET, Intent.Action.ADD_COMMENT)


def deliver(intent_id: int, worker: str) -> str:
    """One attempt at an `attach_files` intent; safe to run twice, concurrently."""
    intent = (
        Intent.objects.select_related("destination").filter(pk=intent_id, action=Intent.Action.ATTACH_FILES).first()
    )
    if intent is None:
        return Outcome.MISSING
    mapping = (
        TicketMapping.objects.filter(inbox_event_id=intent.inbox_event_id, action__in=TICKET_MAKING)
        .order_by("-pk")
        .first()
    )
    if mapping is None:
        return Outcome.NO_TICKET
    if not intents.claim(intent.pk, worker=worker):
        return Outcome.BUSY
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
        return intents.record_failure(intent, exc=exc, worker=worker) or Outcome.CLAIM_LOST
    except ClaimLost:
        return Outcome.CLAIM_LOST
    detail = {
        "attached": len(result["done"]),
        "refused": result["refused"][:20],
        "held": len(held),
        "ticket_id": mapping.ticket_id,
    }
    if not intents.record_files_attached(intent, worker, detail):
        return Outcome.CLAIM_LOST
    logger.info(
        "event %s: %d files attached to ticket %s (%d refused, %d held)",
        event.pk,
        len(result["done"]),
        mapping.ticket_id,
        len(result["refused"]),
        len(held),
    )
    return Outcome.ATTACHED

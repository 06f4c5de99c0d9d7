"""One attempt at a destination: what to send (`Work`), the claim, the call and its recorded outcome
(`execute_intent`), and the call a pool thread makes for an intent handed over to it (`call`).

Apart from ticketing.services (which decides what an event needs and creates the intent) and from
ticketing.bulkhead (the per-destination cap and the hand-over), so that each imports this one way.
"""

import email.utils
import logging
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, cast

from django.conf import settings
from django.db import transaction

from intake.mime.htmlsource import html_source
from intake.mime.message import ParsedMessage
from intake.models import InboxEvent
from intake.normalize import normalize
from intake.selectors import global_pause_on, tenant_pause_on
from intake.services import PROCESS_TOPIC, enqueue_outbox, transition_event, wait_event
from intake.testhooks import pause_point

from . import breaker, bulkhead, classification, intents, people, rich_body, threads, ticket_files
from .destinations import adapter_for
from .destinations.base import (
    AmbiguousOutcome,
    CommentRequest,
    DestinationAdapter,
    HeldFile,
    OutgoingFile,
    PermanentError,
    TicketClosed,
    TicketRequest,
    TicketResult,
    TransientError,
)
from .destinations.capabilities import FILES_WITH_WRITE, FOLLOW_UP
from .intents.progress import ClaimLost, IntentJournal
from .models import Destination, Intent, TicketMapping
from .outcomes import Outcome

if TYPE_CHECKING:
    from .leases import Lease

logger = logging.getLogger(__name__)

State = InboxEvent.State
REUSED_MESSAGE_ID = "message_id_reused"  # the flag (and tag) of a message whose Message-ID another one had


def written_at(event: InboxEvent, parsed: ParsedMessage) -> datetime:
    """When a message was written: its Date header (with a zone), never later than when it was stored, else
    when it was stored. Read from the stored message only, so every attempt sends the same time."""
    try:
        dated = email.utils.parsedate_to_datetime(parsed.date or "")
    except (TypeError, ValueError, IndexError):
        dated = None
    if dated is None or dated.tzinfo is None:
        return event.received_at
    return min(dated, event.received_at)


class Work:
    """One attempt's payload: what to send for the intent's action."""

    def __init__(
        self,
        event: InboxEvent,
        action: str,
        parsed: ParsedMessage,
        target: TicketMapping | None = None,
        flags: Iterable[str] = (),
        follow_up_of: str = "",
    ) -> None:
        # A create_ticket takes its fields from `event.route` (stored by classification) and the
        # operator's `event.route_override`, which wins (`classification.ticket_fields`).
        self.event, self.action, self.parsed, self.target, self.flags = event, action, parsed, target, list(flags)
        self.follow_up_of = follow_up_of

    def perform(self, adapter: DestinationAdapter, intent: Intent) -> TicketResult:
        # Built only from the stored message, so every attempt sends the same body
        # (a destination that keeps our key rejects the same key with another body).
        if self.action == Intent.Action.ADD_COMMENT:
            target = cast(TicketMapping, self.target)  # an add_comment's Work is always given its ticket's mapping
            adapter.add_comment(
                target.ticket_id, self.comment_request(adapter), intent.idempotency_key, intent.external_ref
            )
            return TicketResult(ticket_id=target.ticket_id, url=target.ticket_url)
        return adapter.create_ticket(self.ticket_request(adapter), intent.idempotency_key, intent.external_ref)

    def _rich(
        self, adapter: DestinationAdapter
    ) -> tuple[str, tuple[OutgoingFile, ...], tuple[tuple[OutgoingFile, ...], tuple[HeldFile, ...], str]]:
        """(sanitized HTML or "", the files sent with the write, the list the text ends with) for this desk."""
        capabilities = ticket_files.effective_capabilities(adapter)
        html = rich_body.sanitized_html(html_source(self.parsed)) if capabilities.html else ""
        files, held = ticket_files.select_files(self.event, self.parsed, capabilities, html=html)
        listing = ticket_files.file_list(self.event, files, held)
        with_write = files if capabilities.files == FILES_WITH_WRITE else ()
        return html, with_write, (files, held, listing)

    def ticket_request(self, adapter: DestinationAdapter) -> TicketRequest:
        """The new ticket's fields; the set-based path (`ticketing.batch`) builds its rows from this too."""
        parsed = self.parsed
        chosen = classification.ticket_fields(
            getattr(self.event, "route", None), getattr(self.event, "route_override", None)
        )
        tags = ("mailroom",) + tuple(f"mailroom-{flag.replace('_', '-')}" for flag in self.flags)
        if chosen["sensitive"]:
            tags += (classification.NEEDS_APPROVAL,)
        tags += tuple(t for t in chosen["tags"] if t not in tags)  # filter rules' tags (tag, mark_spam)
        person = people.requester(self.event, parsed)
        cc = people.copied(self.event, parsed, person.email)
        html, files, (_, held, listing) = self._rich(adapter)
        if cc and not adapter.capabilities.cc_field:
            listing += "\n\nCopied: " + ", ".join(cc)
        if person.forwarded_by:
            listing += f"\n\nForwarded by {person.forwarded_by} (an agent); the requester is the original sender."
        return TicketRequest(
            subject=parsed.subject or "(no subject)",
            description=self._fit(adapter, parsed.text, reserve=len(listing)) + listing,
            requester=person.email,
            tags=tags,
            queue=chosen["queue"],
            priority=chosen["priority"],
            request_type=chosen["request_type"],
            assignee=chosen["assignee"],
            requester_name=person.name,
            cc=cc,
            html=html,
            files=files,
            held_files=held,
            follow_up_of=self.follow_up_of,
            status="closed" if self.event.history else "",
            created_at=written_at(self.event, parsed) if self.event.history else None,
        )

    def comment_request(self, adapter: DestinationAdapter) -> CommentRequest:
        """What a reply adds: the new text, written as the customer (public) or, from one of the tenant's
        agents, as an internal note (unless the destination's `agent_notes` setting is false)."""
        parsed = self.parsed
        public, from_agent = people.comment_kind(self.event, parsed)
        if from_agent and (getattr(adapter.destination, "settings", None) or {}).get("agent_notes") is False:
            public = True
        html, files, (_, held, listing) = self._rich(adapter)
        text = self.comment_text()
        return CommentRequest(
            body=self._fit(adapter, text, reserve=len(listing)) + listing,
            author_email=parsed.sender,
            author_name=parsed.sender_name,
            public=public,
            from_agent=from_agent,
            html=html if html else "",
            files=files,
            held_files=held,
            cc=people.copied(self.event, parsed, parsed.sender),
        )

    def comment_text(self) -> str:
        """What a reply adds to its ticket: the new text only, as normalization stored it.

        Events normalized before `reply_text` was stored get it computed now.
        """
        from intake.replytext import reply_text

        details = self.event.details or {}
        if "reply_text" not in details and self.event.pk:
            # Normalization writes details with an UPDATE; the copy in hand may predate it.
            details = InboxEvent.objects.filter(pk=self.event.pk).values_list("details", flat=True).first() or {}
        stored = details.get("reply_text")
        return stored if isinstance(stored, str) else reply_text(self.parsed)

    def truncation_notice(self, limit: int) -> str:
        """Says where the whole message is. No timestamps: every attempt must send the same body."""
        url = f"{settings.MAILROOM_PUBLIC_URL.rstrip('/')}/admin/intake/inboxevent/{self.event.pk}/change/"
        return (
            f"\n\n[Mailroom: this message was shortened to fit the {limit:,}-character limit of this help desk."
            f" The full original is Mailroom inbox event {self.event.pk}: {url} ]"
        )

    def _fit(self, adapter: DestinationAdapter, text: str, reserve: int = 0) -> str:
        """`text` cut at a paragraph boundary, with the notice, when the destination takes less (`reserve`:
        characters kept free for what follows it, the list of files)."""
        from intake.mime.texttrim import trim_text

        limit = getattr(adapter, "max_description_chars", None)
        if not limit or len(text) + reserve <= limit:
            return text
        trimmed, _ = trim_text(text, max(limit - reserve, limit // 2), self.truncation_notice(limit))
        return trimmed


def attempt_in_transaction(
    adapter: DestinationAdapter, intent: Intent, work: Work, worker: str, lease: "Lease | None" = None
) -> str:
    """Claim, write and record inside the caller's transaction (a transactional adapter: the built-in store)."""
    if not intents.claim(intent.pk, worker=worker, lease=lease):
        return Outcome.BUSY
    try:
        result = work.perform(adapter, intent)
    except TicketClosed as exc:  # a solved built-in ticket under the `review` policy
        return _ticket_closed(intent, work, worker, adapter, exc)
    intents.record_success(intent, result=result, actor=f"worker:{worker}", event=work.event)
    return Outcome.CREATED


def execute_intent(
    intent: Intent, work: Work, worker: str, adapter: DestinationAdapter | None = None, lease: "Lease | None" = None
) -> str:
    """One attempt: claim (checking the thread lease in the same transaction), call, record."""
    adapter = adapter or adapter_for(intent.destination)
    if adapter.transactional:
        with transaction.atomic():
            return attempt_in_transaction(adapter, intent, work, worker, lease)

    claimed = bulkhead.claim(intent, worker, lease)  # intents.claim, under the destination's concurrency cap
    if claimed != Outcome.CLAIMED:
        return claimed  # BUSY, or OVER_CAP: nothing was written, the caller tries again shortly
    # A plain step of the happy path: not audited (the attempt's outcome is).
    transition_event(
        intent.inbox_event_id, [State.RECEIVED, State.READY], State.WRITE_PENDING, actor=f"worker:{worker}", kind=None
    )
    pause_point("before_destination_call")
    # The claim must still be ours, with room for a whole request, right before the side effect.
    read_timeout = getattr(adapter, "timeout", (0, 0))[1]
    if not intents.still_claimed(intent.pk, worker, margin_seconds=read_timeout):
        logger.warning("intent %s: claim lost before the call; no request sent", intent.pk)
        return Outcome.CLAIM_LOST
    adapter.journal = IntentJournal(intent, worker)
    try:
        result = work.perform(adapter, intent)
    except ClaimLost:
        logger.warning("intent %s: claim lost between two steps; the next attempt goes on", intent.pk)
        return Outcome.CLAIM_LOST
    except TicketClosed as exc:
        return _ticket_closed(intent, work, worker, adapter, exc)
    except (TransientError, PermanentError, AmbiguousOutcome) as exc:
        # The breaker counts it there.
        return intents.record_failure(intent, exc=exc, worker=worker) or Outcome.CLAIM_LOST
    breaker.record_success(intent.destination)
    pause_point("after_destination_success")
    # A claim that expired meanwhile was moved to `unknown`; the success we hold settles it.
    if intents.record_success(
        intent,
        result=result,
        actor=f"worker:{worker}",
        from_states=(Intent.State.IN_FLIGHT, Intent.State.UNKNOWN),
        event=work.event,
    ):
        return Outcome.CREATED
    logger.error(
        "intent %s: success for ticket %s could not be recorded; reconciliation will look", intent.pk, result.ticket_id
    )
    return Outcome.LATE_SUCCESS


def closed_policy(destination: Destination, adapter: DestinationAdapter) -> str:
    """What a reply to a closed ticket of `destination` becomes: its `closed_policy` setting when the desk can
    carry it out, else the kind's default (`Capabilities.default_closed_policy`)."""
    chosen = (destination.settings or {}).get("closed_policy")
    capabilities = adapter.capabilities
    if chosen in capabilities.closed_policies or chosen == "review":
        return cast(str, chosen)  # a policy's name: one the desk carries out, or "review" (never None)
    return capabilities.default_closed_policy


def _ticket_closed(intent: Intent, work: Work, worker: str, adapter: DestinationAdapter, exc: TicketClosed) -> str:
    """The desk refused the write because the ticket is closed: a follow-up ticket, or review (a failure with
    reason ticket_closed, shown in the recovery queue). `reopen` is the adapter's own (it reopens and writes)."""
    breaker.record_success(intent.destination)  # the desk answered: it is up
    if work.action == Intent.Action.ADD_COMMENT and closed_policy(intent.destination, adapter) == FOLLOW_UP:
        return (
            intents.follow_up_instead(
                intent,
                worker=worker,
                closed_ticket_id=cast(TicketMapping, work.target).ticket_id,  # an add_comment's Work has its mapping
            )
            or Outcome.CLAIM_LOST
        )
    return intents.record_failure(intent, exc=exc, worker=worker) or Outcome.CLAIM_LOST


def call(intent_id: int, worker: str) -> str:
    """The call task's body: rebuild the request from the stored event and make one attempt.

    Returns a short word (as `services.process_inbox_event` does); Outcome.OVER_CAP asks the task to come back.
    """
    intent = Intent.objects.select_related("destination", "inbox_event__mailbox").filter(pk=intent_id).first()
    if intent is None:
        return Outcome.MISSING
    if intent.state not in (Intent.State.PENDING, Intent.State.RETRY_WAIT):
        return Outcome.DONE if intent.state == Intent.State.SUCCEEDED else Outcome.BUSY
    event = intent.inbox_event
    if event.state not in (InboxEvent.State.READY, InboxEvent.State.WRITE_PENDING):
        return Outcome.DONE if event.state not in InboxEvent.OPEN_STATES else Outcome.NOT_READY
    # Pauses are checked again here: one may have been switched on since the hand-over.
    if event.mailbox.paused or intent.destination.paused or global_pause_on() or tenant_pause_on(event.tenant_id):
        wait_event(event.pk, settings.MAILROOM_PAUSE_RECHECK_SECONDS)
        return Outcome.PAUSED
    # Past `received`: re-parsed, not re-judged, and always with a message (an empty one if unparseable).
    parsed = cast(ParsedMessage, normalize(event, actor=f"worker:{worker}").parsed)
    if intent.action != Intent.Action.CREATE_TICKET or threads.is_thread_work(parsed):
        # Never handed over (it needs the thread lease); back to the per-event path, to be safe.
        enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": event.pk})
        return Outcome.HANDED_BACK
    flags = [REUSED_MESSAGE_ID] if event.message_id_reused else []  # as process_inbox_event builds it
    work = Work(event, intent.action, parsed, flags=flags)
    return execute_intent(intent, work, worker)

"""Turning an inbox event into exactly one ticket (or one comment), through a durable intent.

process_inbox_event: normalize and validate (intake) -> thread (comment on the
thread's ticket, under the thread's lease) or classify (`ticketing.classification`,
once, stored in `InboxEvent.route`) and route -> one attempt of the intent. The
state machine itself lives in `ticketing.intents`.
"""
import email.utils
import logging
import os
import socket

from django.conf import settings
from django.db import transaction

from intake.logging import mask_address
from intake.mime.htmlsource import html_source
from intake.models import AuditEvent, InboxEvent
from intake.normalize import normalize
from intake.rawload import with_small_raw
from intake.selectors import global_pause_on, tenant_pause_on
from intake.services import record_audit, record_progress, record_taken, transition_event, wait_event
from intake.testhooks import pause_point
from intake.vocabulary import AuditKind, ReasonCode

from . import (
    bounces,
    breaker,
    classification,
    copies,
    intents,
    leases,
    people,
    rich_body,
    selectors,
    threads,
    ticket_files,
)
from .classification.rules import record_hits
from .destinations import adapter_for
from .destinations.base import (
    AmbiguousOutcome,
    CommentRequest,
    PermanentError,
    TicketClosed,
    TicketRequest,
    TicketResult,
    TransientError,
)
from .destinations.capabilities import FILES_WITH_WRITE, FOLLOW_UP
from .intents.progress import ClaimLost, IntentJournal
from .models import Destination, Intent, TicketMapping

logger = logging.getLogger(__name__)

State = InboxEvent.State
THREAD_RETRY_SECONDS = 2
REUSED_MESSAGE_ID = "message_id_reused"
ARCHIVED_FLAG = "archived"   # the ticket's tag `mailroom-archived`


def worker_identity() -> str:
    # Computed per call: a prefork child has its own pid.
    return f"{socket.gethostname()}:{os.getpid()}"


def route(event: InboxEvent, cache: dict) -> Destination | None:
    """An operator's corrected route wins, then the matching rule's destination (`event.route`), otherwise
    the tenant's default (cached per task group)."""
    if (event.route_override or {}).get("destination_id"):
        return selectors.override_destination(event)
    rule_destination = (event.route or {}).get("destination_id")
    if rule_destination:
        destination = selectors.tenant_destination(event.tenant_id, rule_destination)
        if destination is not None:
            return destination
    key = ("default_destination", event.tenant_id)
    if key not in cache:
        cache[key] = selectors.default_destination(event.tenant_id)
    return cache[key]


def _wait(event: InboxEvent, seconds: float, outcome: str) -> str:
    wait_event(event.pk, seconds)
    return outcome


def written_at(event: InboxEvent, parsed):
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

    def __init__(self, event: InboxEvent, action: str, parsed, target: TicketMapping | None = None, flags=(),
                 follow_up_of: str = ""):
        # A create_ticket takes its fields from `event.route` (stored by classification) and the
        # operator's `event.route_override`, which wins (`classification.ticket_fields`).
        self.event, self.action, self.parsed, self.target, self.flags = event, action, parsed, target, list(flags)
        self.follow_up_of = follow_up_of

    def perform(self, adapter, intent: Intent) -> TicketResult:
        # Built only from the stored message, so every attempt sends the same body
        # (a destination that keeps our key rejects the same key with another body).
        if self.action == Intent.Action.ADD_COMMENT:
            adapter.add_comment(self.target.ticket_id, self.comment_request(adapter), intent.idempotency_key,
                                intent.external_ref)
            return TicketResult(ticket_id=self.target.ticket_id, url=self.target.ticket_url)
        return adapter.create_ticket(self.ticket_request(adapter), intent.idempotency_key, intent.external_ref)

    def _rich(self, adapter) -> tuple[str, tuple, tuple]:
        """(sanitized HTML or "", the files sent with the write, the list the text ends with) for this desk."""
        capabilities = ticket_files.effective_capabilities(adapter)
        html = rich_body.sanitized_html(html_source(self.parsed)) if capabilities.html else ""
        files, held = ticket_files.select_files(self.event, self.parsed, capabilities, html=html)
        listing = ticket_files.file_list(self.event, files, held)
        with_write = files if capabilities.files == FILES_WITH_WRITE else ()
        return html, with_write, (files, held, listing)

    def ticket_request(self, adapter) -> TicketRequest:
        """The new ticket's fields; the set-based path (`ticketing.batch`) builds its rows from this too."""
        parsed = self.parsed
        chosen = classification.ticket_fields(getattr(self.event, "route", None),
                                              getattr(self.event, "route_override", None))
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
        return TicketRequest(subject=parsed.subject or "(no subject)",
                             description=self._fit(adapter, parsed.text, reserve=len(listing)) + listing,
                             requester=person.email, tags=tags,
                             queue=chosen["queue"], priority=chosen["priority"],
                             request_type=chosen["request_type"], assignee=chosen["assignee"],
                             requester_name=person.name, cc=cc, html=html, files=files, held_files=held,
                             follow_up_of=self.follow_up_of, status="closed" if self.event.history else "",
                             created_at=written_at(self.event, parsed) if self.event.history else None)

    def comment_request(self, adapter) -> CommentRequest:
        """What a reply adds: the new text, written as the customer (public) or, from one of the tenant's
        agents, as an internal note (unless the destination's `agent_notes` setting is false)."""
        parsed = self.parsed
        public, from_agent = people.comment_kind(self.event, parsed)
        if from_agent and (getattr(adapter.destination, "settings", None) or {}).get("agent_notes") is False:
            public = True
        html, files, (_, held, listing) = self._rich(adapter)
        text = self.comment_text()
        return CommentRequest(body=self._fit(adapter, text, reserve=len(listing)) + listing,
                              author_email=parsed.sender, author_name=parsed.sender_name, public=public,
                              from_agent=from_agent, html=html if html else "", files=files, held_files=held,
                              cc=people.copied(self.event, parsed, parsed.sender))

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
        return (f"\n\n[Mailroom: this message was shortened to fit the {limit:,}-character limit of this help desk."
                f" The full original is Mailroom inbox event {self.event.pk}: {url} ]")

    def _fit(self, adapter, text: str, reserve: int = 0) -> str:
        """`text` cut at a paragraph boundary, with the notice, when the destination takes less (`reserve`:
        characters kept free for what follows it, the list of files)."""
        from intake.mime.texttrim import trim_text

        limit = getattr(adapter, "max_description_chars", None)
        if not limit or len(text) + reserve <= limit:
            return text
        trimmed, _ = trim_text(text, max(limit - reserve, limit // 2), self.truncation_notice(limit))
        return trimmed


# The group cache's set of events whose take (intake.services.record_taken) this task already counted.
TAKEN = "taken"


def process_inbox_event(event_id: int, worker: str | None = None, group_cache: dict | None = None) -> str:
    """Carry one event as far as it can go now. Safe to run any number of times, concurrently.

    Returns a short word saying what happened, for logs and tests.
    """
    worker = worker or worker_identity()
    # The message comes with the row unless it is large; normalize reads a large one a MiB at a time.
    event = with_small_raw(InboxEvent.objects.select_related("mailbox", "tenant").filter(pk=event_id)).first()
    if event is None:
        return "missing"
    if event.state not in InboxEvent.OPEN_STATES:
        return "done"
    cache = group_cache if group_cache is not None else {}
    if event_id not in cache.get(TAKEN, ()):  # before any work: a take that kills this worker still counts
        record_taken([event_id])
    if "global_pause" not in cache:  # read once per task group
        cache["global_pause"] = global_pause_on()
    if event.mailbox.paused or cache["global_pause"] or tenant_pause_on(event.tenant_id, cache):
        return _wait(event, settings.MAILROOM_PAUSE_RECHECK_SECONDS, "paused")

    outcome = normalize(event, actor=f"worker:{worker}")
    if outcome.state != State.READY:
        bounces.tie(event=event, state=outcome.state, reason_code=outcome.reason_code)  # our own bounced mail
        return outcome.state  # waiting (scanner), or suppressed / awaiting_review / quarantined
    parsed = outcome.parsed
    if followed := copies.follow_primary(event, worker, cache):  # another mailbox's copy makes the ticket
        return followed

    # A ticket made from a message that reused another's Message-ID says so, for the agent.
    ticket_flags = [REUSED_MESSAGE_ID] if event.message_id_reused else []
    if event.history:  # an archive import's history: a closed ticket of its own (intake.archive), tagged so
        ticket_flags.append(ARCHIVED_FLAG)
    follow_up = selectors.follow_up_intent(event.pk)
    if follow_up is not None:  # a reply its desk refused because the ticket is closed: a follow-up ticket
        work = Work(event, Intent.Action.CREATE_TICKET, parsed, flags=ticket_flags,
                    follow_up_of=str(follow_up.progress.get("follow_up_of", "")))
        return _act(event, follow_up.destination, work, worker)
    _note_forward(event, parsed, worker)
    if event.history or not threads.is_thread_work(parsed):  # history never reopens a thread's ticket
        destination = _classify_and_route(event, parsed, worker, cache)
        if isinstance(destination, str):
            return destination
        return _act(event, destination, Work(event, Intent.Action.CREATE_TICKET, parsed, flags=ticket_flags), worker)

    lease = leases.acquire(event.mailbox_id, event.thread_key, worker, settings.MAILROOM_THREAD_LEASE_SECONDS)
    if lease is None:
        return _wait(event, THREAD_RETRY_SECONDS, "thread_busy")
    try:
        pause_point("thread_analysis")
        plan = threads.plan(event, parsed)
        if plan.wait_for_earlier:
            return _wait(event, THREAD_RETRY_SECONDS, "waiting_for_thread")
        if plan.flags:
            _flag(event, plan.flags, worker)
        if plan.target is not None:
            work = Work(event, Intent.Action.ADD_COMMENT, parsed, target=plan.target)
            return _act(event, plan.target.destination, work, worker, lease)
        destination = _classify_and_route(event, parsed, worker, cache)
        if isinstance(destination, str):
            return destination
        work = Work(event, Intent.Action.CREATE_TICKET, parsed, flags=[*ticket_flags, *plan.flags])
        return _act(event, destination, work, worker, lease)
    finally:
        leases.release(lease)


def _classify_and_route(event: InboxEvent, parsed, worker: str, cache: dict) -> Destination | str:
    """The destination of a new ticket, or the outcome word when the event went to review.

    Classifies once: a stored `event.route` is reused, so every attempt (and a replay) sends the same
    fields. A low-confidence AI proposal sends the event to review once; an operator sending it on
    (with or without a corrected route) settles that.
    """
    actor = f"worker:{worker}"
    if not event.route:
        _store_route(event, classification.classify(event, parsed), actor)
    if event.route.get("action") == classification.SUPPRESS and not _rule_suppression_settled(event):
        suppressed = event.route.get("suppressed") or {}
        transition_event(event.pk, InboxEvent.OPEN_STATES, State.SUPPRESSED, actor=actor,
                         kind=AuditKind.SUPPRESSED, reason_code=ReasonCode.RULE_SUPPRESSED,
                         reason_detail=classification.suppression_text(event.route),
                         detail={"rule": suppressed.get("rule"), "rule_name": suppressed.get("name", ""),
                                 "suppress_reason": suppressed.get("reason", "")})
        return State.SUPPRESSED
    if event.route.get("review_reason") == classification.LOW_CONFIDENCE and not _low_confidence_settled(event):
        transition_event(event.pk, InboxEvent.OPEN_STATES, State.AWAITING_REVIEW, actor=actor,
                         kind=AuditKind.AWAITING_REVIEW, reason_code=ReasonCode.LOW_CONFIDENCE,
                         reason_detail="the AI's proposal for the route was below the policy's minimum confidence")
        return "review"
    destination = route(event, cache)
    if destination is None:
        transition_event(event.pk, InboxEvent.OPEN_STATES, State.AWAITING_REVIEW, actor=actor,
                         kind=AuditKind.AWAITING_REVIEW, reason_code=ReasonCode.NO_DESTINATION,
                         reason_detail="the tenant has no default destination and no rule matched")
        return "review"
    return destination


def _store_route(event: InboxEvent, chosen: classification.Route, actor: str) -> None:
    """The route on the event (a plain UPDATE, not a state change), its audit row and the rules' hits,
    together; a worker that classified the same event first keeps its route."""
    data = chosen.as_json()
    with transaction.atomic():
        stored = InboxEvent.objects.filter(pk=event.pk, route={}).update(route=data)
        if stored:
            record_hits(chosen.rules)
            record_audit(event.pk, AuditKind.CLASSIFIED, actor=actor, detail=classified_detail(data))
    if not stored:
        data = InboxEvent.objects.filter(pk=event.pk).values_list("route", flat=True).first() or data
    event.route = data


def classified_detail(route_json: dict) -> dict:
    """The `classified` audit row's detail: the route without the AI's rationale (the console shows that)."""
    return {**route_json, "ai": {k: v for k, v in route_json["ai"].items() if k != "rationale"}}


def _rule_suppression_settled(event: InboxEvent) -> bool:
    """A rule suppressed this event before: only an operator's replay brings it back here, and that wins."""
    return AuditEvent.objects.filter(inbox_event_id=event.pk, kind=AuditKind.SUPPRESSED,
                                     detail__reason=ReasonCode.RULE_SUPPRESSED).exists()


def _low_confidence_settled(event: InboxEvent) -> bool:
    if event.route_override:
        return True
    return AuditEvent.objects.filter(inbox_event_id=event.pk, kind=AuditKind.AWAITING_REVIEW,
                                     detail__reason=ReasonCode.LOW_CONFIDENCE).exists()


def _note_forward(event: InboxEvent, parsed, worker: str) -> None:
    """An agent's forward makes the original sender the requester: said once, in the audit trail."""
    details = event.details or {}
    if "requester_from_forward" in details:
        return
    person = people.requester(event, parsed)
    if not person.forwarded_by:
        return
    details["requester_from_forward"] = True
    details[people.FORWARDED_REQUESTER] = person.email  # a participant of the ticket (ticketing.threads)
    with transaction.atomic():
        InboxEvent.objects.filter(pk=event.pk).update(details=details)
        record_audit(event.pk, AuditKind.REQUESTER_FROM_FORWARD, actor=f"worker:{worker}",
                     detail={"forwarded_by": mask_address(person.forwarded_by),
                             "requester": mask_address(person.email)})
    event.details = details


def _flag(event: InboxEvent, flags: list[str], worker: str) -> None:
    details = event.details or {}
    if set(flags) <= set(details.get("flags", [])):
        return
    details["flags"] = sorted(set(details.get("flags", [])) | set(flags))
    with transaction.atomic():
        InboxEvent.objects.filter(pk=event.pk).update(details=details)
        record_audit(event.pk, AuditKind.FLAGGED, actor=f"worker:{worker}", detail={"flags": flags})
    event.details = details


def _act(event: InboxEvent, destination: Destination, work: Work, worker: str, lease=None) -> str:
    with transaction.atomic():
        intents.create_if_missing(event, work.action, destination)
        # The highest version of the action is the one to carry out (a reviewer may have
        # added one), and an existing intent keeps its own destination (a reviewer may have
        # corrected it).
        intent = selectors.current_intent(event.pk, work.action)
        if intent.state == Intent.State.SUCCEEDED:
            return "done"
        if intent.destination.paused:
            paused = True
        else:
            paused = False
            adapter = adapter_for(intent.destination)
            if adapter.transactional:
                # The built-in store: claim, write and record commit together or not at all.
                return _attempt_in_transaction(adapter, intent, work, worker, lease)
    if paused:
        return _wait(event, settings.MAILROOM_PAUSE_RECHECK_SECONDS, "paused")
    from . import bulkhead  # (imported here: this function and execute_intent are its only users)

    if bulkhead.pooled(lease):
        # The intent is the durable record; the I/O pool makes the call (ticketing.bulkhead).
        bulkhead.hand_over(intent.pk)
        record_progress(event.pk)  # the call waits in the pool's queue: not a take without progress
        return "handed_over"
    outcome = execute_intent(intent, work, worker, adapter, lease)
    if outcome == bulkhead.OVER_CAP:  # the destination's cap is full: the event waits a moment, parked
        return _wait(event, bulkhead.cap_wait_seconds(), outcome)
    return outcome


def _attempt_in_transaction(adapter, intent: Intent, work: Work, worker: str, lease=None) -> str:
    if not intents.claim(intent.pk, worker, lease):
        return "busy"
    try:
        result = work.perform(adapter, intent)
    except TicketClosed as exc:  # a solved built-in ticket under the `review` policy
        return _ticket_closed(intent, work, worker, adapter, exc)
    intents.record_success(intent, result, f"worker:{worker}", event=work.event)
    return "created"


def execute_intent(intent: Intent, work: Work, worker: str, adapter=None, lease=None) -> str:
    """One attempt: claim (checking the thread lease in the same transaction), call, record."""
    adapter = adapter or adapter_for(intent.destination)
    if adapter.transactional:
        with transaction.atomic():
            return _attempt_in_transaction(adapter, intent, work, worker, lease)

    from . import bulkhead

    claimed = bulkhead.claim(intent, worker, lease)  # intents.claim, under the destination's concurrency cap
    if claimed != bulkhead.CLAIMED:
        return claimed  # "busy", or "over_cap": nothing was written, the caller tries again shortly
    # A plain step of the happy path: not audited (the attempt's outcome is).
    transition_event(intent.inbox_event_id, [State.RECEIVED, State.READY], State.WRITE_PENDING,
                     actor=f"worker:{worker}", kind=None)
    pause_point("before_destination_call")
    # The claim must still be ours, with room for a whole request, right before the side effect.
    read_timeout = getattr(adapter, "timeout", (0, 0))[1]
    if not intents.still_claimed(intent.pk, worker, margin_seconds=read_timeout):
        logger.warning("intent %s: claim lost before the call; no request sent", intent.pk)
        return "claim_lost"
    adapter.journal = IntentJournal(intent, worker)
    try:
        result = work.perform(adapter, intent)
    except ClaimLost:
        logger.warning("intent %s: claim lost between two steps; the next attempt goes on", intent.pk)
        return "claim_lost"
    except TicketClosed as exc:
        return _ticket_closed(intent, work, worker, adapter, exc)
    except (TransientError, PermanentError, AmbiguousOutcome) as exc:
        return intents.record_failure(intent, exc, worker) or "claim_lost"  # the breaker counts it there
    breaker.record_success(intent.destination)
    pause_point("after_destination_success")
    # A claim that expired meanwhile was moved to `unknown`; the success we hold settles it.
    if intents.record_success(intent, result, f"worker:{worker}", (Intent.State.IN_FLIGHT, Intent.State.UNKNOWN),
                              event=work.event):
        return "created"
    logger.error("intent %s: success for ticket %s could not be recorded; reconciliation will look",
                 intent.pk, result.ticket_id)
    return "late_success"


def closed_policy(destination, adapter) -> str:
    """What a reply to a closed ticket of `destination` becomes: its `closed_policy` setting when the desk can
    carry it out, else the kind's default (`Capabilities.default_closed_policy`)."""
    chosen = (destination.settings or {}).get("closed_policy")
    capabilities = adapter.capabilities
    if chosen in capabilities.closed_policies or chosen == "review":
        return chosen
    return capabilities.default_closed_policy


def _ticket_closed(intent: Intent, work: Work, worker: str, adapter, exc: TicketClosed) -> str:
    """The desk refused the write because the ticket is closed: a follow-up ticket, or review (a failure with
    reason ticket_closed, shown in the recovery queue). `reopen` is the adapter's own (it reopens and writes)."""
    breaker.record_success(intent.destination)  # the desk answered: it is up
    if work.action == Intent.Action.ADD_COMMENT and closed_policy(intent.destination, adapter) == FOLLOW_UP:
        return intents.follow_up_instead(intent, worker=worker, closed_ticket_id=work.target.ticket_id) or "claim_lost"
    return intents.record_failure(intent, exc, worker) or "claim_lost"

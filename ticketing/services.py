"""Turning an inbox event into exactly one ticket (or one comment), through a durable intent.

process_inbox_event: normalize and validate (intake) -> thread (comment on the
thread's ticket, under the thread's lease) or classify (`ticketing.classification`,
once, stored in `InboxEvent.route`) and route -> one attempt of the intent. The
state machine itself lives in `ticketing.intents`.
"""

import logging
from collections.abc import Hashable
from typing import Any, cast

from django.conf import settings
from django.db import transaction

from intake.logging import mask_address
from intake.mime import ParsedMessage
from intake.models import AuditEvent, InboxEvent
from intake.normalize import normalize
from intake.rawload import with_small_raw
from intake.selectors import global_pause_on, tenant_pause_on
from intake.services import record_audit, record_progress, record_taken, transition_event, wait_event
from intake.testhooks import pause_point
from intake.vocabulary import AuditKind, ReasonCode

from . import (
    bounces,
    bulkhead,
    classification,
    copies,
    intents,
    leases,
    people,
    selectors,
    threads,
)
from .classification.rules import record_hits
from .destinations import adapter_for
from .execution import REUSED_MESSAGE_ID, Work, attempt_in_transaction, execute_intent
from .models import Destination, Intent
from .outcomes import Outcome
from .workers import worker_identity

logger = logging.getLogger(__name__)

State = InboxEvent.State
THREAD_RETRY_SECONDS = 2
ARCHIVED_FLAG = "archived"  # the ticket's tag `mailroom-archived`


def route(event: InboxEvent, cache: dict[Hashable, Any]) -> Destination | None:
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
    return cast("Destination | None", cache[key])  # stored just above, from selectors.default_destination


def _wait(event: InboxEvent, seconds: float, outcome: str) -> str:
    wait_event(event.pk, seconds)
    return outcome


def _outcome_of(state: str) -> Outcome:
    """The event's state after normalize, as an outcome; one another worker finished meanwhile is done."""
    try:
        return Outcome(state)
    except ValueError:
        return Outcome.BUSY if state in InboxEvent.OPEN_STATES else Outcome.DONE


# The group cache's set of events whose take (intake.services.record_taken) this task already counted.
TAKEN = "taken"


def process_inbox_event(
    event_id: int, worker: str | None = None, group_cache: dict[Hashable, Any] | None = None
) -> str:
    """Carry one event as far as it can go now. Safe to run any number of times, concurrently.

    Returns an `Outcome` (ticketing.outcomes) saying what happened, for task results, logs and tests.
    """
    worker = worker or worker_identity()
    # The message comes with the row unless it is large; normalize reads a large one a MiB at a time.
    event = with_small_raw(InboxEvent.objects.select_related("mailbox", "tenant").filter(pk=event_id)).first()
    if event is None:
        return Outcome.MISSING
    if event.state not in InboxEvent.OPEN_STATES:
        return Outcome.DONE
    cache: dict[Hashable, Any] = group_cache if group_cache is not None else {}
    if event_id not in cache.get(TAKEN, ()):  # before any work: a take that kills this worker still counts
        record_taken([event_id])
    if "global_pause" not in cache:  # read once per task group
        cache["global_pause"] = global_pause_on()
    if event.mailbox.paused or cache["global_pause"] or tenant_pause_on(event.tenant_id, cache):
        return _wait(event, settings.MAILROOM_PAUSE_RECHECK_SECONDS, Outcome.PAUSED)

    outcome = normalize(event, actor=f"worker:{worker}")
    if outcome.state != State.READY:
        bounces.tie(event=event, state=outcome.state, reason_code=outcome.reason_code)  # our own bounced mail
        return _outcome_of(outcome.state)  # waiting (scanner), or suppressed / awaiting_review / quarantined
    parsed = cast(ParsedMessage, outcome.parsed)  # normalize's every READY outcome carries the parsed message
    if followed := copies.follow_primary(event, worker, cache):  # another mailbox's copy makes the ticket
        return followed

    # A ticket made from a message that reused another's Message-ID says so, for the agent.
    ticket_flags = [REUSED_MESSAGE_ID] if event.message_id_reused else []
    if event.history:  # an archive import's history: a closed ticket of its own (intake.archive), tagged so
        ticket_flags.append(ARCHIVED_FLAG)
    follow_up = selectors.follow_up_intent(event.pk)
    if follow_up is not None:  # a reply its desk refused because the ticket is closed: a follow-up ticket
        work = Work(
            event,
            Intent.Action.CREATE_TICKET,
            parsed,
            flags=ticket_flags,
            follow_up_of=str(follow_up.progress.get("follow_up_of", "")),
        )
        return _act(event, follow_up.destination, work, worker)
    _note_forward(event, parsed, worker)
    if event.history or not threads.is_thread_work(parsed):  # history never reopens a thread's ticket
        destination = _classify_and_route(event, parsed, worker, cache)
        if isinstance(destination, str):
            return destination
        return _act(event, destination, Work(event, Intent.Action.CREATE_TICKET, parsed, flags=ticket_flags), worker)

    lease = leases.acquire(event.mailbox_id, event.thread_key, worker, settings.MAILROOM_THREAD_LEASE_SECONDS)
    if lease is None:
        return _wait(event, THREAD_RETRY_SECONDS, Outcome.WAITING_FOR_THREAD)
    try:
        pause_point("thread_analysis")
        plan = threads.plan(event, parsed)
        if plan.wait_for_earlier:
            return _wait(event, THREAD_RETRY_SECONDS, Outcome.WAITING_FOR_THREAD)
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


def _classify_and_route(
    event: InboxEvent, parsed: ParsedMessage, worker: str, cache: dict[Hashable, Any]
) -> Destination | str:
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
        transition_event(
            event.pk,
            InboxEvent.OPEN_STATES,
            State.SUPPRESSED,
            actor=actor,
            kind=AuditKind.SUPPRESSED,
            reason_code=ReasonCode.RULE_SUPPRESSED,
            reason_detail=classification.suppression_text(event.route),
            detail={
                "rule": suppressed.get("rule"),
                "rule_name": suppressed.get("name", ""),
                "suppress_reason": suppressed.get("reason", ""),
            },
        )
        return State.SUPPRESSED
    if event.route.get("review_reason") == classification.LOW_CONFIDENCE and not _low_confidence_settled(event):
        return _to_review(
            event,
            actor=actor,
            reason_code=ReasonCode.LOW_CONFIDENCE,
            reason_detail="the AI's proposal for the route was below the policy's minimum confidence",
        )
    destination = route(event, cache)
    if destination is None:
        return _to_review(
            event,
            actor=actor,
            reason_code=ReasonCode.NO_DESTINATION,
            reason_detail="the tenant has no default destination and no rule matched",
        )
    return destination


def _to_review(event: InboxEvent, *, actor: str, reason_code: str, reason_detail: str) -> Outcome:
    """Routing sent the event to a person: the recovery queue, with its reason."""
    transition_event(
        event.pk,
        InboxEvent.OPEN_STATES,
        State.AWAITING_REVIEW,
        actor=actor,
        kind=AuditKind.AWAITING_REVIEW,
        reason_code=reason_code,
        reason_detail=reason_detail,
    )
    return Outcome.AWAITING_REVIEW


def _store_route(event: InboxEvent, chosen: classification.Route, actor: str) -> None:
    """The route on the event (a plain UPDATE, not a state change), its audit row and the rules' hits,
    together; a worker that classified the same event first keeps its route."""
    data = chosen.as_json()
    with transaction.atomic():
        stored = InboxEvent.objects.filter(pk=event.pk, route={}).update(route=data)
        if stored:
            record_hits(chosen.rules)
            record_audit(event.pk, kind=AuditKind.CLASSIFIED, actor=actor, detail=classified_detail(data))
    if not stored:
        data = InboxEvent.objects.filter(pk=event.pk).values_list("route", flat=True).first() or data
    event.route = data


def classified_detail(route_json: dict[str, Any]) -> dict[str, Any]:
    """The `classified` audit row's detail: the route without the AI's rationale (the console shows that)."""
    return {**route_json, "ai": {k: v for k, v in route_json["ai"].items() if k != "rationale"}}


def _rule_suppression_settled(event: InboxEvent) -> bool:
    """A rule suppressed this event before: only an operator's replay brings it back here, and that wins."""
    return AuditEvent.objects.filter(
        inbox_event_id=event.pk, kind=AuditKind.SUPPRESSED, detail__reason=ReasonCode.RULE_SUPPRESSED
    ).exists()


def _low_confidence_settled(event: InboxEvent) -> bool:
    if event.route_override:
        return True
    return AuditEvent.objects.filter(
        inbox_event_id=event.pk, kind=AuditKind.AWAITING_REVIEW, detail__reason=ReasonCode.LOW_CONFIDENCE
    ).exists()


def _note_forward(event: InboxEvent, parsed: ParsedMessage, worker: str) -> None:
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
        record_audit(
            event.pk,
            kind=AuditKind.REQUESTER_FROM_FORWARD,
            actor=f"worker:{worker}",
            detail={"forwarded_by": mask_address(person.forwarded_by), "requester": mask_address(person.email)},
        )
    event.details = details


def _flag(event: InboxEvent, flags: list[str], worker: str) -> None:
    details = event.details or {}
    if set(flags) <= set(details.get("flags", [])):
        return
    details["flags"] = sorted(set(details.get("flags", [])) | set(flags))
    with transaction.atomic():
        InboxEvent.objects.filter(pk=event.pk).update(details=details)
        record_audit(event.pk, kind=AuditKind.FLAGGED, actor=f"worker:{worker}", detail={"flags": flags})
    event.details = details


def _act(
    event: InboxEvent, destination: Destination, work: Work, worker: str, lease: leases.Lease | None = None
) -> str:
    with transaction.atomic():
        intents.create_if_missing(event, action=work.action, destination=destination)
        # The highest version of the action is the one to carry out (a reviewer may have
        # added one), and an existing intent keeps its own destination (a reviewer may have
        # corrected it).
        # create_if_missing just made it (or found it) in this transaction: there is one.
        intent = cast(Intent, selectors.current_intent(event.pk, work.action))
        if intent.state == Intent.State.SUCCEEDED:
            return Outcome.DONE
        if intent.destination.paused:
            paused = True
        else:
            paused = False
            adapter = adapter_for(intent.destination)
            if adapter.transactional:
                # The built-in store: claim, write and record commit together or not at all.
                return attempt_in_transaction(adapter, intent, work, worker, lease)
    if paused:
        return _wait(event, settings.MAILROOM_PAUSE_RECHECK_SECONDS, Outcome.PAUSED)

    if bulkhead.pooled(lease):
        # The intent is the durable record; the I/O pool makes the call (ticketing.bulkhead).
        bulkhead.hand_over(intent.pk)
        record_progress(event.pk)  # the call waits in the pool's queue: not a take without progress
        return Outcome.HANDED_OVER
    outcome = execute_intent(intent, work, worker, adapter, lease)
    if outcome == Outcome.OVER_CAP:  # the destination's cap is full: the event waits a moment, parked
        return _wait(event, bulkhead.cap_wait_seconds(), outcome)
    return outcome

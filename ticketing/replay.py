"""Operator-driven writes on intents: what the recovery queue's actions need from ticketing.

Each write is one transaction: conditional UPDATEs on the states it expects
(zero rows: someone else moved it, nothing is written and `ReplayRefused`
says why), the event's new state, the outbox row that hands the event to a
worker, and an audit row naming the actor. Intents are updated before their
event, the order the workers use. The intent moves are `ticketing.intents`
functions, the event's move is `intake.services.transition_event` (which writes
the action's audit row); this module writes neither state itself.

    replay_same_key          failed/held -> pending under the original idempotency key,
                             optionally with a corrected route (destination, queue, priority,
                             request type; the key stays even for a new destination); an event
                             without an intent goes back to `ready` (routing takes `route_override`).
                             An intent that was ever `unknown` is asked for first (found:
                             failed/held -> succeeded, "linked", no write; refused unless a
                             consistent lookup finds nothing)
    replay_as_new_action     a new action_version with its own key; the previous intent
                             stays as evidence (an `unknown` one is held, so no sweep acts on it)
    confirm_existing_ticket  failed/unknown/held -> succeeded with the ticket a reviewer found;
                             no destination call
    close_not_a_request      event -> suppressed with the reviewer's reason; its open intents held
    settle_acknowledgment    a held/failed acknowledgment (notify_requester) of a completed event marked
                             handled: no email

The reads these writes rely on are `ticketing.selectors` (`current_intent`,
`stuck_acknowledgment`, the destination lookups, `lookup_existing`).
The "current" intent of an event is its ticket work (create_ticket or, in a
thread, add_comment) at the highest action_version. A completed event whose
acknowledgment is held or failed is replayed by reopening that acknowledgment.

A quarantined event is never replayed or confirmed from here: it leaves
quarantine only through a release (security's permission). Nor is a close a
way out: an event that was ever quarantined and not released since
(`intake.selectors.quarantine_unreleased`, from the audit trail) is judged
again by any replay (back to `received`: validation and the malware scan run
again, outcome "rejudged"), is never confirmed or replayed as a new action, and
only a caller allowed to decide on quarantine closes a quarantined event
(`close_not_a_request(may_close_quarantined=True)`).
"""

import logging

from django.db import transaction
from django.utils import timezone

from intake.models import InboxEvent
from intake.selectors import quarantine_unreleased
from intake.services import PROCESS_TOPIC, enqueue_outbox, record_audit, transition_event
from intake.vocabulary import AuditKind, ReasonCode

from . import classification, intents, numbers, people
from .destinations import ticket_url_for
from .destinations.base import TicketResult
from .models import Destination, Intent, Ticket
from .selectors import (
    current_intent,
    default_destination,
    override_destination,
    stuck_acknowledgment,
    tenant_destination,
)

logger = logging.getLogger(__name__)

EventState = InboxEvent.State
IntentState = Intent.State

# Event states from which an operator may send an event on again (not quarantined: that is a release).
REPLAYABLE_EVENT_STATES = (EventState.AWAITING_REVIEW, EventState.FAILED, EventState.UNKNOWN, EventState.SUPPRESSED)
CLOSABLE_EVENT_STATES = InboxEvent.RECOVERY_STATES
REPLAYABLE_INTENT_STATES = intents.REPLAYABLE_STATES
SUPERSEDABLE_INTENT_STATES = intents.SUPERSEDABLE_STATES
CONFIRMABLE_INTENT_STATES = intents.CONFIRMABLE_STATES
ROUTE_KEYS = ("destination_id", "queue", "priority", "request_type")
MAX_TICKET_ID_CHARS = 200


QUARANTINE_UNRELEASED = (
    "it was quarantined and no security user released it: it cannot be {what}; a replay "
    "sends it back to validation and the malware scan"
)
CLOSE_QUARANTINED_REFUSED = "a quarantined item is closed or released by the security role only"
NO_REQUESTER_REFUSED = (
    "it has no usable sender address, so its ticket would be for nobody: enter the requester's "
    "address on the item first"
)
UNSETTLED_REFUSED = (
    "an earlier attempt's outcome is unknown and {why}: a replay could make a second ticket. "
    "Check the desk, then confirm the ticket you find, or replay it as a new action (approved)"
)


class ReplayRefused(Exception):
    """The action does not apply (any more): nothing was written."""


# --- the route an operator corrects -------------------------------------------


def _effective_route(event: InboxEvent, intent: Intent | None) -> dict:
    """What the event would be sent with now: its destination and the fields `Work` sends
    (`classification.ticket_fields`: the operator's override wins over the stored route)."""
    chosen = classification.ticket_fields(event.route, event.route_override)
    destination_id = (
        intent.destination_id
        if intent is not None
        else ((event.route_override or {}).get("destination_id") or (event.route or {}).get("destination_id"))
    )
    return {"destination_id": destination_id, **{key: chosen.get(key, "") for key in ROUTE_KEYS[1:]}}


def _corrections(event: InboxEvent, intent: Intent | None, route: dict | None) -> dict:
    """{field: {"from", "to"}} for every field the operator's route changes (the audit row's `corrected`)."""
    if not route:
        return {}
    before = _effective_route(event, intent)
    return {
        key: {"from": before.get(key) or None, "to": value}
        for key, value in route.items()
        if str(before.get(key) or "") != str(value)
    }


# --- helpers -------------------------------------------------------------------


def _event(event_id: int) -> InboxEvent:
    event = (
        InboxEvent.objects.filter(pk=event_id)
        .only(
            "pk",
            "tenant_id",
            "mailbox_id",
            "provider_message_id",
            "state",
            "route_override",
            "route",
            "details",
            "reason_code",
            "sender",
        )
        .first()
    )
    if event is None:
        raise ReplayRefused("no such event")
    return event


def _not_replayable(state: str) -> str:
    return f"the event is {state}; only {', '.join(REPLAYABLE_EVENT_STATES)} can be replayed"


def _clean_route(route: dict | None, tenant_id: int) -> tuple[dict | None, Destination | None]:
    if route is None:
        return None, None
    clean = {key: route[key] for key in ROUTE_KEYS if route.get(key) not in (None, "")}
    destination = None
    if clean.get("destination_id"):
        destination = tenant_destination(tenant_id, clean["destination_id"])
        if destination is None:
            raise ReplayRefused("that destination does not belong to the event's tenant")
        clean["destination_id"] = destination.pk
    for key in ("queue", "priority", "request_type"):
        if key in clean:
            clean[key] = str(clean[key])[:100]
    return clean, destination


def _send_on(
    event: InboxEvent, to_state: str, now, route: dict | None, *, actor: str, kind: AuditKind, audit_detail: dict
) -> None:
    """The event back on the worker path with the action's audit row, announced by an outbox row,
    in the caller's transaction."""
    extra = {"route_override": route} if route is not None else {}
    if not transition_event(
        event.pk,
        [event.state],
        to_state,
        actor=actor,
        kind=kind,
        audit_detail=audit_detail,
        now=now,
        extra={"retry_at": None, "dispatch_count": 1, **extra},
    ):
        raise ReplayRefused("the event changed meanwhile")
    enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": event.pk}, now=now)


# --- writes --------------------------------------------------------------------


def replay_same_key(event_id: int, *, actor: str, route: dict | None = None) -> str:
    """Send the event's current action again under its original idempotency key.

    `route` (destination_id, queue, priority, request_type) is stored as the
    event's `route_override`; the worker sends its fields (they win over the
    classified route) and its destination becomes the intent's. Returns
    "reopened" (an intent went failed/held -> pending), "rerouted" (no
    intent yet: the event went back to `ready`) or "linked" (see below).

    The key rule for a corrected route: the intent keeps its key (and its
    external_ref), whether the destination changed or not; only
    `replay_as_new_action` (its own permission) mints a new one. A destination
    only remembers a key it answered with success (FakeDesk and Zendesk alike),
    so a correction after a rejected create (401, 422) goes through with the
    corrected body. A held intent whose create did land was `unknown` once, so
    the lookup below finds that ticket and links it (correct its fields in the
    desk); should the key still meet a corrected body, it is answered
    `IdempotentRequestError` -> `unknown`, settled by lookup: never a second ticket.
    The audit row names the operator (`actor`) and the
    corrected fields (`corrected`: {field: {from, to}}).

    An event that was quarantined and not released is judged again instead
    ("rejudged", see the module's docstring). One without a usable sender is refused until an operator
    entered its requester (`people.lacks_requester`): its ticket would be for nobody.

    An intent that was ever `unknown` (an earlier attempt's answer was lost) is looked up by its
    external_ref first, outside the transaction (`_ask_first`): found -> succeeded with that ticket's
    mapping and no write ("linked"); a consistent lookup finding nothing -> the replay goes on; a search
    that lags, no lookup (a comment), or a lookup failing -> `ReplayRefused`, nothing changes. A stuck
    acknowledgment is reopened without asking: SMTP has no lookup, and resending it (same Message-ID)
    is the decision this action records.
    """
    asked = _ask_first(event_id)
    now = timezone.now()
    with transaction.atomic():
        event = _event(event_id)
        if event.state == EventState.COMPLETED and route is None and stuck_acknowledgment(event_id):
            return _reopen_acknowledgment(event_id, actor, now)
        if event.state not in REPLAYABLE_EVENT_STATES:
            raise ReplayRefused(_not_replayable(event.state))
        route, destination = _clean_route(route, event.tenant_id)
        intent = current_intent(event_id)
        if quarantine_unreleased(event_id):
            return _rejudge(event, intent, route, actor=actor, now=now)
        if people.lacks_requester(event):
            raise ReplayRefused(NO_REQUESTER_REFUSED)
        if (
            intent is not None
            and intent.action == Intent.Action.ADD_COMMENT
            and destination is not None
            and destination.pk != intent.destination_id
        ):
            raise ReplayRefused("a comment goes to its thread's ticket: its destination cannot be changed")
        detail = {"event_state": event.state, "route": route, "corrected": _corrections(event, intent, route)}
        if intent is None:
            outcome, to_state = "rerouted", EventState.READY
        else:
            if intent.state not in REPLAYABLE_INTENT_STATES:
                raise ReplayRefused(
                    f"its intent is {intent.state}; only a failed or held intent is replayed with its key"
                )
            if (
                asked is None
                and intents.last_unknown_at(intent) is not None
                or (asked is not None and asked[0] != intent.pk)
            ):
                raise ReplayRefused("its intent changed meanwhile; try again")
            if asked is not None and asked[1].says == intents.FOUND:
                return _link_found(event, intent, asked[1], route, actor=actor, now=now)
            if asked is not None:
                detail["lookup"] = asked[1].says
            if not intents.replay(intent, now, destination_id=destination.pk if destination is not None else None):
                raise ReplayRefused("someone else moved its intent meanwhile")
            outcome, to_state = "reopened", EventState.WRITE_PENDING
            detail.update(
                {
                    "intent": intent.pk,
                    "action_version": intent.action_version,
                    "intent_state": intent.state,
                    "previous_attempts": intent.attempts,
                    "idempotency_key": intent.idempotency_key[:12],
                    "destination": destination.pk if destination is not None else intent.destination_id,
                    "previous_destination": intent.destination_id,
                }
            )
        _send_on(
            event,
            to_state,
            now,
            route,
            actor=actor,
            kind=AuditKind.REPLAYED,
            audit_detail={"outcome": outcome, **detail},
        )
    return outcome


def _ask_first(event_id: int) -> tuple[int, intents.Answer] | None:
    """(intent id, what its destination says) before a same-key replay of an intent that was ever unknown,
    asked with no transaction open (an HTTP call); None when there is nothing to ask. Raises ReplayRefused
    when the destination cannot say that no record exists."""
    state = InboxEvent.objects.filter(pk=event_id).values_list("state", flat=True).first()
    if state not in REPLAYABLE_EVENT_STATES or quarantine_unreleased(event_id):
        return None  # refused, or judged again, by the checks in the transaction
    intent = current_intent(event_id)
    if intent is None or intent.state not in REPLAYABLE_INTENT_STATES or intents.last_unknown_at(intent) is None:
        return None
    answer = intents.ask_destination(intent)
    if answer.says not in (intents.FOUND, intents.NOTHING):
        raise ReplayRefused(UNSETTLED_REFUSED.format(why=answer.detail))
    return intent.pk, answer


def _link_found(
    event: InboxEvent, intent: Intent, answer: intents.Answer, route: dict | None, *, actor: str, now
) -> str:
    """failed/held -> succeeded with the ticket the lookup found (its mapping, the event completed), and
    the replay's audit row; nothing is sent. In the caller's transaction."""
    if not intents.record_success(
        intent,
        result=answer.ticket,
        actor=actor,
        from_states=REPLAYABLE_INTENT_STATES,
        audit_detail={"settled_by": "lookup"},
    ):
        raise ReplayRefused("someone else moved its intent meanwhile")
    record_audit(
        event.pk,
        kind=AuditKind.REPLAYED,
        actor=actor,
        at=now,
        detail={
            "outcome": "linked",
            "event_state": event.state,
            "route": route,
            "intent": intent.pk,
            "intent_state": intent.state,
            "ticket_id": answer.ticket.ticket_id,
            "lookup": answer.says,
            "destination_calls": 1,
        },
    )
    return "linked"


def _rejudge(event: InboxEvent, intent: Intent | None, route: dict | None, *, actor: str, now) -> str:
    """An unreleased quarantined event back to `received`: the worker validates and scans it again, so the
    verdict is its own (quarantined again, or on to routing). In the caller's transaction."""
    if intent is not None:
        # Only mail that got past quarantine before this rule existed has one; a person must look.
        raise ReplayRefused(QUARANTINE_UNRELEASED.format(what="sent on with the intent it already has"))
    details = {k: v for k, v in (event.details or {}).items() if k != "scan_attempts"}  # a fresh scan
    extra = {"retry_at": None, "dispatch_count": 1, "details": details}
    if route is not None:
        extra["route_override"] = route
    if not transition_event(
        event.pk,
        [event.state],
        EventState.RECEIVED,
        actor=actor,
        kind=AuditKind.REPLAYED,
        now=now,
        extra=extra,
        audit_detail={
            "outcome": "rejudged",
            "event_state": event.state,
            "route": route,
            "corrected": _corrections(event, None, route),
            "quarantine_unreleased": True,
        },
    ):
        raise ReplayRefused("the event changed meanwhile")
    enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": event.pk}, now=now)
    return "rejudged"


def _reopen_acknowledgment(event_id: int, actor: str, now) -> str:
    """A held or failed acknowledgment -> pending, same key (same Message-ID), handed to its task."""
    ack = stuck_acknowledgment(event_id)
    if ack is None or not intents.replay(ack, now):
        raise ReplayRefused("someone else moved the acknowledgment meanwhile")
    enqueue_outbox(intents.NOTIFY_TOPIC, {"intent_id": ack.pk}, now=now)
    # The event stays completed: the action's row is written here, beside the intent's move.
    record_audit(
        event_id,
        kind=AuditKind.REPLAYED,
        actor=actor,
        at=now,
        detail={
            "outcome": "acknowledgment_reopened",
            "intent": ack.pk,
            "intent_state": ack.state,
            "previous_attempts": ack.attempts,
            "idempotency_key": ack.idempotency_key[:12],
        },
    )
    return "acknowledgment_reopened"


def settle_acknowledgment(event_id: int, *, actor: str, note: str = "") -> None:
    """A completed event's held or failed acknowledgment: a person says it needs no (more) email."""
    now = timezone.now()
    with transaction.atomic():
        ack = stuck_acknowledgment(event_id)
        if ack is None:
            raise ReplayRefused("no held or failed acknowledgment")
        if not intents.settle(ack, now):
            raise ReplayRefused("someone else moved the acknowledgment meanwhile")
        record_audit(
            event_id,
            kind=AuditKind.ACKNOWLEDGMENT_HANDLED,
            actor=actor,
            at=now,
            detail={"intent": ack.pk, "previous_state": ack.state, "note": note[:500]},
        )


def replay_as_new_action(
    event_id: int, *, actor: str, approved_by: str, route: dict | None = None, reason: str = ""
) -> Intent:
    """A new action_version of the current action, with its own key and external reference.

    For when the original write must not be answered from the destination's
    idempotency store (a changed body, a key that is known to be burnt). The
    previous intent keeps its state as evidence; an `unknown` one becomes
    `held`, so reconciliation does not also act on it.
    """
    now = timezone.now()
    with transaction.atomic():
        event = _event(event_id)
        if event.state not in REPLAYABLE_EVENT_STATES:
            raise ReplayRefused(_not_replayable(event.state))
        if quarantine_unreleased(event_id):
            raise ReplayRefused(QUARANTINE_UNRELEASED.format(what="replayed as a new action"))
        if people.lacks_requester(event):
            raise ReplayRefused(NO_REQUESTER_REFUSED)
        route, destination = _clean_route(route, event.tenant_id)
        current = current_intent(event_id)
        if current is None:
            raise ReplayRefused("nothing was attempted yet: use a plain replay")
        action = current.action
        locked = list(
            Intent.objects.select_for_update()
            .select_related("destination")
            .filter(inbox_event_id=event_id, action=action)
            .order_by("-action_version")
        )
        previous = locked[0]
        # A fresh statement sees a version another approver committed while we waited for the lock.
        if Intent.objects.filter(
            inbox_event_id=event_id, action=action, action_version__gt=previous.action_version
        ).exists():
            raise ReplayRefused("another new action was approved meanwhile")
        if previous.state not in SUPERSEDABLE_INTENT_STATES:
            raise ReplayRefused(
                f"its intent is {previous.state}; only a failed, held or unknown intent can be superseded"
            )
        if previous.state == IntentState.UNKNOWN:
            intents.supersede(previous, now)
        new_version = previous.action_version + 1
        if (
            action == Intent.Action.ADD_COMMENT
            and destination is not None
            and destination.pk != previous.destination_id
        ):
            raise ReplayRefused("a comment goes to its thread's ticket: its destination cannot be changed")
        target = destination or previous.destination
        event_row = InboxEvent.objects.get(pk=event_id)
        new = intents.ensure_intent(event_row, action, target, action_version=new_version)
        if new.state != IntentState.PENDING or new.attempts:
            raise ReplayRefused("the new action already exists")
        Intent.objects.filter(pk=new.pk).update(next_attempt_at=now)
        _send_on(
            event,
            EventState.WRITE_PENDING,
            now,
            route,
            actor=actor,
            kind=AuditKind.REPLAYED_AS_NEW_ACTION,
            audit_detail={
                "approved_by": approved_by,
                "reason": reason[:500],
                "route": route,
                "corrected": _corrections(event, previous, route),
                "previous_intent": previous.pk,
                "previous_version": previous.action_version,
                "previous_state": previous.state,
                "previous_key": previous.idempotency_key[:12],
                "intent": new.pk,
                "action_version": new_version,
                "idempotency_key": new.idempotency_key[:12],
                "destination": target.pk,
            },
        )
    new.refresh_from_db()
    return new


def confirm_existing_ticket(
    event_id: int, *, actor: str, ticket_id: str, ticket_url: str = "", destination_id: int | None = None
) -> Intent:
    """Complete the event with a ticket the reviewer found: mapping + success, and no destination call."""
    ticket_id = (ticket_id or "").strip()
    if not ticket_id or len(ticket_id) > MAX_TICKET_ID_CHARS:
        raise ReplayRefused("a ticket id is required")
    now = timezone.now()
    with transaction.atomic():
        event = _event(event_id)
        if event.state not in REPLAYABLE_EVENT_STATES:
            raise ReplayRefused(
                f"the event is {event.state}; a ticket can be confirmed only for {', '.join(REPLAYABLE_EVENT_STATES)}"
            )
        if quarantine_unreleased(event_id):
            raise ReplayRefused(QUARANTINE_UNRELEASED.format(what="completed with a ticket"))
        intent = current_intent(event_id)
        if destination_id:
            destination = tenant_destination(event.tenant_id, destination_id)
            if destination is None:
                raise ReplayRefused("that destination does not belong to the event's tenant")
        elif intent is not None:
            destination = intent.destination
        else:
            destination = override_destination(event) or default_destination(event.tenant_id)
        if destination is None:
            raise ReplayRefused("choose the destination that holds the ticket")
        if destination.kind == Destination.Kind.BUILTIN:
            ticket_id = builtin_ticket_named(destination, ticket_id.strip())
        elif destination.kind == Destination.Kind.ZENDESK and not ticket_id.isdigit():
            raise ReplayRefused(f"a {destination.kind} ticket id is a number")
        if intent is None:
            # Never attempted: the intent is created held, then settled like any other.
            event_row = InboxEvent.objects.get(pk=event_id)
            intent = intents.create_held(event_row, Intent.Action.CREATE_TICKET, destination, now)
        if intent.state not in CONFIRMABLE_INTENT_STATES:
            raise ReplayRefused(f"its intent is {intent.state}; only a failed, unknown or held intent can be confirmed")
        if intent.destination_id != destination.pk:
            if not Intent.objects.filter(pk=intent.pk, state__in=CONFIRMABLE_INTENT_STATES).update(
                destination_id=destination.pk
            ):
                raise ReplayRefused("someone else moved its intent meanwhile")
            intent.destination_id, intent.destination = destination.pk, destination
        result = TicketResult(ticket_id=ticket_id, url=(ticket_url or ticket_url_for(destination, ticket_id))[:500])
        if not intents.record_success(intent, result=result, actor=actor, from_states=CONFIRMABLE_INTENT_STATES):
            raise ReplayRefused("someone else moved its intent meanwhile")
        record_audit(
            event_id,
            kind=AuditKind.TICKET_CONFIRMED,
            actor=actor,
            at=now,
            detail={
                "intent": intent.pk,
                "ticket_id": ticket_id,
                "destination": destination.pk,
                "previous_event_state": event.state,
                "previous_intent_state": intent.state,
                "destination_calls": 0,
            },
        )
    intent.refresh_from_db()
    return intent


def close_not_a_request(event_id: int, *, actor: str, reason: str, may_close_quarantined: bool = False) -> int:
    """Close an event as not-a-request: `suppressed`, with the reason. Returns how many intents were held.

    Its pending, retry_wait and unknown intents are held first, so no worker or
    sweep writes for it afterwards; an intent in flight refuses the close. A
    quarantined event is closed only with `may_close_quarantined` (the caller
    checked the security role); a later replay judges it again all the same.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ReplayRefused("a reason is required")
    now = timezone.now()
    with transaction.atomic():
        event = _event(event_id)
        current = current_intent(event_id)
        held_current = current is not None and current.state == IntentState.HELD
        if event.state not in CLOSABLE_EVENT_STATES and not (
            held_current and event.state not in (EventState.SUPPRESSED, EventState.COMPLETED)
        ):
            raise ReplayRefused(f"the event is {event.state}; only items of the recovery queue can be closed")
        if event.state == EventState.QUARANTINED and not may_close_quarantined:
            raise ReplayRefused(CLOSE_QUARANTINED_REFUSED)
        held = intents.hold_open(event_id, now)
        if Intent.objects.filter(inbox_event_id=event_id, state=IntentState.IN_FLIGHT).exists():
            raise ReplayRefused("a worker is writing for this event right now; try again in a moment")
        if not transition_event(
            event_id,
            [event.state],
            EventState.SUPPRESSED,
            actor=actor,
            kind=AuditKind.CLOSED_NOT_A_REQUEST,
            reason_code=ReasonCode.NOT_A_REQUEST,
            reason_detail=reason,
            extra={"retry_at": None},
            now=now,
            audit_detail={"reason": reason[:500], "previous_state": event.state, "intents_held": held},
        ):
            raise ReplayRefused("the event changed meanwhile")
    return held


def builtin_ticket_named(destination: Destination, typed: str) -> str:
    """The built-in ticket an operator names, as its own id: `MR-n` as the console lists it, or the ticket's
    own id where that cannot be mistaken for another ticket's number (the ticket has no number yet, or its
    number is that id). Refused otherwise, so "12" never links MR-12's customer to ticket 12's."""
    tickets = Ticket.objects.filter(destination=destination)
    number = numbers.parse_number(typed)
    if number is not None:
        ticket = numbers.builtin_tickets_of_number(tickets, number).first()
        if ticket is None:
            raise ReplayRefused(f"{destination.slug} has no ticket {numbers.format_number(number)}")
        return str(ticket.pk)
    if not typed.isdigit():
        raise ReplayRefused(
            f"name a {destination.slug} ticket by its number as the ticket list shows it, "
            f"e.g. {numbers.format_number(12)}"
        )
    ticket = tickets.with_numbers().filter(pk=int(typed)).first()
    if ticket is None:
        raise ReplayRefused(f"{destination.slug} has no ticket {typed}")
    if ticket.number not in (None, ticket.pk):
        raise ReplayRefused(
            f"{destination.slug}'s ticket {typed} is numbered {ticket}: type {ticket} to confirm "
            f"that one, or {numbers.format_number(int(typed))} for the ticket with that number"
        )
    return typed

"""Bulk replay: look each selected item up in its destination, then link, replay, resolve, reroute or skip.

At most `MAILROOM_BULK_REPLAY_CAP` (20) items at once. Preview and replay share
one plan (`_bulk_plan`); the replay looks everything up again, because the
preview may be stale. An item that was quarantined and never released by a
security user is not looked up, linked or sent on: its plan is "rejudge"
(validation and the malware scan again, as a single replay does).
"""

from dataclasses import dataclass

from django.conf import settings

from intake.models import InboxEvent
from intake.selectors import quarantine_unreleased
from intake.services import record_audit
from intake.vocabulary import AuditKind
from ticketing import intents as ticketing_intents, replay
from ticketing.models import Intent
from ticketing.selectors import Lookup, current_intent, lookup_existing

from .. import selectors
from .access import ActionRefused, actor_name, require
from .roles import PERM_CONFIRM, PERM_REPLAY

DEFAULT_BULK_REPLAY_CAP = 20


def bulk_replay_cap() -> int:
    return int(getattr(settings, "MAILROOM_BULK_REPLAY_CAP", DEFAULT_BULK_REPLAY_CAP))


@dataclass
class BulkItem:
    event_id: int
    subject: str
    event_state: str
    intent_state: str
    destination: str
    external_ref: str
    lookup: str
    found_ticket_id: str = ""
    found_ticket_url: str = ""
    lookup_detail: str = ""
    plan: str = "skip"  # confirm, replay, resolve, reroute, rejudge, skip
    plan_text: str = ""
    outcome: str = ""


def _bulk_plan(
    event: InboxEvent, intent: Intent | None, found: Lookup, *, unreleased: bool, unknown_before: bool = False
) -> tuple[str, str]:
    state = event.state
    if state == InboxEvent.State.QUARANTINED:
        return "skip", "quarantined: only a release (security role) lets it out"
    if state not in replay.REPLAYABLE_EVENT_STATES:
        return "skip", f"{state}: nothing to replay"
    if unreleased:
        if intent is not None:
            return "skip", "quarantined once and never released, yet sent on: review it on its own page"
        return "rejudge", "quarantined once and never released: back to validation and the malware scan"
    if intent is None:
        return "reroute", "never sent to a destination: back to routing"
    if intent.state not in (Intent.State.FAILED, Intent.State.HELD, Intent.State.UNKNOWN):
        return "skip", f"its intent is {intent.state}"
    if found.status == "found":
        return "confirm", f"the destination has ticket {found.ticket.ticket_id}: link it, no write"
    if intent.state == Intent.State.UNKNOWN:
        if found.status == "not_found":
            return "resolve", "outcome unknown, nothing found: settled by reconciliation's rules"
        return "skip", "outcome unknown and the destination cannot be asked: review it on its own page"
    if found.status == "not_found":
        return "replay", "nothing found: replay with the original idempotency key"
    if unknown_before:  # its failure is known only if the destination can say no record exists
        return (
            "skip",
            "an earlier attempt's outcome is unknown and the destination cannot be asked: review it on its own page",
        )
    if intent.state == Intent.State.FAILED:
        return "replay", "a known failure (nothing was written): replay with the original idempotency key"
    return "skip", "held and the destination cannot be asked: review it on its own page"


def _bulk_items(user, event_ids) -> list[tuple[BulkItem, InboxEvent, Intent | None, Lookup]]:
    ids = sorted({int(i) for i in event_ids})
    cap = bulk_replay_cap()
    if not ids:
        raise ActionRefused("select at least one item")
    if len(ids) > cap:
        raise ActionRefused(f"select at most {cap} items for a bulk replay ({len(ids)} selected)")
    events = {e.pk: e for e in selectors.visible_events(user).filter(pk__in=ids)}
    missing = set(ids) - set(events)
    if missing:
        raise InboxEvent.DoesNotExist(f"no visible events {sorted(missing)}")
    rows = []
    for event_id in ids:
        event = events[event_id]
        intent = current_intent(event_id)
        unreleased = quarantine_unreleased(event_id)
        found = (
            lookup_existing(intent)
            if event.state in replay.REPLAYABLE_EVENT_STATES and intent is not None and not unreleased
            else Lookup("no_intent" if intent is None else "skipped")
        )
        unknown_before = intent is not None and ticketing_intents.last_unknown_at(intent) is not None
        plan, text = _bulk_plan(event, intent, found, unreleased=unreleased, unknown_before=unknown_before)
        item = BulkItem(
            event_id=event_id,
            subject=event.subject,
            event_state=event.state,
            intent_state=intent.state if intent else "",
            destination=intent.destination.slug if intent else "",
            external_ref=intent.external_ref if intent else "",
            lookup=found.status,
            found_ticket_id=found.ticket.ticket_id if found.ticket else "",
            found_ticket_url=found.ticket.url if found.ticket else "",
            lookup_detail=found.detail,
            plan=plan,
            plan_text=text,
        )
        rows.append((item, event, intent, found))
    return rows


def do_bulk_replay_preview(user, event_ids) -> list[BulkItem]:
    """Look each selected item up in its destination by external reference; say what a bulk replay would do."""
    require(user, PERM_REPLAY, PERM_CONFIRM)
    return [item for item, *_ in _bulk_items(user, event_ids)]


def do_bulk_replay(user, event_ids) -> list[BulkItem]:
    """Look up again (the preview may be stale), then link found tickets and replay the rest with their keys."""
    require(user, PERM_REPLAY, PERM_CONFIRM)
    actor = actor_name(user)
    done = []
    for item, event, intent, found in _bulk_items(user, event_ids):
        if item.plan != "skip":
            record_audit(
                event.pk,
                kind=AuditKind.BULK_LOOKUP,
                actor=actor,
                detail={
                    "lookup": found.status,
                    "ticket_id": item.found_ticket_id,
                    "plan": item.plan,
                    "external_ref": item.external_ref,
                },
            )
        try:
            if item.plan == "confirm":
                replay.confirm_existing_ticket(
                    event.pk, actor=actor, ticket_id=found.ticket.ticket_id, ticket_url=found.ticket.url
                )
                item.outcome = f"linked ticket {found.ticket.ticket_id}"
            elif item.plan in ("replay", "reroute", "rejudge"):  # replay_same_key judges an unreleased one again
                item.outcome = replay.replay_same_key(event.pk, actor=actor)
            elif item.plan == "resolve":
                item.outcome = ticketing_intents.resolve_unknown(intent.pk, actor=actor) or "unchanged"
            else:
                item.outcome = "skipped"
        except replay.ReplayRefused as exc:
            item.outcome = f"refused: {exc}"
        done.append(item)
    return done

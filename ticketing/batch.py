"""Set-based processing of a task's group: plain mail to the built-in store in one transaction.

`process_plain(ids)` reads the group in one SELECT and normalizes each message (`intake.normalize`, the
same code and outcomes as the per-event path). An event is *plain* when, after that, it is `ready`,
not thread work, the primary of its copies, classified by rules alone (no AI) and routed to a
built-in (transactional) destination that is not paused, with no stored route, no operator override
and no pause. The plain events of the group then get, in one transaction: their intents (INSERT ... ON
CONFLICT DO NOTHING), routes and `classified` rows, tickets, succeeded intents, mappings, `completed`
events, audit rows and acknowledgment plans (`ticketing.intents.batch`). The unique keys are the
backstop: an event whose intent someone else made, or any conditional write that did not land, goes
back to the per-event path (`services.process_inbox_event`), as does every event that is not plain.
What ends up stored is what the per-event path would have stored (tests/test_batch.py compares them on
PostgreSQL, tests/test_sqlite_parity.py on SQLite). The embedded default (SQLite) runs this same path: its
statements read the group's rows from a JSON array instead of arrays (`ticketing.intents.batch`, which says why).
"""

import json
import logging
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from intake.mime import ParsedMessage
from intake.models import AuditEvent, InboxEvent
from intake.normalize import normalize
from intake.rawload import with_small_raw
from intake.selectors import global_pause_on, tenant_pause_on
from intake.services import record_taken
from intake.vocabulary import AuditKind

from . import bounces, classification, copies, execution, intents, services, threads
from .destinations import adapter_for
from .destinations.base import DestinationAdapter
from .intents import batch as intents_batch
from .models import CopiedMessage, Destination, Intent, RoutingPolicy, RoutingRule, Ticket
from .outcomes import Outcome

logger = logging.getLogger(__name__)

State = InboxEvent.State


@dataclass
class _Plain:
    event: InboxEvent
    parsed: ParsedMessage
    route: dict[str, Any]
    destination: Destination
    adapter: DestinationAdapter


def process_plain(event_ids: list[int], worker: str, cache: dict[Hashable, Any]) -> tuple[dict[int, str], list[int]]:
    """({event id: outcome word} for the events handled here, [ids left for the per-event path, in order])."""
    actor = f"worker:{worker}"
    events = {
        e.pk: e
        for e in with_small_raw(InboxEvent.objects.select_related("mailbox", "tenant").filter(pk__in=list(event_ids)))
    }
    if "global_pause" not in cache:
        cache["global_pause"] = global_pause_on()
    outcomes: dict[int, str] = {}
    rest: list[int] = []
    candidates = []
    taken = []
    for event_id in dict.fromkeys(event_ids):  # each id once (the caller counts repeats)
        event = events.pop(event_id, None)
        if event is None:
            outcomes[event_id] = Outcome.MISSING
        elif event.state not in InboxEvent.OPEN_STATES:
            outcomes[event_id] = Outcome.DONE
        elif not _may_be_plain(event, cache):
            rest.append(event_id)
        else:
            taken.append(event)
    # One take for all of them before any work (the per-event path does not count these again).
    record_taken([event.pk for event in taken])
    cache.setdefault(services.TAKEN, set()).update(event.pk for event in taken)
    for event in taken:
        outcome = normalize(event, actor=actor)
        if outcome.state != State.READY:
            bounces.tie(event=event, state=outcome.state, reason_code=outcome.reason_code)  # our bounced mail
            outcomes[event.pk] = outcome.state  # waiting (scanner), suppressed, awaiting_review, quarantined
        # normalize's every READY outcome carries the parsed message.
        elif threads.is_thread_work(cast(ParsedMessage, outcome.parsed)):
            rest.append(event.pk)
        else:
            candidates.append((event, cast(ParsedMessage, outcome.parsed)))
    plain = []
    for event, parsed in _primaries(candidates, cache, rest):
        item = _classified(event, parsed, cache)
        if item is None:
            rest.append(event.pk)
        else:
            plain.append(item)
    if plain:
        done = _write(plain, worker, actor)
        outcomes.update({pk: Outcome.CREATED for pk in done})
        rest.extend(item.event.pk for item in plain if item.event.pk not in done)
    order = {event_id: n for n, event_id in reversed(list(enumerate(event_ids)))}
    return outcomes, sorted(set(rest), key=order.__getitem__)


def _may_be_plain(event: InboxEvent, cache: dict[Hashable, Any]) -> bool:
    """What can be told before normalization; the per-event path handles everything else."""
    if event.state != State.RECEIVED or event.mailbox.paused or cache["global_pause"]:
        return False
    if tenant_pause_on(event.tenant_id, cache):
        return False  # the per-event path parks it
    if event.route or event.route_override:
        return False  # classified before, or corrected by an operator: a replay, not plain
    if event.history:
        return False  # archive history: a closed ticket, made by the per-event path (intake.archive)
    return not _policy(event.tenant_id, cache).ai_enabled  # a proposal may need a review first


def _policy(tenant_id: int, cache: dict[Hashable, Any]) -> RoutingPolicy:
    key = ("routing_policy", tenant_id)
    if key not in cache:
        cache[key] = classification.policy_for(tenant_id)
    return cast(RoutingPolicy, cache[key])  # stored just above, from classification.policy_for


def _primaries(
    candidates: list[tuple[InboxEvent, ParsedMessage]], cache: dict[Hashable, Any], rest: list[int]
) -> list[tuple[InboxEvent, ParsedMessage]]:
    """The candidates that do their own ticket work (`copies.follow_primary` returns None for them).

    The first copy of a message to ask becomes its primary: one INSERT ... ON CONFLICT DO NOTHING for
    the group (in group order, as the per-event path would ask) and one SELECT.
    """
    asking = [(e, p) for e, p in candidates if e.fingerprint and copies.one_ticket_per_message(e.tenant_id, cache)]
    if not asking:
        return candidates
    now = timezone.now()
    CopiedMessage.objects.bulk_create(
        [
            CopiedMessage(tenant_id=e.tenant_id, fingerprint=e.fingerprint, primary_id=e.pk, created_at=now)
            for e, _ in asking
        ],
        ignore_conflicts=True,
    )
    primary = {
        (t, f): pk
        for t, f, pk in CopiedMessage.objects.filter(fingerprint__in={e.fingerprint for e, _ in asking}).values_list(
            "tenant_id", "fingerprint", "primary_id"
        )
    }
    keep = []
    for event, parsed in candidates:
        if event.fingerprint and primary.get((event.tenant_id, event.fingerprint), event.pk) != event.pk:
            rest.append(event.pk)  # a copy: it follows its primary on the per-event path
        else:
            keep.append((event, parsed))
    return keep


def _classified(event: InboxEvent, parsed: ParsedMessage, cache: dict[Hashable, Any]) -> _Plain | None:
    """Classify (rules, the policy's defaults) and route; None when the event is not plain after all."""
    route = classification.classify(event, parsed, policy=_policy(event.tenant_id, cache)).as_json()
    if route.get("review_reason") or route.get("action") == classification.SUPPRESS:
        return None  # review or a rule's suppression: the per-event path moves the event
    event.route = route  # `services.route` reads it; cleared again below if the event is not plain
    destination = services.route(event, cache)
    adapter = _builtin_adapter(destination, cache)
    if adapter is None:
        event.route = {}
        return None
    # _builtin_adapter found an adapter, so there is a destination.
    return _Plain(event, parsed, route, cast(Destination, destination), adapter)


def _builtin_adapter(destination: Destination | None, cache: dict[Hashable, Any]) -> DestinationAdapter | None:
    """The destination's adapter when it is the built-in store and not paused (None otherwise)."""
    if destination is None or destination.paused:
        return None
    key = ("adapter", destination.pk)
    if key not in cache:
        cache[key] = adapter_for(destination)
    adapter: DestinationAdapter = cache[key]  # stored just above, from adapter_for
    return adapter if adapter.transactional else None


def _write(plain: list[_Plain], worker: str, actor: str) -> set[int]:
    """One transaction for the group's plain events; the ids completed here (empty after a rollback)."""
    now = timezone.now()
    try:
        with transaction.atomic():
            mine = intents_batch.create_missing(
                [(p.event, p.destination) for p in plain], Intent.Action.CREATE_TICKET, now
            )
            plain = [p for p in plain if p.event.pk in mine]  # the others: someone else's intent
            if not plain:
                return set()
            leading = _store_routes(plain, actor, now)
            tickets = _insert_tickets(plain, mine, now)
            stored = _stored(plain)
            intents_batch.record_successes_builtin(
                [
                    intents_batch.BuiltinSuccess(
                        stored[p.event.pk],
                        mine[p.event.pk][0],
                        p.destination,
                        str(ticket.pk),
                        p.adapter.ticket_url(ticket.pk),
                    )
                    for p, ticket in zip(plain, tickets, strict=True)
                ],
                worker,
                now,
                leading,
            )
    except (intents_batch.Conflict, IntegrityError) as exc:
        logger.info(
            "set-based write of %d events rolled back (%s): each goes its own way", len(plain), type(exc).__name__
        )
        return set()
    return {p.event.pk for p in plain}


_STORE_ROUTES = """
UPDATE {table} AS e SET route = v.route::jsonb
FROM unnest(%(ids)s::bigint[], %(routes)s::text[]) AS v(id, route)
WHERE e.id = v.id AND e.route = '{{}}'::jsonb
"""
# SQLite (the embedded default; `intents_batch.group_statement`): rows [id, route text] from a JSON array; the
# JSONField is text there, `json()` compares it minified.
_STORE_ROUTES_SQLITE = """
UPDATE {table} AS e SET route = json_extract(v.value, '$[1]')
FROM json_each(%(rows)s) AS v
WHERE e.id = json_extract(v.value, '$[0]') AND json(e.route) = '{{}}'
"""


def _store_routes(plain: list[_Plain], actor: str, now: datetime) -> dict[int, list[AuditEvent]]:
    """`services._store_route` for the group: the routes, the rules' hits, and the `classified` rows to write."""
    sql, params = intents_batch.group_statement(
        _STORE_ROUTES,
        _STORE_ROUTES_SQLITE,
        {"ids": [p.event.pk for p in plain], "routes": [json.dumps(p.route) for p in plain]},
        {},
    )
    with connection.cursor() as cursor:
        cursor.execute(sql.format(table=InboxEvent._meta.db_table), params)
        if cursor.rowcount != len(plain):
            raise intents_batch.Conflict("a route was stored by someone else")
    hits = Counter(rule_id for p in plain for rule_id in p.route["rules"])
    for rule_id, count in sorted(hits.items()):
        RoutingRule.objects.filter(pk=rule_id).update(hits=F("hits") + count, last_hit_at=now)
    return {
        p.event.pk: [
            AuditEvent(
                inbox_event_id=p.event.pk,
                kind=AuditKind.CLASSIFIED,
                actor=actor,
                at=now,
                detail=services.classified_detail(p.route),
            )
        ]
        for p in plain
    }


def _insert_tickets(plain: list[_Plain], mine: dict[int, tuple[int, str]], now: datetime) -> list[Ticket]:
    """The built-in store's rows, as `BuiltinDestination.create_ticket` writes them (unique key: the intent's)."""
    rows = []
    for p in plain:
        flags = [execution.REUSED_MESSAGE_ID] if p.event.message_id_reused else []
        request = execution.Work(p.event, Intent.Action.CREATE_TICKET, p.parsed, flags=flags).ticket_request(p.adapter)
        key = mine[p.event.pk][1]
        rows.append(
            Ticket(
                destination=p.destination,
                idempotency_key=key,
                external_ref=intents.external_ref(key),
                subject=request.subject[:998],
                requester=request.requester[:320],
                description=request.description,
                tags=list(request.tags),
                queue=request.queue[:100],
                priority=request.priority[:10],
                request_type=request.request_type[:100],
                assignee=request.assignee[:200],
                created_at=now,
            )
        )
    return Ticket.objects.bulk_create(rows)


def _stored(plain: list[_Plain]) -> dict[int, InboxEvent]:
    """The events as normalization stored them (sender, details, auth results): what the acknowledgment reads."""
    stored = {
        e.pk: e
        for e in InboxEvent.objects.filter(pk__in=[p.event.pk for p in plain]).only(
            "pk",
            "tenant_id",
            "mailbox_id",
            "provider_message_id",
            "sender",
            "details",
            "auth_results",
            "route",
            "history",
        )
    }
    for p in plain:
        stored[p.event.pk].mailbox = p.event.mailbox
    return stored

"""Dry run of a routing rule: which stored events of the last N days it would match, and what would change.

Read-only by construction: nothing here saves a row, counts a hit or writes an audit row, and the
whole run happens in a transaction that is rolled back. It works for disabled rules too (test a rule
before enabling it). Each event's stored raw is parsed again (`intake.mime.parse_message`), its facts
built (`ticketing.classification.facts.MessageFacts.from_event`) and the rule's conditions tested
(`ticketing.classification.conditions.matches`). Newest first, at most `MAX_EVENTS` events; events
whose raw was purged are skipped and counted.
"""
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from intake.mime import parse_message
from intake.models import InboxEvent

from .classification.conditions import matches
from .classification.facts import MessageFacts
from .models import RoutingRule

DEFAULT_DAYS = 7
MAX_DAYS = 90
MAX_EVENTS = 500
ROUTE_FIELDS = ("queue", "priority", "request_type", "assignee")


@dataclass
class Change:
    field: str
    current: str
    new: str


@dataclass
class Match:
    event: InboxEvent
    changes: list[Change]


@dataclass
class DryRun:
    rule: RoutingRule
    days: int
    since: object
    scanned: int = 0
    skipped_purged: int = 0
    errors: int = 0
    truncated: bool = False
    matches: list[Match] = field(default_factory=list)


def clamp_days(value, default: int = DEFAULT_DAYS) -> int:
    try:
        days = int(value)
    except (TypeError, ValueError):
        return default
    return max(1, min(MAX_DAYS, days))


def _current(event: InboxEvent) -> dict:
    """The route the event has now: classification's choice, with an operator's override on top."""
    route = event.route or {}
    fields = {name: (spec or {}).get("value", "") if isinstance(spec, dict) else spec
              for name, spec in (route.get("fields") or {}).items()}
    current = {name: str(fields.get(name) or "") for name in ROUTE_FIELDS}
    current["destination_id"] = route.get("destination_id")
    current["sensitive"] = bool(route.get("sensitive"))
    override = event.route_override or {}
    for name in ROUTE_FIELDS:
        if override.get(name):
            current[name] = str(override[name])
    if override.get("destination_id"):
        current["destination_id"] = override["destination_id"]
    return current


def _changes(rule: RoutingRule, event: InboxEvent, destinations: dict) -> list[Change]:
    current = _current(event)
    changes = []
    if rule.destination_id and rule.destination_id != current["destination_id"]:
        changes.append(Change("destination", destinations.get(current["destination_id"], "default"),
                              destinations.get(rule.destination_id, str(rule.destination_id))))
    for name in ROUTE_FIELDS:
        new = getattr(rule, name)
        if new and new != current[name]:
            changes.append(Change(name, current[name], new))
    if rule.sensitive and not current["sensitive"]:
        changes.append(Change("sensitive", "no", "yes"))
    return changes


def dry_run(rule: RoutingRule, days=DEFAULT_DAYS, *, limit: int = MAX_EVENTS) -> DryRun:
    """What `rule` would have done to the tenant's stored events of the last `days` days (writes nothing)."""
    days = clamp_days(days)
    result = DryRun(rule=rule, days=days, since=timezone.now() - timedelta(days=days))
    events = InboxEvent.objects.filter(tenant_id=rule.tenant_id, received_at__gte=result.since)
    if rule.mailbox_id:
        events = events.filter(mailbox_id=rule.mailbox_id)
    destinations = {d.pk: d.slug for d in rule.tenant.destinations.all()}
    with transaction.atomic():  # belt and braces: whatever a dry run might write is rolled back
        try:
            # Streamed (a server-side cursor, a few raws in memory at a time), newest first.
            newest = events.select_related("mailbox").order_by("-received_at", "-pk")[: limit + 1]
            for event in newest.iterator(chunk_size=20):
                if result.scanned == limit:
                    result.truncated = True
                    break
                result.scanned += 1
                if event.raw is None:
                    result.skipped_purged += 1
                    continue
                try:
                    parsed = parse_message(bytes(event.raw), loop_header=settings.MAILROOM_LOOP_HEADER)
                    hit = matches(rule.conditions or {}, MessageFacts.from_event(event, parsed))
                except Exception:  # one odd message must not hide the others
                    result.errors += 1
                    continue
                if hit:
                    event.raw = None  # the page needs none of it
                    result.matches.append(Match(event, _changes(rule, event, destinations)))
        finally:
            transaction.set_rollback(True)
    return result

"""Dry run of a routing rule: which stored events of the last N days it would match, and what would change.

The scan (`dry_run`) is read-only by construction: nothing in it saves a row or counts a hit, and it
runs in a transaction that is rolled back. It works for disabled rules too (test a rule before
enabling it). Each event's stored raw is parsed again (`intake.mime.parse_message`), its facts built
(`ticketing.classification.facts.MessageFacts.from_event`) and the rule's conditions tested
(`ticketing.classification.conditions.matches`): header conditions read the stored raw's header block,
risk conditions (spam score, attachment verdict) what normalization stored in `details`. Newest first,
at most `MAX_EVENTS` events; events whose raw was purged are skipped and counted.

What a filter action would do is listed with the field changes: suppress ("outcome": suppressed with the
rule's reason), tag (the tags added), mark_spam (the spam queue, the tags, no acknowledgment).

A run has a total time budget (`MAILROOM_DRY_RUN_SECONDS`, default 10 s; each message's regular
expressions also keep their own limits): when it is spent the run stops and says "stopped after N of
M messages (time budget)", so a request never holds a web worker for minutes.

A rule whose conditions read the body (`BODY_KEYS`: `body_regex`, `keywords`) tells which stored
messages contain what: `run_dry_run` lets only users with the message-body permission run it, and
writes one `body_searched` audit row per message it searched (after the scan, outside its rollback),
as a body view does.
"""

import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from intake.mime import parse_message
from intake.models import AuditEvent, InboxEvent
from intake.vocabulary import AuditKind

from .classification.conditions import CLASSIFICATION_REGEX_SECONDS, Budget, matches
from .classification.facts import MessageFacts
from .classification.rules import SPAM_QUEUE, SPAM_TAG
from .models import RoutingRule

DEFAULT_DAYS = 7
MAX_DAYS = 90
MAX_EVENTS = 500
ROUTE_FIELDS = ("queue", "priority", "request_type", "assignee")
# Conditions that look into the message body (keywords: the subject or the body).
BODY_KEYS = ("body_regex", "keywords")
# The security role's permission (intake.InboxEvent's Meta), as reconciliation.services.roles names it too.
VIEW_BODY_PERMISSION = "intake.view_message_body"
BODY_DRY_RUN_DENIED = (
    f"this rule searches message bodies ({{keys}}): its dry run needs the message-body "
    f"permission ({VIEW_BODY_PERMISSION}), and every message it searches is audited"
)


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
    total: int = 0  # events in the window, at most MAX_EVENTS: what a full run would scan
    stopped_for_time: bool = False  # the total time budget ran out after `scanned` of `total`
    matches: list[Match] = field(default_factory=list)
    searched_ids: list[int] = field(default_factory=list)  # events whose message was tested (for the audit)

    @property
    def stopped_text(self) -> str:
        return f"stopped after {self.scanned} of {self.total} messages (time budget)" if self.stopped_for_time else ""


def budget_seconds() -> float:
    return float(settings.MAILROOM_DRY_RUN_SECONDS)


def body_keys(conditions) -> list[str]:
    """The conditions of a rule that read the message body ([] when it reads none)."""
    return [key for key in BODY_KEYS if isinstance(conditions, dict) and key in conditions]


def clamp_days(value, default: int = DEFAULT_DAYS) -> int:
    try:
        days = int(value)
    except (TypeError, ValueError):
        return default
    return max(1, min(MAX_DAYS, days))


def _current(event: InboxEvent) -> dict:
    """The route the event has now: classification's choice, with an operator's override on top."""
    route = event.route or {}
    fields = {
        name: (spec or {}).get("value", "") if isinstance(spec, dict) else spec
        for name, spec in (route.get("fields") or {}).items()
    }
    current = {name: str(fields.get(name) or "") for name in ROUTE_FIELDS}
    current["destination_id"] = route.get("destination_id")
    current["sensitive"] = bool(route.get("sensitive"))
    current["tags"] = [str(t) for t in route.get("tags") or []]
    current["action"] = route.get("action") or "route"
    override = event.route_override or {}
    for name in ROUTE_FIELDS:
        if override.get(name):
            current[name] = str(override[name])
    if override.get("destination_id"):
        current["destination_id"] = override["destination_id"]
    return current


def _action_changes(rule: RoutingRule, current: dict) -> list[Change]:
    """What a filter action (suppress, tag, mark_spam) would do on top of the fields (`rules.py`)."""
    tags = ", ".join(current["tags"]) or "—"
    if rule.action == RoutingRule.Action.SUPPRESS:
        return [
            Change(
                "outcome",
                "ticket" if current["action"] != "suppress" else "suppressed",
                f"suppressed: {rule.suppress_reason or 'no reason given'} (replayable)",
            )
        ]
    if rule.action == RoutingRule.Action.TAG:
        added = [t for t in rule.tags or [] if t not in current["tags"]]
        return [Change("tags", tags, "+ " + ", ".join(added))] if added else []
    if rule.action == RoutingRule.Action.MARK_SPAM:
        changes = []
        queue = rule.queue or SPAM_QUEUE
        if queue != current["queue"]:
            changes.append(Change("queue", current["queue"], queue))
        added = [t for t in [SPAM_TAG, *(rule.tags or [])] if t not in current["tags"]]
        if added:
            changes.append(Change("tags", tags, "+ " + ", ".join(added)))
        if current["action"] != "mark_spam":
            changes.append(Change("acknowledgment", "as usual", "none (marked as spam)"))
        return changes
    return []


def _changes(rule: RoutingRule, event: InboxEvent, destinations: dict) -> list[Change]:
    current = _current(event)
    if rule.action in (RoutingRule.Action.SUPPRESS, RoutingRule.Action.TAG):
        return _action_changes(rule, current)  # these set no field and no destination
    changes = []
    if rule.destination_id and rule.destination_id != current["destination_id"]:
        changes.append(
            Change(
                "destination",
                destinations.get(current["destination_id"], "default"),
                destinations.get(rule.destination_id, str(rule.destination_id)),
            )
        )
    for name in ROUTE_FIELDS:
        new = getattr(rule, name)
        if new and new != current[name]:
            changes.append(Change(name, current[name], new))
    if rule.sensitive and not current["sensitive"]:
        changes.append(Change("sensitive", "no", "yes"))
    return [*changes, *_action_changes(rule, current)]


def dry_run(rule: RoutingRule, days=DEFAULT_DAYS, *, limit: int = MAX_EVENTS, seconds: float | None = None) -> DryRun:
    """What `rule` would have done to the tenant's stored events of the last `days` days (writes nothing).

    Stops when `seconds` (default `budget_seconds()`) have passed, with `stopped_for_time` set. No permission
    check and no audit: callers acting for a person use `run_dry_run`.
    """
    days = clamp_days(days)
    deadline = time.monotonic() + (budget_seconds() if seconds is None else seconds)
    result = DryRun(rule=rule, days=days, since=timezone.now() - timedelta(days=days))
    events = InboxEvent.objects.filter(tenant_id=rule.tenant_id, received_at__gte=result.since)
    if rule.mailbox_id:
        events = events.filter(mailbox_id=rule.mailbox_id)
    destinations = {d.pk: d.slug for d in rule.tenant.destinations.all()}
    conditions = rule.conditions or {}
    reads_body = bool(body_keys(conditions))
    other_conditions = {k: v for k, v in conditions.items() if k not in BODY_KEYS} if reads_body else conditions
    with transaction.atomic():  # belt and braces: whatever a dry run might write is rolled back
        try:
            result.total = events[:limit].count()
            # Streamed (a server-side cursor, a few raws in memory at a time), newest first.
            newest = events.select_related("mailbox").order_by("-received_at", "-pk")[: limit + 1]
            for event in newest.iterator(chunk_size=20):
                if result.scanned == limit:
                    result.truncated = True
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    result.stopped_for_time = True
                    break
                result.scanned += 1
                if event.raw is None:
                    result.skipped_purged += 1
                    continue
                try:
                    parsed = parse_message(bytes(event.raw), loop_header=settings.MAILROOM_LOOP_HEADER)
                    facts = MessageFacts.from_event(event, parsed)
                    # Each message's regex time, and never past the run's own deadline.
                    budget = Budget(seconds=min(CLASSIFICATION_REGEX_SECONDS, left))
                    # The body is searched (and audited) only for a message the other conditions let through.
                    hit = matches(other_conditions, facts, budget)
                    if hit and reads_body:
                        result.searched_ids.append(event.pk)
                        hit = matches(conditions, facts, budget)
                except Exception:  # one odd message must not hide the others
                    result.errors += 1
                    continue
                if hit:
                    event.raw = None  # the page needs none of it
                    result.matches.append(Match(event, _changes(rule, event, destinations)))
        finally:
            transaction.set_rollback(True)
    return result


def run_dry_run(*, user, rule: RoutingRule, days=DEFAULT_DAYS, limit: int = MAX_EVENTS) -> DryRun:
    """`dry_run` for a person: a rule that reads bodies needs their body permission (PermissionDenied, a 403,
    otherwise) and leaves a `body_searched` audit row on every message it searched, naming them."""
    keys = body_keys(rule.conditions)
    if keys and not (user is not None and user.is_active and user.has_perm(VIEW_BODY_PERMISSION)):
        raise PermissionDenied(BODY_DRY_RUN_DENIED.format(keys=", ".join(keys)))
    result = dry_run(rule, days, limit=limit)
    if keys and result.searched_ids:
        matched = {m.event.pk for m in result.matches}
        now, actor = timezone.now(), f"user:{user.get_username()}"
        AuditEvent.objects.bulk_create(
            [
                AuditEvent(
                    inbox_event_id=event_id,
                    kind=AuditKind.BODY_SEARCHED,
                    actor=actor,
                    at=now,
                    detail={"rule": rule.pk, "conditions": keys, "matched": event_id in matched},
                )
                for event_id in result.searched_ids
            ]
        )
    return result

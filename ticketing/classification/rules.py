"""The tenant's routing rules, tried in order (`RoutingRule.position`, then id).

Only enabled rules count, and a rule with a mailbox only for that mailbox's mail. The first rule
that matches sets its fields (destination, queue, priority, request_type, assignee, sensitive); with
`stop_processing` off, later matching rules may fill fields that are still empty (never overwrite
one), and any of them may add `sensitive` (none removes it). A matching rule with
`stop_processing` on ends the evaluation.

Actions (`RoutingRule.action`) other than `route`:
- `tag`: adds its `tags` (and `sensitive`, if set) and never ends the evaluation, whatever its
  `stop_processing`; it sets no field and no destination.
- `suppress`: the first matching one ends the evaluation; the event is suppressed (`rule_suppressed`,
  with the rule's name and `suppress_reason`) instead of becoming a ticket (`ticketing.services`).
- `mark_spam`: ends the evaluation; the ticket goes to the spam queue (the rule's `queue`, else
  `SPAM_QUEUE`, replacing a queue an earlier rule filled), is tagged `spam` (and the rule's tags), and
  is never acknowledged (`ticketing.acknowledgments`). Its `destination`, if set, is used like a route's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from django.db.models import F, Q
from django.utils import timezone

from intake import groupcache

from ..models import RoutingRule
from .conditions import Budget, matches
from .facts import MessageFacts

RULE_FIELDS = ("queue", "priority", "request_type", "assignee")
SPAM_QUEUE = "spam"
SPAM_TAG = "spam"
MAX_TAGS = 20
TAG_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,50}")
Action = RoutingRule.Action


@dataclass
class RuleOutcome:
    fields: dict = field(default_factory=dict)  # name -> (value, rule id)
    destination_id: int | None = None
    destination_rule: int | None = None
    sensitive_rule: int | None = None
    matched: list = field(default_factory=list)  # rule ids, in order
    tags: list = field(default_factory=list)  # from tag and mark_spam rules, in order, each once
    suppressed_by: RoutingRule | None = None  # the suppress rule that matched
    spam_rule: int | None = None  # the mark_spam rule that matched

    def add_tags(self, tags) -> None:
        for tag in tags or ():
            tag = str(tag).strip()
            if tag and tag not in self.tags and len(self.tags) < MAX_TAGS:
                self.tags.append(tag)


def rules_for(tenant_id: int, mailbox_id: int | None) -> list[RoutingRule]:
    """The enabled rules for the mailbox, in order; read once per task group (`intake.groupcache`)."""
    return groupcache.remembered(("rules", tenant_id, mailbox_id), lambda: _read_rules(tenant_id, mailbox_id))


def _read_rules(tenant_id: int, mailbox_id: int | None) -> list[RoutingRule]:
    return list(
        RoutingRule.objects.filter(tenant_id=tenant_id, enabled=True)
        .filter(Q(mailbox__isnull=True) | Q(mailbox_id=mailbox_id))
        .order_by("position", "pk")
    )


def evaluate(rules: list[RoutingRule], facts: MessageFacts, budget: Budget | None = None) -> RuleOutcome:
    budget = budget or Budget()
    outcome = RuleOutcome()
    for rule in rules:
        if not matches(rule.conditions, facts, budget, label=f"rule {rule.pk}: "):
            continue
        outcome.matched.append(rule.pk)
        action = rule.action or Action.ROUTE
        if rule.sensitive and outcome.sensitive_rule is None:
            outcome.sensitive_rule = rule.pk
        if action == Action.TAG:
            outcome.add_tags(rule.tags)
            continue
        if action == Action.SUPPRESS:
            outcome.suppressed_by = rule
            break
        if action == Action.MARK_SPAM:
            outcome.spam_rule = rule.pk
            outcome.fields["queue"] = (rule.queue or SPAM_QUEUE, rule.pk)
            outcome.add_tags([SPAM_TAG, *(rule.tags or [])])
        for name in RULE_FIELDS:
            value = getattr(rule, name)
            if value and name not in outcome.fields:
                outcome.fields[name] = (value, rule.pk)
        if rule.destination_id and outcome.destination_id is None:
            outcome.destination_id, outcome.destination_rule = rule.destination_id, rule.pk
        if rule.stop_processing or action == Action.MARK_SPAM:
            break
    return outcome


def record_hits(rule_ids, now=None) -> None:
    """One UPDATE per matched rule; call in the transaction that stores the route."""
    now = now or timezone.now()
    for rule_id in rule_ids:
        RoutingRule.objects.filter(pk=rule_id).update(hits=F("hits") + 1, last_hit_at=now)


def clean_tags(value) -> list[str]:
    """A rule's tags as stored: a list of strings, or "a, b" as typed; each once, stripped."""
    items = value.replace("\n", ",").split(",") if isinstance(value, str) else list(value or [])
    result = []
    for item in items:
        item = str(item).strip()
        if item and item not in result:
            result.append(item)
    return result


def action_errors(*, action: str, tags, suppress_reason: str, fields: dict) -> dict[str, str]:
    """{field: message} for an action that cannot work as configured ({} when it can). `fields`: the rule's
    destination, queue, priority, request_type and assignee (empty values for none)."""
    action = action or Action.ROUTE
    errors = {}
    if action not in Action.values:
        return {"action": f"action must be one of {', '.join(Action.values)}"}
    if not isinstance(tags, (list, tuple)):
        return {"tags": "Tags must be a list of words."}
    bad = [t for t in tags or [] if not isinstance(t, str) or not TAG_PATTERN.fullmatch(t)]
    if bad:
        errors["tags"] = f"Not a tag (letters, digits, - and _, at most 50 characters): {', '.join(map(str, bad))}"
    elif len(tags or []) > MAX_TAGS:
        errors["tags"] = f"At most {MAX_TAGS} tags."
    if action == Action.TAG and not tags:
        errors["tags"] = "A tag rule needs at least one tag."
    if action not in (Action.TAG, Action.MARK_SPAM) and tags:
        errors["tags"] = "Tags are added by the tag and mark_spam actions only."
    if action == Action.SUPPRESS and not (suppress_reason or "").strip():
        errors["suppress_reason"] = "A suppress rule needs the reason the console shows for the mail it suppresses."
    if action != Action.SUPPRESS and (suppress_reason or "").strip():
        errors["suppress_reason"] = "Only a suppress rule has a suppression reason."
    if action in (Action.SUPPRESS, Action.TAG):
        for name, value in fields.items():
            if value:
                errors[name] = f"A {action} rule sets no {name}: it would be ignored."
    return errors

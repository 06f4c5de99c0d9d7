"""The tenant's routing rules, tried in order (`RoutingRule.position`, then id).

Only enabled rules count, and a rule with a mailbox only for that mailbox's mail. The first rule
that matches sets its fields (destination, queue, priority, request_type, assignee, sensitive); with
`stop_processing` off, later matching rules may fill fields that are still empty (never overwrite
one), and any of them may add `sensitive` (none removes it). A matching rule with
`stop_processing` on ends the evaluation.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import F, Q
from django.utils import timezone

from ..models import RoutingRule
from .conditions import Budget, matches
from .facts import MessageFacts

RULE_FIELDS = ("queue", "priority", "request_type", "assignee")


@dataclass
class RuleOutcome:
    fields: dict = field(default_factory=dict)      # name -> (value, rule id)
    destination_id: int | None = None
    destination_rule: int | None = None
    sensitive_rule: int | None = None
    matched: list = field(default_factory=list)     # rule ids, in order


def rules_for(tenant_id: int, mailbox_id: int | None) -> list[RoutingRule]:
    return list(RoutingRule.objects.filter(tenant_id=tenant_id, enabled=True)
                .filter(Q(mailbox__isnull=True) | Q(mailbox_id=mailbox_id)).order_by("position", "pk"))


def evaluate(rules: list[RoutingRule], facts: MessageFacts, budget: Budget | None = None) -> RuleOutcome:
    budget = budget or Budget()
    outcome = RuleOutcome()
    for rule in rules:
        if not matches(rule.conditions, facts, budget, label=f"rule {rule.pk}: "):
            continue
        outcome.matched.append(rule.pk)
        for name in RULE_FIELDS:
            value = getattr(rule, name)
            if value and name not in outcome.fields:
                outcome.fields[name] = (value, rule.pk)
        if rule.destination_id and outcome.destination_id is None:
            outcome.destination_id, outcome.destination_rule = rule.destination_id, rule.pk
        if rule.sensitive and outcome.sensitive_rule is None:
            outcome.sensitive_rule = rule.pk
        if rule.stop_processing:
            break
    return outcome


def record_hits(rule_ids, now=None) -> None:
    """One UPDATE per matched rule; call in the transaction that stores the route."""
    now = now or timezone.now()
    for rule_id in rule_ids:
        RoutingRule.objects.filter(pk=rule_id).update(hits=F("hits") + 1, last_hit_at=now)

"""Classification: which queue, priority, request type and assignee a new ticket gets, where it goes,
and whether it needs approval. Runs once per event (before its ticket is created; replies that
become comments are not classified); the result is stored in `InboxEvent.route` and every attempt
builds its ticket from that stored route, so every retry sends the same body.

    classify(event, parsed) -> Route         Route.as_json() / Route.from_json(event.route)
    ticket_fields(route_json, route_override) -> dict   what the ticket gets (the operator's word wins)

Order, per field (queue, priority, request_type, assignee):
1. rules (`rules.py`; conditions in `conditions.py`), origin "rule:<id>";
2. the AI proposer, only if `RoutingPolicy.ai_enabled` and some of queue/priority/request_type are
   still open, only for those fields, origin "ai";
3. the policy's defaults (`default_queue`, `default_priority`, `default_request_type`), origin "default";
4. at ticket time an operator's `InboxEvent.route_override` (queue, priority, request_type, assignee,
   destination_id) overrides all of them ("operator:<name>" is the origin the console records).
The destination: the operator's > the first matching rule's > the tenant default (`destination_id` None).
A value outside the policy's vocabulary (a queue not in a non-empty `policy.queues`, ...) is kept
and flagged `not_in_vocabulary`.

Sensitive: a matching rule marked `sensitive`, or a request type in `policy.sensitive_request_types`.
The ticket is then tagged `needs-approval`. Nothing in the mail and nothing the AI says can clear it:
the AI's answer is read for field values only.

Actions (`rules.py`): `Route.action` is "route", "suppress" (then `Route.suppressed` names the rule, its
name and `suppress_reason`; `ticketing.services` suppresses the event with `rule_suppressed` unless an
operator sent it on) or "mark_spam" (queue `rules.SPAM_QUEUE` or the rule's, never flagged as outside the
vocabulary; tag `spam`; `ticketing.acknowledgments` skips it with `marked_spam`). `Route.tags` (tag and
mark_spam rules) travel to the ticket with `mailroom` and `needs-approval` (`ticket_fields`).

The AI proposer contract (`ticketing.classification.ai`, another module):

    propose(facts: MessageFacts, policy: RoutingPolicy, open_fields: tuple[str, ...]) -> Proposal

    Proposal.fields      dict {field name: value} of accepted values, already validated against the
                         policy's vocabulary (queues, request_types, PRIORITIES); only `open_fields`
    Proposal.confidence  float in [0, 1], or None when the model gave none
    Proposal.rationale   str, short, for the console
    Proposal.failure     "" or a reason code (timeout, unparseable answer, ...): then no fields
    Proposal.raw_ok      bool: the model's raw answer was well-formed

It must not raise (an exception is recorded as failure "ai_error"); a missing module or function is
failure "ai_unavailable". Below `policy.ai_min_confidence` (or without a confidence) the proposal is
not applied: the route keeps it under `ai` and says `review_reason = "low_confidence"`, and the
worker sends the event to review (awaiting_review/low_confidence). Here its fields are checked again
(open fields only, within the vocabulary); anything else it returns is ignored.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field

from ..models import PRIORITIES, RoutingPolicy
from . import rules as rules_module
from .conditions import Budget
from .facts import MessageFacts

logger = logging.getLogger(__name__)

__all__ = [
    "FIELDS",
    "LOW_CONFIDENCE",
    "MARK_SPAM",
    "NEEDS_APPROVAL",
    "SUPPRESS",
    "MessageFacts",
    "Route",
    "classify",
    "suppression_text",
    "ticket_fields",
]

FIELDS = ("queue", "priority", "request_type", "assignee")
AI_FIELDS = ("queue", "priority", "request_type")
NEEDS_APPROVAL = "needs-approval"
LOW_CONFIDENCE = "low_confidence"
NOT_IN_VOCABULARY = "not_in_vocabulary"
AI_MODULE = "ticketing.classification.ai"
MAX_RATIONALE_CHARS = 1000
ROUTE, SUPPRESS, MARK_SPAM = "route", "suppress", "mark_spam"  # Route.action


@dataclass
class FieldChoice:
    value: str = ""
    origin: str = ""  # "rule:<id>", "ai", "default", "operator:<name>"; "" while open
    flag: str = ""  # "not_in_vocabulary"

    def as_json(self) -> dict:
        data = {"value": self.value, "origin": self.origin}
        if self.flag:
            data["flag"] = self.flag
        return data


@dataclass
class Route:
    fields: dict = field(default_factory=lambda: {name: FieldChoice() for name in FIELDS})
    destination_id: int | None = None  # None: the tenant default
    destination_origin: str = "default"
    sensitive: bool = False
    sensitive_reason: str = ""  # "rule:<id>" or "request_type:<slug>"
    sensitive_request_types: list = field(default_factory=list)  # the policy's, when classified
    rules: list = field(default_factory=list)  # matched rule ids, in order
    ai: dict = field(default_factory=lambda: {"status": "disabled"})
    review_reason: str = ""  # "low_confidence"
    notes: list = field(default_factory=list)  # regex timeouts and the like
    action: str = ROUTE  # route, suppress or mark_spam
    tags: list = field(default_factory=list)  # tag and mark_spam rules' tags
    suppressed: dict = field(default_factory=dict)  # {"rule", "name", "reason"} when suppress

    def value(self, name: str) -> str:
        return self.fields[name].value

    def as_json(self) -> dict:
        return {
            "fields": {name: choice.as_json() for name, choice in self.fields.items()},
            "destination_id": self.destination_id,
            "destination_origin": self.destination_origin,
            "sensitive": self.sensitive,
            "sensitive_reason": self.sensitive_reason,
            "sensitive_request_types": list(self.sensitive_request_types),
            "rules": list(self.rules),
            "ai": dict(self.ai),
            "review_reason": self.review_reason,
            "notes": list(self.notes),
            "action": self.action,
            "tags": list(self.tags),
            "suppressed": dict(self.suppressed),
        }

    @classmethod
    def from_json(cls, data: dict | None) -> Route:
        data = data or {}
        stored = data.get("fields") or {}
        fields = {}
        for name in FIELDS:
            entry = stored.get(name) or {}
            fields[name] = FieldChoice(
                str(entry.get("value") or ""), str(entry.get("origin") or ""), str(entry.get("flag") or "")
            )
        return cls(
            fields=fields,
            destination_id=data.get("destination_id"),
            destination_origin=data.get("destination_origin") or "default",
            sensitive=bool(data.get("sensitive")),
            sensitive_reason=data.get("sensitive_reason") or "",
            sensitive_request_types=list(data.get("sensitive_request_types") or []),
            rules=list(data.get("rules") or []),
            ai=dict(data.get("ai") or {}),
            review_reason=data.get("review_reason") or "",
            notes=list(data.get("notes") or []),
            action=data.get("action") or ROUTE,
            tags=[str(t) for t in data.get("tags") or []],
            suppressed=dict(data.get("suppressed") or {}),
        )


def policy_for(tenant_id: int) -> RoutingPolicy:
    return RoutingPolicy.objects.filter(tenant_id=tenant_id).first() or RoutingPolicy(tenant_id=tenant_id)


def vocabulary(policy: RoutingPolicy, name: str) -> list:
    """The allowed values of a field ([]: any value)."""
    return {
        "queue": list(policy.queues or []),
        "request_type": list(policy.request_types or []),
        "priority": list(PRIORITIES),
    }.get(name, [])


def _in_vocabulary(policy: RoutingPolicy, name: str, value: str) -> bool:
    allowed = vocabulary(policy, name)
    return not allowed or value in allowed


def classify(event, parsed, policy: RoutingPolicy | None = None, budget: Budget | None = None) -> Route:
    """The route for a new ticket from this event: rules, then the AI for open fields, then defaults."""
    policy = policy or policy_for(event.tenant_id)
    budget = budget or Budget()
    facts = MessageFacts.from_event(event, parsed)
    route = Route(sensitive_request_types=list(policy.sensitive_request_types or []))

    outcome = rules_module.evaluate(rules_module.rules_for(event.tenant_id, event.mailbox_id), facts, budget)
    route.rules = outcome.matched
    for name, (value, rule_id) in outcome.fields.items():
        route.fields[name] = FieldChoice(value, f"rule:{rule_id}")
    if outcome.destination_id is not None:
        route.destination_id, route.destination_origin = outcome.destination_id, f"rule:{outcome.destination_rule}"
    if outcome.sensitive_rule is not None:
        route.sensitive, route.sensitive_reason = True, f"rule:{outcome.sensitive_rule}"
    route.tags = list(outcome.tags)
    if outcome.suppressed_by is not None:
        rule = outcome.suppressed_by
        route.action = SUPPRESS
        route.suppressed = {"rule": rule.pk, "name": rule.name, "reason": rule.suppress_reason}
    elif outcome.spam_rule is not None:
        route.action = MARK_SPAM

    open_fields = tuple(name for name in AI_FIELDS if not route.fields[name].value)
    if route.action == SUPPRESS:
        route.ai = {"status": "not_needed"}  # no ticket is made: nothing to ask
    elif not policy.ai_enabled:
        route.ai = {"status": "disabled"}
    elif not open_fields:
        route.ai = {"status": "not_needed"}
    else:
        _ask_ai(route, facts, policy, open_fields)

    defaults = {
        "queue": policy.default_queue,
        "priority": policy.default_priority,
        "request_type": policy.default_request_type,
    }
    for name, value in defaults.items():
        if value and not route.fields[name].value:
            route.fields[name] = FieldChoice(value, "default")
    for name, choice in route.fields.items():
        spam_queue = name == "queue" and route.action == MARK_SPAM and choice.origin == f"rule:{outcome.spam_rule}"
        if choice.value and not spam_queue and not _in_vocabulary(policy, name, choice.value):
            choice.flag = NOT_IN_VOCABULARY

    request_type = route.value("request_type")
    if request_type and request_type in route.sensitive_request_types and not route.sensitive:
        route.sensitive, route.sensitive_reason = True, f"request_type:{request_type}"
    route.notes = list(budget.notes)
    return route


def _ask_ai(route: Route, facts: MessageFacts, policy: RoutingPolicy, open_fields: tuple) -> None:
    try:
        propose = getattr(importlib.import_module(AI_MODULE), "propose", None)
    except ImportError:
        propose = None
    if propose is None:
        route.ai = {"status": "failed", "failure": "ai_unavailable", "fields": {}}
        return
    try:
        proposal = propose(facts, policy, open_fields)
    except Exception:  # the proposer must not raise; if it does, the mail still goes on
        logger.exception("classification: the AI proposer raised")
        route.ai = {"status": "failed", "failure": "ai_error", "fields": {}}
        return
    failure = str(getattr(proposal, "failure", "") or "")
    confidence = getattr(proposal, "confidence", None)
    confidence = float(confidence) if isinstance(confidence, (int, float)) else None
    proposed = getattr(proposal, "fields", None) or {}
    # Only open fields, only string values within the vocabulary: nothing else the answer says counts.
    accepted = (
        {
            name: value
            for name, value in proposed.items()
            if name in open_fields and isinstance(value, str) and value and _in_vocabulary(policy, name, value)
        }
        if isinstance(proposed, dict) and not failure
        else {}
    )
    route.ai = {
        "fields": accepted,
        "confidence": confidence,
        "rationale": str(getattr(proposal, "rationale", "") or "")[:MAX_RATIONALE_CHARS],
        "failure": failure,
        "raw_ok": bool(getattr(proposal, "raw_ok", False)),
        "min_confidence": policy.ai_min_confidence,
    }
    if failure:
        route.ai["status"] = "failed"
    elif not accepted:
        route.ai["status"] = "no_proposal"
    elif confidence is None or confidence < policy.ai_min_confidence:
        route.ai["status"] = LOW_CONFIDENCE
        route.review_reason = LOW_CONFIDENCE
    else:
        route.ai["status"] = "applied"
        for name, value in accepted.items():
            route.fields[name] = FieldChoice(value, "ai")


def suppression_text(route_json: dict | None) -> str:
    """What the console shows for an event a rule suppressed: the rule's name and its reason."""
    suppressed = (route_json or {}).get("suppressed") or {}
    text = f"suppressed by rule {suppressed.get('rule')} “{suppressed.get('name', '')}”"
    return f"{text}: {suppressed['reason']}" if suppressed.get("reason") else text


def ticket_fields(route_json: dict | None, route_override: dict | None) -> dict:
    """What the ticket gets: {queue, priority, request_type, assignee, sensitive, tags}.

    The operator's `route_override` values win over the stored route. Deterministic (built only from
    stored JSON), so every attempt sends the same body. An override may make a ticket sensitive (its
    request type is one of the policy's sensitive types when classified), never clear `sensitive`.
    """
    route = Route.from_json(route_json)
    override = route_override or {}
    values = {name: str(override.get(name) or route.value(name)) for name in FIELDS}
    sensitive = route.sensitive or (
        bool(values["request_type"]) and values["request_type"] in route.sensitive_request_types
    )
    return {**values, "sensitive": sensitive, "tags": list(route.tags)}

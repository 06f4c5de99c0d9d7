"""Stored details in words for the console: an audit row's detail, a route and its origins.

One renderer, so no page shows a Python dict or list repr: a detail becomes "label: value" lines, nested
objects become dotted labels ("fields.queue: billing"), lists are joined, None/True/False are words, long
strings are cut. A route (`InboxEvent.route`, an override, a `classified` row's detail) is read as its
fields, each with where it came from: "set by rule 3 (refunds)", "proposed by the AI", "the policy's
default", "corrected by olga".
"""

import re
from dataclasses import dataclass

from django.utils.dateparse import parse_datetime

from intake.vocabulary import actor_words

from . import times

MAX_VALUE_CHARS = 300
MAX_LINES = 40
ROUTE_FIELDS = ("queue", "priority", "request_type", "assignee")
ISO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?([+-]\d{2}:\d{2}|Z)?")
DESTINATION_KEYS = ("destination", "previous_destination", "destination_id")  # ids, shown by their slug


def label(key: str) -> str:
    return str(key).replace("_", " ")


def value_words(value) -> str:
    """A scalar, a list or an object as words (never a repr)."""
    if value is None or value == "":
        return "—"
    if value is True:
        return "yes"
    if value is False:
        return "no"
    if isinstance(value, dict):
        return "; ".join(f"{label(k)}: {value_words(v)}" for k, v in value.items()) or "—"
    if isinstance(value, list | tuple | set):
        return ", ".join(value_words(v) for v in value) or "none"
    text = str(value)
    if ISO_TIME.fullmatch(text):  # a stored time (escalate_at, at): in the console's one format
        parsed = parse_datetime(text)
        if parsed is not None and parsed.tzinfo is not None:
            return times.absolute(parsed)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def origin_words(origin: str, rule_names: dict | None = None) -> str:
    """Where a route field's value came from."""
    origin = str(origin or "")
    kind, _, rest = origin.partition(":")
    if kind == "rule":
        name = (rule_names or {}).get(rest) or (rule_names or {}).get(int(rest) if rest.isdigit() else rest)
        return f"set by rule {rest}" + (f" ({name})" if name else "")
    if kind == "operator":
        return f"corrected by {rest or 'an operator'}"
    if origin == "ai":
        return "proposed by the AI"
    if origin == "default":
        return "the policy's default"
    if origin == "":
        return "not set"
    return value_words(origin)


def route_lines(route: dict | None, rule_names: dict | None = None, destination_names: dict | None = None) -> list[str]:
    """A stored route (or an operator's override) in lines of words."""
    route = route or {}
    lines = []
    fields = route.get("fields") if isinstance(route.get("fields"), dict) else {}
    for name in ROUTE_FIELDS:
        entry = fields.get(name)
        if isinstance(entry, dict) and entry.get("value"):
            where = origin_words(entry.get("origin"), rule_names)
            lines.append(f"{label(name)}: {value_words(entry['value'])} ({where})")
        elif name in route and route[name]:  # an override names the fields directly
            lines.append(f"{label(name)}: {value_words(route[name])}")
    if "destination_id" in route:
        destination = route.get("destination_id")
        if destination:
            named = (destination_names or {}).get(destination)
            where = (
                origin_words(route.get("destination_origin", ""), rule_names)
                if "destination_origin" in route
                else "corrected"
            )
            lines.append(f"destination: {named or f'#{destination}'} ({where})")
        elif "destination_origin" in route:
            lines.append("destination: the tenant's default")
    if route.get("sensitive"):
        lines.append(f"needs approval: yes ({value_words(route.get('sensitive_reason'))})")
    if route.get("rules"):
        lines.append(f"rules matched: {value_words(route['rules'])}")
    ai = route.get("ai")
    if isinstance(ai, dict) and ai.get("status") and ai.get("status") != "disabled":
        lines.append(f"AI: {value_words({k: v for k, v in ai.items() if k != 'rationale'})}")
    if route.get("review_reason"):
        lines.append(f"review: {value_words(route['review_reason'])}")
    if route.get("notes"):
        lines.append(f"notes: {value_words(route['notes'])}")
    return lines


def is_route(detail) -> bool:
    return isinstance(detail, dict) and isinstance(detail.get("fields"), dict) and "destination_origin" in detail


def is_changes(value) -> bool:
    """{field: {"from", "to"}}: the `corrected` of a replay's audit row."""
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(v, dict) and set(v) <= {"from", "to"} for v in value.values())
    )


def change_words(changes: dict, destination_names: dict | None = None) -> str:
    """ "priority normal → high; destination desk-bad → desk" """
    names = destination_names or {}

    def shown(name, value):
        named = names.get(value) if name in DESTINATION_KEYS and isinstance(value, int) else None
        return value_words(named or value)

    return "; ".join(
        f"{label(name).removesuffix(' id')} {shown(name, v.get('from'))} → {shown(name, v.get('to'))}"
        for name, v in changes.items()
    )


def detail_lines(detail, rule_names: dict | None = None, destination_names: dict | None = None) -> list[str]:
    """An audit row's detail in lines of words; a route inside it (classified, a correction) read as a route."""
    if not isinstance(detail, dict):
        return [] if detail in (None, "", [], {}) else [value_words(detail)]
    if is_route(detail):
        return route_lines(detail, rule_names, destination_names)
    lines: list[str] = []
    for key, value in detail.items():
        if key in DESTINATION_KEYS and isinstance(value, int) and value in (destination_names or {}):
            lines.append(f"{label(key)}: {destination_names[value]}")
        elif key == "corrected" and is_changes(value):
            lines.append(f"corrected: {change_words(value, destination_names)}")
        elif is_route(value) or (key in ("route", "override", "route_override") and isinstance(value, dict)):
            lines += [f"{label(key)} — {line}" for line in route_lines(value, rule_names, destination_names)]
        elif isinstance(value, dict) and value:
            lines += [f"{label(key)}.{line}" for line in detail_lines(value, rule_names, destination_names)]
        else:
            lines.append(f"{label(key)}: {value_words(value)}")
        if len(lines) >= MAX_LINES:
            return lines[:MAX_LINES] + ["…"]
    return lines


@dataclass(frozen=True)
class TimelineRow:
    """One audit row as the item page shows it."""

    at: object
    kind: str
    kind_label: str
    actor: str
    lines: list

    @property
    def actor_words(self) -> str:
        return actor_words(self.actor)


def timeline_rows(
    audits, *, kind_labels: dict, rule_names: dict | None = None, destination_names: dict | None = None
) -> list[TimelineRow]:
    return [
        TimelineRow(
            at=a.at,
            kind=a.kind,
            kind_label=kind_labels.get(a.kind, label(a.kind)),
            actor=a.actor,
            lines=detail_lines(a.detail, rule_names, destination_names),
        )
        for a in audits
    ]


# --- the effective route: what the next attempt sends ---------------------------------------------

EFFECTIVE_FIELDS = ("queue", "priority", "request_type")
CORRECTING_KINDS = ("replayed", "replayed_as_new_action")  # AuditKind values whose detail carries a route


@dataclass(frozen=True)
class RouteField:
    """One field of the effective route, in words: "priority", "high", "corrected by olga"."""

    name: str
    label: str
    value: str
    origin: str


def corrected_by(audits) -> str:
    """Who stored the item's current corrected route: the latest replay row with a route (a "linked" replay
    stores none), without the "user:" prefix; "" when nobody corrected it."""
    latest = None
    for row in audits:
        detail = row.detail if isinstance(row.detail, dict) else {}
        if row.kind in CORRECTING_KINDS and detail.get("route") and detail.get("outcome") != "linked":
            if latest is None or (row.at, row.pk or 0) >= (latest.at, latest.pk or 0):
                latest = row
    return str(latest.actor).removeprefix("user:") if latest is not None else ""


def _destination(
    route: dict, override: dict, intent_destination_id, default_destination_id, who: str, rule_names: dict | None
) -> tuple[object, str]:
    """(destination id, its origin in words) as the next attempt goes: an intent keeps its destination
    (a correction moved it there); without one, routing takes the override, a rule's, or the default."""
    chosen = (
        intent_destination_id or override.get("destination_id") or route.get("destination_id") or default_destination_id
    )
    if chosen is None:
        return None, "the tenant has no default destination"
    if override.get("destination_id") == chosen:
        return chosen, who
    if route.get("destination_id") == chosen and str(route.get("destination_origin", "")).startswith("rule:"):
        return chosen, origin_words(route["destination_origin"], rule_names)
    if chosen == default_destination_id:
        return chosen, "the tenant's default"
    return chosen, "where its last attempt went"


def effective_route(
    route: dict | None,
    override: dict | None,
    *,
    intent_destination_id=None,
    default_destination_id=None,
    corrected_by_name: str = "",
    rule_names: dict | None = None,
    destination_names: dict | None = None,
) -> list[RouteField]:
    """The route the next attempt uses (destination, queue, priority, request type, and the assignee and
    approval flag when set), each with where its value came from. The override wins field by field, as
    `ticketing.classification.ticket_fields` has it."""
    route = route if isinstance(route, dict) else {}
    override = override if isinstance(override, dict) else {}
    who = f"corrected by {corrected_by_name}" if corrected_by_name else "corrected by an operator"
    destination, where = _destination(route, override, intent_destination_id, default_destination_id, who, rule_names)
    named = (destination_names or {}).get(destination) if destination is not None else None
    out = [RouteField("destination", "destination", named or (f"#{destination}" if destination else "—"), where)]
    fields = route.get("fields") if isinstance(route.get("fields"), dict) else {}
    for name in (*EFFECTIVE_FIELDS, "assignee"):
        entry = fields.get(name) if isinstance(fields.get(name), dict) else {}
        if override.get(name):
            out.append(RouteField(name, label(name), value_words(override[name]), who))
        elif entry.get("value"):
            out.append(
                RouteField(
                    name, label(name), value_words(entry["value"]), origin_words(entry.get("origin"), rule_names)
                )
            )
        elif name != "assignee":
            out.append(RouteField(name, label(name), "—", "not set: the destination's default"))
    request_type = override.get("request_type") or (fields.get("request_type") or {}).get("value") or ""
    sensitive_reason = str(route.get("sensitive_reason") or "")
    if not route.get("sensitive") and request_type and request_type in (route.get("sensitive_request_types") or []):
        sensitive_reason = f"request_type:{request_type}"
    if route.get("sensitive") or sensitive_reason.startswith("request_type:"):
        kind, _, rest = sensitive_reason.partition(":")
        why = (
            f"its request type {rest} is sensitive"
            if kind == "request_type"
            else origin_words(sensitive_reason, rule_names)
        )
        out.append(RouteField("needs_approval", "needs approval", "yes", why))
    return out


def route_changes(before: list[RouteField], after: list[RouteField]) -> str:
    """What a correction changed, in words: "priority normal → high; destination kept (fakedesk)"."""
    old = {f.name: f.value for f in before}
    parts, kept = [], ""
    for field_ in after:
        was = old.get(field_.name, "—")
        if field_.name == "destination":
            kept = (
                f"destination kept ({field_.value})" if was == field_.value else f"destination {was} → {field_.value}"
            )
        elif was != field_.value:
            parts.append(
                f"{field_.label} {'not set' if was == '—' else was} → "
                f"{'not set' if field_.value == '—' else field_.value}"
            )
    return "; ".join([*parts, kept] if parts else ["no field changed", kept])

"""Stored details in words for the console: an audit row's detail, a route and its origins.

One renderer, so no page shows a Python dict or list repr: a detail becomes "label: value" lines, nested
objects become dotted labels ("fields.queue: billing"), lists are joined, None/True/False are words, long
strings are cut. A route (`InboxEvent.route`, an override, a `classified` row's detail) is read as its
fields, each with where it came from: "set by rule 3 (refunds)", "proposed by the AI", "the policy's
default", "corrected by olga".
"""
from dataclasses import dataclass

MAX_VALUE_CHARS = 300
MAX_LINES = 40
ROUTE_FIELDS = ("queue", "priority", "request_type", "assignee")


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
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 1] + "…"


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


def route_lines(route: dict | None, rule_names: dict | None = None, destination_names: dict | None = None
                ) -> list[str]:
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
            where = origin_words(route.get("destination_origin", ""), rule_names) if "destination_origin" in route \
                else "corrected"
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


def detail_lines(detail, rule_names: dict | None = None, destination_names: dict | None = None) -> list[str]:
    """An audit row's detail in lines of words; a route inside it (classified, a correction) read as a route."""
    if not isinstance(detail, dict):
        return [] if detail in (None, "", [], {}) else [value_words(detail)]
    if is_route(detail):
        return route_lines(detail, rule_names, destination_names)
    lines: list[str] = []
    for key, value in detail.items():
        if is_route(value) or (key in ("route", "override", "route_override") and isinstance(value, dict)):
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


def timeline_rows(audits, *, kind_labels: dict, rule_names: dict | None = None,
                  destination_names: dict | None = None) -> list[TimelineRow]:
    return [TimelineRow(at=a.at, kind=a.kind, kind_label=kind_labels.get(a.kind, label(a.kind)), actor=a.actor,
                        lines=detail_lines(a.detail, rule_names, destination_names)) for a in audits]

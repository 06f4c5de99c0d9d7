"""The console's one renderer of stored details: every audit kind's detail and every route origin in words,
never a Python dict or list repr, never None/True/False as text."""

import re
from datetime import UTC, datetime

import pytest

from intake.vocabulary import AuditKind, ReasonCode
from reconciliation.rendering import detail_lines, origin_words, route_lines, timeline_rows
from ticketing.classification import FieldChoice, Route

REPR = re.compile(r"\{'|\['|\bNone\b|\bTrue\b|\bFalse\b|\}\s*$")
ORIGINS = ["rule:3", "ai", "default", "operator:olga", "", "something-new"]


def a_route(origin: str) -> dict:
    route = Route()
    route.fields = {
        name: FieldChoice(value, origin)
        for name, value in (("queue", "billing"), ("priority", "high"), ("request_type", "refund"), ("assignee", ""))
    }
    route.destination_id, route.destination_origin = 7, origin or "default"
    route.sensitive, route.sensitive_reason = True, "rule:3"
    route.rules, route.ai = [3, 5], {"status": "proposed", "confidence": 0.42, "rationale": "secret words"}
    route.notes = ["rule 5: regex timed out"]
    return route.as_json()


def assert_words(lines: list[str]):
    assert lines, "nothing rendered"
    for line in lines:
        assert isinstance(line, str) and not REPR.search(line), line


@pytest.mark.parametrize("origin", ORIGINS)
def test_every_route_origin_reads_as_words(origin):
    lines = route_lines(a_route(origin), rule_names={"3": "refunds"}, destination_names={7: "zendesk-eu"})
    assert_words(lines)
    assert "queue: billing (" + origin_words(origin, {"3": "refunds"}) + ")" in lines
    assert any(line.startswith("destination: zendesk-eu") for line in lines)
    assert not any("secret words" in line for line in lines)  # the AI's rationale stays on its own panel


def test_the_origins_name_who_set_a_value():
    names = {"3": "refunds"}
    assert origin_words("rule:3", names) == "set by rule 3 (refunds)"
    assert origin_words("operator:olga") == "corrected by olga"
    assert origin_words("ai") == "proposed by the AI"
    assert origin_words("default") == "the policy's default"


# Shapes the stored details take: nested objects, lists of objects, nulls, flags, numbers, a route inside.
SHAPES = [
    {"intent": 12, "attempt": 2, "error_kind": "transient", "reason": ReasonCode.RATE_LIMITED, "retry_at": None},
    {
        "outcome": "rerouted",
        "route": a_route("operator:olga"),
        "corrected": {"queue": ["tech", "billing"]},
        "quarantine_unreleased": False,
    },
    {"findings": [{"state": "quarantined", "reason": "malware", "detail": "x.exe: Eicar"}], "flags": ["a", "b"]},
    {"attached": 2, "refused": [], "held": 1, "ticket_id": "41"},
    {"from": {"state": "unknown", "claimed": True}, "nested": {"deeper": {"list": [1, None, {"k": "v"}]}}},
    {},
]


@pytest.mark.parametrize("kind", list(AuditKind))
def test_every_audit_kind_renders_each_detail_shape_in_words(kind):
    class Row:
        at, actor = datetime(2026, 12, 1, tzinfo=UTC), "worker:host:1"

    for shape in SHAPES:
        row = Row()
        row.kind = kind.value
        row.detail = a_route("rule:3") if kind == AuditKind.CLASSIFIED and not shape else shape
        [rendered] = timeline_rows([row], kind_labels=dict(AuditKind.choices), rule_names={"3": "refunds"})
        assert rendered.kind_label == kind.label
        if row.detail:
            assert_words(rendered.lines)
        else:
            assert rendered.lines == []


def test_a_long_value_is_cut_and_a_huge_detail_is_bounded():
    lines = detail_lines({"text": "x" * 5000, **{f"k{i}": i for i in range(100)}})
    assert len(lines[0]) < 400 and lines[0].endswith("…")
    assert len(lines) <= 41


@pytest.mark.parametrize(
    ("stored", "words"),
    [
        ("user:olga", "olga"),
        ("worker:vm:24553", "worker on vm, process 24553"),
        ("worker:mail-1.example.internal:7", "worker on mail-1.example.internal, process 7"),
        ("system:sweep", "Mailroom (sweep)"),
        ("provider:raw", "mail provider (raw)"),
        ("operator", "operator"),
    ],
)
def test_who_did_it_reads_as_words_on_the_timeline(stored, words):
    audit = type(
        "Audit", (), {"at": datetime(2026, 12, 1, tzinfo=UTC), "kind": "replayed", "actor": stored, "detail": {}}
    )()
    row = timeline_rows([audit], kind_labels=dict(AuditKind.choices))[0]
    assert (row.actor, row.actor_words) == (stored, words)

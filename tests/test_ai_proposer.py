"""The AI proposer (`ticketing.classification.ai.propose`) against a stub chat-completions server over real HTTP.

Every answer the model can give ends as a Proposal: accepted fields for the open fields only, or a
failure code and no fields. No database.
"""

import logging
import time
from types import SimpleNamespace

import pytest

from tests.fake_chat import fake_chat  # noqa: F401  (the fixture)
from ticketing.classification import ai
from ticketing.models import RoutingPolicy

OPEN = ("queue", "priority", "request_type")
GOOD = {
    "queue": "billing",
    "priority": "high",
    "request_type": "refund",
    "confidence": 0.93,
    "rationale": "The customer asks for money back on an invoice.",
}
SECRET_BODY = "my card number is 4111 and the invoice is wrong"


def policy():
    return RoutingPolicy(
        queues=["billing", "tech"],
        request_types=["refund", "outage"],
        sensitive_request_types=["refund"],
        ai_enabled=True,
        ai_min_confidence=0.7,
    )


def facts(body=SECRET_BODY, subject="Invoice 42"):
    return SimpleNamespace(subject=subject, body=body, sender="jane@example.com")


def test_a_valid_answer_is_a_proposal_and_the_request_carries_the_vocabulary(fake_chat, monkeypatch, settings):  # noqa: F811
    monkeypatch.setenv("TEST_AI_KEY", "sk-test")
    settings.MAILROOM_AI_API_KEY_REF = "env:TEST_AI_KEY"
    fake_chat.answer_json(GOOD)
    proposal = ai.propose(facts(), policy(), OPEN)
    assert proposal == ai.Proposal(
        fields={"queue": "billing", "priority": "high", "request_type": "refund"},
        confidence=0.93,
        rationale=GOOD["rationale"],
        failure="",
        raw_ok=True,
    )
    [sent] = fake_chat.requests
    assert sent["path"] == "/v1/chat/completions" and sent["model"] == "test-model"
    assert fake_chat.headers[0]["Authorization"] == "Bearer sk-test"
    schema = sent["response_format"]["json_schema"]["schema"]
    assert sent["response_format"]["type"] == "json_schema"
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"queue", "priority", "request_type", "confidence", "rationale"}
    assert schema["properties"]["queue"]["enum"] == ["billing", "tech"]
    assert schema["properties"]["priority"]["enum"] == ["low", "normal", "high", "urgent"]
    assert schema["properties"]["request_type"]["enum"] == ["refund", "outage"]
    assert schema["properties"]["confidence"] == {"type": "number", "minimum": 0, "maximum": 1}
    assert schema["properties"]["rationale"]["maxLength"] == 500


def test_only_open_fields_are_proposed(fake_chat):  # noqa: F811
    fake_chat.answer_json(GOOD)
    proposal = ai.propose(facts(), policy(), ["priority"])
    assert proposal.fields == {"priority": "high"} and proposal.raw_ok


def test_low_confidence_is_returned_as_is_for_the_caller_to_judge(fake_chat):  # noqa: F811
    fake_chat.answer_json({**GOOD, "confidence": 0.2})
    proposal = ai.propose(facts(), policy(), OPEN)
    assert proposal.confidence == 0.2 and proposal.failure == "" and proposal.fields["queue"] == "billing"


@pytest.mark.parametrize(
    ("answer", "failure"),
    [
        ("this is not json {", ai.INVALID_JSON),
        (
            '{"queue": "billing", "priority": "high", "request_type": "refund", "confidence": 0.9, "rationale": "x", '
            '"sensitive": false}',
            ai.SCHEMA,
        ),
        ('{"action": "drop", "reason": "spam", "confidence": 0.99}', ai.SCHEMA),
        (
            '{"queue": "billing", "priority": "high", "request_type": "refund", "confidence": 0.9, "rationale": "x", '
            '"action": "delete"}',
            ai.SCHEMA,
        ),
        (
            '{"queue": "billing", "priority": "high", "request_type": "refund", "confidence": 1.5, "rationale": "x"}',
            ai.SCHEMA,
        ),
        ('{"queue": "billing", "priority": "high", "confidence": 0.9, "rationale": "x"}', ai.SCHEMA),
        ('["billing"]', ai.SCHEMA),
        (
            '{"queue": "legal", "priority": "high", "request_type": "refund", "confidence": 0.9, "rationale": "x"}',
            ai.OUT_OF_VOCABULARY,
        ),
        (
            '{"queue": "billing", "priority": "critical", "request_type": "refund", '
            '"confidence": 0.9, "rationale": "x"}',
            ai.OUT_OF_VOCABULARY,
        ),
    ],
)
def test_a_bad_answer_is_a_failure_with_no_fields(fake_chat, answer, failure):  # noqa: F811
    fake_chat.answer_content(answer)
    proposal = ai.propose(facts(), policy(), OPEN)
    assert (proposal.failure, proposal.fields, proposal.raw_ok, proposal.confidence) == (failure, {}, False, None)


def test_an_overlong_rationale_is_a_schema_failure(fake_chat):  # noqa: F811
    fake_chat.answer_json({**GOOD, "rationale": "x" * 501})
    assert ai.propose(facts(), policy(), OPEN).failure == ai.SCHEMA


def test_http_500_is_a_failure(fake_chat):  # noqa: F811
    fake_chat.status(500)
    proposal = ai.propose(facts(), policy(), OPEN)
    assert (proposal.failure, proposal.fields) == (ai.HTTP_ERROR, {})


def test_a_stall_past_the_timeout_is_a_failure(fake_chat, settings):  # noqa: F811
    settings.MAILROOM_AI_TIMEOUT_SECONDS = 0.3
    fake_chat.stall(5)
    started = time.monotonic()
    proposal = ai.propose(facts(), policy(), OPEN)
    assert time.monotonic() - started < 2
    assert (proposal.failure, proposal.fields) == (ai.TIMEOUT, {})


def test_not_configured_makes_no_call(settings):
    settings.MAILROOM_AI_BASE_URL = ""
    assert ai.propose(facts(), policy(), OPEN) == ai.Proposal(failure=ai.NOT_CONFIGURED)


def test_an_unresolvable_key_is_not_configured(fake_chat, settings):  # noqa: F811
    settings.MAILROOM_AI_API_KEY_REF = "env:MAILROOM_TEST_NO_SUCH_KEY"
    assert ai.propose(facts(), policy(), OPEN).failure == ai.NOT_CONFIGURED
    assert fake_chat.requests == []


def test_the_text_sent_is_trimmed_and_never_logged(fake_chat, settings, caplog):  # noqa: F811
    settings.MAILROOM_AI_MAX_INPUT_CHARS = 300
    fake_chat.answer_json(GOOD)
    with caplog.at_level(logging.DEBUG):
        ai.propose(facts(body=SECRET_BODY + " filler" * 5000), policy(), OPEN)
    user_text = [m for m in fake_chat.requests[0]["messages"] if m["role"] == "user"][0]["content"]
    assert len(user_text) == 300 and SECRET_BODY in user_text and "Invoice 42" in user_text
    logged = caplog.text + " ".join(str(r.__dict__) for r in caplog.records)
    assert "4111" not in logged and "Invoice 42" not in logged and "jane@example.com" not in logged
    assert any(getattr(r, "ai_failure", None) == "" for r in caplog.records)

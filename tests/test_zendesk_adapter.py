"""The Zendesk adapter against FakeDesk over real HTTP: every outcome maps to exactly one failure kind."""

import json
import logging
import socket
import time
from datetime import datetime, timedelta, timezone

import pytest

from intake.http import parse_retry_after
from ticketing.destinations import adapter_for
from ticketing.destinations.base import (
    AmbiguousOutcome,
    CommentRequest,
    PermanentError,
    TicketRequest,
    TransientError,
)
from ticketing.destinations.http import field_errors as _field_errors
from ticketing.destinations.zendesk import ZendeskDestination, ticket_payload
from ticketing.models import Destination

REQUEST = TicketRequest(
    subject="Printer on fire",
    description="The printer on floor 3 is on fire.",
    requester="Jane Doe <jane.doe@example.com>",
    tags=("email", "printer"),
    fields={"priority": "high", "360001": "floor-3"},
)


@pytest.fixture
def zendesk(desk, monkeypatch):
    """Build an adapter for the desk (`desk`: the FakeDesk plugin's fixture) or any URL, with the secret in
    the environment."""
    monkeypatch.setenv("ZD_CREDENTIALS", f"agent@example.com/token:{desk.token}")

    def build(base_url=None, credentials_ref="env:ZD_CREDENTIALS", **settings):
        destination = Destination(
            kind="zendesk",
            slug="zd",
            base_url=base_url or desk.url,
            credentials_ref=credentials_ref,
            settings={"read_timeout": 2, **settings},
        )
        return adapter_for(destination)

    return build


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def only_ticket(desk):
    [ticket] = desk.tickets()
    return ticket


# --- Capabilities -------------------------------------------------------------


def test_capabilities_follow_the_destination_settings(zendesk):
    default = zendesk()
    assert isinstance(default, ZendeskDestination)
    assert (default.honours_idempotency_key, default.idempotency_window_seconds, default.consistent_lookup) == (
        True,
        7200,
        True,
    )
    assert default.timeout == (3.05, 2.0)
    assert not default.transactional

    plain = zendesk(idempotency_supported=False, lookup_supported=False, connect_timeout=1, read_timeout=4)
    assert (plain.honours_idempotency_key, plain.idempotency_window_seconds, plain.consistent_lookup) == (
        False,
        None,
        False,
    )
    assert plain.timeout == (1.0, 4.0)
    assert zendesk(idempotency_window_seconds=600).idempotency_window_seconds == 600


# --- Creating tickets -----------------------------------------------------------


def test_create_ticket_sends_key_and_external_id_and_returns_the_ticket(desk, zendesk):
    result = zendesk().create_ticket(REQUEST, "key-1", "evt-1")

    assert result.ticket_id == "1"
    assert result.url == f"{desk.url}/agent/tickets/1"
    ticket = only_ticket(desk)
    assert ticket["external_id"] == "evt-1"
    assert ticket["subject"] == "Printer on fire"
    assert ticket["description"] == "The printer on floor 3 is on fire."
    assert ticket["requester"] == {"email": "jane.doe@example.com", "name": "Jane Doe"}
    assert ticket["tags"] == ["email", "printer"]
    assert ticket["custom_fields"] == [{"id": 360001, "value": "floor-3"}]
    [entry] = desk.requests_log()
    assert (entry["idempotency_key"], entry["external_id"], entry["idempotency_lookup"]) == ("key-1", "evt-1", "miss")


def test_a_bare_api_token_is_sent_as_the_configured_agent(desk, zendesk, monkeypatch):
    monkeypatch.setenv("ZD_TOKEN_ONLY", desk.token)
    adapter = zendesk(credentials_ref="env:ZD_TOKEN_ONLY", email="agent@example.com")
    assert adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id == "1"


def test_the_same_create_twice_returns_the_same_ticket(desk, zendesk):
    adapter = zendesk()
    first = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    again = adapter.create_ticket(REQUEST, "key-1", "evt-1")

    assert again == first
    assert len(desk.tickets()) == 1
    assert [e["idempotency_lookup"] for e in desk.requests_log()] == ["miss", "hit"]


def test_the_key_reused_with_another_body_is_ambiguous_and_the_lookup_resolves_it(desk, zendesk):
    adapter = zendesk()
    original = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    changed = TicketRequest(subject="Printer still on fire", description="x", requester="jane.doe@example.com")

    with pytest.raises(AmbiguousOutcome) as caught:
        adapter.create_ticket(changed, "key-1", "evt-1")

    assert caught.value.reason == "idempotent_request_error"
    assert adapter.find_by_external_ref("evt-1") == original


# --- Error mapping ------------------------------------------------------------------


def test_429_is_transient_with_retry_after_in_seconds(desk, zendesk):
    desk.set_plan(["rate_limit:2"])
    with pytest.raises(TransientError) as caught:
        zendesk().create_ticket(REQUEST, "key-1", "evt-1")

    assert (caught.value.reason, caught.value.retry_after) == ("rate_limited", 2.0)
    assert desk.tickets() == []


def test_429_is_transient_with_retry_after_as_an_http_date(desk, zendesk):
    desk.set_plan(["rate_limit_date:30"])
    with pytest.raises(TransientError) as caught:
        zendesk().create_ticket(REQUEST, "key-1", "evt-1")

    assert caught.value.reason == "rate_limited"
    assert 25 <= caught.value.retry_after <= 31


def test_503_with_retry_after_is_transient(desk, zendesk):
    desk.set_plan(["unavailable_503:5"])
    with pytest.raises(TransientError) as caught:
        zendesk(idempotency_supported=False).create_ticket(REQUEST, "key-1", "evt-1")

    assert (caught.value.reason, caught.value.retry_after) == ("unavailable", 5.0)


@pytest.mark.parametrize("fault", ["error_500", "unavailable_503"])
def test_other_5xx_is_transient_when_the_key_is_honoured(desk, zendesk, fault):
    desk.set_plan([fault])
    with pytest.raises(TransientError) as caught:
        zendesk().create_ticket(REQUEST, "key-1", "evt-1")

    assert caught.value.reason == "server_error"
    assert desk.tickets() == []
    assert len(desk.requests_log()) == 1  # no automatic retry behind our back


@pytest.mark.parametrize("fault", ["error_500", "unavailable_503"])
def test_other_5xx_is_ambiguous_when_the_key_is_not_honoured(desk, zendesk, fault):
    desk.set_plan([fault])
    with pytest.raises(AmbiguousOutcome) as caught:
        zendesk(idempotency_supported=False).create_ticket(REQUEST, "key-1", "evt-1")

    assert caught.value.reason == "server_error"
    assert len(desk.requests_log()) == 1


def test_422_is_permanent_and_keeps_the_field_errors(desk, zendesk):
    desk.set_plan(["reject_422"])
    with pytest.raises(PermanentError) as caught:
        zendesk().create_ticket(REQUEST, "key-1", "evt-1")

    assert caught.value.reason == "invalid_fields"
    assert json.loads(caught.value.detail) == {"requester": [{"description": "Requester email is invalid"}]}
    assert desk.tickets() == []


def test_a_ticket_the_desk_finds_invalid_is_permanent(desk, zendesk):
    blank = TicketRequest(subject="Empty", description="", requester="jane@example.com")
    with pytest.raises(PermanentError) as caught:
        zendesk().create_ticket(blank, "key-1", "evt-1")

    assert caught.value.reason == "invalid_fields"
    assert "description" in json.loads(caught.value.detail)


def test_field_errors_are_capped_and_addresses_masked():
    detail = _field_errors({"details": {"requester": [{"description": "jane.doe@example.com is invalid"}]}}, 422)
    assert "jane.doe@example.com" not in detail
    assert "j***@e***.com is invalid" in detail
    assert len(_field_errors({"details": {"x": "y" * 5000}}, 422)) == 2000


@pytest.mark.parametrize("how", ["fault", "wrong_token", "missing_secret"])
def test_credential_problems_are_permanent(desk, zendesk, monkeypatch, how):
    if how == "fault":
        desk.set_plan(["unauthorized_401"])
    elif how == "wrong_token":
        monkeypatch.setenv("ZD_CREDENTIALS", "agent@example.com/token:wrong")
    else:
        monkeypatch.delenv("ZD_CREDENTIALS")

    with pytest.raises(PermanentError) as caught:
        zendesk().create_ticket(REQUEST, "key-1", "evt-1")

    assert caught.value.reason == "credentials"
    assert desk.tickets() == []


def test_drop_before_commit_is_ambiguous_and_nothing_was_written(desk, zendesk):
    desk.set_plan(["drop_before_commit"])
    adapter = zendesk()
    with pytest.raises(AmbiguousOutcome) as caught:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")

    assert caught.value.reason == "connection_lost"
    assert desk.tickets() == []
    assert adapter.find_by_external_ref("evt-1") is None


def test_drop_after_commit_is_ambiguous_and_a_retry_with_the_key_returns_the_ticket(desk, zendesk):
    desk.set_plan(["drop_after_commit"])
    adapter = zendesk()
    with pytest.raises(AmbiguousOutcome) as caught:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")

    assert caught.value.reason == "connection_lost"
    written = only_ticket(desk)
    assert written["external_id"] == "evt-1"
    assert adapter.find_by_external_ref("evt-1").ticket_id == str(written["id"])
    assert adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id == str(written["id"])
    assert len(desk.tickets()) == 1


def test_a_stall_past_the_read_timeout_is_ambiguous_and_the_ticket_exists(desk, zendesk):
    desk.set_plan(["stall_after_commit:3"])
    adapter = zendesk(read_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(AmbiguousOutcome) as caught:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")

    assert caught.value.reason == "timeout"
    assert time.monotonic() - started < 2
    assert only_ticket(desk)["external_id"] == "evt-1"
    assert adapter.find_by_external_ref("evt-1").ticket_id == "1"


def test_connection_refused_is_transient(zendesk):
    adapter = zendesk(base_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(TransientError) as caught:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")
    assert caught.value.reason == "connection"

    # A lookup that cannot connect is transient too.
    with pytest.raises(TransientError):
        adapter.find_by_external_ref("evt-1")


@pytest.fixture
def unanswered_port():
    """A port whose accept backlog is full: the kernel drops further SYNs, so connecting times out."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port, fillers = listener.getsockname()[1], []
    for _ in range(10):
        filler = socket.socket()
        filler.settimeout(0.2)
        try:
            filler.connect(("127.0.0.1", port))
        except TimeoutError:
            filler.close()
            break
        fillers.append(filler)
    else:
        pytest.fail("could not fill the accept backlog")
    yield port
    for sock in fillers + [listener]:
        sock.close()


def test_a_connect_timeout_is_transient_because_nothing_was_sent(zendesk, unanswered_port):
    adapter = zendesk(base_url=f"http://127.0.0.1:{unanswered_port}", connect_timeout=0.3)
    with pytest.raises(TransientError) as caught:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")
    assert caught.value.reason == "connection"


def test_retry_after_parsing():
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("0") == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past: now
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


# --- Looking up by external_id ----------------------------------------------------------


def test_find_by_external_ref_returns_none_or_the_lowest_id(desk, zendesk):
    adapter = zendesk()
    assert adapter.find_by_external_ref("evt-1") is None

    adapter.create_ticket(REQUEST, "key-other", "evt-other")
    first = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    adapter.create_ticket(REQUEST, "key-2", "evt-1")  # external_id is not unique

    found = adapter.find_by_external_ref("evt-1")
    assert found == first
    assert found.ticket_id == "2"


def test_a_destination_without_lookup_refuses_to_guess(zendesk):
    with pytest.raises(NotImplementedError):
        zendesk(lookup_supported=False).find_by_external_ref("evt-1")


def test_retention_expiry_means_a_retry_creates_again(desk, zendesk):
    desk.set_idempotency(retention_seconds=0.2)
    adapter = zendesk()
    first = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    desk.advance_clock(0.3)
    second = adapter.create_ticket(REQUEST, "key-1", "evt-1")

    assert second != first  # why the service must not retry outside idempotency_window_seconds
    assert adapter.find_by_external_ref("evt-1") == first


def test_with_idempotency_off_on_the_desk_a_replay_duplicates(desk, zendesk):
    desk.set_idempotency(enabled=False)
    adapter = zendesk(idempotency_supported=False)
    adapter.create_ticket(REQUEST, "key-1", "evt-1")
    adapter.create_ticket(REQUEST, "key-1", "evt-1")

    assert [t["external_id"] for t in desk.tickets()] == ["evt-1", "evt-1"]
    assert adapter.find_by_external_ref("evt-1").ticket_id == "1"


# --- Archive history: the Ticket Import API ----------------------------------------------

HISTORY = TicketRequest(
    subject="Order 7: the printer jams again",
    description="Order 7 jams on page two.",
    requester="Jane Doe <jane.doe@example.com>",
    status="closed",
    created_at=datetime(2026, 3, 4, 10, 15, 30, tzinfo=timezone(timedelta(hours=1))),
)


def test_archive_history_is_imported_closed_with_the_date_it_was_written(desk, zendesk):
    result = zendesk().create_ticket(HISTORY, "key-1", "evt-1")

    ticket = only_ticket(desk)
    assert (result.ticket_id, ticket["status"], ticket["external_id"]) == (str(ticket["id"]), "closed", "evt-1")
    assert (ticket["fields"]["created_at"], ticket["fields"]["solved_at"]) == (
        "2026-03-04T09:15:30Z",
        "2026-03-04T09:15:30Z",
    )
    [entry] = desk.requests_log()
    assert (entry["method"], entry["path"], entry["idempotency_key"]) == ("POST", "/api/v2/imports/tickets", "key-1")
    # The comment is dated too, and the same request always makes the same body (a retry under its key).
    payload = ticket_payload(HISTORY, "evt-1")
    assert (payload["status"], payload["comment"]["created_at"]) == ("closed", "2026-03-04T09:15:30Z")
    assert ticket_payload(HISTORY, "evt-1") == payload


def test_a_live_ticket_is_still_created_through_the_tickets_api_with_the_desks_own_dates(desk, zendesk):
    zendesk().create_ticket(REQUEST, "key-1", "evt-1")

    ticket = only_ticket(desk)
    assert ticket["status"] == "new" and "created_at" not in ticket["fields"] and "status" not in ticket["fields"]
    assert [(e["method"], e["path"]) for e in desk.requests_log()] == [("POST", "/api/v2/tickets.json")]


def test_a_lost_answer_to_an_import_is_settled_by_the_external_id_lookup_not_a_second_import(desk, zendesk):
    # Zendesk documents its Idempotency-Key for ticket creation only: the desk here ignores it for this test.
    desk.set_idempotency(enabled=False)
    desk.set_plan(["drop_after_commit"])
    adapter = zendesk()
    with pytest.raises(AmbiguousOutcome):
        adapter.create_ticket(HISTORY, "key-1", "evt-1")

    again = adapter.create_ticket(HISTORY, "key-1", "evt-1")  # the next attempt, with the intent's journal

    written = only_ticket(desk)
    assert (again.ticket_id, written["status"]) == (str(written["id"]), "closed")
    assert [e["path"] for e in desk.requests_log()] == ["/api/v2/imports/tickets"]


def test_an_import_refused_before_it_was_written_is_sent_again_after_the_lookup_finds_nothing(desk, zendesk):
    desk.set_idempotency(enabled=False)
    desk.set_plan(["drop_before_commit"])
    adapter = zendesk()
    with pytest.raises(AmbiguousOutcome):
        adapter.create_ticket(HISTORY, "key-1", "evt-1")

    assert adapter.create_ticket(HISTORY, "key-1", "evt-1").ticket_id == str(only_ticket(desk)["id"])
    assert [e["committed"] for e in desk.requests_log()] == [False, True]


# --- Comments ---------------------------------------------------------------------------


def test_add_comment_returns_the_comment_id_and_is_idempotent(desk, zendesk):
    adapter = zendesk()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")

    reply = CommentRequest(body="Now it is smoking.", author_email="Jane Doe <jane.doe@example.com>")
    ref = adapter.add_comment(ticket.ticket_id, reply, "key-c", "evt-2")
    again = adapter.add_comment(ticket.ticket_id, reply, "key-c", "evt-2")

    assert ref == again
    comments = only_ticket(desk)["comments"]
    assert [c["body"] for c in comments] == ["The printer on floor 3 is on fire.", "Now it is smoking."]
    added = comments[1]
    assert str(added["id"]) == ref
    # Written as the requester (the user Zendesk made for the ticket, found by address), publicly.
    [jane] = [p for p in desk.people() if p["email"] == "jane.doe@example.com"]
    assert (added["author_id"], added["author"]) == (jane["id"], "jane.doe@example.com")
    assert added["public"] is True
    assert [e["idempotency_lookup"] for e in desk.requests_log()] == ["miss", "miss", "hit"]
    assert added["metadata"] == {"custom": {"external_ref": "evt-2"}}


def test_add_comment_errors(desk, zendesk):
    adapter = zendesk()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")

    with pytest.raises(PermanentError) as missing:
        adapter.add_comment("999", CommentRequest(body="hello", author_email="jane.doe@example.com"), "key-c1", "evt-2")
    assert missing.value.reason == "not_found"

    hello = CommentRequest(body="hello", author_email="jane.doe@example.com")
    desk.set_plan(["rate_limit:4", "drop_after_commit"])
    with pytest.raises(TransientError) as limited:
        adapter.add_comment(ticket.ticket_id, hello, "key-c2", "evt-3")
    assert limited.value.retry_after == 4.0
    with pytest.raises(AmbiguousOutcome) as dropped:
        adapter.add_comment(ticket.ticket_id, hello, "key-c2", "evt-3")
    assert dropped.value.reason == "connection_lost"
    assert len(only_ticket(desk)["comments"]) == 2


# --- Privacy ------------------------------------------------------------------------------


def test_nothing_logged_contains_bodies_or_addresses(desk, zendesk, caplog):
    caplog.set_level(logging.DEBUG)
    adapter = zendesk()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    adapter.add_comment(
        ticket.ticket_id,
        CommentRequest(body="Secret reply text", author_email="jane.doe@example.com"),
        "key-c",
        "evt-2",
    )
    adapter.find_by_external_ref("evt-1")
    desk.set_plan(["reject_422"])
    with pytest.raises(PermanentError):
        adapter.create_ticket(REQUEST, "key-2", "evt-3")

    adapter_lines = [r.getMessage() for r in caplog.records if r.name.startswith("ticketing.destinations")]
    assert any("evt-1" in line for line in adapter_lines)
    text = "\n".join(r.getMessage() for r in caplog.records)
    for secret in ("jane.doe@example.com", "on floor 3", "Secret reply text", "Printer on fire", desk.token):
        assert secret not in text

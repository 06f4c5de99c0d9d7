"""The Freshdesk adapter against FakeDesk's freshdesk dialect over real HTTP: the ticket Freshdesk gets, the
lagging filter search, the kind's own error mappings, check_connection and the settings' checks.
(Create, duplicates, lost answers, 429/401/422, comments and corrections through the pipeline are in the
shared contract suite, tests/test_destination_contract.py.)"""
import json
import time

import pytest
import requests

from tests.destination_kits import adapter_builder, freshdesk as kit, only_record
from ticketing.destinations import adapter_for
from ticketing.destinations.base import AmbiguousOutcome, PermanentError, TicketRequest
from ticketing.destinations.freshdesk import FreshdeskDestination, text_to_html, ticket_payload
from ticketing.destinations.settings import validate

pytestmark = pytest.mark.fakedesk(dialect="freshdesk")

REF = "mailroom-0123456789abcdef"
REQUEST = TicketRequest(
    subject="Invoice 4471\n charged twice",
    description="Line <1> & more\nline 2",
    requester="Jane Doe <jane.doe@example.com>",
    tags=("email", "billing, invoices"),
    queue="billing", priority="urgent", request_type="refund", assignee="alice",
)


@pytest.fixture
def freshdesk(tenant, desk, monkeypatch):
    """`freshdesk(**settings)`: an adapter for a freshdesk destination against `desk` (the kit's settings)."""
    return adapter_builder(kit, tenant, desk, monkeypatch)


# --- The payload ----------------------------------------------------------------------------------

def test_the_ticket_freshdesk_gets_carries_the_route_the_reference_and_the_requester(desk, freshdesk):
    result = freshdesk().create_ticket(REQUEST, "key-1", REF)

    assert (result.ticket_id, result.url) == ("1", f"{desk.url}/a/tickets/1")
    record = only_record(desk)
    assert record["external_id"] == REF
    assert record["fields"] == {
        "subject": "Invoice 4471 charged twice",
        "description": "Line &lt;1&gt; &amp; more<br>line 2",   # HTML: escaped, line breaks as <br>
        "email": "jane.doe@example.com", "name": "Jane Doe",
        "status": 2, "source": 1,                               # open, by email
        "tags": ["email", "billing invoices"],                  # Freshdesk refuses commas in a tag
        "priority": 4, "group_id": 101, "responder_id": 201, "type": "Refund",
        "custom_fields": {"cf_mailroom_ref": REF},
    }
    assert kit.route_of(record) == {"queue": "billing", "priority": "urgent"}
    assert desk.requests_log()[0]["idempotency_key"] is None  # Freshdesk has no idempotency key


def test_unmapped_route_values_are_left_out_and_raw_fields_come_last(desk, freshdesk):
    request = TicketRequest(subject="Hi", description="Text", requester="jane@example.com", queue="sales",
                            priority="normal", request_type="other", assignee="bob",
                            fields={"cf_product": "Printer", "priority": 1})
    freshdesk().create_ticket(request, "key-1", REF)
    fields = only_record(desk)["fields"]
    assert fields["priority"] == 1                                # request.fields win over the route
    assert not {"group_id", "responder_id", "type"} & set(fields)
    assert fields["custom_fields"] == {"cf_mailroom_ref": REF, "cf_product": "Printer"}


def test_the_payload_is_deterministic_and_the_reference_field_is_configurable():
    settings = {"external_ref_field": "cf_ticket_ref"}
    assert ticket_payload(REQUEST, REF, settings) == ticket_payload(REQUEST, REF, settings)
    assert ticket_payload(REQUEST, REF, settings)["custom_fields"] == {"cf_ticket_ref": REF}
    assert len(ticket_payload(TicketRequest("x" * 300, "d", "a@example.com"), REF, {})["subject"]) == 255
    assert text_to_html("a\r\nb\rc\n<d>") == "a<br>b<br>c<br>&lt;d&gt;"


# --- Capabilities ----------------------------------------------------------------------------------

def test_capabilities_a_lagging_search_and_nothing_else(freshdesk):
    adapter = freshdesk(search_settle_seconds=None)
    assert isinstance(adapter, FreshdeskDestination)
    assert (adapter.honours_idempotency_key, adapter.upsert, adapter.consistent_lookup) == (False, False, False)
    assert adapter.idempotency_window_seconds is None and not adapter.retry_safe
    assert adapter.lookup_settle_seconds == 60.0
    assert freshdesk(search_settle_seconds=0).lookup_settle_seconds == 0.0


# --- The lagging search -----------------------------------------------------------------------------

@pytest.mark.fakedesk(dialect="freshdesk", search_lag_seconds=0.5)
def test_the_search_sees_a_ticket_only_after_the_index_caught_up(desk, freshdesk):
    adapter = freshdesk()
    created = adapter.create_ticket(REQUEST, "key-1", REF)
    assert adapter.find_by_external_ref(REF) is None  # the index lags behind the create
    time.sleep(0.6)
    assert adapter.find_by_external_ref(REF) == created
    assert adapter.find_by_external_ref("mailroom-other") is None


def test_several_tickets_with_our_reference_the_first_is_kept(freshdesk):
    adapter = freshdesk()
    first = adapter.create_ticket(REQUEST, "key-1", REF)
    adapter.create_ticket(REQUEST, "key-1", REF)
    assert adapter.find_by_external_ref(REF) == first


def test_a_search_freshdesk_refuses_is_a_configuration_error(freshdesk):
    with pytest.raises(PermanentError) as caught:
        freshdesk(external_ref_field="cf_nope").find_by_external_ref(REF)
    assert caught.value.reason == "configuration"
    assert "nope" in caught.value.detail


# --- The kind's error mappings ------------------------------------------------------------------------

@pytest.mark.parametrize(("fields", "field"), [({"cf_nope": "x"}, "cf_nope"), ({"type": "Complaint"}, "type"),
                                               ({"group_id": 999}, "group_id")])
def test_validation_failed_is_invalid_fields_with_freshdesks_field_errors(desk, freshdesk, fields, field):
    request = TicketRequest(subject="Hi", description="Text", requester="jane@example.com", fields=fields)
    with pytest.raises(PermanentError) as caught:
        freshdesk().create_ticket(request, "key-1", REF)
    assert caught.value.reason == "invalid_fields"
    assert [e["field"] for e in json.loads(caught.value.detail)] == [field]
    assert desk.tickets() == []


@pytest.mark.parametrize(("fault", "reason"), [("error_500", "server_error"), ("drop_after_commit", "connection_lost"),
                                               ("stall_after_commit:2", "timeout")])
def test_a_lost_answer_after_the_create_is_ambiguous(desk, freshdesk, fault, reason):
    desk.set_plan([fault])
    with pytest.raises(AmbiguousOutcome) as caught:
        freshdesk(read_timeout=0.5).create_ticket(REQUEST, "key-1", REF)
    assert caught.value.reason == reason
    assert len(desk.requests_log()) == 1


def test_a_reply_is_a_public_incoming_note_and_a_missing_ticket_is_not_found(desk, freshdesk):
    adapter = freshdesk()
    ticket_id = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    note_id = adapter.add_comment(ticket_id, "Still <charged>\ntwice.", "jane.doe@example.com", "key-2", REF)

    notes = requests.get(f"{desk.url}/api/v2/tickets/{ticket_id}/conversations", auth=(desk.token, "X"),
                         timeout=5).json()
    assert [(str(n["id"]), n["body"], n["private"], n["incoming"]) for n in notes] == [
        (note_id, "Still &lt;charged&gt;<br>twice.", False, True)]
    assert kit.comments_of(only_record(desk)) == ["Still <charged>\ntwice."]
    with pytest.raises(PermanentError) as caught:
        adapter.add_comment("99", "x", "", "key-3", REF)
    assert caught.value.reason == "not_found"
    writes = len(desk.requests_log())
    with pytest.raises(PermanentError):
        adapter.add_comment("SUP-1", "x", "", "key-4", REF)
    assert len(desk.requests_log()) == writes  # nothing sent for an id that is not a number


# --- check_connection ----------------------------------------------------------------------------------

def test_check_connection_finds_the_reference_field_and_writes_nothing(desk, freshdesk):
    assert "cf_mailroom_ref" in freshdesk().check_connection()
    assert desk.requests_log() == [] and desk.tickets() == []


def test_check_connection_without_the_reference_field_is_a_configuration_error(desk, freshdesk):
    with pytest.raises(PermanentError) as caught:
        freshdesk(external_ref_field="cf_ticket_ref").check_connection()
    assert caught.value.reason == "configuration"
    assert "cf_ticket_ref" in caught.value.detail
    assert desk.requests_log() == []


def test_check_connection_with_a_wrong_key_is_credentials_and_writes_nothing(tenant, desk, monkeypatch):
    destination = kit.configure(tenant, desk, monkeypatch)
    monkeypatch.setenv(destination.credentials_ref.removeprefix("env:"), "wrong-key:X")
    with pytest.raises(PermanentError) as caught:
        adapter_for(destination).check_connection()
    assert caught.value.reason == "credentials"
    assert desk.requests_log() == [] and desk.tickets() == []


def test_a_bare_api_key_is_sent_with_the_password_x(tenant, desk, monkeypatch):
    destination = kit.configure(tenant, desk, monkeypatch)
    monkeypatch.setenv(destination.credentials_ref.removeprefix("env:"), desk.token)
    assert adapter_for(destination).auth_for(desk.token) == ((desk.token, "X"), {})
    assert "cf_mailroom_ref" in adapter_for(destination).check_connection()


# --- SETTINGS ----------------------------------------------------------------------------------------

def test_settings_are_checked_field_by_field():
    good = {"external_ref_field": "cf_mailroom_ref", "groups": {"billing": 101}, "agents": {"alice": 201},
            "ticket_types": {"refund": "Refund"}, "search_settle_seconds": 90, "read_timeout": 5}
    assert validate(FreshdeskDestination.SETTINGS, good) == {}
    assert validate(FreshdeskDestination.SETTINGS, {}) == {}  # nothing is required
    errors = validate(FreshdeskDestination.SETTINGS, {
        "external_ref_field": "Mailroom Ref", "groups": {"billing": "Billing"}, "agents": {"alice": 0},
        "search_settle_seconds": "soon", "domain": "acme"})
    assert set(errors) == {"external_ref_field", "groups", "agents", "search_settle_seconds", "domain"}


# --- The fake dialect -----------------------------------------------------------------------------------

def test_the_fake_refuses_a_wrong_key_the_way_freshdesk_does(desk):
    answer = requests.get(f"{desk.url}/api/v2/ticket_fields", auth=("wrong", "X"), timeout=5)
    assert answer.status_code == 401 and answer.json()["code"] == "invalid_credentials"


@pytest.mark.parametrize("query", ["\"mailroom_ref:'{ref}'\"", "cf_mailroom_ref:'{ref}'", '"mailroom_ref:"{ref}""'])
def test_the_fake_search_reads_the_query_leniently(desk, freshdesk, query):
    freshdesk().create_ticket(REQUEST, "key-1", REF)
    answer = requests.get(f"{desk.url}/api/v2/search/tickets", params={"query": query.format(ref=REF)},
                          auth=(desk.token, "X"), timeout=5).json()
    assert [t["id"] for t in answer["results"]] == [1] and answer["total"] == 1
    assert answer["results"][0]["custom_fields"]["cf_mailroom_ref"] == REF

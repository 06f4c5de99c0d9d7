"""The ServiceNow adapter against FakeDesk's servicenow dialect over real HTTP: the record it writes,
the Import Set upsert, the correlation_id lookup, ServiceNow's own error bodies, check_connection.

What every kind shares (duplicates, lost answers, 429/401/422, comments through the pipeline) is in
tests/test_destination_contract.py."""
import logging
import re

import pytest
import requests

from tests.destination_kits import servicenow as kit
from ticketing.destinations import adapter_for
from ticketing.destinations.base import AmbiguousOutcome, PermanentError, TicketRequest, TransientError
from ticketing.destinations.servicenow import ServiceNowDestination
from ticketing.destinations.settings import validate

pytestmark = pytest.mark.fakedesk(dialect="servicenow")

REQUEST = TicketRequest(
    subject="Invoice 42 charged twice",
    description="I was charged twice for invoice 42.",
    requester="Jane Doe <jane.doe@example.com>",
    tags=("email",),
    queue="billing", priority="urgent", request_type="refund", assignee="alice",
)
SYS_ID = re.compile(r"[0-9a-f]{32}")


@pytest.fixture
def servicenow(tenant, desk, monkeypatch):
    """build(**settings) -> a ServiceNow adapter against the desk (each call its own destination)."""
    made = []

    def build(**settings):
        made.append(kit.configure(tenant, desk, monkeypatch, slug=f"sn-{len(made)}", **settings))
        return adapter_for(made[-1])

    return build


@pytest.fixture
def seen(desk):
    """Every API request the desk receives: (method, path, query, headers, body)."""
    requests_seen = []
    desk.on_request(lambda request: requests_seen.append(request) and None)
    return requests_seen


def records(desk):
    return [t["fields"] for t in desk.tickets()]


# --- Capabilities -------------------------------------------------------------

def test_capabilities_table_mode_looks_up_and_import_set_mode_upserts(servicenow):
    table = servicenow()
    assert isinstance(table, ServiceNowDestination)
    assert (table.consistent_lookup, table.upsert, table.honours_idempotency_key, table.retry_safe) == (
        True, False, False, False)
    assert (table.lookup_settle_seconds, table.idempotency_window_seconds, table.max_description_chars) == (
        None, None, 4000)

    imported = servicenow(import_set_table="u_mailroom_incident_import")
    # retry_safe names writes that are all safe twice (a kept key); the upsert covers only its create.
    assert (imported.consistent_lookup, imported.upsert, imported.retry_safe) == (True, True, False)


# --- The record it writes -----------------------------------------------------------

def test_create_sends_the_table_api_record_with_route_and_correlation_id(desk, servicenow, seen):
    adapter = servicenow()
    result = adapter.create_ticket(REQUEST, "key-1", "evt-1")

    [record] = records(desk)
    assert SYS_ID.fullmatch(result.ticket_id) and result.ticket_id == record["sys_id"]
    assert result.url == f"{desk.url}/nav_to.do?uri=incident.do?sys_id={record['sys_id']}"
    assert record["number"] == "INC0010001"
    sent = {name: record[name] for name in record if not name.startswith("sys_") and name != "number"}
    assert sent == {
        "short_description": "Invoice 42 charged twice",
        "description": "I was charged twice for invoice 42.",
        "caller_id": "jane.doe@example.com",
        "contact_type": "email",
        "correlation_id": "evt-1",
        "correlation_display": "Mailroom",
        "assignment_group": "Billing",
        "impact": "1", "urgency": "1",
        "category": "inquiry",
        "assigned_to": "alice.agent",
    }
    [create] = [r for r in seen if r.method == "POST"]
    assert create.path == "/api/now/table/incident"
    assert create.query["sysparm_input_display_value"] == ["true"]
    assert "Idempotency-Key" not in create.headers


def test_unmapped_route_values_are_left_out_and_raw_fields_win(desk, servicenow):
    request = TicketRequest(subject="x" * 200, description="Body", requester="jane@example.com",
                            queue="unknown-queue", request_type="other", assignee="bob",
                            fields={"urgency": "3", "u_vip": True})
    servicenow(priorities={"low": {"impact": "3", "urgency": "3"}}).create_ticket(request, "key-1", "evt-1")

    [record] = records(desk)
    assert not {"assignment_group", "category", "assigned_to", "impact"} & set(record)
    assert (record["urgency"], record["u_vip"]) == ("3", True)
    assert record["short_description"] == "x" * 160   # the field's length in ServiceNow


def test_the_priority_mapping_is_configurable_and_deterministic():
    from ticketing.destinations.servicenow import record_payload

    settings = {"priorities": {"low": {"impact": "3", "urgency": "3"}}}
    low = TicketRequest(subject="s", description="d", requester="a@example.com", priority="low")
    assert record_payload(low, "evt-1", settings) == record_payload(low, "evt-1", settings)
    assert {k: record_payload(low, "evt-1", settings)[k] for k in ("impact", "urgency")} == {
        "impact": "3", "urgency": "3"}
    high = TicketRequest(subject="s", description="d", requester="a@example.com", priority="high")
    assert (record_payload(high, "evt-1", settings)["impact"], record_payload(high, "evt-1")["urgency"]) == ("1", "2")


# --- Import Set mode: a retry updates the one record ------------------------------------

def test_import_set_mode_stages_u_fields_and_coalesces_on_our_reference(desk, servicenow, seen):
    adapter = servicenow(import_set_table="u_mailroom_incident_import")
    first = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    again = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    corrected = adapter.create_ticket(TicketRequest(subject="Corrected", description="New body",
                                                    requester="jane.doe@example.com"), "key-1", "evt-1")

    assert first == again == corrected
    [record] = records(desk)
    assert (record["short_description"], record["correlation_id"]) == ("Corrected", "evt-1")
    staged = [r.json() for r in seen if r.path == "/api/now/import/u_mailroom_incident_import"]
    assert len(staged) == 3
    assert staged[0]["u_correlation_id"] == "evt-1"
    assert staged[0]["u_short_description"] == "Invoice 42 charged twice"
    assert staged[0]["u_assignment_group"] == "Billing"
    assert not [name for name in staged[0] if not name.startswith("u_")]


def test_import_set_lost_answer_then_retry_makes_one_record(desk, servicenow):
    adapter = servicenow(import_set_table="u_mailroom_incident_import")
    desk.set_plan(["drop_after_commit", "error_500"])
    with pytest.raises(AmbiguousOutcome):
        adapter.create_ticket(REQUEST, "key-1", "evt-1")
    with pytest.raises(TransientError) as caught:   # retry-safe: a 5xx is worth another attempt
        adapter.create_ticket(REQUEST, "key-1", "evt-1")
    assert caught.value.reason == "server_error"

    result = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    [record] = records(desk)
    assert result.ticket_id == record["sys_id"]


def test_a_transform_error_is_permanent_with_its_message(desk, servicenow):
    adapter = servicenow(import_set_table="u_mailroom_incident_import")
    with pytest.raises(PermanentError) as caught:
        adapter.create_ticket(TicketRequest(subject="s", description=" ", requester="jane@example.com"),
                              "key-1", "evt-1")
    assert caught.value.reason == "invalid_fields"
    assert "description" in caught.value.detail.lower()
    assert records(desk) == []


def test_an_ignored_row_is_rejected_and_several_targets_are_multiple_matches(desk, servicenow):
    adapter = servicenow(import_set_table="u_mailroom_incident_import")
    answers = iter([
        {"import_set": "ISET1", "result": [{"table": "incident", "status": "ignored"}]},
        {"import_set": "ISET2", "result": [{"table": "incident", "status": "inserted", "sys_id": "a" * 32},
                                           {"table": "incident", "status": "updated", "sys_id": "b" * 32}]},
    ])
    desk.on_request(lambda request: (201, next(answers)) if request.method == "POST" else None)

    with pytest.raises(PermanentError) as ignored:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")
    assert ignored.value.reason == "rejected"
    with pytest.raises(PermanentError) as several:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")
    assert several.value.reason == "multiple_matches"


# --- Looking up by correlation_id -------------------------------------------------------------

def test_find_by_external_ref_returns_none_or_the_first_created(desk, servicenow, seen):
    adapter = servicenow()
    assert adapter.find_by_external_ref("evt-1") is None
    adapter.create_ticket(REQUEST, "key-0", "evt-other")
    first = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    adapter.create_ticket(REQUEST, "key-2", "evt-1")

    assert adapter.find_by_external_ref("evt-1") == first
    lookup = [r for r in seen if r.method == "GET"][-1]
    assert lookup.query["sysparm_query"] == ["correlation_id=evt-1^ORDERBYsys_created_on"]
    assert [r.ticket_id for r in adapter.records_for_ref("evt-1")][0] == first.ticket_id


def test_a_caret_in_the_reference_cannot_widen_the_query(desk, servicenow):
    adapter = servicenow()
    adapter.create_ticket(REQUEST, "key-1", "evt-1")
    assert adapter.find_by_external_ref("evt-1^ORDERBYnumber") is None
    odd = adapter.create_ticket(REQUEST, "key-2", "a^b")
    assert adapter.find_by_external_ref("a^b") == odd


def test_listing_finds_our_records_and_the_ones_that_still_exist(desk, servicenow):
    from datetime import UTC, datetime, timedelta

    adapter = servicenow()
    ours = [adapter.create_ticket(REQUEST, f"key-{n}", f"mr-{n}").ticket_id for n in range(3)]
    adapter.create_ticket(REQUEST, "key-x", "other-1")

    page = adapter.records_with_ref("mr-", datetime.now(UTC) - timedelta(hours=1), limit=2)
    assert [r.external_ref for r in page.records] == ["mr-0", "mr-1"] and page.resume == {"offset": 2}
    rest = adapter.records_with_ref("mr-", datetime.now(UTC) - timedelta(hours=1), limit=2, resume=page.resume)
    assert [r.ticket_id for r in rest.records] == [ours[2]] and rest.resume is None
    assert adapter.existing_tickets(ours + ["f" * 32, "not-a-sys-id"]) == set(ours)


# --- Comments ----------------------------------------------------------------------------------

def test_a_comment_is_a_customer_visible_journal_entry_or_a_work_note(desk, servicenow, seen):
    adapter = servicenow()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    assert adapter.add_comment(ticket.ticket_id, "Any news?", "jane.doe@example.com", "key-c", "evt-2") == \
        ticket.ticket_id
    servicenow(comment_field="work_notes").add_comment(ticket.ticket_id, "Internal", "x", "key-d", "evt-3")

    patch = [r for r in seen if r.method == "PATCH"][0]
    assert (patch.path, patch.json()) == (f"/api/now/table/incident/{ticket.ticket_id}", {"comments": "Any news?"})
    [ticket_record] = desk.tickets()
    assert [(c["body"], c["public"]) for c in ticket_record["comments"][1:]] == [("Any news?", True),
                                                                                 ("Internal", False)]


def test_comment_errors(desk, servicenow):
    adapter = servicenow(import_set_table="u_mailroom_incident_import")
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    with pytest.raises(PermanentError) as malformed:
        adapter.add_comment("42", "hello", "x", "key-c", "evt-2")
    assert malformed.value.reason == "not_found"
    with pytest.raises(PermanentError) as missing:
        adapter.add_comment("f" * 32, "hello", "x", "key-c", "evt-2")
    assert missing.value.reason == "not_found"

    # Import Set mode makes creates retry-safe, never a journal entry: a 5xx after a PATCH stays ambiguous.
    desk.set_plan(["error_500"])
    with pytest.raises(AmbiguousOutcome) as failed:
        adapter.add_comment(ticket.ticket_id, "hello", "x", "key-c", "evt-2")
    assert failed.value.reason == "server_error"


# --- ServiceNow's error answers ----------------------------------------------------------------

def test_a_400_is_invalid_fields_with_servicenow_s_message(desk, servicenow):
    desk.set_plan(["reject_422"])
    with pytest.raises(PermanentError) as caught:
        servicenow().create_ticket(REQUEST, "key-1", "evt-1")
    assert (caught.value.reason, caught.value.detail) == (
        "invalid_fields", "Invalid input: caller_id: Invalid reference")


@pytest.mark.parametrize(("detail", "reason"), [
    ("Data Policy Exception: The following fields are mandatory: Caller", "invalid_fields"),
    ("ACL Exception Insert Failed due to security constraints", "credentials"),
])
def test_a_403_is_a_data_policy_or_an_acl(desk, servicenow, detail, reason):
    desk.on_request(lambda request: (403, {"error": {"message": "Operation Failed", "detail": detail},
                                           "status": "failure"}))
    with pytest.raises(PermanentError) as caught:
        servicenow().create_ticket(REQUEST, "key-1", "evt-1")
    assert caught.value.reason == reason


def test_a_rate_limit_rule_is_transient_with_its_retry_after(desk, servicenow):
    desk.set_plan(["rate_limit:7"])
    with pytest.raises(TransientError) as caught:
        servicenow().create_ticket(REQUEST, "key-1", "evt-1")
    assert (caught.value.reason, caught.value.retry_after) == ("rate_limited", 7.0)


def test_a_5xx_after_a_table_create_is_ambiguous_and_the_lookup_settles_it(desk, servicenow):
    desk.set_plan(["stall_after_commit:3"])
    adapter = servicenow(read_timeout=0.3)
    with pytest.raises(AmbiguousOutcome) as caught:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")
    assert caught.value.reason == "timeout"
    assert adapter.find_by_external_ref("evt-1").ticket_id == records(desk)[0]["sys_id"]


def test_a_bearer_token_is_sent_as_is(desk, servicenow, tenant, monkeypatch, seen):
    adapter = servicenow()
    monkeypatch.setenv(adapter.destination.credentials_ref[4:], f"Bearer {desk.token}")
    assert adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id
    assert seen[-1].headers["Authorization"] == f"Bearer {desk.token}"
    assert "the OAuth token" in adapter.check_connection()


def test_a_secret_in_neither_format_is_refused_before_anything_is_sent(desk, servicenow, monkeypatch, seen):
    adapter = servicenow()
    monkeypatch.setenv(adapter.destination.credentials_ref[4:], "just-a-token")
    with pytest.raises(PermanentError) as caught:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")
    assert caught.value.reason == "credentials"
    assert seen == []


# --- check_connection ---------------------------------------------------------------------------

def test_check_connection_reads_the_table_and_writes_nothing(desk, servicenow, seen):
    line = servicenow().check_connection()
    assert line == "read the incident table as user 'mailroom.integration'"
    [read] = seen
    assert (read.method, read.path, read.query["sysparm_limit"]) == ("GET", "/api/now/table/incident", ["1"])
    assert "import set u_x" in servicenow(import_set_table="u_x").check_connection()


def test_check_connection_with_a_wrong_password_is_credentials_and_nothing_is_written(desk, servicenow, monkeypatch):
    adapter = servicenow()
    monkeypatch.setenv(adapter.destination.credentials_ref[4:], "mailroom.integration:wrong")
    with pytest.raises(PermanentError) as caught:
        adapter.check_connection()
    assert caught.value.reason == "credentials"
    assert desk.requests_log() == [] and desk.tickets() == []


def test_a_wrong_table_is_configuration_for_check_connection_and_for_an_import(desk, servicenow):
    with pytest.raises(PermanentError) as caught:
        servicenow(table="incidnet").check_connection()
    assert (caught.value.reason, caught.value.detail) == ("configuration", "HTTP 400: Invalid table incidnet")
    with pytest.raises(PermanentError) as importing:
        servicenow(import_set_table="mailroom_import").create_ticket(REQUEST, "key-1", "evt-1")
    assert (importing.value.reason, importing.value.detail) == (
        "configuration", "HTTP 400: Invalid table mailroom_import")


# --- Settings -------------------------------------------------------------------------------------

def test_settings_are_checked_field_by_field():
    spec = ServiceNowDestination.SETTINGS
    good = {"table": "sn_customerservice_case", "import_set_table": "u_mailroom_import", "comment_field": "work_notes",
            "assignment_groups": {"billing": "Billing"}, "priorities": {"urgent": {"impact": "1", "urgency": "1"}},
            "categories": {"refund": "inquiry"}, "assignees": {"alice": "alice.agent"}, "read_timeout": 5}
    assert validate(spec, good) == {}
    errors = validate(spec, {"table": "Incident; drop", "comment_field": "notes", "priorities": {
        "critical": {"impact": "1", "urgency": "1"}, "high": {"impact": "4", "urgency": "1"}, "low": "3"},
        "assignment_groups": ["Billing"], "tabel": "incident"})
    assert set(errors) == {"table", "comment_field", "priorities", "assignment_groups", "tabel"}
    assert any("critical" in message for message in errors["priorities"])
    assert any("impact must be 1, 2 or 3" in message for message in errors["priorities"])
    assert any("'low'" in message for message in errors["priorities"])


def test_nothing_logged_carries_bodies_addresses_or_the_password(desk, servicenow, caplog):
    caplog.set_level(logging.DEBUG)
    adapter = servicenow()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    adapter.add_comment(ticket.ticket_id, "Secret reply text", "jane.doe@example.com", "key-c", "evt-2")
    adapter.find_by_external_ref("evt-1")
    desk.set_plan(["reject_422"])
    with pytest.raises(PermanentError):
        adapter.create_ticket(REQUEST, "key-2", "evt-3")

    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "evt-1" in text
    for secret in ("jane.doe@example.com", "charged twice", "Secret reply text", desk.token):
        assert secret not in text


# --- The fake itself ------------------------------------------------------------------------------

def test_the_fake_refuses_without_credentials_in_servicenow_s_shape(desk):
    answer = requests.get(f"{desk.url}/api/now/table/incident", timeout=5)
    assert answer.status_code == 401
    assert answer.json() == {"error": {"message": "User Not Authenticated",
                                       "detail": "Required to provide Auth information"}, "status": "failure"}
    assert requests.get(f"{desk.url}/api/now/table/incident", auth=("someone", desk.token), timeout=5).json() == {
        "result": []}

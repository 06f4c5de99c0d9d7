"""The Jira Service Management adapter against FakeDesk's jira_sm dialect over real HTTP: the payload Jira
gets, the lagging JQL lookup, the kind's own error mappings, check_connection and the settings' checks.
(Create, duplicates, lost answers, 429/401/422, comments and corrections through the pipeline are in the
shared contract suite, tests/test_destination_contract.py.)"""
import logging
import time

import pytest
import requests

from intake.secrets import env_prefix
from tests.destination_kits import adapter_builder, jira_sm as kit, only_record
from ticketing.destinations import adapter_for
from ticketing.destinations.base import AmbiguousOutcome, PermanentError, TicketRequest
from ticketing.destinations.jira_sm import JiraServiceManagementDestination, jira_errors, request_payload
from ticketing.destinations.settings import validate

pytestmark = pytest.mark.fakedesk(dialect="jira_sm")

REF = "mailroom-0123456789abcdef"
REQUEST = TicketRequest(
    subject="Invoice 4471\n  charged twice",
    description="The invoice shows\nthe same line twice.",
    requester="Jane Doe <jane.doe@example.com>",
    tags=("email", "billing issue"),
    queue="billing", priority="urgent", request_type="refund", assignee="alice",
)


@pytest.fixture
def jira(tenant, desk, monkeypatch):
    """`jira(**settings)`: an adapter for a jira_sm destination against `desk` (the kit's settings, overridden)."""
    return adapter_builder(kit, tenant, desk, monkeypatch)


# --- The payload ----------------------------------------------------------------------------------

def test_the_request_jira_gets_carries_the_route_the_reference_and_the_requester(desk, jira):
    result = jira().create_ticket(REQUEST, "key-1", REF)

    assert (result.ticket_id, result.url) == ("SUP-1", f"{desk.url}/browse/SUP-1")
    record = only_record(desk)
    assert record["external_id"] == REF
    assert {k: v for k, v in record["fields"].items() if k not in ("issueKey", "issueId")} == {
        "serviceDeskId": "1",
        "requestTypeId": "21",                                  # request_types["refund"] wins over the default
        "raiseOnBehalfOf": "jane.doe@example.com",
        "requestFieldValues": {
            "summary": "Invoice 4471 charged twice",            # one line
            "description": "The invoice shows\nthe same line twice.",
            "labels": ["email", "billing_issue"],               # a label has no spaces
            "customfield_10050": REF,
            "customfield_10060": {"value": "Billing"},
            "priority": {"name": "Highest"},
            "customfield_10070": {"accountId": "5b10a2844c20165700ede21g"},
        },
    }
    assert kit.route_of(record) == {"queue": "billing", "priority": "urgent"}
    # No idempotency key goes out: Jira has none.
    assert desk.requests_log()[0]["idempotency_key"] is None


def test_without_a_reference_field_the_reference_is_a_label_and_a_queue_picks_the_request_type(desk, jira):
    adapter = jira(external_ref_field=None, queue_field=None, queues={"billing": "11"}, priorities=None,
                   assignee_field=None, request_types={})
    request = TicketRequest(subject="Hi", description="Text", requester="jane@example.com", tags=("email",),
                            queue="billing", priority="high", request_type="unmapped", assignee="alice",
                            fields={"customfield_10060": {"value": "Technical"}})
    adapter.create_ticket(request, "key-1", REF)

    values = only_record(desk)["fields"]["requestFieldValues"]
    assert only_record(desk)["fields"]["requestTypeId"] == "11"
    # The reference as a label; priority, request type and assignee without a mapping are left out;
    # request.fields come last.
    assert values == {"summary": "Hi", "description": "Text", "labels": ["email", REF],
                      "customfield_10060": {"value": "Technical"}}
    assert adapter.find_by_external_ref(REF).ticket_id == "SUP-1"


def test_the_payload_is_deterministic_and_the_summary_fits_jira():
    settings = {"service_desk_id": "1", "request_type_id": "10", "raise_on_behalf_of": False}
    long = TicketRequest(subject="x" * 300, description="d", requester="a@example.com")
    assert request_payload(long, REF, settings) == request_payload(long, REF, settings)
    payload = request_payload(long, REF, settings)
    assert len(payload["requestFieldValues"]["summary"]) == 255
    assert "raiseOnBehalfOf" not in payload


# --- Capabilities ----------------------------------------------------------------------------------

def test_capabilities_a_lagging_search_and_nothing_else(jira):
    adapter = jira(search_settle_seconds=None)
    assert isinstance(adapter, JiraServiceManagementDestination)
    assert (adapter.honours_idempotency_key, adapter.upsert, adapter.consistent_lookup) == (False, False, False)
    assert adapter.idempotency_window_seconds is None and not adapter.retry_safe
    assert adapter.lookup_settle_seconds == 60.0
    assert jira(search_settle_seconds=5).lookup_settle_seconds == 5.0
    assert adapter.max_description_chars == 32_000


# --- The lagging search -----------------------------------------------------------------------------

@pytest.mark.fakedesk(dialect="jira_sm", search_lag_seconds=0.5)
def test_the_search_sees_a_request_only_after_the_index_caught_up(desk, jira):
    adapter = jira()
    created = adapter.create_ticket(REQUEST, "key-1", REF)
    assert adapter.find_by_external_ref(REF) is None  # the index lags behind the create
    time.sleep(0.6)
    assert adapter.find_by_external_ref(REF) == created
    assert adapter.find_by_external_ref("mailroom-other") is None


def test_several_requests_with_our_reference_the_first_is_kept(desk, jira):
    adapter = jira()
    first = adapter.create_ticket(REQUEST, "key-1", REF)
    adapter.create_ticket(REQUEST, "key-1", REF)
    adapter.create_ticket(REQUEST, "key-2", REF + "-other")
    assert adapter.find_by_external_ref(REF) == first


def test_a_search_jira_refuses_is_a_configuration_error(jira):
    with pytest.raises(PermanentError) as caught:
        jira(external_ref_field="customfield_99999").find_by_external_ref(REF)
    assert caught.value.reason == "configuration"
    assert "does not exist" in caught.value.detail


# --- The kind's error mappings ------------------------------------------------------------------------

def test_a_field_not_on_the_form_is_400_invalid_fields_with_jiras_message(desk, jira):
    request = TicketRequest(subject="Hi", description="Text", requester="jane@example.com",
                            fields={"customfield_99999": "x"})
    with pytest.raises(PermanentError) as caught:
        jira().create_ticket(request, "key-1", REF)
    assert caught.value.reason == "invalid_fields"
    assert "customfield_99999" in caught.value.detail
    assert desk.tickets() == []


def test_both_shapes_of_jira_errors_are_kept_with_addresses_masked():
    detail = jira_errors({"errorMessage": "The customer jane.doe@example.com is not valid.",
                          "errorMessages": ["Summary is required."], "errors": {"labels": "no spaces"}})
    assert detail == "The customer j***@e***.com is not valid.; Summary is required.; labels: no spaces"
    assert jira_errors({}) == "HTTP 400"


def test_creating_in_a_service_project_that_is_not_there_is_a_configuration_error(desk, jira):
    with pytest.raises(PermanentError) as caught:
        jira(service_desk_id="7").create_ticket(REQUEST, "key-1", REF)
    assert caught.value.reason == "configuration"
    assert desk.tickets() == []


@pytest.mark.parametrize(("fault", "reason"), [("error_500", "server_error"), ("drop_after_commit", "connection_lost"),
                                               ("stall_after_commit:2", "timeout")])
def test_a_lost_answer_after_the_create_is_ambiguous(desk, jira, fault, reason):
    desk.set_plan([fault])
    with pytest.raises(AmbiguousOutcome) as caught:
        jira(read_timeout=0.5).create_ticket(REQUEST, "key-1", REF)
    assert caught.value.reason == reason
    assert len(desk.requests_log()) == 1  # never a second create behind our back


def test_comments_are_public_and_a_missing_request_is_not_found(desk, jira):
    adapter = jira()
    key = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    comment_id = adapter.add_comment(key, "Still charged twice.", "jane.doe@example.com", "key-2", REF)

    listed = requests.get(f"{desk.url}/rest/servicedeskapi/request/{key}/comment",
                          auth=("agent@acme.test", desk.token), timeout=5).json()
    assert listed["values"] == [{"id": comment_id, "body": "Still charged twice.", "public": True}]
    with pytest.raises(PermanentError) as caught:
        adapter.add_comment("SUP-99", "x", "", "key-3", REF)
    assert caught.value.reason == "not_found"
    writes = len(desk.requests_log())
    with pytest.raises(PermanentError):
        adapter.add_comment("not a key", "x", "", "key-4", REF)
    assert len(desk.requests_log()) == writes  # nothing sent for a malformed key


def test_a_bare_token_is_sent_as_a_bearer_token(tenant, desk, monkeypatch):
    variable = f"{env_prefix(tenant.slug)}JIRA_BEARER"
    monkeypatch.setenv(variable, desk.token)
    destination = kit.configure(tenant, desk, monkeypatch, slug="bearer")
    destination.credentials_ref = f"env:{variable}"
    assert adapter_for(destination).create_ticket(REQUEST, "key-1", REF).ticket_id == "SUP-1"


def test_nothing_logged_holds_the_customer_address(jira, caplog):
    caplog.set_level(logging.DEBUG)
    jira().create_ticket(REQUEST, "key-1", REF)
    assert "jane.doe@example.com" not in caplog.text
    assert "SUP-1" in caplog.text


# --- check_connection ----------------------------------------------------------------------------------

def test_check_connection_names_the_project_and_writes_nothing(desk, jira):
    said = jira().check_connection()
    assert "SUP" in said and "customfield_10050" in said
    assert desk.requests_log() == [] and desk.tickets() == []


def test_check_connection_with_wrong_credentials_is_credentials_and_writes_nothing(tenant, desk, monkeypatch):
    destination = kit.configure(tenant, desk, monkeypatch)
    monkeypatch.setenv(destination.credentials_ref.removeprefix("env:"), "agent@acme.test:wrong")
    with pytest.raises(PermanentError) as caught:
        adapter_for(destination).check_connection()
    assert caught.value.reason == "credentials"
    assert desk.requests_log() == [] and desk.tickets() == []


@pytest.mark.parametrize("settings", [{"service_desk_id": "7"}, {"request_type_id": "99"},
                                      {"request_type_id": "30"},                            # no reference field
                                      {"request_type_id": "30", "external_ref_field": None}])  # no labels
def test_check_connection_finds_a_wrong_project_or_request_type(desk, jira, settings):
    with pytest.raises(PermanentError) as caught:
        jira(**settings).check_connection()
    assert caught.value.reason == "configuration"
    assert desk.requests_log() == []


# --- SETTINGS ----------------------------------------------------------------------------------------

def test_settings_are_checked_field_by_field():
    good = {"service_desk_id": "1", "request_type_id": "10", "request_types": {"refund": "21"},
            "queues": {"billing": "Billing"}, "queue_field": "customfield_10060",
            "priorities": {"urgent": "Highest"}, "assignees": {"alice": "712020:abc-def"},
            "assignee_field": "customfield_10070", "external_ref_field": "customfield_10050",
            "raise_on_behalf_of": True, "search_settle_seconds": 120, "read_timeout": 5}
    assert validate(JiraServiceManagementDestination.SETTINGS, good) == {}
    errors = validate(JiraServiceManagementDestination.SETTINGS, {
        "request_type_id": "ten", "queue_field": "Queue", "priorities": {"critical": "Highest"},
        "request_types": {"refund": 21.5}, "raise_on_behalf_of": "yes", "search_settle_seconds": -1,
        "project": "SUP"})
    assert errors["service_desk_id"] == ["is required"]
    assert set(errors) == {"service_desk_id", "request_type_id", "queue_field", "priorities", "request_types",
                           "raise_on_behalf_of", "search_settle_seconds", "project"}


# --- The fake dialect -----------------------------------------------------------------------------------

def test_the_fake_refuses_unauthenticated_calls_the_way_jira_does(desk):
    answer = requests.get(f"{desk.url}/rest/servicedeskapi/servicedesk/1", timeout=5)
    assert answer.status_code == 401 and "errorMessage" in answer.json()
    answer = requests.get(f"{desk.url}/rest/servicedeskapi/servicedesk/1", timeout=5,
                          headers={"Authorization": f"Bearer {desk.token}"})
    assert answer.json()["projectKey"] == "SUP"
    answer = requests.get(f"{desk.url}/rest/api/3/search/jql", params={"jql": "project = SUP"}, timeout=5,
                          auth=("agent@acme.test", desk.token))
    assert answer.status_code == 400 and answer.json()["errorMessages"]

"""The HubSpot adapter against FakeDesk's hubspot dialect over real HTTP: the ticket upsert by the unique
property, the requester's contact, notes, HubSpot's error bodies, check_connection.

What every kind shares (duplicates, lost answers, 429/401/422, comments through the pipeline) is in
tests/test_destination_contract.py."""
import json
import logging
from datetime import datetime

import pytest
import requests

from tests.destination_kits import hubspot as kit
from tests.factories import make_event
from ticketing import intents
from ticketing.destinations import adapter_for
from ticketing.destinations.base import AmbiguousOutcome, PermanentError, TicketRequest, TransientError
from ticketing.destinations.hubspot import HubSpotDestination, ticket_properties
from ticketing.destinations.settings import validate
from ticketing.models import Destination

pytestmark = pytest.mark.fakedesk(dialect="hubspot")

REQUEST = TicketRequest(
    subject="Invoice 42 charged twice",
    description="I was charged twice for invoice 42.",
    requester="Jane Doe <jane.doe@example.com>",
    tags=("email",),
    queue="billing", priority="urgent", request_type="refund", assignee="alice",
    fields={"mailroom_requester": "from-fields"},
)
UPSERT_PATH = "/crm/v3/objects/tickets/batch/upsert"
MISSING_SCOPES = {"status": "error", "message": "This app hasn't been granted all required scopes to make this call.",
                  "correlationId": "c0ffee", "category": "MISSING_SCOPES",
                  "errors": [{"message": "One or more of the following scopes are required.",
                              "context": {"requiredGranularScopes": ["tickets"]}}]}


@pytest.fixture
def hubspot(tenant, desk, monkeypatch):
    """build(**settings) -> a HubSpot adapter against the desk (each call its own destination)."""
    made = []

    def build(**settings):
        settings.setdefault("create_contacts", False)
        made.append(kit.configure(tenant, desk, monkeypatch, slug=f"hs-{len(made)}", **settings))
        return adapter_for(made[-1])

    return build


@pytest.fixture
def seen(desk):
    requests_seen = []
    desk.on_request(lambda request: requests_seen.append(request) and None)
    return requests_seen


def answer(desk, method: str, path_start: str, status: int, body: dict, headers: dict | None = None):
    """Make the desk answer matching requests with `status` (a request hook)."""
    desk.on_request(lambda r: (status, body, headers or {}) if r.method == method and r.path.startswith(path_start)
                    else None)


# --- Capabilities and settings ----------------------------------------------------

def test_capabilities_an_upsert_with_a_consistent_lookup_and_a_default_api_url(hubspot):
    adapter = hubspot(read_timeout=4)
    assert isinstance(adapter, HubSpotDestination)
    # Only the create is an upsert: `retry_safe` (every write, comments too) stays false.
    assert (adapter.upsert, adapter.consistent_lookup, adapter.retry_safe, adapter.honours_idempotency_key) == (
        True, True, False, False)
    assert (adapter.max_description_chars, adapter.id_property, adapter.timeout[1]) == (64_000, "mailroom_ref", 4.0)
    assert HubSpotDestination.needs_base_url and HubSpotDestination.needs_credentials
    bare = HubSpotDestination(Destination(kind="hubspot", settings={}))
    assert (bare.base_url, bare.ticket_url("7")) == ("https://api.hubapi.com", "")
    eu = HubSpotDestination(Destination(kind="hubspot", settings={"portal_id": "99",
                                                                  "app_url": "https://app-eu1.hubspot.com"}))
    assert eu.ticket_url("7") == "https://app-eu1.hubspot.com/contacts/99/record/0-5/7"


def test_settings_are_checked_field_by_field():
    good = {"id_property": "ticket_ref", "pipeline": "12345", "pipeline_stage": "67890", "portal_id": 4242,
            "app_url": "https://app-eu1.hubspot.com", "create_contacts": True, "requester_property": "requester",
            "queues": {"billing": "111:222", "tech": "333"}, "priorities": {"urgent": "HIGH"},
            "owners": {"alice": "7001"}, "categories": {"refund": "BILLING_ISSUE"}, "connect_timeout": 2}
    assert validate(HubSpotDestination.SETTINGS, good) == {}
    errors = validate(HubSpotDestination.SETTINGS, {
        "id_property": "Mailroom Ref", "portal_id": "acme", "create_contacts": "no", "queues": {"billing": "a:b:c"},
        "priorities": {"urgent": "CRITICAL"}, "owners": {"alice": "alice@acme"}, "pipline": "0"})
    assert set(errors) == {"id_property", "portal_id", "create_contacts", "queues", "priorities", "owners", "pipline"}
    assert errors["priorities"] == ["'urgent': must be one of LOW, MEDIUM, HIGH, URGENT"]


# --- The ticket ---------------------------------------------------------------------------

def test_create_upserts_by_the_unique_property_with_the_mapped_route(desk, hubspot, seen):
    result = hubspot(requester_property="mailroom_requester").create_ticket(REQUEST, "key-1", "evt-1")

    [upsert] = [r for r in seen if r.path == UPSERT_PATH]
    assert upsert.json() == {"inputs": [{"idProperty": "mailroom_ref", "id": "evt-1", "properties": {
        "subject": "Invoice 42 charged twice", "content": "I was charged twice for invoice 42.",
        "source_type": "EMAIL", "hs_pipeline": "billing-pipeline", "hs_pipeline_stage": "billing-new",
        "hs_ticket_priority": "URGENT", "hubspot_owner_id": "7001", "hs_ticket_category": "BILLING_ISSUE",
        "mailroom_requester": "from-fields",  # request.fields come last and win
    }}]}
    [record] = desk.tickets()
    assert result.ticket_id == str(record["id"])
    assert result.url == f"https://app.hubspot.com/contacts/4242/record/0-5/{record['id']}"
    assert record["fields"]["mailroom_ref"] == "evt-1" and record["external_id"] == "evt-1"
    assert [(e["status"], e["external_id"]) for e in desk.requests_log()] == [(200, "evt-1")]


def test_the_default_pipeline_the_requester_property_and_unmapped_values():
    request = TicketRequest("s", "d", "Jane <jane@example.com>", queue="sales", priority="", request_type="other",
                            assignee="bob")
    assert ticket_properties(request, {"requester_property": "requester"}) == {
        "subject": "s", "content": "d", "source_type": "EMAIL", "hs_pipeline": "0", "hs_pipeline_stage": "1",
        "requester": "jane@example.com"}
    urgent = ticket_properties(TicketRequest("s", "d", "a@b.c", priority="urgent", queue="tech"),
                               {"pipeline": "9", "pipeline_stage": "10", "queues": {"tech": "20"}})
    assert (urgent["hs_ticket_priority"], urgent["hs_pipeline"], urgent["hs_pipeline_stage"]) == ("URGENT", "20", "10")


def test_a_retry_updates_the_one_ticket_and_the_lookup_finds_it(desk, hubspot):
    adapter = hubspot()
    assert adapter.find_by_external_ref("evt-1") is None
    first = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    again = adapter.create_ticket(REQUEST, "key-1", "evt-1")

    assert again == first and adapter.find_by_external_ref("evt-1") == first
    assert len(desk.tickets()) == 1 and len(desk.requests_log()) == 2


# --- The requester's contact ---------------------------------------------------------------

def test_a_known_contact_is_associated_with_the_ticket(desk, hubspot, seen):
    contact_id = desk.control("hubspot/contacts", {"email": "jane.doe@example.com"})["id"]
    ticket = hubspot().create_ticket(REQUEST, "key-1", "evt-1")

    [search] = [r for r in seen if r.path == "/crm/v3/objects/contacts/search"]
    assert search.json()["filterGroups"] == [{"filters": [
        {"propertyName": "email", "operator": "EQ", "value": "jane.doe@example.com"}]}]
    assert [r.path for r in seen if r.method == "PUT"] == [
        f"/crm/v4/objects/tickets/{ticket.ticket_id}/associations/default/contacts/{contact_id}"]
    [record] = desk.tickets()
    assert record["fields"]["associations"] == {"contacts": [{"id": contact_id, "email": "jane.doe@example.com"}]}


def test_an_unknown_sender_gets_a_contact_only_with_create_contacts(desk, hubspot, seen):
    hubspot().create_ticket(REQUEST, "key-1", "evt-1")
    assert "associations" not in desk.tickets()[0]["fields"]
    assert not [r for r in seen if r.path.endswith("/contacts/batch/upsert") or r.method == "PUT"]

    hubspot(create_contacts=True).create_ticket(REQUEST, "key-2", "evt-2")
    [upsert] = [r for r in seen if r.path == "/crm/v3/objects/contacts/batch/upsert"]
    assert upsert.json() == {"inputs": [{"idProperty": "email", "id": "jane.doe@example.com",
                                         "properties": {"email": "jane.doe@example.com", "firstname": "Jane Doe"}}]}
    assert desk.tickets()[1]["fields"]["associations"]["contacts"][0]["email"] == "jane.doe@example.com"


@pytest.mark.parametrize("path", ["/crm/v4/objects/tickets/", "/crm/v3/objects/contacts/search"])
def test_a_failed_association_neither_fails_nor_repeats_the_ticket(desk, hubspot, caplog, path):
    desk.control("hubspot/contacts", {"email": "jane.doe@example.com"})
    answer(desk, "PUT" if "v4" in path else "POST", path, 500, {"status": "error", "category": "INTERNAL_ERROR"})
    caplog.set_level(logging.INFO)
    result = hubspot().create_ticket(REQUEST, "key-1", "evt-1")

    [record] = desk.tickets()
    assert result.ticket_id == str(record["id"]) and "associations" not in record["fields"]
    assert len(desk.requests_log()) == 1
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "was not associated (server_error)" in warning and "j***@e***.com" in warning


# --- HubSpot's errors ---------------------------------------------------------------------

def test_missing_scopes_are_a_credentials_failure_that_names_them(desk, hubspot):
    answer(desk, "POST", UPSERT_PATH, 403, MISSING_SCOPES)
    with pytest.raises(PermanentError) as caught:
        hubspot().create_ticket(REQUEST, "key-1", "evt-1")
    assert (caught.value.reason, caught.value.detail) == ("credentials", "the private app lacks scopes: tickets")


def test_an_unknown_property_or_option_is_invalid_fields(desk, hubspot):
    bogus = TicketRequest("s", "d", "a@example.com", priority="urgent", fields={"bogus": "x"})
    with pytest.raises(PermanentError) as caught:
        hubspot(priorities={"urgent": "URGENT"}).create_ticket(bogus, "key-1", "evt-1")
    assert caught.value.reason == "invalid_fields"
    body = json.loads(caught.value.detail)
    assert body["category"] == "VALIDATION_ERROR" and body["errors"][0]["error"] == "PROPERTY_DOESNT_EXIST"
    assert desk.tickets() == []


def test_the_ten_secondly_limit_is_transient_with_retry_after(desk, hubspot):
    desk.set_plan(["rate_limit:3"])
    with pytest.raises(TransientError) as caught:
        hubspot().create_ticket(REQUEST, "key-1", "evt-1")
    assert (caught.value.reason, caught.value.retry_after) == ("rate_limited", 3.0)


@pytest.mark.parametrize("fault", ["error_500", "unavailable_503"])
def test_a_5xx_after_the_upsert_is_transient_but_after_a_note_ambiguous(desk, hubspot, fault):
    adapter = hubspot()
    desk.set_plan([fault])
    with pytest.raises(TransientError) as create:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")
    assert create.value.reason == "server_error"

    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    desk.set_plan([fault])
    with pytest.raises(AmbiguousOutcome) as note:
        adapter.add_comment(ticket.ticket_id, "More.", "jane@example.com", "key-c", "evt-2")
    assert note.value.reason == "server_error"


# --- Notes ------------------------------------------------------------------------------------

def test_a_comment_is_a_note_associated_with_the_ticket(desk, hubspot, seen):
    adapter = hubspot()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    note_id = adapter.add_comment(ticket.ticket_id, "Still charged twice.", "jane@example.com", "key-c", "evt-2")

    [note] = [r.json() for r in seen if r.path == "/crm/v3/objects/notes"]
    assert note["associations"] == [{"to": {"id": ticket.ticket_id}, "types": [
        {"associationCategory": "HUBSPOT_DEFINED", "associationTypeId": 228}]}]
    assert note["properties"]["hs_note_body"] == "Still charged twice."
    [record] = desk.tickets()
    assert kit.comments_of(record) == ["Still charged twice."]
    assert str(record["comments"][1]["id"]) == note_id and record["comments"][1]["public"] is False


def test_the_note_timestamp_is_when_the_reply_came_in_the_same_on_every_attempt(desk, hubspot, seen, mailbox):
    event = make_event(mailbox)
    intent = intents.ensure_intent(event, "add_comment", event.tenant.destinations.get(is_default=True))
    adapter = hubspot()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    adapter.add_comment(ticket.ticket_id, "Reply.", "a", intent.idempotency_key, intent.external_ref)
    adapter.add_comment(ticket.ticket_id, "Reply.", "a", intent.idempotency_key, intent.external_ref)

    first, again = [r.json() for r in seen if r.path == "/crm/v3/objects/notes"]
    assert first == again
    stamp = datetime.fromisoformat(first["properties"]["hs_timestamp"].replace("Z", "+00:00"))
    assert abs((stamp - intent.created_at).total_seconds()) < 0.001


def test_a_note_on_a_ticket_that_does_not_exist_is_not_found(desk, hubspot):
    adapter = hubspot()
    with pytest.raises(PermanentError) as missing:
        adapter.add_comment("999", "hello", "a", "key-c", "evt-2")
    with pytest.raises(PermanentError) as malformed:
        adapter.add_comment("TICKET-9", "hello", "a", "key-d", "evt-3")
    assert (missing.value.reason, malformed.value.reason) == ("not_found", "not_found")
    assert [e["status"] for e in desk.requests_log()] == [400]  # the malformed id was never sent


# --- check_connection ----------------------------------------------------------------------

def test_check_connection_reads_the_unique_property_and_contacts(desk, hubspot, seen):
    said = hubspot().check_connection()
    assert "ticket property mailroom_ref has unique values" in said
    assert [(r.method, r.path) for r in seen] == [("GET", "/crm/v3/properties/tickets/mailroom_ref"),
                                                  ("GET", "/crm/v3/objects/contacts")]
    for prop, words in (("subject", "does not require unique values"), ("nope", "have no property nope")):
        with pytest.raises(PermanentError) as caught:
            hubspot(id_property=prop).check_connection()
        assert caught.value.reason == "configuration" and words in caught.value.detail
    assert desk.requests_log() == [] and desk.tickets() == []


def test_check_connection_with_a_wrong_token_or_missing_scopes_is_credentials(desk, hubspot, monkeypatch):
    adapter = hubspot()
    monkeypatch.setenv(adapter.destination.credentials_ref[4:], "pat-na1-wrong")
    with pytest.raises(PermanentError) as wrong:
        adapter.check_connection()
    assert wrong.value.reason == "credentials"
    assert desk.requests_log() == [] and desk.tickets() == []

    answer(desk, "GET", "/crm/v3/objects/contacts", 403, {**MISSING_SCOPES, "errors": [
        {"context": {"requiredGranularScopes": ["crm.objects.contacts.read"]}}]})
    with pytest.raises(PermanentError) as scopes:
        hubspot().check_connection()
    assert scopes.value.reason == "credentials" and "crm.objects.contacts.read" in scopes.value.detail


# --- The fake dialect ---------------------------------------------------------------------------

def test_the_fake_wants_the_bearer_token_and_a_unique_id_property(desk):
    body = {"inputs": [{"idProperty": "subject", "id": "x", "properties": {"content": "y"}}]}
    refused = requests.post(desk.url + UPSERT_PATH, json=body, timeout=5)
    assert (refused.status_code, refused.json()["category"]) == (401, "INVALID_AUTHENTICATION")
    not_unique = requests.post(desk.url + UPSERT_PATH, json=body, timeout=5,
                               headers={"Authorization": f"Bearer {desk.token}"})
    assert (not_unique.status_code, not_unique.json()["category"]) == (400, "VALIDATION_ERROR")
    assert desk.tickets() == []


# --- Privacy --------------------------------------------------------------------------------

def test_nothing_logged_contains_bodies_addresses_or_the_token(desk, hubspot, caplog):
    caplog.set_level(logging.DEBUG)
    adapter = hubspot(create_contacts=True)
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    adapter.add_comment(ticket.ticket_id, "Secret reply text", "jane.doe@example.com", "key-c", "evt-2")
    adapter.find_by_external_ref("evt-1")

    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "evt-1" in text
    for secret in ("jane.doe@example.com", "charged twice for", "Secret reply text", desk.token):
        assert secret not in text

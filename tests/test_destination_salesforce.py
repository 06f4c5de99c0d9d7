"""The Salesforce adapter against FakeDesk's salesforce dialect over real HTTP: the Case it upserts, OAuth
(client credentials, JWT bearer, the one refresh), 300 Multiple Choices, Salesforce's error lists,
CaseComments, check_connection.

What every kind shares (duplicates, lost answers, 429/401/422, comments through the pipeline) is in
tests/test_destination_contract.py."""
import base64
import json
import logging
import time
from urllib.parse import parse_qs

import pytest
import requests
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.destination_kits import salesforce as kit
from ticketing.destinations import adapter_for
from ticketing.destinations.base import AmbiguousOutcome, PermanentError, TicketRequest, TransientError
from ticketing.destinations.salesforce import SalesforceDestination, case_payload
from ticketing.destinations.settings import validate

pytestmark = pytest.mark.fakedesk(dialect="salesforce")

REQUEST = TicketRequest(
    subject="Invoice 42 charged twice",
    description="I was charged twice for invoice 42.",
    requester="Jane Doe <jane.doe@example.com>",
    tags=("email",),
    queue="billing", priority="urgent", request_type="refund",
    fields={"Product__c": "Printer"},
)
UPSERT_PATH = "/services/data/v62.0/sobjects/Case/Mailroom_Ref__c/evt-1"


@pytest.fixture
def salesforce(tenant, desk, monkeypatch):
    """build(**settings) -> a Salesforce adapter against the desk (each call its own destination)."""
    made = []

    def build(**settings):
        made.append(kit.configure(tenant, desk, monkeypatch, slug=f"sf-{len(made)}", **settings))
        return adapter_for(made[-1])

    return build


@pytest.fixture
def seen(desk):
    """Every API request the desk receives (token requests included)."""
    requests_seen = []
    desk.on_request(lambda request: requests_seen.append(request) and None)
    return requests_seen


def token_requests(seen) -> list:
    return [r for r in seen if r.path == "/services/oauth2/token"]


def seed_case(desk, ref: str, subject: str = "seeded") -> str:
    return desk.control("salesforce/cases", {"Subject": subject, "Description": "x", "Mailroom_Ref__c": ref})["id"]


# --- Capabilities and settings ----------------------------------------------------

def test_capabilities_an_upsert_with_a_consistent_lookup(salesforce):
    adapter = salesforce(connect_timeout=1, read_timeout=4)
    assert isinstance(adapter, SalesforceDestination)
    # Only the create is an upsert: `retry_safe` (every write, comments too) stays false.
    assert (adapter.upsert, adapter.consistent_lookup, adapter.retry_safe, adapter.honours_idempotency_key) == (
        True, True, False, False)
    assert (adapter.lookup_settle_seconds, adapter.max_description_chars, adapter.timeout) == (None, 32_000, (1.0, 4.0))
    assert (adapter.api_version, adapter.external_id_field, adapter.auth_flow) == (
        "62.0", "Mailroom_Ref__c", "client_credentials")


def test_settings_are_checked_field_by_field():
    good = {"api_version": "61.0", "external_id_field": "Ticket_Ref__c", "auth_flow": "jwt_bearer",
            "login_url": "https://login.salesforce.com", "username": "mailroom@acme.example", "origin": "Web",
            "comment_public": False, "queues": {"billing": "00G000000000001AAA"},
            "owners": {"alice": "005000000000001"}, "priorities": {"urgent": "High"},
            "case_types": {"refund": "012000000000001AAA"}, "read_timeout": 5}
    assert validate(SalesforceDestination.SETTINGS, good) == {}
    errors = validate(SalesforceDestination.SETTINGS, {
        "api_version": "62", "auth_flow": "password", "login_url": "ftp://login", "queues": {"billing": "Billing"},
        "priorities": {"critical": "High"}, "comment_public": "yes", "externalid_field": "x"})
    assert set(errors) == {"api_version", "auth_flow", "login_url", "queues", "priorities", "comment_public",
                           "externalid_field"}
    assert errors["queues"] == ["'billing': must match [a-zA-Z0-9]{15}(?:[a-zA-Z0-9]{3})?"]


# --- The Case --------------------------------------------------------------------------

def test_create_upserts_the_case_by_its_external_id_with_the_mapped_route(desk, salesforce, seen):
    result = salesforce().create_ticket(REQUEST, "key-1", "evt-1")

    [upsert] = [r for r in seen if r.method == "PATCH"]
    assert upsert.path == UPSERT_PATH
    assert upsert.json() == {
        "Subject": "Invoice 42 charged twice", "Description": "I was charged twice for invoice 42.",
        "Origin": "Email", "SuppliedEmail": "jane.doe@example.com", "SuppliedName": "Jane Doe",
        "OwnerId": kit.QUEUES["billing"], "Priority": "Urgent", "Type": "Refund", "Product__c": "Printer",
    }  # our reference travels in the URL only
    [record] = desk.tickets()
    assert result.ticket_id == record["fields"]["Id"] and len(result.ticket_id) == 18
    assert result.url == f"{desk.url}/lightning/r/Case/{result.ticket_id}/view"
    assert record["fields"]["Mailroom_Ref__c"] == "evt-1" and record["external_id"] == "evt-1"
    assert [(e["status"], e["external_id"], e["committed"]) for e in desk.requests_log()] == [(201, "evt-1", True)]


def test_the_route_mapping_assignee_wins_record_types_and_unmapped_values_are_left_out():
    settings = {"queues": {"billing": "00G000000000001"}, "owners": {"alice": "005000000000001"},
                "case_types": {"refund": "012000000000009", "question": "Question"}}
    both = case_payload(TicketRequest("s", "d", "a@example.com", queue="billing", assignee="alice",
                                      request_type="refund", priority="urgent"), settings, "Mailroom_Ref__c")
    assert (both["OwnerId"], both["RecordTypeId"], both["Priority"]) == ("005000000000001", "012000000000009", "High")
    assert "Type" not in both
    unmapped = case_payload(TicketRequest("s", "d", "a@example.com", queue="sales", assignee="bob",
                                          request_type="complaint", priority="", tags=("x",),
                                          fields={"Mailroom_Ref__c": "other", "Id": "500x", "Reason": "Other"}),
                            settings, "Mailroom_Ref__c")
    assert unmapped == {"Subject": "s", "Description": "d", "Origin": "Email", "SuppliedEmail": "a@example.com",
                        "SuppliedName": "a", "Reason": "Other"}
    assert case_payload(TicketRequest("s", "d", "a@example.com", request_type="question"), settings,
                        "X__c")["Type"] == "Question"


def test_a_retry_updates_the_one_case_and_the_lookup_finds_it(desk, salesforce):
    adapter = salesforce()
    assert adapter.find_by_external_ref("evt-1") is None
    first = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    again = adapter.create_ticket(REQUEST, "key-1", "evt-1")

    assert again == first
    assert adapter.find_by_external_ref("evt-1") == first
    assert len(desk.tickets()) == 1
    assert [e["status"] for e in desk.requests_log()] == [201, 200]


def test_several_cases_with_our_reference_are_multiple_matches_never_retried(desk, salesforce):
    first = seed_case(desk, "evt-1", "first")
    seed_case(desk, "evt-1", "second")
    adapter = salesforce()

    with pytest.raises(PermanentError) as caught:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")

    assert caught.value.reason == "multiple_matches"
    assert [(e["status"], e["committed"]) for e in desk.requests_log()] == [(300, False)]
    assert [t["subject"] for t in desk.tickets()] == ["first", "second"]  # neither touched
    assert adapter.find_by_external_ref("evt-1").ticket_id == first  # the lowest Id, the first made


# --- OAuth --------------------------------------------------------------------------------

def test_the_token_is_cached_and_fetched_again_once_after_the_session_is_revoked(desk, salesforce, seen):
    adapter = salesforce()
    adapter.create_ticket(REQUEST, "key-1", "evt-1")
    salesforce_again = adapter_for(adapter.destination)
    salesforce_again.find_by_external_ref("evt-1")
    assert len(token_requests(seen)) == 1  # one token per destination and secret in this process

    desk.revoke_sessions()
    assert salesforce_again.create_ticket(REQUEST, "key-2", "evt-2").ticket_id
    assert len(token_requests(seen)) == 2
    assert [e["status"] for e in desk.requests_log()] == [201, 401, 201]
    form = parse_qs(token_requests(seen)[0].body.decode())
    assert form["grant_type"] == ["client_credentials"] and form["client_id"] == ["mailroom-connected-app"]


@pytest.mark.parametrize("secret", ['{"client_id": "app", "client_secret": "wrong"}', "app:wrong", "no-colon",
                                    '{"client_secret": "x"}'])
def test_refused_or_malformed_client_credentials_are_permanent_and_write_nothing(desk, salesforce, monkeypatch,
                                                                                 secret):
    adapter = salesforce()
    monkeypatch.setenv(adapter.destination.credentials_ref[4:], secret)
    with pytest.raises(PermanentError) as caught:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")
    assert caught.value.reason == "credentials"
    assert desk.requests_log() == [] and desk.tickets() == []


def _jwt_part(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def test_the_jwt_bearer_flow_signs_an_rs256_assertion(desk, salesforce, monkeypatch, seen):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    adapter = salesforce(auth_flow="jwt_bearer", username="mailroom@acme.example")
    monkeypatch.setenv(adapter.destination.credentials_ref[4:], json.dumps({"client_id": desk.token,
                                                                            "private_key": pem}))
    assert adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id

    [token_request] = token_requests(seen)
    form = parse_qs(token_request.body.decode())
    assert form["grant_type"] == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]
    header, claims, signature = form["assertion"][0].split(".")
    assert json.loads(_jwt_part(header))["alg"] == "RS256"
    claims_json = json.loads(_jwt_part(claims))
    assert (claims_json["iss"], claims_json["sub"], claims_json["aud"]) == (desk.token, "mailroom@acme.example",
                                                                            desk.url)
    assert time.time() < claims_json["exp"] <= time.time() + 300
    key.public_key().verify(_jwt_part(signature), f"{header}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256())


def test_the_jwt_bearer_flow_needs_a_username_and_a_key_the_org_accepts(desk, salesforce, monkeypatch):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                            serialization.NoEncryption()).decode()
    no_user = salesforce(auth_flow="jwt_bearer")
    with pytest.raises(PermanentError) as caught:
        no_user.create_ticket(REQUEST, "key-1", "evt-1")
    assert caught.value.reason == "configuration"

    other_app = salesforce(auth_flow="jwt_bearer", username="mailroom@acme.example")
    monkeypatch.setenv(other_app.destination.credentials_ref[4:], json.dumps({"client_id": "another-app",
                                                                              "private_key": pem}))
    with pytest.raises(PermanentError) as refused:
        other_app.create_ticket(REQUEST, "key-1", "evt-1")
    assert refused.value.reason == "credentials" and "invalid_grant" in refused.value.detail
    assert desk.requests_log() == []


# --- Salesforce's errors -----------------------------------------------------------------------

def test_the_daily_request_limit_is_transient_and_not_resent_with_a_new_token(desk, salesforce, seen):
    desk.set_plan(["rate_limit:7"])
    with pytest.raises(TransientError) as caught:
        salesforce().create_ticket(REQUEST, "key-1", "evt-1")

    assert (caught.value.reason, caught.value.retry_after, caught.value.detail) == (
        "rate_limited", 7.0, "REQUEST_LIMIT_EXCEEDED")
    assert [e["status"] for e in desk.requests_log()] == [403]
    assert len(token_requests(seen)) == 1


def test_field_errors_are_invalid_fields_with_salesforces_error_list(desk, salesforce):
    bogus = TicketRequest("s", "d", "jane@example.com", fields={"Bogus": 1})
    with pytest.raises(PermanentError) as caught:
        salesforce().create_ticket(bogus, "key-1", "evt-1")

    assert caught.value.reason == "invalid_fields"
    [error] = json.loads(caught.value.detail)
    assert (error["errorCode"], error["fields"]) == ("INVALID_FIELD", ["Bogus"])
    assert desk.tickets() == []


def test_an_unknown_external_id_field_is_a_configuration_error(desk, salesforce):
    adapter = salesforce(external_id_field="Nope__c")
    with pytest.raises(PermanentError) as create:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")
    with pytest.raises(PermanentError) as lookup:
        adapter.find_by_external_ref("evt-1")
    assert (create.value.reason, lookup.value.reason) == ("configuration", "configuration")


@pytest.mark.parametrize("fault", ["error_500", "unavailable_503"])
def test_a_5xx_after_the_upsert_is_transient_but_after_a_comment_ambiguous(desk, salesforce, fault):
    adapter = salesforce()
    desk.set_plan([fault])
    with pytest.raises(TransientError) as create:
        adapter.create_ticket(REQUEST, "key-1", "evt-1")
    assert create.value.reason == "server_error"

    case = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    desk.set_plan([fault])
    with pytest.raises(AmbiguousOutcome) as comment:
        adapter.add_comment(case.ticket_id, "More.", "jane@example.com", "key-c", "evt-2")
    assert comment.value.reason == "server_error"


# --- CaseComments ---------------------------------------------------------------------------

def test_a_comment_is_a_case_comment_published_or_not(desk, salesforce, seen):
    adapter = salesforce()
    case = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    comment_id = adapter.add_comment(case.ticket_id, "Still charged twice.", "jane@example.com", "key-c", "evt-2")
    salesforce(comment_public=False).add_comment(case.ticket_id, "Internal.", "x", "key-d", "evt-3")

    posted = [r for r in seen if r.path == "/services/data/v62.0/sobjects/CaseComment"]
    assert posted[0].json() == {"ParentId": case.ticket_id, "CommentBody": "Still charged twice.",
                                "IsPublished": True}
    assert comment_id.startswith("00a") and len(comment_id) == 18
    [record] = desk.tickets()
    assert kit.comments_of(record) == ["Still charged twice.", "Internal."]
    assert [c["public"] for c in record["comments"][1:]] == [True, False]


def test_a_long_comment_is_cut_to_salesforces_limit_the_same_way_every_time(desk, salesforce, seen):
    adapter = salesforce()
    case = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    adapter.add_comment(case.ticket_id, "x" * 5000, "a", "key-c", "evt-2")
    adapter.add_comment(case.ticket_id, "x" * 5000, "a", "key-c", "evt-2")

    first, again = [r.json()["CommentBody"] for r in seen if r.path.endswith("/CaseComment")]
    assert first == again and len(first) == 4000
    assert first.endswith("comment limit.]")


def test_a_comment_on_a_case_that_does_not_exist_is_not_found(desk, salesforce):
    adapter = salesforce()
    with pytest.raises(PermanentError) as missing:
        adapter.add_comment("500000000000999AAQ", "hello", "a", "key-c", "evt-2")
    with pytest.raises(PermanentError) as malformed:
        adapter.add_comment("42", "hello", "a", "key-d", "evt-3")
    assert (missing.value.reason, malformed.value.reason) == ("not_found", "not_found")
    assert [e["status"] for e in desk.requests_log()] == [400]  # the malformed id was never sent


# --- check_connection ----------------------------------------------------------------------

def test_check_connection_signs_in_and_checks_the_external_id_field(desk, salesforce):
    said = salesforce().check_connection()
    assert "Mailroom_Ref__c is an External ID, unique" in said
    for field, words in (("Subject", "not marked External ID"), ("Missing__c", "has no field Missing__c")):
        with pytest.raises(PermanentError) as caught:
            salesforce(external_id_field=field).check_connection()
        assert caught.value.reason == "configuration" and words in caught.value.detail
    assert desk.requests_log() == [] and desk.tickets() == []


def test_check_connection_with_wrong_credentials_is_permanent_and_writes_nothing(desk, salesforce, monkeypatch):
    adapter = salesforce()
    monkeypatch.setenv(adapter.destination.credentials_ref[4:], "mailroom-connected-app:wrong")
    with pytest.raises(PermanentError) as caught:
        adapter.check_connection()
    assert caught.value.reason == "credentials"
    assert desk.requests_log() == [] and desk.tickets() == []


# --- The fake dialect ---------------------------------------------------------------------------

def test_the_fake_refuses_calls_without_a_session_and_unknown_grants(desk):
    unauthenticated = requests.patch(desk.url + UPSERT_PATH, json={"Subject": "x", "Description": "y"}, timeout=5)
    assert unauthenticated.status_code == 401
    assert unauthenticated.json()[0]["errorCode"] == "INVALID_SESSION_ID"
    grant = requests.post(desk.url + "/services/oauth2/token", data={"grant_type": "password"}, timeout=5)
    assert (grant.status_code, grant.json()["error"]) == (400, "unsupported_grant_type")
    token = requests.post(desk.url + "/services/oauth2/token", timeout=5, data={
        "grant_type": "client_credentials", "client_id": "app", "client_secret": desk.token}).json()
    assert token["token_type"] == "Bearer" and token["instance_url"] == desk.url
    describe = requests.get(desk.url + "/services/data/v62.0/sobjects/Case/describe", timeout=5,
                            headers={"Authorization": f"Bearer {token['access_token']}"})
    [field] = [f for f in describe.json()["fields"] if f["name"] == "Mailroom_Ref__c"]
    assert (field["externalId"], field["unique"]) == (True, True)


# --- Privacy --------------------------------------------------------------------------------

def test_nothing_logged_contains_bodies_addresses_or_tokens(desk, salesforce, caplog, seen):
    caplog.set_level(logging.DEBUG)
    adapter = salesforce()
    case = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    adapter.add_comment(case.ticket_id, "Secret reply text", "jane.doe@example.com", "key-c", "evt-2")
    desk.revoke_sessions()
    adapter.find_by_external_ref("evt-1")

    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "evt-1" in text
    access_tokens = {r.headers["Authorization"].split()[1] for r in seen if "Authorization" in r.headers}
    assert len(access_tokens) == 2  # the first and the one after the refresh
    for secret in ("jane.doe@example.com", "charged twice for", "Secret reply text", desk.token, *access_tokens):
        assert secret not in text

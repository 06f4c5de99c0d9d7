"""The Salesforce adapter against FakeDesk's salesforce dialect over real HTTP: the Case it upserts, OAuth
(client credentials, JWT bearer, the one refresh), 300 Multiple Choices, Salesforce's error lists,
CaseComments, the requester's Contact, files as ContentVersions, closed Cases, Ref ID threads,
check_connection.

What every kind shares (duplicates, lost answers, 429/401/422, comments through the pipeline) is in
tests/test_destination_contract.py."""

import base64
import hashlib
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
from ticketing.destinations.base import (
    AmbiguousOutcome,
    CommentRequest,
    OutgoingFile,
    PermanentError,
    TicketClosed,
    TicketRequest,
    TransientError,
)
from ticketing.destinations.capabilities import FILES_AFTER_WRITE, MB, REQUESTER_FIND_OR_CREATE
from ticketing.destinations.files import attach_each
from ticketing.destinations.journal import MemoryJournal
from ticketing.destinations.salesforce import SalesforceDestination, case_ids_from_ref, case_payload
from ticketing.destinations.settings import validate

pytestmark = pytest.mark.fakedesk(dialect="salesforce")

REQUEST = TicketRequest(
    subject="Invoice 42 charged twice",
    description="I was charged twice for invoice 42.",
    requester="Jane Doe <jane.doe@example.com>",
    tags=("email",),
    queue="billing",
    priority="urgent",
    request_type="refund",
    fields={"Product__c": "Printer"},
)
UPSERT_PATH = "/services/data/v62.0/sobjects/Case/Mailroom_Ref__c/evt-1"
CONTENT_VERSION_PATH = "/services/data/v62.0/sobjects/ContentVersion"
CONTACT_PATH = "/services/data/v62.0/sobjects/Contact"
REPLY = CommentRequest(body="Still charged twice.", author_email="jane.doe@example.com", author_name="Jane Doe")


def outgoing(index: int, filename: str, data: bytes, content_type: str = "application/pdf") -> OutgoingFile:
    return OutgoingFile(
        index=index,
        filename=filename,
        content_type=content_type,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        payload=lambda: data,
    )


FILES = (
    outgoing(0, "invoice-42.pdf", b"%PDF-1.7 invoice 42"),
    outgoing(1, "screenshot.png", b"\x89PNG shot", "image/png"),
)


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
        True,
        True,
        False,
        False,
    )
    assert (adapter.lookup_settle_seconds, adapter.max_description_chars, adapter.timeout) == (None, 32_000, (1.0, 4.0))
    assert (adapter.api_version, adapter.external_id_field, adapter.auth_flow) == (
        "62.0",
        "Mailroom_Ref__c",
        "client_credentials",
    )
    caps = adapter.capabilities
    assert (caps.files, caps.max_file_bytes, caps.html, caps.requester, caps.cc_field) == (
        FILES_AFTER_WRITE,
        37 * MB,
        False,
        REQUESTER_FIND_OR_CREATE,
        "",
    )
    assert (
        caps.closed_policies,
        caps.default_closed_policy,
        caps.acknowledges_requester,
        caps.customer_authored_comments,
        caps.requests_per_minute,
    ) == (("follow_up", "reopen", "review"), "follow_up", False, False, 40)


def test_settings_are_checked_field_by_field():
    good = {
        "api_version": "61.0",
        "external_id_field": "Ticket_Ref__c",
        "auth_flow": "jwt_bearer",
        "login_url": "https://login.salesforce.com",
        "username": "mailroom@acme.example",
        "origin": "Web",
        "comment_public": False,
        "create_contacts": False,
        "file_key_field": "Mailroom_File_Key__c",
        "reopen_status": "Working",
        "closed_policy": "reopen",
        "queues": {"billing": "00G000000000001AAA"},
        "owners": {"alice": "005000000000001"},
        "priorities": {"urgent": "High"},
        "case_types": {"refund": "012000000000001AAA"},
        "read_timeout": 5,
    }
    assert validate(SalesforceDestination.SETTINGS, good) == {}
    errors = validate(
        SalesforceDestination.SETTINGS,
        {
            "api_version": "62",
            "auth_flow": "password",
            "login_url": "ftp://login",
            "queues": {"billing": "Billing"},
            "priorities": {"critical": "High"},
            "comment_public": "yes",
            "externalid_field": "x",
            "file_key_field": "Reason For Change",
            "closed_policy": "reopen_always",
        },
    )
    assert set(errors) == {
        "api_version",
        "auth_flow",
        "login_url",
        "queues",
        "priorities",
        "comment_public",
        "externalid_field",
        "file_key_field",
        "closed_policy",
    }
    assert errors["queues"] == ["'billing': must match [a-zA-Z0-9]{15}(?:[a-zA-Z0-9]{3})?"]


# --- The Case --------------------------------------------------------------------------


def test_create_upserts_the_case_by_its_external_id_with_the_mapped_route(desk, salesforce, seen):
    result = salesforce().create_ticket(REQUEST, "key-1", "evt-1")

    [upsert] = [r for r in seen if r.method == "PATCH"]
    assert upsert.path == UPSERT_PATH
    [record] = desk.tickets()
    assert upsert.json() == {
        "Subject": "Invoice 42 charged twice",
        "Description": "I was charged twice for invoice 42.",
        "Origin": "Email",
        "SuppliedEmail": "jane.doe@example.com",
        "SuppliedName": "Jane Doe",
        "ContactId": record["fields"]["ContactId"],
        "OwnerId": kit.QUEUES["billing"],
        "Priority": "Urgent",
        "Type": "Refund",
        "Product__c": "Printer",
    }  # our reference travels in the URL only
    assert result.ticket_id == record["fields"]["Id"] and len(result.ticket_id) == 18
    assert result.url == f"{desk.url}/lightning/r/Case/{result.ticket_id}/view"
    assert record["fields"]["Mailroom_Ref__c"] == "evt-1" and record["external_id"] == "evt-1"
    assert [(e["status"], e["external_id"], e["committed"]) for e in desk.requests_log()] == [(201, "evt-1", True)]


def test_the_route_mapping_assignee_wins_record_types_and_unmapped_values_are_left_out():
    settings = {
        "queues": {"billing": "00G000000000001"},
        "owners": {"alice": "005000000000001"},
        "case_types": {"refund": "012000000000009", "question": "Question"},
    }
    both = case_payload(
        TicketRequest(
            "s", "d", "a@example.com", queue="billing", assignee="alice", request_type="refund", priority="urgent"
        ),
        settings,
        "Mailroom_Ref__c",
    )
    assert (both["OwnerId"], both["RecordTypeId"], both["Priority"]) == ("005000000000001", "012000000000009", "High")
    assert "Type" not in both
    unmapped = case_payload(
        TicketRequest(
            "s",
            "d",
            "a@example.com",
            queue="sales",
            assignee="bob",
            request_type="complaint",
            priority="",
            tags=("x",),
            fields={"Mailroom_Ref__c": "other", "Id": "500x", "Reason": "Other"},
        ),
        settings,
        "Mailroom_Ref__c",
    )
    assert unmapped == {
        "Subject": "s",
        "Description": "d",
        "Origin": "Email",
        "SuppliedEmail": "a@example.com",
        "SuppliedName": "a",
        "Reason": "Other",
    }
    assert (
        case_payload(TicketRequest("s", "d", "a@example.com", request_type="question"), settings, "X__c")["Type"]
        == "Question"
    )


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
    # The first call after the revocation, the requester's Contact lookup (a read), drew the 401 and the refresh.
    second_token = [i for i, r in enumerate(seen) if r.path == "/services/oauth2/token"][1]
    refused, again = seen[second_token - 1], seen[second_token + 1]
    assert refused.path.endswith("/query") and again.query == refused.query
    assert refused.headers["Authorization"] != again.headers["Authorization"]
    assert [e["status"] for e in desk.requests_log()] == [201, 201]
    form = parse_qs(token_requests(seen)[0].body.decode())
    assert form["grant_type"] == ["client_credentials"] and form["client_id"] == ["mailroom-connected-app"]


@pytest.mark.parametrize(
    "secret", ['{"client_id": "app", "client_secret": "wrong"}', "app:wrong", "no-colon", '{"client_secret": "x"}']
)
def test_refused_or_malformed_client_credentials_are_permanent_and_write_nothing(desk, salesforce, monkeypatch, secret):
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
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    adapter = salesforce(auth_flow="jwt_bearer", username="mailroom@acme.example")
    monkeypatch.setenv(
        adapter.destination.credentials_ref[4:], json.dumps({"client_id": desk.token, "private_key": pem})
    )
    assert adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id

    [token_request] = token_requests(seen)
    form = parse_qs(token_request.body.decode())
    assert form["grant_type"] == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]
    header, claims, signature = form["assertion"][0].split(".")
    assert json.loads(_jwt_part(header))["alg"] == "RS256"
    claims_json = json.loads(_jwt_part(claims))
    assert (claims_json["iss"], claims_json["sub"], claims_json["aud"]) == (
        desk.token,
        "mailroom@acme.example",
        desk.url,
    )
    assert time.time() < claims_json["exp"] <= time.time() + 300
    key.public_key().verify(_jwt_part(signature), f"{header}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256())


def test_the_jwt_bearer_flow_needs_a_username_and_a_key_the_org_accepts(desk, salesforce, monkeypatch):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    ).decode()
    no_user = salesforce(auth_flow="jwt_bearer")
    with pytest.raises(PermanentError) as caught:
        no_user.create_ticket(REQUEST, "key-1", "evt-1")
    assert caught.value.reason == "configuration"

    other_app = salesforce(auth_flow="jwt_bearer", username="mailroom@acme.example")
    monkeypatch.setenv(
        other_app.destination.credentials_ref[4:], json.dumps({"client_id": "another-app", "private_key": pem})
    )
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
        "rate_limited",
        7.0,
        "REQUEST_LIMIT_EXCEEDED",
    )
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
        adapter.add_comment(case.ticket_id, REPLY, "key-c", "evt-2")
    assert comment.value.reason == "server_error"


# --- CaseComments ---------------------------------------------------------------------------


def test_a_customers_reply_is_a_published_case_comment_opening_with_who_wrote_it(desk, salesforce, seen):
    adapter = salesforce()
    case = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    with_cc = CommentRequest(
        body="Still charged twice.",
        author_email="jane.doe@example.com",
        author_name="Jane Doe",
        cc=("bob@example.com",),
    )
    comment_id = adapter.add_comment(case.ticket_id, with_cc, "key-c", "evt-2")

    [posted] = [r.json() for r in seen if r.path == "/services/data/v62.0/sobjects/CaseComment"]
    assert posted == {
        "ParentId": case.ticket_id,
        "IsPublished": True,
        "CommentBody": "From: Jane Doe <jane.doe@example.com>\nCC: bob@example.com\n\nStill charged twice.",
    }
    assert comment_id.startswith("00a") and len(comment_id) == 18
    [record] = desk.tickets()
    assert kit.comment_records_of(record) == [{"body": posted["CommentBody"], "public": True, "author": ""}]


def test_an_agents_mail_is_an_unpublished_comment_and_comment_public_false_publishes_none(desk, salesforce):
    case = salesforce().create_ticket(REQUEST, "key-1", "evt-1")
    agent = CommentRequest(
        body="Refund issued.", author_email="sam@support.example", author_name="Sam", public=False, from_agent=True
    )
    salesforce().add_comment(case.ticket_id, agent, "key-c", "evt-2")
    salesforce(comment_public=False).add_comment(case.ticket_id, REPLY, "key-d", "evt-3")

    [record] = desk.tickets()
    assert [(c["body"].split("\n")[0], c["public"]) for c in kit.comment_records_of(record)] == [
        ("From: Sam <sam@support.example> (agent)", False),
        ("From: Jane Doe <jane.doe@example.com>", False),
    ]


def test_a_long_comment_is_cut_to_salesforces_limit_the_same_way_every_time(desk, salesforce, seen):
    adapter = salesforce()
    case = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    long_reply = CommentRequest(body="x" * 5000, author_email="a@example.com")
    adapter.add_comment(case.ticket_id, long_reply, "key-c", "evt-2")
    adapter.add_comment(case.ticket_id, long_reply, "key-c", "evt-2")

    first, again = [r.json()["CommentBody"] for r in seen if r.path.endswith("/CaseComment")]
    assert first == again and len(first) == 4000
    assert first.startswith("From: a@example.com\n\nxxx") and first.endswith("comment limit.]")


def test_a_comment_on_a_case_that_does_not_exist_is_not_found(desk, salesforce):
    adapter = salesforce()
    with pytest.raises(PermanentError) as missing:
        adapter.add_comment("500000000000999AAQ", REPLY, "key-c", "evt-2")
    with pytest.raises(PermanentError) as malformed:
        adapter.add_comment("42", REPLY, "key-d", "evt-3")
    assert (missing.value.reason, malformed.value.reason) == ("not_found", "not_found")
    assert desk.requests_log() == []  # the Case was read first; nothing was written


# --- Closed Cases -----------------------------------------------------------------------------------


def test_a_reply_to_a_closed_case_is_refused_as_closed_before_anything_is_written(desk, salesforce):
    adapter = salesforce()
    case = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    desk.close(desk.tickets()[0]["id"])

    with pytest.raises(TicketClosed) as caught:
        adapter.add_comment(case.ticket_id, REPLY, "key-c", "evt-2")
    assert caught.value.reason == "ticket_closed"
    [record] = desk.tickets()
    assert kit.comment_records_of(record) == [] and len(desk.requests_log()) == 1  # the create only


def test_closed_policy_reopen_sets_the_open_status_then_comments(desk, salesforce, seen):
    adapter = salesforce(closed_policy="reopen", reopen_status="Working")
    case = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    desk.close(desk.tickets()[0]["id"])
    adapter.add_comment(case.ticket_id, REPLY, "key-c", "evt-2")

    [reopen] = [r for r in seen if r.method == "PATCH" and r.path.endswith(f"/Case/{case.ticket_id}")]
    assert reopen.json() == {"Status": "Working"}
    [record] = desk.tickets()
    assert record["status"] == "open" and record["fields"]["Status"] == "Working"
    assert len(kit.comment_records_of(record)) == 1
    assert [(e["method"], e["status"]) for e in desk.requests_log()] == [("PATCH", 201), ("PATCH", 204), ("POST", 201)]


def test_a_follow_up_case_has_the_closed_case_as_parent(desk, salesforce):
    adapter = salesforce()
    closed = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    follow_up = TicketRequest(
        subject="Re: Invoice 42",
        description="Still charged.",
        requester=REQUEST.requester,
        follow_up_of=closed.ticket_id,
    )
    adapter.create_ticket(follow_up, "key-2", "evt-2")

    first, second = desk.tickets()
    assert kit.follow_up_of(second) == closed.ticket_id and kit.follow_up_of(first) is None


# --- People -----------------------------------------------------------------------------------------


def test_the_requester_becomes_a_contact_once_and_is_found_by_email_after(desk, salesforce, seen):
    first = salesforce().create_ticket(REQUEST, "key-1", "evt-1")
    second = salesforce().create_ticket(TicketRequest("Another", "d", "JANE.DOE@example.com"), "key-2", "evt-2")

    assert first.ticket_id != second.ticket_id
    [contact_post] = [r.json() for r in seen if r.path == CONTACT_PATH]
    assert contact_post == {"FirstName": "Jane", "LastName": "Doe", "Email": "jane.doe@example.com"}
    [person] = desk.people()
    assert person["email"] == "jane.doe@example.com"
    one, two = desk.tickets()
    assert one["fields"]["ContactId"] == two["fields"]["ContactId"] and one["fields"]["ContactId"].startswith("003")
    assert one["people"] == {"requester": "jane.doe@example.com", "cc": []}
    queries = [r.query["q"][0] for r in seen if r.path.endswith("/query")]
    assert queries == [
        "SELECT Id FROM Contact WHERE Email = 'jane.doe@example.com' ORDER BY CreatedDate LIMIT 1",
        "SELECT Id FROM Contact WHERE Email = 'JANE.DOE@example.com' ORDER BY CreatedDate LIMIT 1",
    ]


def test_without_create_contacts_an_unknown_requester_keeps_supplied_email_only(desk, salesforce, seen):
    salesforce(create_contacts=False).create_ticket(REQUEST, "key-1", "evt-1")
    [record] = desk.tickets()
    assert "ContactId" not in record["fields"] and record["fields"]["SuppliedEmail"] == "jane.doe@example.com"
    assert desk.people() == [] and not [r for r in seen if r.path == CONTACT_PATH]


def test_a_contact_salesforce_refuses_leaves_the_case_with_supplied_email(desk, salesforce, caplog):
    desk.on_request(
        lambda r: (
            (400, [{"errorCode": "FIELD_CUSTOM_VALIDATION_EXCEPTION", "message": "no", "fields": ["Email"]}])
            if r.path == CONTACT_PATH
            else None
        )
    )
    caplog.set_level(logging.WARNING)
    result = salesforce().create_ticket(REQUEST, "key-1", "evt-1")
    [record] = desk.tickets()
    assert result.ticket_id == record["fields"]["Id"] and "ContactId" not in record["fields"]
    assert "j***@e***.com" in caplog.text and "jane.doe@example.com" not in caplog.text


def test_ccd_addresses_open_the_description_a_case_has_no_cc(desk, salesforce):
    copied = TicketRequest("s", "The text.", "jane.doe@example.com", cc=("bob@example.com", "eve@example.com"))
    salesforce().create_ticket(copied, "key-1", "evt-1")
    [record] = desk.tickets()
    assert record["description"] == "CC: bob@example.com, eve@example.com\n\nThe text."
    assert record["people"]["cc"] == [] and kit.CC_ON_RECORD is False
    long = case_payload(TicketRequest("s", "y" * 32_000, "a@example.com", cc=("bob@example.com",)), {}, "X__c")
    assert len(long["Description"]) == 32_000 and long["Description"].endswith("description limit.]")


# --- Files ------------------------------------------------------------------------------------------


def attached_by_sha(record: dict) -> dict:
    counts = {}
    for attachment in record["attachments"]:
        counts[attachment["sha256"]] = counts.get(attachment["sha256"], 0) + 1
    return counts


def test_two_files_become_two_content_versions_on_the_case_once(desk, salesforce, seen):
    adapter = salesforce()
    adapter.journal = MemoryJournal()
    case = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    done = attach_each(adapter, case.ticket_id, FILES, "key-1")
    again = attach_each(adapter, case.ticket_id, FILES, "key-1")  # the journal says done: nothing is sent

    assert again == done and len(done["done"]) == 2 and done["refused"] == []
    [first, _] = [r.json() for r in seen if r.path == CONTENT_VERSION_PATH]
    assert {k: v for k, v in first.items() if k != "VersionData"} == {
        "Title": "invoice-42",
        "PathOnClient": "invoice-42.pdf",
        "FirstPublishLocationId": case.ticket_id,
        "ReasonForChange": "key-1-f0",
    }
    assert base64.b64decode(first["VersionData"]) == b"%PDF-1.7 invoice 42"
    [record] = desk.tickets()
    assert attached_by_sha(record) == {f.sha256: 1 for f in FILES}
    assert [(a["filename"], a["marker"]) for a in record["attachments"]] == [
        ("invoice-42.pdf", "key-1-f0"),
        ("screenshot.png", "key-1-f1"),
    ]
    assert all(v.startswith("068") for v in done["done"])


@pytest.mark.parametrize("fault", ["drop_after_commit", "drop_before_commit", "error_500"])
def test_a_lost_upload_answer_is_looked_up_by_its_key_never_sent_twice(desk, salesforce, fault):
    adapter = salesforce()
    adapter.journal = MemoryJournal()
    case = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    desk.set_plan([fault])
    with pytest.raises(TransientError):
        attach_each(adapter, case.ticket_id, FILES, "key-1")
    result = attach_each(adapter, case.ticket_id, FILES, "key-1")

    assert len(result["done"]) == 2
    [record] = desk.tickets()
    assert attached_by_sha(record) == {f.sha256: 1 for f in FILES}  # one copy of each file
    uploads = [e for e in desk.requests_log() if e["path"].endswith("/ContentVersion")]
    # A file committed before its answer was lost is found by its key; one never written is sent again.
    assert len(uploads) == (2 if fault == "drop_after_commit" else 3)
    assert [e["committed"] for e in uploads].count(True) == 2


def test_find_file_sees_only_the_key_on_this_case(desk, salesforce):
    adapter = salesforce()
    adapter.journal = MemoryJournal()
    one = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    other = adapter.create_ticket(REQUEST, "key-2", "evt-2")
    version = adapter.upload_file(one.ticket_id, FILES[0], "key-1-f0")
    assert adapter.find_file(one.ticket_id, FILES[0], "key-1-f0") == version
    assert adapter.find_file(one.ticket_id[:15], FILES[0], "key-1-f0") == version
    assert adapter.find_file(other.ticket_id, FILES[0], "key-1-f0") is None
    assert adapter.find_file(one.ticket_id, FILES[0], "key-1-f1") is None
    assert adapter.find_file(one.ticket_id, FILES[0], "it's\\odd") is None  # quoted, not a broken query


def test_a_file_salesforce_refuses_is_refused_for_good_and_the_others_go_on(desk, salesforce):
    adapter = salesforce()
    adapter.journal = MemoryJournal()
    case = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    desk.on_request(
        lambda r: (
            (400, [{"errorCode": "STORAGE_LIMIT_EXCEEDED", "message": "storage limit exceeded"}])
            if r.path == CONTENT_VERSION_PATH and b"invoice-42" in r.body
            else None
        )
    )
    result = attach_each(adapter, case.ticket_id, FILES, "key-1")
    assert result["refused"] == ["invoice-42.pdf"] and len(result["done"]) == 1


# --- Email-to-Case references --------------------------------------------------------------------------


def test_a_ref_id_in_a_reply_names_its_case(desk, salesforce):
    adapter = salesforce()
    case = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    [record] = desk.tickets()
    subject = f"Re: Invoice 42 charged twice {kit.desk_reference(record)}"
    assert subject.endswith("[ ref:_00D001._5000000001:ref ]")

    [pattern] = adapter.reference_patterns
    ref = pattern.search(subject).group("ref")
    assert adapter.resolve_reference(ref) == case.ticket_id
    assert set(adapter.reference_fields) == {"subject", "body"}
    assert adapter.resolve_reference("_00D001._5000000009") is None  # no such Case in this org
    assert adapter.resolve_reference("nonsense") is None
    assert pattern.search("ref:_00D001._0010000001:ref") is None  # an Account, not a Case


def test_the_zeros_of_a_ref_id_may_have_stood_anywhere_in_its_middle():
    assert case_ids_from_ref("_00D50IQwR._50050PQo5L") == ["5005000000PQo5L"]
    assert case_ids_from_ref("_00D001._500AB12345") == ["500AB0000012345"]
    assert len(case_ids_from_ref("_00D001._500ABx12345")) == 5 and "500AB0000x12345" in case_ids_from_ref(
        "_00D001._500ABx12345"
    )


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
    token = requests.post(
        desk.url + "/services/oauth2/token",
        timeout=5,
        data={"grant_type": "client_credentials", "client_id": "app", "client_secret": desk.token},
    ).json()
    assert token["token_type"] == "Bearer" and token["instance_url"] == desk.url
    describe = requests.get(
        desk.url + "/services/data/v62.0/sobjects/Case/describe",
        timeout=5,
        headers={"Authorization": f"Bearer {token['access_token']}"},
    )
    [field] = [f for f in describe.json()["fields"] if f["name"] == "Mailroom_Ref__c"]
    assert (field["externalId"], field["unique"]) == (True, True)
    auth = {"Authorization": f"Bearer {token['access_token']}"}
    for soql, code in (
        ("SELECT Id FROM Nope", "INVALID_TYPE"),
        ("SELECT Bogus FROM Contact", "INVALID_FIELD"),
        ("SELECT Id FROM Contact WHERE Email LIKE 'x'", "MALFORMED_QUERY"),
    ):
        refused = requests.get(desk.url + "/services/data/v62.0/query", params={"q": soql}, headers=auth, timeout=5)
        assert (refused.status_code, refused.json()[0]["errorCode"]) == (400, code)
    empty = requests.get(
        desk.url + "/services/data/v62.0/query",
        timeout=5,
        headers=auth,
        params={"q": "SELECT Id FROM Contact WHERE Email = 'nobody@example.com'"},
    ).json()
    assert (empty["totalSize"], empty["done"], empty["records"]) == (0, True, [])


# --- Privacy --------------------------------------------------------------------------------


def test_nothing_logged_contains_bodies_addresses_or_tokens(desk, salesforce, caplog, seen):
    caplog.set_level(logging.DEBUG)
    adapter = salesforce()
    case = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    adapter.add_comment(
        case.ticket_id, CommentRequest(body="Secret reply text", author_email="jane.doe@example.com"), "key-c", "evt-2"
    )
    desk.revoke_sessions()
    adapter.find_by_external_ref("evt-1")

    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "evt-1" in text
    access_tokens = {r.headers["Authorization"].split()[1] for r in seen if "Authorization" in r.headers}
    assert len(access_tokens) == 2  # the first and the one after the refresh
    for secret in ("jane.doe@example.com", "charged twice for", "Secret reply text", desk.token, *access_tokens):
        assert secret not in text

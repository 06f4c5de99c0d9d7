"""The Jira Service Management adapter against FakeDesk's jira_sm dialect over real HTTP: the payload Jira
gets, the customers and participants, files after the write, comments and internal notes, closed requests,
JSM's own references, the lagging JQL lookup, the kind's own error mappings, check_connection and the
settings' checks. (Create, duplicates, lost answers, 429/401/422, comments and corrections through the
pipeline are in the shared contract suites, tests/test_destination_contract.py and
tests/test_desk_contract_rich.py.)"""

import hashlib
import logging

import pytest
import requests

from intake.secrets import env_prefix
from tests.destination_kits import adapter_builder, jira_sm as kit, only_record
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
from ticketing.destinations.capabilities import FILES_AFTER_WRITE, REQUESTER_FIND_OR_CREATE
from ticketing.destinations.files import attach_each
from ticketing.destinations.jira_sm import JiraServiceManagementDestination, jira_errors, request_payload
from ticketing.destinations.journal import MemoryJournal
from ticketing.destinations.settings import validate

pytestmark = pytest.mark.fakedesk(dialect="jira_sm")

REF = "mailroom-0123456789abcdef"
REQUEST = TicketRequest(
    subject="Invoice 4471\n  charged twice",
    description="The invoice shows\nthe same line twice.",
    requester="Jane Doe <jane.doe@example.com>",
    requester_name="Jane Doe",
    tags=("email", "billing issue"),
    queue="billing",
    priority="urgent",
    request_type="refund",
    assignee="alice",
)
INVOICE = b"%PDF-1.4\n% invoice 4471\n%%EOF\n"
SCREENSHOT = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def outgoing(index: int, filename: str, data: bytes, content_type: str) -> OutgoingFile:
    return OutgoingFile(
        index=index,
        filename=filename,
        content_type=content_type,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        payload=lambda: data,
    )


FILES = (
    outgoing(0, "invoice-4471.pdf", INVOICE, "application/pdf"),
    outgoing(1, "screen shot.png", SCREENSHOT, "image/png"),
)


def copies(record: dict) -> dict[str, int]:
    """sha256 -> how many copies of it the record holds."""
    counts: dict[str, int] = {}
    for attachment in record["attachments"]:
        counts[attachment["sha256"]] = counts.get(attachment["sha256"], 0) + 1
    return counts


def writes(desk, path_part: str) -> list[dict]:
    return [w for w in desk.requests_log() if path_part in w["path"]]


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
    [jane] = desk.people()
    assert (jane["email"], jane["name"]) == ("jane.doe@example.com", "Jane Doe")  # a customer account, made
    assert {k: v for k, v in record["fields"].items() if k not in ("issueKey", "issueId")} == {
        "serviceDeskId": "1",
        "requestTypeId": "21",  # request_types["refund"] wins over the default
        "raiseOnBehalfOf": f"qm:fakedesk:{jane['id']}",  # its accountId
        "requestFieldValues": {
            "summary": "Invoice 4471 charged twice",  # one line
            "description": "The invoice shows\nthe same line twice.",
            "labels": ["email", "billing_issue"],  # a label has no spaces
            "customfield_10050": REF,
            "customfield_10060": {"value": "Billing"},
            "priority": {"name": "Highest"},
            "customfield_10070": {"accountId": "5b10a2844c20165700ede21g"},
        },
    }
    assert kit.route_of(record) == {"queue": "billing", "priority": "urgent"}
    assert record["people"] == {"requester": "jane.doe@example.com", "cc": []}
    # No idempotency key goes out: Jira has none.
    assert desk.requests_log()[0]["idempotency_key"] is None


def test_without_a_reference_field_the_reference_is_a_label_and_a_queue_picks_the_request_type(desk, jira):
    adapter = jira(
        external_ref_field=None,
        queue_field=None,
        queues={"billing": "11"},
        priorities=None,
        assignee_field=None,
        request_types={},
    )
    request = TicketRequest(
        subject="Hi",
        description="Text",
        requester="jane@example.com",
        tags=("email",),
        queue="billing",
        priority="high",
        request_type="unmapped",
        assignee="alice",
        fields={"customfield_10060": {"value": "Technical"}},
    )
    adapter.create_ticket(request, "key-1", REF)

    values = only_record(desk)["fields"]["requestFieldValues"]
    assert only_record(desk)["fields"]["requestTypeId"] == "11"
    # The reference as a label; priority, request type and assignee without a mapping are left out;
    # request.fields come last.
    assert values == {
        "summary": "Hi",
        "description": "Text",
        "labels": ["email", REF],
        "customfield_10060": {"value": "Technical"},
    }
    assert adapter.find_by_external_ref(REF).ticket_id == "SUP-1"


def test_the_payload_is_deterministic_and_the_summary_fits_jira():
    settings = {"service_desk_id": "1", "request_type_id": "10", "raise_on_behalf_of": False}
    long = TicketRequest(subject="x" * 300, description="d", requester="a@example.com")
    assert request_payload(long, REF, settings) == request_payload(long, REF, settings)
    payload = request_payload(long, REF, settings)
    assert len(payload["requestFieldValues"]["summary"]) == 255
    assert "raiseOnBehalfOf" not in payload


# --- Capabilities ----------------------------------------------------------------------------------


def test_capabilities_files_after_the_write_customers_and_participants():
    declared = JiraServiceManagementDestination.capabilities
    assert (declared.files, declared.requester, declared.cc_field) == (
        FILES_AFTER_WRITE,
        REQUESTER_FIND_OR_CREATE,
        "request participants",
    )
    assert declared.max_file_bytes == 1024 * 1024 * 1024 and declared.html is False
    assert (declared.customer_authored_comments, declared.internal_notes) == (False, True)
    assert declared.closed_policies == ("follow_up", "review") and declared.default_closed_policy == "follow_up"
    assert declared.acknowledges_requester is True and declared.requests_per_minute is None


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
    desk.advance_clock(0.6)  # the index catches up
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
    request = TicketRequest(
        subject="Hi", description="Text", requester="jane@example.com", fields={"customfield_99999": "x"}
    )
    with pytest.raises(PermanentError) as caught:
        jira().create_ticket(request, "key-1", REF)
    assert caught.value.reason == "invalid_fields"
    assert "customfield_99999" in caught.value.detail
    assert desk.tickets() == []


def test_both_shapes_of_jira_errors_are_kept_with_addresses_masked():
    detail = jira_errors(
        {
            "errorMessage": "The customer jane.doe@example.com is not valid.",
            "errorMessages": ["Summary is required."],
            "errors": {"labels": "no spaces"},
        }
    )
    assert detail == "The customer j***@e***.com is not valid.; Summary is required.; labels: no spaces"
    assert jira_errors({}) == "HTTP 400"


def test_creating_in_a_service_project_that_is_not_there_is_a_configuration_error(desk, jira):
    with pytest.raises(PermanentError) as caught:
        jira(service_desk_id="7").create_ticket(REQUEST, "key-1", REF)
    assert caught.value.reason == "configuration"
    assert desk.tickets() == []


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("error_500", "server_error"), ("drop_after_commit", "connection_lost"), ("stall_after_commit:2", "timeout")],
)
def test_a_lost_answer_after_the_create_is_ambiguous(desk, jira, fault, reason):
    desk.set_plan([fault])
    with pytest.raises(AmbiguousOutcome) as caught:
        jira(read_timeout=0.5).create_ticket(REQUEST, "key-1", REF)
    assert caught.value.reason == reason
    assert len(desk.requests_log()) == 1  # never a second create behind our back


def test_a_customer_comment_is_public_and_says_whose_mail_it_is(desk, jira, tenant):
    adapter = jira()
    key = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    reply = CommentRequest(body="Still charged twice.", author_email="jane.doe@example.com", author_name="Jane Doe")
    comment_id = adapter.add_comment(key, reply, "key-2", REF)

    listed = requests.get(
        f"{desk.url}/rest/servicedeskapi/request/{key}/comment", auth=("agent@acme.test", desk.token), timeout=5
    ).json()
    assert listed["values"] == [
        {
            "id": comment_id,
            "body": "From: Jane Doe <jane.doe@example.com>\n\nStill charged twice.",
            "public": True,
            "author": {"emailAddress": f"agent@{tenant.slug}.test"},
        }
    ]  # the API account
    [comment] = kit.comment_records_of(only_record(desk))
    assert (comment["public"], comment["author"]) == (True, f"agent@{tenant.slug}.test")


def test_an_agents_mail_is_an_internal_comment(desk, jira):
    adapter = jira()
    key = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    note = CommentRequest(
        body="Refund approved.",
        author_email="sam@acme-support.test",
        author_name="Sam Agënt",
        public=False,
        from_agent=True,
    )
    adapter.add_comment(key, note, "key-2", REF)
    [comment] = kit.comment_records_of(only_record(desk))
    assert comment["public"] is False
    assert comment["body"] == "From: Sam Agënt <sam@acme-support.test>\n\nRefund approved."  # readable, not =?utf-8?


def test_a_comment_on_a_missing_request_is_not_found_and_a_malformed_key_sends_nothing(desk, jira):
    adapter = jira()
    adapter.create_ticket(REQUEST, "key-1", REF)
    with pytest.raises(PermanentError) as caught:
        adapter.add_comment("SUP-99", CommentRequest(body="x", author_email=""), "key-3", REF)
    assert caught.value.reason == "not_found"
    count = len(desk.requests_log())
    with pytest.raises(PermanentError):
        adapter.add_comment("not a key", CommentRequest(body="x", author_email=""), "key-4", REF)
    assert len(desk.requests_log()) == count  # nothing sent for a malformed key


# --- People -----------------------------------------------------------------------------------------


def test_the_requester_and_the_copied_people_are_customers_and_participants(desk, jira):
    request = TicketRequest(
        subject="Hi",
        description="Text",
        requester="jane.doe@example.com",
        requester_name="Jane Doe",
        cc=("bob@customer.test", "carol@partner.test"),
    )
    jira().create_ticket(request, "key-1", REF)

    record = only_record(desk)
    assert record["people"] == {"requester": "jane.doe@example.com", "cc": ["bob@customer.test", "carol@partner.test"]}
    accounts = {p["email"]: f"qm:fakedesk:{p['id']}" for p in desk.people()}
    assert record["fields"]["raiseOnBehalfOf"] == accounts["jane.doe@example.com"]
    assert record["fields"]["requestParticipants"] == [accounts["bob@customer.test"], accounts["carol@partner.test"]]


def test_a_known_customer_is_found_not_made_and_a_retry_sends_the_same_request(desk, jira):
    seen = []
    desk.on_request(lambda request: seen.append((request.method, request.path)) and None)
    journal = MemoryJournal()
    first = jira()
    first.journal = journal
    first.create_ticket(REQUEST, "key-1", REF)
    assert seen.count(("POST", "/rest/servicedeskapi/customer")) == 1

    seen.clear()
    again = jira()
    again.journal = journal  # the same intent's next attempt: the ids are noted
    again.create_ticket(REQUEST, "key-1", REF)
    assert seen == [("POST", "/rest/servicedeskapi/request")]
    first_record, second_record = desk.tickets()
    assert first_record["fields"]["raiseOnBehalfOf"] == second_record["fields"]["raiseOnBehalfOf"]

    seen.clear()
    jira().create_ticket(REQUEST, "key-2", REF + "-2")  # another message from her: found by the user search
    assert ("GET", "/rest/api/3/user/search") in seen and ("POST", "/rest/servicedeskapi/customer") not in seen
    assert len(desk.people()) == 1


def test_an_address_no_customer_can_be_made_for_is_named_in_the_description(desk, jira):
    desk.on_request(
        lambda request: (
            (403, {"errorMessage": "You do not have permission to create customers."})
            if request.path == "/rest/servicedeskapi/customer"
            else None
        )
    )
    request = TicketRequest(
        subject="Hi", description="Text", requester="jane.doe@example.com", cc=("bob@customer.test",)
    )
    jira().create_ticket(request, "key-1", REF)
    record = only_record(desk)
    assert "raiseOnBehalfOf" not in record["fields"] and "requestParticipants" not in record["fields"]
    assert record["description"] == "Text\n\nNo Jira customer account for: jane.doe@example.com, bob@customer.test"


def test_a_replys_copied_people_become_participants(desk, jira):
    adapter = jira()
    key = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    adapter.add_comment(
        key,
        CommentRequest(body="Adding Bob.", author_email="jane.doe@example.com", cc=("bob@customer.test",)),
        "key-2",
        REF,
    )
    assert only_record(desk)["people"]["cc"] == ["bob@customer.test"]


# --- Files after the write -----------------------------------------------------------------------------


def test_two_files_are_attached_once_each_and_a_second_pass_sends_nothing(desk, jira):
    adapter = jira()
    key = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    adapter.journal = MemoryJournal()
    done = attach_each(adapter, key, FILES, "key-1")
    assert len(done["done"]) == 2 and done["refused"] == []
    record = only_record(desk)
    assert copies(record) == {f.sha256: 1 for f in FILES}
    assert sorted(a["filename"] for a in record["attachments"]) == ["invoice-4471.pdf", "screen shot.png"]

    count = len(desk.requests_log())
    assert attach_each(adapter, key, FILES, "key-1") == done  # all done: nothing sent again
    assert len(desk.requests_log()) == count
    # Jira's own listing shows them, with an id the journal keeps.
    issue = requests.get(
        f"{desk.url}/rest/api/3/issue/{key}",
        params={"fields": "attachment"},
        auth=("agent@acme.test", desk.token),
        timeout=5,
    ).json()
    assert sorted(a["id"] for a in issue["fields"]["attachment"]) == sorted(done["done"])


@pytest.mark.parametrize("lost", ["attachTemporaryFile", "/attachment"])
def test_a_lost_answer_on_either_call_never_doubles_a_file(desk, jira, lost):
    adapter = jira()
    key = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    adapter.journal = MemoryJournal()
    # The first file's upload (temporary file, then attach): the chosen call loses its answer.
    desk.set_plan(["drop_after_commit"] if lost == "attachTemporaryFile" else ["ok", "drop_after_commit"])
    with pytest.raises(TransientError) as caught:
        attach_each(adapter, key, FILES, "key-1")
    assert caught.value.reason == "connection_lost"
    result = attach_each(adapter, key, FILES, "key-1")  # the next attempt looks before it sends
    assert len(result["done"]) == 2
    assert copies(only_record(desk)) == {f.sha256: 1 for f in FILES}
    # A lost attach is found on the request, never sent again; a lost temporary file is only made again.
    assert len(writes(desk, "/attachment")) == 2
    assert len(writes(desk, "attachTemporaryFile")) == (3 if lost == "attachTemporaryFile" else 2)


def test_a_temporary_file_is_used_once_and_needs_the_xsrf_header(desk, jira):
    adapter = jira()
    key = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    auth = ("agent@acme.test", desk.token)
    url = f"{desk.url}/rest/servicedeskapi/servicedesk/1/attachTemporaryFile"
    assert requests.post(url, files={"file": ("a.txt", b"hello")}, auth=auth, timeout=5).status_code == 403
    made = requests.post(
        url, files={"file": ("a.txt", b"hello")}, auth=auth, timeout=5, headers={"X-Atlassian-Token": "no-check"}
    )
    [temporary] = made.json()["temporaryAttachments"]
    body = {"temporaryAttachmentIds": [temporary["temporaryAttachmentId"]], "public": True}
    attach = f"{desk.url}/rest/servicedeskapi/request/{key}/attachment"
    assert requests.post(attach, json=body, auth=auth, timeout=5).status_code == 201
    assert requests.post(attach, json=body, auth=auth, timeout=5).status_code == 400  # used up
    [attachment] = only_record(desk)["attachments"]
    assert attachment["sha256"] == hashlib.sha256(b"hello").hexdigest()


# --- Closed requests ----------------------------------------------------------------------------------


def test_a_closed_request_refuses_comments_and_files_as_ticket_closed(desk, jira):
    adapter = jira()
    key = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    desk.close(only_record(desk)["id"])
    with pytest.raises(TicketClosed) as caught:
        adapter.add_comment(key, CommentRequest(body="Again.", author_email="jane.doe@example.com"), "key-2", REF)
    assert caught.value.reason == "ticket_closed"
    adapter.journal = MemoryJournal()
    result = attach_each(adapter, key, FILES[:1], "key-2")
    assert result == {"done": [], "refused": ["invoice-4471.pdf"]}
    assert kit.comment_records_of(only_record(desk)) == [] and only_record(desk)["attachments"] == []


def test_a_refusal_of_an_open_request_stays_what_it_is(desk, jira):
    adapter = jira()
    key = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    desk.on_request(lambda request: (403, {"errorMessage": "Forbidden"}) if request.path.endswith("/comment") else None)
    with pytest.raises(PermanentError) as caught:
        adapter.add_comment(key, CommentRequest(body="x", author_email="jane.doe@example.com"), "key-2", REF)
    assert not isinstance(caught.value, TicketClosed) and caught.value.reason == "credentials"


def test_a_follow_up_names_the_closed_request_first(desk, jira):
    adapter = jira()
    closed = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    follow_up = TicketRequest(
        subject="Re: Invoice", description="It happened again.", requester="jane.doe@example.com", follow_up_of=closed
    )
    adapter.create_ticket(follow_up, "key-2", REF + "-2")
    record = desk.tickets()[1]
    assert record["description"] == "Follow-up of SUP-1, which is closed.\n\nIt happened again."
    assert kit.follow_up_of(record) == "SUP-1" and kit.follow_up_of(desk.tickets()[0]) is None


# --- JSM's own references ---------------------------------------------------------------------------


def test_the_projects_keys_in_a_subject_name_its_requests(desk, jira):
    adapter = jira()
    key = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    subject = f"Re: {kit.desk_reference(only_record(desk))} Invoice 4471 (see ISO-9001, XSUP-1)"
    found = [m.group("ref") for pattern in adapter.reference_patterns for m in pattern.finditer(subject)]
    assert found == [key] and adapter.reference_fields == ("subject",)
    assert adapter.resolve_reference(key) == key
    assert adapter.resolve_reference("SUP-99") is None  # no such request
    assert adapter.resolve_reference("ABC-1") is None  # another project's key: not even asked
    # Without project_key any key is a candidate, and the service project decides.
    loose = jira(project_key=None)
    assert [m.group("ref") for m in loose.reference_patterns[0].finditer("Re: ISO-9001 SUP-1")] == ["ISO-9001", "SUP-1"]
    assert loose.resolve_reference("SUP-1") == "SUP-1" and loose.resolve_reference("ISO-9001") is None
    assert jira(service_desk_id="7").resolve_reference("SUP-1") is None  # a request of another service project


def test_a_bare_token_is_sent_as_a_bearer_token(tenant, desk, monkeypatch):
    variable = f"{env_prefix(tenant.slug)}JIRA_BEARER"
    monkeypatch.setenv(variable, desk.token)
    destination = kit.configure(tenant, desk, monkeypatch, slug="bearer")
    destination.credentials_ref = f"env:{variable}"
    assert adapter_for(destination).create_ticket(REQUEST, "key-1", REF).ticket_id == "SUP-1"


def test_nothing_logged_holds_the_customer_address_or_a_body(jira, caplog):
    caplog.set_level(logging.DEBUG)
    adapter = jira()
    adapter.create_ticket(
        TicketRequest(
            subject="Hi", description="Secret text", requester="jane.doe@example.com", cc=("bob@customer.test",)
        ),
        "key-1",
        REF,
    )
    adapter.add_comment("SUP-1", CommentRequest(body="Secret reply", author_email="jane.doe@example.com"), "k", REF)
    attach_each(adapter, "SUP-1", FILES[:1], "key-1")
    text = "\n".join(r.getMessage() for r in caplog.records)
    for secret in ("jane.doe@example.com", "bob@customer.test", "Secret text", "Secret reply"):
        assert secret not in text
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


@pytest.mark.parametrize(
    "settings",
    [
        {"service_desk_id": "7"},
        {"request_type_id": "99"},
        {"request_type_id": "30"},  # no reference field
        {"request_type_id": "30", "external_ref_field": None},
    ],
)  # no labels
def test_check_connection_finds_a_wrong_project_or_request_type(desk, jira, settings):
    with pytest.raises(PermanentError) as caught:
        jira(**settings).check_connection()
    assert caught.value.reason == "configuration"
    assert desk.requests_log() == []


# --- SETTINGS ----------------------------------------------------------------------------------------


def test_settings_are_checked_field_by_field():
    good = {
        "service_desk_id": "1",
        "request_type_id": "10",
        "request_types": {"refund": "21"},
        "queues": {"billing": "Billing"},
        "queue_field": "customfield_10060",
        "priorities": {"urgent": "Highest"},
        "assignees": {"alice": "712020:abc-def"},
        "assignee_field": "customfield_10070",
        "external_ref_field": "customfield_10050",
        "raise_on_behalf_of": True,
        "search_settle_seconds": 120,
        "read_timeout": 5,
    }
    assert validate(JiraServiceManagementDestination.SETTINGS, good) == {}
    errors = validate(
        JiraServiceManagementDestination.SETTINGS,
        {
            "request_type_id": "ten",
            "queue_field": "Queue",
            "priorities": {"critical": "Highest"},
            "request_types": {"refund": 21.5},
            "raise_on_behalf_of": "yes",
            "search_settle_seconds": -1,
            "project": "SUP",
        },
    )
    assert errors["service_desk_id"] == ["is required"]
    assert set(errors) == {
        "service_desk_id",
        "request_type_id",
        "queue_field",
        "priorities",
        "request_types",
        "raise_on_behalf_of",
        "search_settle_seconds",
        "project",
    }


# --- The fake dialect -----------------------------------------------------------------------------------


def test_the_fake_refuses_unauthenticated_calls_the_way_jira_does(desk):
    answer = requests.get(f"{desk.url}/rest/servicedeskapi/servicedesk/1", timeout=5)
    assert answer.status_code == 401 and "errorMessage" in answer.json()
    answer = requests.get(
        f"{desk.url}/rest/servicedeskapi/servicedesk/1", timeout=5, headers={"Authorization": f"Bearer {desk.token}"}
    )
    assert answer.json()["projectKey"] == "SUP"
    answer = requests.get(
        f"{desk.url}/rest/api/3/search/jql",
        params={"jql": "project = SUP"},
        timeout=5,
        auth=("agent@acme.test", desk.token),
    )
    assert answer.status_code == 400 and answer.json()["errorMessages"]

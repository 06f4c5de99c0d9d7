"""The ServiceNow adapter against FakeDesk's servicenow dialect over real HTTP: the record it writes,
its caller and watch list, files after the write, journal entries, closed and resolved incidents,
ServiceNow's own references, the Import Set upsert, the correlation_id lookup, ServiceNow's own error
bodies, check_connection.

What every kind shares (duplicates, lost answers, 429/401/422, comments, files and people through the
pipeline) is in tests/test_destination_contract.py and tests/test_desk_contract_rich.py."""

import hashlib
import logging
import re

import pytest
import requests

from tests.destination_kits import only_record, servicenow as kit
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
from ticketing.destinations.journal import MemoryJournal
from ticketing.destinations.servicenow import ServiceNowDestination
from ticketing.destinations.settings import validate

pytestmark = pytest.mark.fakedesk(dialect="servicenow")

REQUEST = TicketRequest(
    subject="Invoice 42 charged twice",
    description="I was charged twice for invoice 42.",
    requester="Jane Doe <jane.doe@example.com>",
    requester_name="Jane Doe",
    tags=("email",),
    queue="billing",
    priority="urgent",
    request_type="refund",
    assignee="alice",
)
SYS_ID = re.compile(r"[0-9a-f]{32}")
INVOICE = b"%PDF-1.4\n% invoice 42\n%%EOF\n"
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
    outgoing(0, "invoice-42.pdf", INVOICE, "application/pdf"),
    outgoing(1, "screen shot.png", SCREENSHOT, "image/png"),
)


def copies(record: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for attachment in record["attachments"]:
        counts[attachment["sha256"]] = counts.get(attachment["sha256"], 0) + 1
    return counts


def api(desk, method: str, path: str, **options):
    """A call to the fake as an agent of the instance would make it."""
    return requests.request(method, f"{desk.url}{path}", auth=("admin", desk.token), timeout=5, **options)


def user_sys_id(desk, address: str) -> str:
    [user] = api(desk, "GET", "/api/now/table/sys_user", params={"sysparm_query": f"email={address}"}).json()["result"]
    return user["sys_id"]


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


def test_capabilities_files_after_the_write_a_caller_and_a_watch_list():
    declared = ServiceNowDestination.capabilities
    assert (declared.files, declared.requester, declared.cc_field) == (
        FILES_AFTER_WRITE,
        REQUESTER_FIND_OR_CREATE,
        "watch_list",
    )
    assert declared.max_file_bytes == 1024 * 1024 * 1024 and declared.html is False
    assert (declared.customer_authored_comments, declared.internal_notes) == (False, True)
    assert declared.closed_policies == ("follow_up", "reopen", "review")
    assert declared.acknowledges_requester is True and declared.requests_per_minute is None


def test_capabilities_table_mode_looks_up_and_import_set_mode_upserts(servicenow):
    table = servicenow()
    assert isinstance(table, ServiceNowDestination)
    assert (table.consistent_lookup, table.upsert, table.honours_idempotency_key, table.retry_safe) == (
        True,
        False,
        False,
        False,
    )
    assert (table.lookup_settle_seconds, table.idempotency_window_seconds, table.max_description_chars) == (
        None,
        None,
        4000,
    )

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
    sent = {
        name: record[name]
        for name in record
        if not name.startswith("sys_") and name not in ("number", "state", "active")
    }
    assert sent == {
        "short_description": "Invoice 42 charged twice",
        "description": "I was charged twice for invoice 42.",
        "caller_id": user_sys_id(desk, "jane.doe@example.com"),  # the user made for her
        "contact_type": "email",
        "correlation_id": "evt-1",
        "correlation_display": "Mailroom",
        "assignment_group": "Billing",
        "impact": "1",
        "urgency": "1",
        "category": "inquiry",
        "assigned_to": "alice.agent",
    }
    [create] = [r for r in seen if r.method == "POST" and r.path == "/api/now/table/incident"]
    assert create.query["sysparm_input_display_value"] == ["true"]
    assert "Idempotency-Key" not in create.headers


def test_unmapped_route_values_are_left_out_and_raw_fields_win(desk, servicenow):
    request = TicketRequest(
        subject="x" * 200,
        description="Body",
        requester="jane@example.com",
        queue="unknown-queue",
        request_type="other",
        assignee="bob",
        fields={"urgency": "3", "u_vip": True},
    )
    servicenow(priorities={"low": {"impact": "3", "urgency": "3"}}).create_ticket(request, "key-1", "evt-1")

    [record] = records(desk)
    assert not {"assignment_group", "category", "assigned_to", "impact"} & set(record)
    assert (record["urgency"], record["u_vip"]) == ("3", True)
    assert record["short_description"] == "x" * 160  # the field's length in ServiceNow


def test_the_priority_mapping_is_configurable_and_deterministic():
    from ticketing.destinations.servicenow import record_payload

    settings = {"priorities": {"low": {"impact": "3", "urgency": "3"}}}
    low = TicketRequest(subject="s", description="d", requester="a@example.com", priority="low")
    assert record_payload(low, "evt-1", settings) == record_payload(low, "evt-1", settings)
    assert {k: record_payload(low, "evt-1", settings)[k] for k in ("impact", "urgency")} == {
        "impact": "3",
        "urgency": "3",
    }
    high = TicketRequest(subject="s", description="d", requester="a@example.com", priority="high")
    assert (record_payload(high, "evt-1", settings)["impact"], record_payload(high, "evt-1")["urgency"]) == ("1", "2")


# --- Import Set mode: a retry updates the one record ------------------------------------


def test_import_set_mode_stages_u_fields_and_coalesces_on_our_reference(desk, servicenow, seen):
    adapter = servicenow(import_set_table="u_mailroom_incident_import")
    first = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    again = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    corrected = adapter.create_ticket(
        TicketRequest(subject="Corrected", description="New body", requester="jane.doe@example.com"), "key-1", "evt-1"
    )

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
    with pytest.raises(TransientError) as caught:  # retry-safe: a 5xx is worth another attempt
        adapter.create_ticket(REQUEST, "key-1", "evt-1")
    assert caught.value.reason == "server_error"

    result = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    [record] = records(desk)
    assert result.ticket_id == record["sys_id"]


def test_a_transform_error_is_permanent_with_its_message(desk, servicenow):
    adapter = servicenow(import_set_table="u_mailroom_incident_import")
    with pytest.raises(PermanentError) as caught:
        adapter.create_ticket(
            TicketRequest(subject="s", description=" ", requester="jane@example.com"), "key-1", "evt-1"
        )
    assert caught.value.reason == "invalid_fields"
    assert "description" in caught.value.detail.lower()
    assert records(desk) == []


def test_an_ignored_row_is_rejected_and_several_targets_are_multiple_matches(desk, servicenow):
    adapter = servicenow(import_set_table="u_mailroom_incident_import")
    answers = iter(
        [
            {"import_set": "ISET1", "result": [{"table": "incident", "status": "ignored"}]},
            {
                "import_set": "ISET2",
                "result": [
                    {"table": "incident", "status": "inserted", "sys_id": "a" * 32},
                    {"table": "incident", "status": "updated", "sys_id": "b" * 32},
                ],
            },
        ]
    )
    desk.on_request(lambda request: (201, next(answers)) if request.path.startswith("/api/now/import/") else None)

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
    reply = CommentRequest(body="Any news?", author_email="jane.doe@example.com", author_name="Jane Doe")
    assert adapter.add_comment(ticket.ticket_id, reply, "key-c", "evt-2") == ticket.ticket_id
    note = CommentRequest(body="Refund approved.", author_email="sam@acme-support.test", public=False, from_agent=True)
    adapter.add_comment(ticket.ticket_id, note, "key-d", "evt-3")
    servicenow(comment_field="work_notes").add_comment(ticket.ticket_id, reply, "key-e", "evt-4")

    patch = [r for r in seen if r.method == "PATCH"][0]
    assert (patch.path, patch.json()) == (
        f"/api/now/table/incident/{ticket.ticket_id}",
        {"comments": "From: Jane Doe <jane.doe@example.com>\n\nAny news?"},
    )
    entries = kit.comment_records_of(only_record(desk))
    assert [(c["body"], c["public"], c["author"]) for c in entries] == [
        ("From: Jane Doe <jane.doe@example.com>\n\nAny news?", True, "mailroom.integration"),
        ("From: sam@acme-support.test\n\nRefund approved.", False, "mailroom.integration"),
        ("From: Jane Doe <jane.doe@example.com>\n\nAny news?", False, "mailroom.integration"),
    ]


def test_comment_errors(desk, servicenow):
    adapter = servicenow(import_set_table="u_mailroom_incident_import")
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    hello = CommentRequest(body="hello", author_email="x@example.com")
    with pytest.raises(PermanentError) as malformed:
        adapter.add_comment("42", hello, "key-c", "evt-2")
    assert malformed.value.reason == "not_found"
    with pytest.raises(PermanentError) as missing:
        adapter.add_comment("f" * 32, hello, "key-c", "evt-2")
    assert missing.value.reason == "not_found"

    # Import Set mode makes creates retry-safe, never a journal entry: a 5xx after a PATCH stays ambiguous.
    desk.set_plan(["error_500"])
    with pytest.raises(AmbiguousOutcome) as failed:
        adapter.add_comment(ticket.ticket_id, hello, "key-c", "evt-2")
    assert failed.value.reason == "server_error"


# --- People ------------------------------------------------------------------------------------


def test_the_caller_is_a_user_found_or_made_and_the_copied_people_watch(desk, servicenow, seen):
    api(
        desk,
        "POST",
        "/api/now/table/sys_user",
        json={"user_name": "bob", "email": "bob@customer.test", "first_name": "Bob", "last_name": "Buyer"},
    )
    seen.clear()
    request = TicketRequest(
        subject="s",
        description="d",
        requester="Jane Doe <jane.doe@example.com>",
        requester_name="Jane Doe",
        cc=("bob@customer.test", "carol@partner.test"),
    )
    servicenow().create_ticket(request, "key-1", "evt-1")

    [record] = records(desk)
    jane, bob = user_sys_id(desk, "jane.doe@example.com"), user_sys_id(desk, "bob@customer.test")
    assert record["caller_id"] == jane
    assert record["watch_list"] == f"{bob},carol@partner.test"  # a known user by sys_id, anyone else as address
    assert only_record(desk)["people"] == {
        "requester": "jane.doe@example.com",
        "cc": ["bob@customer.test", "carol@partner.test"],
    }
    made = [r.json() for r in seen if r.method == "POST" and r.path == "/api/now/table/sys_user"]
    assert made == [
        {
            "user_name": "jane.doe@example.com",
            "email": "jane.doe@example.com",
            "first_name": "Jane",
            "last_name": "Doe",
            "notification": "2",
        }
    ]
    assert [p["name"] for p in desk.people() if p["email"] == "jane.doe@example.com"] == ["Jane Doe"]


def test_a_known_caller_is_found_and_a_retry_sends_the_same_record(desk, servicenow, seen):
    journal = MemoryJournal()
    first = servicenow()
    first.journal = journal
    first.create_ticket(REQUEST, "key-1", "evt-1")
    again = servicenow()
    again.journal = journal
    seen.clear()
    again.create_ticket(REQUEST, "key-1", "evt-1")
    assert [(r.method, r.path) for r in seen] == [("POST", "/api/now/table/incident")]  # the ids were noted
    servicenow().create_ticket(REQUEST, "key-2", "evt-2")
    assert len(desk.people()) == 1
    assert len({r["caller_id"] for r in records(desk)}) == 1


@pytest.mark.parametrize("settings, refusal", [({"create_callers": False}, None), ({}, 403)])
def test_without_a_user_the_caller_is_the_address(desk, servicenow, settings, refusal):
    if refusal:
        desk.on_request(
            lambda request: (
                (
                    refusal,
                    {
                        "error": {
                            "message": "Operation Failed",
                            "detail": "ACL Exception Insert Failed due to security constraints",
                        },
                        "status": "failure",
                    },
                )
                if request.method == "POST" and request.path == "/api/now/table/sys_user"
                else None
            )
        )
    servicenow(**settings).create_ticket(REQUEST, "key-1", "evt-1")
    assert records(desk)[0]["caller_id"] == "jane.doe@example.com" and desk.people() == []
    assert only_record(desk)["people"]["requester"] == "jane.doe@example.com"


def test_a_replys_copied_people_join_the_watch_list(desk, servicenow):
    adapter = servicenow()
    ticket = adapter.create_ticket(
        TicketRequest(subject="s", description="d", requester="jane.doe@example.com", cc=("carol@partner.test",)),
        "key-1",
        "evt-1",
    )
    adapter.add_comment(
        ticket.ticket_id,
        CommentRequest(
            body="Adding Dan.", author_email="jane.doe@example.com", cc=("carol@partner.test", "dan@customer.test")
        ),
        "key-c",
        "evt-2",
    )
    assert records(desk)[0]["watch_list"] == "carol@partner.test,dan@customer.test"


# --- Files after the write ----------------------------------------------------------------------


def test_two_files_are_attached_once_each_with_their_hash(desk, servicenow, seen):
    adapter = servicenow()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id
    adapter.journal = MemoryJournal()
    done = attach_each(adapter, ticket, FILES, "key-1")
    assert len(done["done"]) == 2 and all(SYS_ID.fullmatch(i) for i in done["done"])
    assert copies(only_record(desk)) == {f.sha256: 1 for f in FILES}
    upload = [r for r in seen if r.method == "POST" and r.path == "/api/now/attachment/file"][1]
    assert upload.query == {"table_name": ["incident"], "table_sys_id": [ticket], "file_name": ["screen shot.png"]}
    assert (upload.headers["Content-Type"], upload.body) == ("image/png", SCREENSHOT)
    listed = api(desk, "GET", "/api/now/attachment", params={"sysparm_query": f"table_sys_id={ticket}"}).json()
    assert sorted(row["hash"] for row in listed["result"]) == sorted(f.sha256 for f in FILES)
    count = len(desk.requests_log())
    assert attach_each(adapter, ticket, FILES, "key-1") == done and len(desk.requests_log()) == count


def test_a_lost_upload_answer_never_doubles_a_file(desk, servicenow):
    adapter = servicenow()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id
    adapter.journal = MemoryJournal()
    desk.set_plan(["ok", "drop_after_commit"])  # the second file's upload loses its answer
    with pytest.raises(TransientError) as caught:
        attach_each(adapter, ticket, FILES, "key-1")
    assert caught.value.reason == "connection_lost"
    assert len(attach_each(adapter, ticket, FILES, "key-1")["done"]) == 2
    assert copies(only_record(desk)) == {f.sha256: 1 for f in FILES}
    assert len([w for w in desk.requests_log() if w["path"] == "/api/now/attachment/file"]) == 2


def test_a_file_of_the_same_name_and_size_but_other_bytes_is_not_ours(desk, servicenow):
    adapter = servicenow()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id
    other = b"%PDF-1.4\n% invoice 43\n%%EOF\n"
    assert len(other) == len(INVOICE)
    api(
        desk,
        "POST",
        "/api/now/attachment/file",
        data=other,
        headers={"Content-Type": "application/pdf"},
        params={"table_name": "incident", "table_sys_id": ticket, "file_name": "invoice-42.pdf"},
    )
    assert adapter.find_file(ticket, FILES[0], "key-1-f0") is None
    attached = adapter.upload_file(ticket, FILES[0], "key-1-f0")
    assert adapter.find_file(ticket, FILES[0], "key-1-f0") == attached


# --- Closed and resolved incidents ------------------------------------------------------------------


def test_a_closed_incident_is_ticket_closed_without_a_write(desk, servicenow):
    adapter = servicenow()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id
    desk.close(only_record(desk)["id"])
    count = len(desk.requests_log())
    with pytest.raises(TicketClosed) as caught:
        adapter.add_comment(ticket, CommentRequest(body="Again.", author_email="jane.doe@example.com"), "k", "e")
    assert caught.value.reason == "ticket_closed" and "INC0010001" in caught.value.detail
    assert len(desk.requests_log()) == count
    adapter.journal = MemoryJournal()
    assert attach_each(adapter, ticket, FILES[:1], "key-2") == {"done": [], "refused": ["invoice-42.pdf"]}
    # The instance refuses the writes itself too (its write ACL), as 403s.
    patch = api(desk, "PATCH", f"/api/now/table/incident/{ticket}", json={"comments": "x"})
    assert (patch.status_code, patch.json()["error"]["message"]) == (403, "Operation Failed")


def test_a_record_closed_between_the_read_and_the_write_is_ticket_closed(desk, servicenow):
    adapter = servicenow()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id
    desk.close(only_record(desk)["id"])
    stale = [{"sys_id": ticket, "number": "INC0010001", "state": "2", "active": "true", "watch_list": ""}]
    answered = []

    def open_at_first(request):
        if request.method == "GET" and request.path == "/api/now/table/incident" and not answered:
            answered.append(request)
            return 200, {"result": stale}
        return None

    desk.on_request(open_at_first)
    with pytest.raises(TicketClosed):
        adapter.add_comment(ticket, CommentRequest(body="Again.", author_email="jane.doe@example.com"), "k", "e")
    assert [w["status"] for w in desk.requests_log()][-1] == 403


@pytest.mark.parametrize("policy, state", [("reopen", "2"), ("follow_up", "6"), (None, "6")])
def test_a_resolved_incident_takes_the_comment_and_reopens_only_under_reopen(desk, servicenow, policy, state):
    adapter = servicenow(closed_policy=policy) if policy else servicenow()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id
    api(desk, "PATCH", f"/api/now/table/incident/{ticket}", json={"state": "6", "close_code": "Solution provided"})
    adapter.add_comment(ticket, CommentRequest(body="Still broken.", author_email="jane.doe@example.com"), "k", "e")
    assert (records(desk)[0]["state"], records(desk)[0]["active"]) == (state, "true")
    assert "Still broken." in kit.comment_records_of(only_record(desk))[-1]["body"]


@pytest.mark.parametrize("table, link", [("incident", "parent_incident"), ("sn_customerservice_case", "parent")])
def test_a_follow_up_links_the_closed_record(desk, servicenow, table, link):
    adapter = servicenow(table=table)
    closed = adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id
    adapter.create_ticket(
        TicketRequest(
            subject="Again", description="It happened again.", requester="jane.doe@example.com", follow_up_of=closed
        ),
        "key-2",
        "evt-2",
    )
    follow_up = records(desk)[1]
    assert follow_up[link] == closed and follow_up["description"] == "It happened again."
    if table == "incident":
        assert kit.follow_up_of(desk.tickets()[1]) == closed and kit.follow_up_of(desk.tickets()[0]) is None


# --- ServiceNow's own references ----------------------------------------------------------------------


def test_the_number_and_the_watermark_name_the_record(desk, servicenow):
    adapter = servicenow()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1").ticket_id
    reference = kit.desk_reference(only_record(desk))
    text = f"RE: Incident INC0010001 -- opened on your behalf\n{reference}"
    found = [m.group("ref") for pattern in adapter.reference_patterns for m in pattern.finditer(text)]
    assert found == ["INC0010001", reference.removeprefix("Ref:")]
    assert set(adapter.reference_fields) == {"subject", "body"}
    assert [adapter.resolve_reference(ref) for ref in found] == [ticket, ticket]
    assert adapter.resolve_reference("INC0099999") is None and adapter.resolve_reference("MSG0099999_x") is None
    # Another table's record is not this destination's, whichever reference names it.
    problems = servicenow(table="problem")
    problem = problems.create_ticket(REQUEST, "key-2", "evt-2").ticket_id
    problem_mark = kit.desk_reference(desk.tickets()[1]).removeprefix("Ref:")
    assert (problems.resolve_reference(problem_mark), adapter.resolve_reference(problem_mark)) == (problem, None)
    assert [m.group("ref") for m in problems.reference_patterns[0].finditer("PRB0010001 INC0010001")] == ["PRB0010001"]


def test_an_unreadable_watermark_table_leaves_the_number(desk, servicenow):
    adapter = servicenow()
    adapter.create_ticket(REQUEST, "key-1", "evt-1")
    desk.on_request(
        lambda request: (
            (403, {"error": {"message": "User Not Authorized", "detail": "ACL"}, "status": "failure"})
            if "sys_watermark" in request.path
            else None
        )
    )
    assert adapter.resolve_reference(kit.desk_reference(only_record(desk)).removeprefix("Ref:")) is None
    assert adapter.resolve_reference("INC0010001") == records(desk)[0]["sys_id"]


# --- ServiceNow's error answers ----------------------------------------------------------------


def test_a_400_is_invalid_fields_with_servicenow_s_message(desk, servicenow):
    desk.set_plan(["reject_422"])
    with pytest.raises(PermanentError) as caught:
        servicenow().create_ticket(REQUEST, "key-1", "evt-1")
    assert (caught.value.reason, caught.value.detail) == (
        "invalid_fields",
        "Invalid input: caller_id: Invalid reference",
    )


@pytest.mark.parametrize(
    ("detail", "reason"),
    [
        ("Data Policy Exception: The following fields are mandatory: Caller", "invalid_fields"),
        ("ACL Exception Insert Failed due to security constraints", "credentials"),
    ],
)
def test_a_403_is_a_data_policy_or_an_acl(desk, servicenow, detail, reason):
    desk.on_request(
        lambda request: (
            (403, {"error": {"message": "Operation Failed", "detail": detail}, "status": "failure"})
            if request.path == "/api/now/table/incident" and request.method == "POST"
            else None
        )
    )
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
        "configuration",
        "HTTP 400: Invalid table mailroom_import",
    )


# --- Settings -------------------------------------------------------------------------------------


def test_settings_are_checked_field_by_field():
    spec = ServiceNowDestination.SETTINGS
    good = {
        "table": "sn_customerservice_case",
        "import_set_table": "u_mailroom_import",
        "comment_field": "work_notes",
        "assignment_groups": {"billing": "Billing"},
        "priorities": {"urgent": {"impact": "1", "urgency": "1"}},
        "categories": {"refund": "inquiry"},
        "assignees": {"alice": "alice.agent"},
        "read_timeout": 5,
    }
    assert validate(spec, good) == {}
    errors = validate(
        spec,
        {
            "table": "Incident; drop",
            "comment_field": "notes",
            "priorities": {
                "critical": {"impact": "1", "urgency": "1"},
                "high": {"impact": "4", "urgency": "1"},
                "low": "3",
            },
            "assignment_groups": ["Billing"],
            "tabel": "incident",
        },
    )
    assert set(errors) == {"table", "comment_field", "priorities", "assignment_groups", "tabel"}
    assert any("critical" in message for message in errors["priorities"])
    assert any("impact must be 1, 2 or 3" in message for message in errors["priorities"])
    assert any("'low'" in message for message in errors["priorities"])


def test_nothing_logged_carries_bodies_addresses_or_the_password(desk, servicenow, caplog):
    caplog.set_level(logging.DEBUG)
    adapter = servicenow()
    ticket = adapter.create_ticket(
        TicketRequest(subject="s", description="d", requester="jane.doe@example.com", cc=("bob@customer.test",)),
        "key-1",
        "evt-1",
    )
    adapter.add_comment(
        ticket.ticket_id,
        CommentRequest(body="Secret reply text", author_email="jane.doe@example.com"),
        "key-c",
        "evt-2",
    )
    attach_each(adapter, ticket.ticket_id, FILES[:1], "key-1")
    adapter.find_by_external_ref("evt-1")
    desk.set_plan(["reject_422"])
    with pytest.raises(PermanentError):
        adapter.create_ticket(REQUEST, "key-2", "evt-3")

    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "evt-1" in text
    for secret in ("jane.doe@example.com", "bob@customer.test", "charged twice", "Secret reply text", desk.token):
        assert secret not in text


# --- The fake itself ------------------------------------------------------------------------------


def test_the_fake_refuses_without_credentials_in_servicenow_s_shape(desk):
    answer = requests.get(f"{desk.url}/api/now/table/incident", timeout=5)
    assert answer.status_code == 401
    assert answer.json() == {
        "error": {"message": "User Not Authenticated", "detail": "Required to provide Auth information"},
        "status": "failure",
    }
    assert requests.get(f"{desk.url}/api/now/table/incident", auth=("someone", desk.token), timeout=5).json() == {
        "result": []
    }

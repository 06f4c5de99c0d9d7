"""The Freshdesk adapter against FakeDesk's freshdesk dialect over real HTTP: the ticket Freshdesk gets, the
lagging filter search, the kind's own error mappings, check_connection and the settings' checks.
(Create, duplicates, lost answers, 429/401/422, comments and corrections through the pipeline are in the
shared contract suite, tests/test_destination_contract.py.)"""

import hashlib
import json
from collections import Counter

import pytest
import requests

from tests.destination_kits import adapter_builder, freshdesk as kit, only_record
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
from ticketing.destinations.capabilities import MB
from ticketing.destinations.freshdesk import (
    FreshdeskDestination,
    form_fields,
    multipart_body,
    text_to_html,
    ticket_payload,
)
from ticketing.destinations.settings import validate

pytestmark = pytest.mark.fakedesk(dialect="freshdesk")

REF = "mailroom-0123456789abcdef"
REQUEST = TicketRequest(
    subject="Invoice 4471\n charged twice",
    description="Line <1> & more\nline 2",
    requester="Jane Doe <jane.doe@example.com>",
    tags=("email", "billing, invoices"),
    queue="billing",
    priority="urgent",
    request_type="refund",
    assignee="alice",
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
        "description": "Line &lt;1&gt; &amp; more<br>line 2",  # HTML: escaped, line breaks as <br>
        "email": "jane.doe@example.com",
        "name": "Jane Doe",
        "status": 2,
        "source": 1,  # open, by email
        "tags": ["email", "billing invoices"],  # Freshdesk refuses commas in a tag
        "priority": 4,
        "group_id": 101,
        "responder_id": 201,
        "type": "Refund",
        "custom_fields": {"cf_mailroom_ref": REF},
    }
    assert kit.route_of(record) == {"queue": "billing", "priority": "urgent"}
    assert desk.requests_log()[0]["idempotency_key"] is None  # Freshdesk has no idempotency key


def test_unmapped_route_values_are_left_out_and_raw_fields_come_last(desk, freshdesk):
    request = TicketRequest(
        subject="Hi",
        description="Text",
        requester="jane@example.com",
        queue="sales",
        priority="normal",
        request_type="other",
        assignee="bob",
        fields={"cf_product": "Printer", "priority": 1},
    )
    freshdesk().create_ticket(request, "key-1", REF)
    fields = only_record(desk)["fields"]
    assert fields["priority"] == 1  # request.fields win over the route
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
    desk.advance_clock(0.6)  # the index catches up
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


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"cf_nope": "x"}, "cf_nope"), ({"type": "Complaint"}, "type"), ({"group_id": 999}, "group_id")],
)
def test_validation_failed_is_invalid_fields_with_freshdesks_field_errors(desk, freshdesk, fields, field):
    request = TicketRequest(subject="Hi", description="Text", requester="jane@example.com", fields=fields)
    with pytest.raises(PermanentError) as caught:
        freshdesk().create_ticket(request, "key-1", REF)
    assert caught.value.reason == "invalid_fields"
    assert [e["field"] for e in json.loads(caught.value.detail)] == [field]
    assert desk.tickets() == []


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("error_500", "server_error"), ("drop_after_commit", "connection_lost"), ("stall_after_commit:2", "timeout")],
)
def test_a_lost_answer_after_the_create_is_ambiguous(desk, freshdesk, fault, reason):
    desk.set_plan([fault])
    with pytest.raises(AmbiguousOutcome) as caught:
        freshdesk(read_timeout=0.5).create_ticket(REQUEST, "key-1", REF)
    assert caught.value.reason == reason
    assert len(desk.requests_log()) == 1


def test_a_reply_is_a_public_incoming_note_and_a_missing_ticket_is_not_found(desk, freshdesk):
    adapter = freshdesk()
    ticket_id = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    reply = CommentRequest(body="Still <charged>\ntwice.", author_email="jane.doe@example.com")
    note_id = adapter.add_comment(ticket_id, reply, "key-2", REF)

    notes = requests.get(
        f"{desk.url}/api/v2/tickets/{ticket_id}/conversations", auth=(desk.token, "X"), timeout=5
    ).json()
    [jane] = desk.people()
    assert [(str(n["id"]), n["body"], n["private"], n["incoming"], n["user_id"]) for n in notes] == [
        (note_id, "Still &lt;charged&gt;<br>twice.", False, True, jane["id"])
    ]
    assert kit.comments_of(only_record(desk)) == ["Still <charged>\ntwice."]
    with pytest.raises(PermanentError) as caught:
        adapter.add_comment("99", CommentRequest(body="x", author_email=""), "key-3", REF)
    assert caught.value.reason == "not_found"
    writes = len(desk.requests_log())
    with pytest.raises(PermanentError):
        adapter.add_comment("SUP-1", CommentRequest(body="x", author_email=""), "key-4", REF)
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
    good = {
        "external_ref_field": "cf_mailroom_ref",
        "groups": {"billing": 101},
        "agents": {"alice": 201},
        "ticket_types": {"refund": "Refund"},
        "search_settle_seconds": 90,
        "read_timeout": 5,
    }
    assert validate(FreshdeskDestination.SETTINGS, good) == {}
    assert validate(FreshdeskDestination.SETTINGS, {}) == {}  # nothing is required
    errors = validate(
        FreshdeskDestination.SETTINGS,
        {
            "external_ref_field": "Mailroom Ref",
            "groups": {"billing": "Billing"},
            "agents": {"alice": 0},
            "search_settle_seconds": "soon",
            "domain": "acme",
        },
    )
    assert set(errors) == {"external_ref_field", "groups", "agents", "search_settle_seconds", "domain"}


# --- The fake dialect -----------------------------------------------------------------------------------


def test_the_fake_refuses_a_wrong_key_the_way_freshdesk_does(desk):
    answer = requests.get(f"{desk.url}/api/v2/ticket_fields", auth=("wrong", "X"), timeout=5)
    assert answer.status_code == 401 and answer.json()["code"] == "invalid_credentials"


@pytest.mark.parametrize("query", ["\"mailroom_ref:'{ref}'\"", "cf_mailroom_ref:'{ref}'", '"mailroom_ref:"{ref}""'])
def test_the_fake_search_reads_the_query_leniently(desk, freshdesk, query):
    freshdesk().create_ticket(REQUEST, "key-1", REF)
    answer = requests.get(
        f"{desk.url}/api/v2/search/tickets", params={"query": query.format(ref=REF)}, auth=(desk.token, "X"), timeout=5
    ).json()
    assert [t["id"] for t in answer["results"]] == [1] and answer["total"] == 1
    assert answer["results"][0]["custom_fields"]["cf_mailroom_ref"] == REF


# --- Files, people, authorship, closed tickets and references (issue 22) ---------------------------------

# Bytes a careless multipart writer or reader would mangle: every byte value, bare CRs and LFs, CRLFs, and a
# line that looks like a boundary.
AWKWARD = bytes(range(256)) * 8 + b"\r\n\r\n--mailroom-\r\n\r\rx\n\n--\r\n" + bytes(range(255, -1, -1)) * 8


def outgoing(
    index: int, filename: str, data: bytes, content_type: str = "application/octet-stream", **options
) -> OutgoingFile:
    return OutgoingFile(
        index=index,
        filename=filename,
        content_type=content_type,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        payload=lambda: data,
        **options,
    )


SCREENSHOT = outgoing(0, "screenshot.png", b"\x89PNG\r\n\x1a\n" + AWKWARD, "image/png")
INVOICE = outgoing(1, 'Rechnung "März" 4471.pdf', b"%PDF-1.7\n" + AWKWARD[::-1], "application/pdf")
WITH_FILES = TicketRequest(
    subject="Invoice 4471",
    description="See the files.\n\nAttachments:\n- screenshot.png",
    requester="jane.doe@example.com",
    requester_name="Jane Doe",
    cc=("bob@example.com", "carol@example.com"),
    files=(SCREENSHOT, INVOICE),
)


def sha256s(record: dict) -> Counter:
    return Counter(a["sha256"] for a in record["attachments"])


def test_a_create_with_two_files_is_one_multipart_ticket_with_both_files_once_and_its_people(desk, freshdesk):
    seen = []
    desk.on_request(lambda request: seen.append(request) and None)
    result = freshdesk().create_ticket(WITH_FILES, "key-1", REF)

    [create] = seen
    assert create.headers["Content-Type"].startswith("multipart/form-data; boundary=mailroom-")
    record = only_record(desk)
    assert sha256s(record) == Counter({SCREENSHOT.sha256: 1, INVOICE.sha256: 1})
    assert [(a["filename"], a["content_type"], a["size"]) for a in record["attachments"]] == [
        ("screenshot.png", "image/png", SCREENSHOT.size),
        ('Rechnung "März" 4471.pdf', "application/pdf", INVOICE.size),
    ]
    # The form's fields are Freshdesk's typed parameters, as the JSON create sends them.
    assert {k: record["fields"][k] for k in ("email", "name", "status", "source", "cc_emails", "custom_fields")} == {
        "email": "jane.doe@example.com",
        "name": "Jane Doe",
        "status": 2,
        "source": 1,
        "cc_emails": ["bob@example.com", "carol@example.com"],
        "custom_fields": {"cf_mailroom_ref": REF},
    }
    assert record["people"] == {"requester": "jane.doe@example.com", "cc": ["bob@example.com", "carol@example.com"]}
    assert [(p["email"], p["name"]) for p in desk.people()] == [("jane.doe@example.com", "Jane Doe")]
    ticket = requests.get(f"{desk.url}/api/v2/tickets/{result.ticket_id}", auth=(desk.token, "X"), timeout=5).json()
    assert ticket["cc_emails"] == ["bob@example.com", "carol@example.com"]
    assert ticket["requester_id"] == desk.people()[0]["id"]
    assert [a["name"] for a in ticket["attachments"]] == ["screenshot.png", 'Rechnung "März" 4471.pdf']


def test_a_retried_create_sends_the_very_same_bytes_and_a_new_key_another_boundary():
    fields = form_fields(ticket_payload(WITH_FILES, REF, {}))
    first, content_type = multipart_body(fields, WITH_FILES.files, "key-1")
    again, same_type = multipart_body(fields, WITH_FILES.files, "key-1")
    other, other_type = multipart_body(fields, WITH_FILES.files, "key-2")
    assert (first, content_type) == (again, same_type)
    assert other_type != content_type and other != first


@pytest.mark.fakedesk(dialect="freshdesk", search_lag_seconds=0.3)
def test_a_lost_answer_after_a_create_with_files_leaves_one_ticket_with_each_file_once(desk, freshdesk):
    adapter = freshdesk()
    desk.set_plan(["drop_after_commit"])
    with pytest.raises(AmbiguousOutcome):
        adapter.create_ticket(WITH_FILES, "key-1", REF)

    # Freshdesk's rule for an unknown outcome: never a second create; the search settles it once it caught up.
    desk.advance_clock(0.4)
    found = adapter.find_by_external_ref(REF)
    record = only_record(desk)
    assert found.ticket_id == str(record["id"])
    assert sha256s(record) == Counter({SCREENSHOT.sha256: 1, INVOICE.sha256: 1})
    assert len(desk.requests_log()) == 1


def test_files_past_the_20_mb_of_a_ticket_are_held_back_and_listed(desk, freshdesk):
    big = outgoing(0, "video.mp4", b"\x00" * (12 * MB), "video/mp4")
    bigger = outgoing(1, "dump.bin", b"\x01" * (9 * MB))
    small = outgoing(2, "note.txt", b"hello", "text/plain")
    request = TicketRequest(
        subject="Big", description="Files", requester="jane@example.com", files=(big, bigger, small)
    )
    freshdesk(read_timeout=10).create_ticket(request, "key-1", REF)

    record = only_record(desk)
    assert [a["filename"] for a in record["attachments"]] == ["video.mp4", "note.txt"]
    assert "dump.bin" in record["description"] and "20 MB" in record["description"]
    assert "video.mp4" not in record["description"]


def test_the_fake_refuses_attachments_past_20_mb_as_freshdesk_does(desk):
    files = [("attachments[]", ("a.bin", b"\x00" * (11 * MB))), ("attachments[]", ("b.bin", b"\x00" * (10 * MB)))]
    answer = requests.post(
        f"{desk.url}/api/v2/tickets",
        auth=(desk.token, "X"),
        timeout=10,
        files=files,
        data={"email": "jane@example.com", "subject": "s", "description": "d"},
    )
    assert answer.status_code == 400
    assert [e["field"] for e in answer.json()["errors"]] == ["attachments"]
    assert desk.tickets() == []


def test_the_fake_reads_any_client_s_form_typed(desk):
    """requests' own multipart writer, not ours: the fake parses forms the way Freshdesk reads them."""
    answer = requests.post(
        f"{desk.url}/api/v2/tickets",
        auth=(desk.token, "X"),
        timeout=5,
        data={
            "email": "jane@example.com",
            "subject": "s",
            "description": "<p>d</p>",
            "priority": "3",
            "tags[]": ["a", "b"],
            "cc_emails[]": ["bob@example.com"],
            "custom_fields[cf_product]": "Printer",
        },
        files=[("attachments[]", ("x.bin", AWKWARD, "application/octet-stream"))],
    )
    assert answer.status_code == 201, answer.text
    record = only_record(desk)
    assert (record["fields"]["priority"], record["tags"], record["fields"]["custom_fields"]) == (
        3,
        ["a", "b"],
        {"cf_product": "Printer"},
    )
    assert sha256s(record) == Counter({hashlib.sha256(AWKWARD).hexdigest(): 1})


def test_the_description_is_the_sanitized_html_with_the_list_of_files(desk, freshdesk):
    html_body = '<p>See <b>this</b>:</p><img src="cid:shot@x" alt="shot">'
    request = TicketRequest(
        subject="s",
        description="See this:\n\nAttachments:\n- screenshot.png (2 KB, shown inline)",
        requester="jane@example.com",
        html=html_body,
        files=(outgoing(0, "screenshot.png", b"png", "image/png", content_id="shot@x", inline=True),),
    )
    freshdesk().create_ticket(request, "key-1", REF)
    description = only_record(desk)["description"]
    assert description.startswith("<p>See <b>this</b>:</p>")
    assert 'src=""' in description and "cid:" not in description  # the image itself is an attachment
    assert description.endswith("<br><br>Attachments:<br>- screenshot.png (2 KB, shown inline)")
    assert [a["filename"] for a in only_record(desk)["attachments"]] == ["screenshot.png"]


def test_a_customer_s_reply_is_an_incoming_public_note_written_as_the_customer(desk, freshdesk):
    adapter = freshdesk()
    ticket_id = adapter.create_ticket(WITH_FILES, "key-1", REF).ticket_id
    reply = CommentRequest(
        body="Still charged.",
        author_email="Jane Doe <jane.doe@example.com>",
        files=(outgoing(3, "receipt.pdf", b"%PDF receipt", "application/pdf"),),
    )
    adapter.add_comment(ticket_id, reply, "key-2", REF)

    record = only_record(desk)
    assert kit.comment_records_of(record) == [
        {"body": "Still charged.", "public": True, "author": "jane.doe@example.com"}
    ]
    [note] = [a for a in record["attachments"] if a["comment_id"] is not None]
    assert (note["filename"], note["sha256"]) == ("receipt.pdf", hashlib.sha256(b"%PDF receipt").hexdigest())
    assert sha256s(record)[SCREENSHOT.sha256] == 1  # the ticket's own files are not sent again


def test_a_reply_from_another_known_contact_is_theirs_and_an_unknown_one_opens_with_who_wrote_it(desk, freshdesk):
    adapter = freshdesk()
    first = adapter.create_ticket(
        TicketRequest(subject="a", description="d", requester="bob@example.com"), "key-1", "mailroom-a"
    ).ticket_id
    ticket_id = adapter.create_ticket(REQUEST, "key-2", REF).ticket_id
    adapter.add_comment(ticket_id, CommentRequest(body="Me too.", author_email="bob@example.com"), "key-3", REF)
    adapter.add_comment(
        ticket_id, CommentRequest(body="And me.", author_email="zoe@example.net", author_name="Zoe Q"), "key-4", REF
    )

    record = [r for r in desk.tickets() if str(r["id"]) == ticket_id][0]
    assert first != ticket_id
    assert kit.comment_records_of(record) == [
        {"body": "Me too.", "public": True, "author": "bob@example.com"},
        {"body": "From the customer: Zoe Q <zoe@example.net>And me.", "public": True, "author": ""},
    ]
    assert [c["metadata"]["custom"]["incoming"] for c in record["comments"][1:]] == [True, True]


def test_an_agent_s_mail_is_a_private_note_never_incoming(desk, freshdesk):
    adapter = freshdesk()
    ticket_id = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    note = CommentRequest(
        body="Refund issued.", author_email="alice@support.example", author_name="Alice", public=False, from_agent=True
    )
    adapter.add_comment(ticket_id, note, "key-2", REF)

    [comment] = only_record(desk)["comments"][1:]
    assert (comment["public"], comment["metadata"]["custom"]["incoming"]) == (False, False)
    assert kit.comment_records_of(only_record(desk))[0]["body"] == (
        "From an agent: Alice <alice@support.example>Refund issued."
    )


def test_who_a_note_is_written_as_is_kept_for_the_retry(desk, freshdesk):
    adapter = freshdesk()
    adapter.create_ticket(TicketRequest(subject="a", description="d", requester="bob@example.com"), "key-0", "mr-a")
    ticket_id = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    seen = []
    desk.on_request(lambda request: seen.append(request) and None)
    desk.set_plan(["error_500"])
    reply = CommentRequest(body="Hello", author_email="bob@example.com")
    with pytest.raises(AmbiguousOutcome):
        adapter.add_comment(ticket_id, reply, "key-2", REF)
    adapter.add_comment(ticket_id, reply, "key-2", REF)

    notes = [r.body for r in seen if r.method == "POST"]
    assert len(notes) == 2 and notes[0] == notes[1]
    assert [r.path for r in seen].count("/api/v2/contacts") == 1  # the second attempt asked the journal
    bob = next(p for p in desk.people() if p["email"] == "bob@example.com")
    assert adapter.journal.get("note_author") == {"key": "key-2", "user_id": bob["id"]}


def test_a_reply_to_a_closed_ticket_is_refused_as_closed_and_nothing_is_written(desk, freshdesk):
    adapter = freshdesk()
    ticket_id = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    desk.close(int(ticket_id))
    shown = requests.get(f"{desk.url}/api/v2/tickets/{ticket_id}", auth=(desk.token, "X"), timeout=5).json()
    assert shown["status"] == 5

    with pytest.raises(TicketClosed) as caught:
        adapter.add_comment(
            ticket_id, CommentRequest(body="Hi again", author_email="jane.doe@example.com"), "key-2", REF
        )
    assert caught.value.reason == "ticket_closed"
    assert len(desk.requests_log()) == 1 and only_record(desk)["comments"][1:] == []
    assert freshdesk(closed_policy="review").closed_policy() == "review"
    assert freshdesk().closed_policy() == "follow_up"


def test_with_closed_policy_reopen_the_ticket_is_reopened_then_the_note_added(desk, freshdesk):
    adapter = freshdesk(closed_policy="reopen")
    ticket_id = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    desk.close(int(ticket_id))
    adapter.add_comment(ticket_id, CommentRequest(body="Hi again", author_email="jane.doe@example.com"), "key-2", REF)

    assert [(e["method"], e["path"]) for e in desk.requests_log()][1:] == [
        ("PUT", f"/api/v2/tickets/{ticket_id}"),
        ("POST", f"/api/v2/tickets/{ticket_id}/notes"),
    ]
    shown = requests.get(f"{desk.url}/api/v2/tickets/{ticket_id}", auth=(desk.token, "X"), timeout=5).json()
    assert shown["status"] == 2
    assert kit.comments_of(only_record(desk)) == ["Hi again"]


def test_a_lost_answer_to_the_reopen_is_tried_again_not_held(desk, freshdesk):
    adapter = freshdesk(closed_policy="reopen")
    ticket_id = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    desk.close(int(ticket_id))
    desk.set_plan(["drop_after_commit"])
    with pytest.raises(TransientError):
        adapter.add_comment(ticket_id, CommentRequest(body="Hi", author_email="jane.doe@example.com"), "key-2", REF)
    adapter.add_comment(ticket_id, CommentRequest(body="Hi", author_email="jane.doe@example.com"), "key-2", REF)
    assert kit.comments_of(only_record(desk)) == ["Hi"]


def test_a_follow_up_names_the_closed_ticket_and_links_it(desk, freshdesk):
    adapter = freshdesk()
    closed = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    desk.close(int(closed))
    follow_up = TicketRequest(
        subject="Again", description="Still broken", requester="jane.doe@example.com", follow_up_of=closed
    )
    adapter.create_ticket(follow_up, "key-2", "mailroom-follow-up")

    record = desk.tickets()[-1]
    assert kit.follow_up_of(record) == closed and kit.follow_up_of(desk.tickets()[0]) is None
    assert f'href="{desk.url}/a/tickets/{closed}"' in record["description"]


def test_freshdesk_s_own_reference_in_a_subject_names_its_ticket(desk, freshdesk):
    adapter = freshdesk()
    ticket_id = adapter.create_ticket(REQUEST, "key-1", REF).ticket_id
    subject = f"Re: {kit.desk_reference(only_record(desk))} Invoice 4471 charged twice"
    [pattern] = adapter.reference_patterns
    found = pattern.search(subject)
    assert found and adapter.resolve_reference(found.group("ref")) == ticket_id
    assert adapter.reference_fields == ("subject",)
    for other in ("Re: [#MR-12] Invoice", "Order #123", "[# 12]"):
        assert pattern.search(other) is None


def test_the_capabilities_say_what_freshdesk_does():
    capabilities = FreshdeskDestination.capabilities
    assert (
        capabilities.files,
        capabilities.max_file_bytes,
        capabilities.html,
        capabilities.requester,
        capabilities.cc_field,
    ) == ("with_write", 20 * MB, True, "find_or_create", "cc_emails")
    assert (
        capabilities.customer_authored_comments,
        capabilities.internal_notes,
        capabilities.acknowledges_requester,
        capabilities.requests_per_minute,
    ) == (True, True, True, 80)
    assert capabilities.closed_policies == ("follow_up", "reopen", "review")


def test_without_a_setting_the_request_budget_is_freshdesk_s_smallest_plan(freshdesk):
    assert freshdesk(requests_per_minute=None).quota.per_minute == 80  # the kit switches it off for tests
    assert freshdesk(requests_per_minute=400).quota.per_minute == 400  # a Pro plan's
    assert freshdesk().quota is None

"""The HubSpot adapter against FakeDesk's hubspot dialect over real HTTP: the ticket upsert by the unique
property, the requester's and the CC'd contacts, notes, files (uploaded, then attached by a note), closed
stages, follow-ups, HubSpot's error bodies, check_connection.

What every kind shares (duplicates, lost answers, 429/401/422, comments through the pipeline) is in
tests/test_destination_contract.py."""

import email.parser
import email.policy
import hashlib
import json
import logging
from datetime import datetime

import pytest
import requests

from tests.destination_kits import hubspot as kit
from tests.factories import make_event
from ticketing import intents
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
from ticketing.destinations.hubspot import HubSpotDestination, note_html, ticket_properties
from ticketing.destinations.journal import MemoryJournal
from ticketing.destinations.settings import validate
from ticketing.models import Destination

pytestmark = pytest.mark.fakedesk(dialect="hubspot")

REQUEST = TicketRequest(
    subject="Invoice 42 charged twice",
    description="I was charged twice for invoice 42.",
    requester="Jane Doe <jane.doe@example.com>",
    tags=("email",),
    queue="billing",
    priority="urgent",
    request_type="refund",
    assignee="alice",
    fields={"mailroom_requester": "from-fields"},
)
UPSERT_PATH = "/crm/v3/objects/tickets/batch/upsert"
NOTES_PATH = "/crm/v3/objects/notes"
EMAILS_PATH = "/crm/v3/objects/emails"
FILES_PATH = "/files/v3/files"
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


def multipart_fields(request) -> dict:
    """The parts of a multipart/form-data request: name -> text, or (filename, bytes) for the file."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {request.headers['Content-Type']}\r\n\r\n".encode() + request.body
    )
    parts = {}
    for part in message.iter_parts():
        name, data = part.get_param("name", header="content-disposition"), part.get_payload(decode=True)
        parts[name] = (part.get_filename(), data) if part.get_filename() else data.decode()
    return parts


def attached_by_sha(record: dict) -> dict:
    counts = {}
    for attachment in record["attachments"]:
        counts[attachment["sha256"]] = counts.get(attachment["sha256"], 0) + 1
    return counts


MISSING_SCOPES = {
    "status": "error",
    "message": "This app hasn't been granted all required scopes to make this call.",
    "correlationId": "c0ffee",
    "category": "MISSING_SCOPES",
    "errors": [
        {
            "message": "One or more of the following scopes are required.",
            "context": {"requiredGranularScopes": ["tickets"]},
        }
    ],
}


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
    desk.on_request(
        lambda r: (status, body, headers or {}) if r.method == method and r.path.startswith(path_start) else None
    )


# --- Capabilities and settings ----------------------------------------------------


def test_capabilities_an_upsert_with_a_consistent_lookup_and_a_default_api_url(hubspot):
    adapter = hubspot(read_timeout=4)
    assert isinstance(adapter, HubSpotDestination)
    # Only the create is an upsert: `retry_safe` (every write, comments too) stays false.
    assert (adapter.upsert, adapter.consistent_lookup, adapter.retry_safe, adapter.honours_idempotency_key) == (
        True,
        True,
        False,
        False,
    )
    assert (adapter.max_description_chars, adapter.id_property, adapter.timeout[1]) == (64_000, "mailroom_ref", 4.0)
    assert HubSpotDestination.needs_base_url and HubSpotDestination.needs_credentials
    bare = HubSpotDestination(Destination(kind="hubspot", settings={}))
    assert (bare.base_url, bare.ticket_url("7")) == ("https://api.hubapi.com", "")
    eu = HubSpotDestination(
        Destination(kind="hubspot", settings={"portal_id": "99", "app_url": "https://app-eu1.hubspot.com"})
    )
    assert eu.ticket_url("7") == "https://app-eu1.hubspot.com/contacts/99/record/0-5/7"
    caps = HubSpotDestination.capabilities
    assert (caps.files, caps.max_file_bytes, caps.html, caps.requester, caps.cc_field) == (
        FILES_AFTER_WRITE,
        20 * MB,
        False,
        REQUESTER_FIND_OR_CREATE,
        "associations",
    )
    assert (
        caps.closed_policies,
        caps.acknowledges_requester,
        caps.customer_authored_comments,
        caps.requests_per_minute,
    ) == (("follow_up", "reopen", "review"), False, True, 600)
    assert (bare.create_contacts, bare.closed_policy, HubSpotDestination.reference_patterns) == (True, "follow_up", ())


def test_settings_are_checked_field_by_field():
    good = {
        "id_property": "ticket_ref",
        "pipeline": "12345",
        "pipeline_stage": "67890",
        "portal_id": 4242,
        "app_url": "https://app-eu1.hubspot.com",
        "create_contacts": True,
        "requester_property": "requester",
        "queues": {"billing": "111:222", "tech": "333"},
        "priorities": {"urgent": "HIGH"},
        "owners": {"alice": "7001"},
        "categories": {"refund": "BILLING_ISSUE"},
        "connect_timeout": 2,
        "files_folder": "/support/mailroom",
        "reopen_stage": "2",
        "closed_policy": "reopen",
    }
    assert validate(HubSpotDestination.SETTINGS, good) == {}
    errors = validate(
        HubSpotDestination.SETTINGS,
        {
            "id_property": "Mailroom Ref",
            "portal_id": "acme",
            "create_contacts": "no",
            "queues": {"billing": "a:b:c"},
            "priorities": {"urgent": "CRITICAL"},
            "owners": {"alice": "alice@acme"},
            "pipline": "0",
            "files_folder": "mailroom",
        },
    )
    assert set(errors) == {
        "id_property",
        "portal_id",
        "create_contacts",
        "queues",
        "priorities",
        "owners",
        "pipline",
        "files_folder",
    }
    assert errors["priorities"] == ["'urgent': must be one of LOW, MEDIUM, HIGH, URGENT"]


# --- The ticket ---------------------------------------------------------------------------


def test_create_upserts_by_the_unique_property_with_the_mapped_route(desk, hubspot, seen):
    result = hubspot(requester_property="mailroom_requester").create_ticket(REQUEST, "key-1", "evt-1")

    [upsert] = [r for r in seen if r.path == UPSERT_PATH]
    assert upsert.json() == {
        "inputs": [
            {
                "idProperty": "mailroom_ref",
                "id": "evt-1",
                "properties": {
                    "subject": "Invoice 42 charged twice",
                    "content": "I was charged twice for invoice 42.",
                    "source_type": "EMAIL",
                    "hs_pipeline": "billing-pipeline",
                    "hs_pipeline_stage": "billing-new",
                    "hs_ticket_priority": "URGENT",
                    "hubspot_owner_id": "7001",
                    "hs_ticket_category": "BILLING_ISSUE",
                    "mailroom_requester": "from-fields",  # request.fields come last and win
                },
            }
        ]
    }
    [record] = desk.tickets()
    assert result.ticket_id == str(record["id"])
    assert result.url == f"https://app.hubspot.com/contacts/4242/record/0-5/{record['id']}"
    assert record["fields"]["mailroom_ref"] == "evt-1" and record["external_id"] == "evt-1"
    assert [(e["status"], e["external_id"]) for e in desk.requests_log()] == [(200, "evt-1")]


def test_the_default_pipeline_the_requester_property_and_unmapped_values():
    request = TicketRequest(
        "s", "d", "Jane <jane@example.com>", queue="sales", priority="", request_type="other", assignee="bob"
    )
    assert ticket_properties(request, {"requester_property": "requester"}) == {
        "subject": "s",
        "content": "d",
        "source_type": "EMAIL",
        "hs_pipeline": "0",
        "hs_pipeline_stage": "1",
        "requester": "jane@example.com",
    }
    urgent = ticket_properties(
        TicketRequest("s", "d", "a@b.c", priority="urgent", queue="tech"),
        {"pipeline": "9", "pipeline_stage": "10", "queues": {"tech": "20"}},
    )
    assert (urgent["hs_ticket_priority"], urgent["hs_pipeline"], urgent["hs_pipeline_stage"]) == ("URGENT", "20", "10")


def test_a_retry_updates_the_one_ticket_and_the_lookup_finds_it(desk, hubspot):
    adapter = hubspot()
    assert adapter.find_by_external_ref("evt-1") is None
    first = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    again = adapter.create_ticket(REQUEST, "key-1", "evt-1")

    assert again == first and adapter.find_by_external_ref("evt-1") == first
    assert len(desk.tickets()) == 1 and len(desk.requests_log()) == 2


# --- The requester's contact ---------------------------------------------------------------


def test_a_known_contact_is_read_by_email_and_associated_with_the_ticket(desk, hubspot, seen):
    contact_id = desk.control("hubspot/contacts", {"email": "jane.doe@example.com"})["id"]
    ticket = hubspot().create_ticket(REQUEST, "key-1", "evt-1")

    [lookup] = [r for r in seen if r.path.startswith("/crm/v3/objects/contacts/")]
    assert (lookup.method, lookup.path, lookup.query) == (
        "GET",
        "/crm/v3/objects/contacts/jane.doe%40example.com",
        {"idProperty": ["email"]},
    )
    assert [r.path for r in seen if r.method == "PUT"] == [
        f"/crm/v4/objects/tickets/{ticket.ticket_id}/associations/default/contacts/{contact_id}"
    ]
    [record] = desk.tickets()
    assert record["fields"]["associations"] == {"contacts": [{"id": contact_id, "email": "jane.doe@example.com"}]}
    assert record["people"] == {"requester": "jane.doe@example.com", "cc": []}


def test_an_unknown_sender_gets_a_contact_only_with_create_contacts(desk, hubspot, seen):
    hubspot().create_ticket(REQUEST, "key-1", "evt-1")
    assert "associations" not in desk.tickets()[0]["fields"]
    assert not [r for r in seen if r.path.endswith("/contacts/batch/upsert") or r.method == "PUT"]

    hubspot(create_contacts=True).create_ticket(REQUEST, "key-2", "evt-2")
    [upsert] = [r for r in seen if r.path == "/crm/v3/objects/contacts/batch/upsert"]
    assert upsert.json() == {
        "inputs": [
            {
                "idProperty": "email",
                "id": "jane.doe@example.com",
                "properties": {"email": "jane.doe@example.com", "firstname": "Jane Doe"},
            }
        ]
    }
    assert desk.tickets()[1]["fields"]["associations"]["contacts"][0]["email"] == "jane.doe@example.com"


def test_the_requester_comes_first_and_the_ccd_addresses_are_associated_contacts_too(desk, hubspot):
    copied = TicketRequest("s", "d", "Jane Doe <jane.doe@example.com>", cc=("bob@example.com", "Eve@Example.com"))
    adapter = hubspot(create_contacts=True)
    adapter.create_ticket(copied, "key-1", "evt-1")
    adapter.create_ticket(copied, "key-2", "evt-2")  # the same three contacts, found this time

    first, second = desk.tickets()
    assert (
        first["people"]
        == second["people"]
        == {"requester": "jane.doe@example.com", "cc": ["bob@example.com", "eve@example.com"]}
    )
    assert sorted(p["email"] for p in desk.people()) == ["bob@example.com", "eve@example.com", "jane.doe@example.com"]
    assert kit.CC_ON_RECORD is True


@pytest.mark.parametrize("path", ["/crm/v4/objects/tickets/", "/crm/v3/objects/contacts/jane"])
def test_a_failed_association_neither_fails_nor_repeats_the_ticket(desk, hubspot, caplog, path):
    desk.control("hubspot/contacts", {"email": "jane.doe@example.com"})
    answer(desk, "PUT" if "v4" in path else "GET", path, 500, {"status": "error", "category": "INTERNAL_ERROR"})
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
        adapter.add_comment(ticket.ticket_id, REPLY, "key-c", "evt-2")
    assert note.value.reason == "server_error"


# --- Notes ------------------------------------------------------------------------------------


def test_a_customers_reply_is_logged_as_the_incoming_email_it_is(desk, hubspot, seen):
    adapter = hubspot()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    with_cc = CommentRequest(
        body="Still charged twice.\n\nSee below.",
        author_email="jane.doe@example.com",
        author_name="Jane Doe",
        cc=("bob@example.com",),
    )
    email_id = adapter.add_comment(ticket.ticket_id, with_cc, "key-c", "evt-2")

    [logged] = [r.json() for r in seen if r.path == EMAILS_PATH]
    assert logged["associations"] == [
        {
            "to": {"id": ticket.ticket_id},
            "types": [{"associationCategory": "HUBSPOT_DEFINED", "associationTypeId": 224}],
        }
    ]
    properties = logged["properties"]
    assert (properties["hs_email_direction"], properties["hs_email_text"], properties["hs_email_html"]) == (
        "INCOMING_EMAIL",
        "Still charged twice.\n\nSee below.",
        "<p>Still charged twice.</p><p>See below.</p>",
    )
    assert json.loads(properties["hs_email_headers"]) == {
        "from": {"email": "jane.doe@example.com", "firstName": "Jane", "lastName": "Doe"},
        "to": [],
        "cc": [{"email": "bob@example.com"}],
        "bcc": [],
    }
    [record] = desk.tickets()
    assert kit.comment_records_of(record) == [
        {"body": "Still charged twice.\n\nSee below.", "public": True, "author": "jane.doe@example.com"}
    ]
    assert str(record["comments"][1]["id"]) == email_id and not [r for r in seen if r.path == NOTES_PATH]


@pytest.mark.parametrize(
    ("settings", "comment"),
    [
        (
            {},
            CommentRequest(
                body="Refund issued.",
                author_email="sam@support.example",
                author_name="Sam Agent",
                public=False,
                from_agent=True,
            ),
        ),
        ({"customer_replies": "note"}, REPLY),
    ],
)
def test_an_agents_mail_or_with_customer_replies_note_any_reply_is_an_internal_note(
    desk, hubspot, seen, settings, comment
):
    adapter = hubspot(**settings)
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    note_id = adapter.add_comment(ticket.ticket_id, comment, "key-c", "evt-2")

    [note] = [r.json() for r in seen if r.path == NOTES_PATH]
    assert note["associations"] == [
        {
            "to": {"id": ticket.ticket_id},
            "types": [{"associationCategory": "HUBSPOT_DEFINED", "associationTypeId": 228}],
        }
    ]
    assert note["properties"]["hs_note_body"] == note_html(comment)
    [record] = desk.tickets()
    [written] = kit.comment_records_of(record)
    author = "Sam Agent <sam@support.example> (agent)" if comment.from_agent else "Jane Doe <jane.doe@example.com>"
    assert written == {"body": f"From: {author}\n\n{comment.body}", "public": False, "author": ""}
    assert str(record["comments"][1]["id"]) == note_id and not [r for r in seen if r.path == EMAILS_PATH]


def test_a_note_keeps_the_texts_paragraphs_and_escapes_its_markup():
    agent = CommentRequest(
        body="Hi <b>team</b> & all\nline two\n\nsecond paragraph",
        author_email="sam@x.example",
        from_agent=True,
        public=False,
        cc=("bob@example.com",),
    )
    assert note_html(agent) == (
        "<p>From: sam@x.example (agent)</p><p>CC: bob@example.com</p>"
        "<p>Hi &lt;b&gt;team&lt;/b&gt; &amp; all<br>line two</p><p>second paragraph</p>"
    )
    long = note_html(CommentRequest(body="&" * 70_000, author_email="a@example.com"))
    assert len(long) <= 65_536 and long.endswith("note limit.]</p>")
    assert long == note_html(CommentRequest(body="&" * 70_000, author_email="a@example.com"))  # the same every time


def test_the_timestamp_is_when_the_reply_came_in_the_same_on_every_attempt(desk, hubspot, seen, mailbox):
    event = make_event(mailbox)
    intent = intents.ensure_intent(event, "add_comment", event.tenant.destinations.get(is_default=True))
    adapter = hubspot()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    reply = CommentRequest(body="Reply.", author_email="a@example.com")
    adapter.add_comment(ticket.ticket_id, reply, intent.idempotency_key, intent.external_ref)
    adapter.add_comment(ticket.ticket_id, reply, intent.idempotency_key, intent.external_ref)

    first, again = [r.json() for r in seen if r.path == EMAILS_PATH]
    assert first == again
    stamp = datetime.fromisoformat(first["properties"]["hs_timestamp"].replace("Z", "+00:00"))
    assert abs((stamp - intent.created_at).total_seconds()) < 0.001


def test_a_note_on_a_ticket_that_does_not_exist_is_not_found(desk, hubspot):
    adapter = hubspot()
    with pytest.raises(PermanentError) as missing:
        adapter.add_comment("999", REPLY, "key-c", "evt-2")
    with pytest.raises(PermanentError) as malformed:
        adapter.add_comment("TICKET-9", REPLY, "key-d", "evt-3")
    assert (missing.value.reason, malformed.value.reason) == ("not_found", "not_found")
    assert desk.requests_log() == []  # the ticket was read first; nothing was written


# --- Closed stages and follow-ups ----------------------------------------------------------------


def test_a_reply_to_a_ticket_in_a_closed_stage_is_refused_as_closed(desk, hubspot, seen):
    adapter = hubspot()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    desk.close(int(ticket.ticket_id))
    with pytest.raises(TicketClosed) as caught:
        adapter.add_comment(ticket.ticket_id, REPLY, "key-c", "evt-2")

    assert caught.value.reason == "ticket_closed"
    assert [r.path for r in seen if r.path.startswith("/crm/v3/pipelines")] == [
        "/crm/v3/pipelines/tickets/billing-pipeline"
    ]
    [record] = desk.tickets()
    assert kit.comments_of(record) == [] and len(desk.requests_log()) == 1


@pytest.mark.parametrize(("settings", "stage"), [({}, "billing-new"), ({"reopen_stage": "billing-new"}, "billing-new")])
def test_closed_policy_reopen_moves_the_ticket_to_an_open_stage_then_notes(desk, hubspot, seen, settings, stage):
    adapter = hubspot(closed_policy="reopen", **settings)
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    desk.close(int(ticket.ticket_id))
    adapter.add_comment(ticket.ticket_id, REPLY, "key-c", "evt-2")
    adapter.add_comment(ticket.ticket_id, REPLY, "key-d", "evt-3")  # open now: no second move

    [move] = [r.json() for r in seen if r.method == "PATCH"]
    assert move == {"properties": {"hs_pipeline_stage": stage}}
    [record] = desk.tickets()
    assert record["status"] == "open" and record["fields"]["hs_pipeline_stage"] == stage
    assert len(kit.comments_of(record)) == 2
    assert len([r for r in seen if r.path.startswith("/crm/v3/pipelines")]) == 1  # read once per adapter


def test_a_follow_up_names_the_closed_ticket_and_is_associated_with_it(desk, hubspot):
    adapter = hubspot()
    closed = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    follow_up = TicketRequest("Re: Invoice 42", "Still charged.", REQUEST.requester, follow_up_of=closed.ticket_id)
    adapter.create_ticket(follow_up, "key-2", "evt-2")

    first, second = desk.tickets()
    assert kit.follow_up_of(second) == closed.ticket_id and kit.follow_up_of(first) is None
    assert (
        second["fields"]["content"] == f"Follow-up of HubSpot ticket {closed.ticket_id}, which is closed.\n\n"
        "Still charged."
    )
    assert kit.desk_reference(second) == ""


# --- Files ------------------------------------------------------------------------------------------


def test_each_file_is_uploaded_privately_then_attached_by_a_note_of_its_own(desk, hubspot, seen):
    adapter = hubspot()
    adapter.journal = MemoryJournal()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    done = attach_each(adapter, ticket.ticket_id, FILES, "key-1")
    assert attach_each(adapter, ticket.ticket_id, FILES, "key-1") == done  # done: nothing sent again

    first_upload = multipart_fields([r for r in seen if r.path == FILES_PATH][0])
    assert first_upload["file"] == ("invoice-42.pdf", b"%PDF-1.7 invoice 42")
    assert (first_upload["fileName"], first_upload["folderPath"]) == ("invoice-42.pdf", "/mailroom/key-1-f0")
    assert json.loads(first_upload["options"])["access"] == "PRIVATE"
    notes = [r.json()["properties"] for r in seen if r.path == NOTES_PATH]
    assert [n["hs_attachment_ids"] for n in notes] == done["done"]
    assert notes[1]["hs_note_body"] == "<p>Attached to the email: screenshot.png</p>"
    [record] = desk.tickets()
    assert attached_by_sha(record) == {f.sha256: 1 for f in FILES}
    assert [(a["filename"], a["marker"]) for a in record["attachments"]] == [
        ("invoice-42.pdf", "key-1-f0"),
        ("screenshot.png", "key-1-f1"),
    ]
    assert kit.comments_of(record) == []  # a file's note is no comment


@pytest.mark.parametrize(
    ("faults", "uploads", "notes"),
    [
        (["drop_after_commit"], 3, 2),  # the first upload's answer lost: uploaded again (one unattached)
        (["ok", "drop_after_commit"], 2, 2),  # the first note's answer lost: found among the ticket's notes
        (["ok", "error_500"], 2, 3),  # the first note refused: the same upload attached by a new note
        (["drop_before_commit"], 3, 2),
    ],
)
def test_a_lost_answer_on_an_upload_or_a_note_never_doubles_a_file(desk, hubspot, faults, uploads, notes):
    adapter = hubspot()
    adapter.journal = MemoryJournal()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    desk.set_plan(faults)
    with pytest.raises(TransientError):
        attach_each(adapter, ticket.ticket_id, FILES, "key-1")
    assert len(attach_each(adapter, ticket.ticket_id, FILES, "key-1")["done"]) == 2

    [record] = desk.tickets()
    assert attached_by_sha(record) == {f.sha256: 1 for f in FILES}  # one copy of each file on the ticket
    log = desk.requests_log()
    assert (len([e for e in log if e["path"] == FILES_PATH]), len([e for e in log if e["path"] == NOTES_PATH])) == (
        uploads,
        notes,
    )


def test_without_a_noted_upload_find_file_finds_nothing_and_reads_nothing(desk, hubspot, seen):
    adapter = hubspot()
    adapter.journal = MemoryJournal()
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    before = len(seen)
    assert adapter.find_file(ticket.ticket_id, FILES[0], "key-1-f0") is None
    assert len(seen) == before
    file_id = adapter.upload_file(ticket.ticket_id, FILES[0], "key-1-f0")
    assert adapter.find_file(ticket.ticket_id, FILES[0], "key-1-f0") == file_id
    other = adapter.create_ticket(REQUEST, "key-2", "evt-2")
    assert adapter.find_file(other.ticket_id, FILES[0], "key-1-f0") is None


# --- check_connection ----------------------------------------------------------------------


def test_check_connection_reads_the_unique_property_and_contacts(desk, hubspot, seen):
    said = hubspot().check_connection()
    assert "ticket property mailroom_ref has unique values" in said
    assert [(r.method, r.path) for r in seen] == [
        ("GET", "/crm/v3/properties/tickets/mailroom_ref"),
        ("GET", "/crm/v3/objects/contacts"),
        ("GET", "/files/v3/files/search"),
    ]
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

    answer(
        desk,
        "GET",
        "/crm/v3/objects/contacts",
        403,
        {**MISSING_SCOPES, "errors": [{"context": {"requiredGranularScopes": ["crm.objects.contacts.read"]}}]},
    )
    with pytest.raises(PermanentError) as scopes:
        hubspot().check_connection()
    assert scopes.value.reason == "credentials" and "crm.objects.contacts.read" in scopes.value.detail


# --- The fake dialect ---------------------------------------------------------------------------


def test_the_fake_wants_the_bearer_token_and_a_unique_id_property(desk):
    body = {"inputs": [{"idProperty": "subject", "id": "x", "properties": {"content": "y"}}]}
    refused = requests.post(desk.url + UPSERT_PATH, json=body, timeout=5)
    assert (refused.status_code, refused.json()["category"]) == (401, "INVALID_AUTHENTICATION")
    not_unique = requests.post(
        desk.url + UPSERT_PATH, json=body, timeout=5, headers={"Authorization": f"Bearer {desk.token}"}
    )
    assert (not_unique.status_code, not_unique.json()["category"]) == (400, "VALIDATION_ERROR")
    assert desk.tickets() == []


# --- Privacy --------------------------------------------------------------------------------


def test_nothing_logged_contains_bodies_addresses_or_the_token(desk, hubspot, caplog):
    caplog.set_level(logging.DEBUG)
    adapter = hubspot(create_contacts=True)
    ticket = adapter.create_ticket(REQUEST, "key-1", "evt-1")
    adapter.add_comment(
        ticket.ticket_id,
        CommentRequest(body="Secret reply text", author_email="jane.doe@example.com"),
        "key-c",
        "evt-2",
    )
    adapter.find_by_external_ref("evt-1")

    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "evt-1" in text
    for secret in ("jane.doe@example.com", "charged twice for", "Secret reply text", desk.token):
        assert secret not in text

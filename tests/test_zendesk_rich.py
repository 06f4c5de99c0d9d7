"""A Zendesk ticket a desk can work with, against FakeDesk over real HTTP: files uploaded first and named by
token (exactly once whatever answer is lost), the HTML body with its inline image, the requester and the
CC'd people, comments written as their author, closed tickets and their follow-ups, and Zendesk's own
ticket references."""

import hashlib

import pytest
import requests

from tests.destination_kits import zendesk as kit
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
from ticketing.destinations.journal import MemoryJournal
from ticketing.destinations.zendesk import UPLOAD_VALID_SECONDS
from ticketing.models import Destination

CONTENTS = {
    "report.pdf": (b"%PDF-1.7 quarterly report", "application/pdf"),
    "crash.log": (b"Traceback: printer on fire\n", "text/plain"),
    "screenshot.png": (b"\x89PNG\r\n\x1a\n a screenshot", "image/png"),
}


def outgoing(index: int, filename: str, *, content_id: str = "") -> OutgoingFile:
    data, content_type = CONTENTS[filename]
    return OutgoingFile(
        index=index,
        filename=filename,
        content_type=content_type,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        content_id=content_id,
        inline=bool(content_id),
        payload=lambda: data,
    )


FILES = (outgoing(0, "report.pdf"), outgoing(1, "crash.log"), outgoing(2, "screenshot.png", content_id="shot@mail"))
LISTING = (
    "\n\nAttachments:\n- report.pdf (25 bytes)\n- crash.log (27 bytes)\n"
    "- screenshot.png (22 bytes, shown inline)\n- setup.exe (1 KB) not attached here, blocked type; "
    "kept in Mailroom: https://mailroom.example/console/events/7/files/3"
)
RICH = TicketRequest(
    subject="Printer on fire",
    description="The printer on floor 3 is on fire. See the screenshot." + LISTING,
    requester="alice@customer.test",
    requester_name="Alice Example",
    cc=("bob@customer.test", "carol@customer.test"),
    html='<p>The printer on floor 3 is on fire. See <img src="cid:shot@mail" alt="the screenshot"></p>',
    files=FILES,
)


@pytest.fixture
def zendesk(desk, monkeypatch):
    monkeypatch.setenv("ZD_CREDENTIALS", f"agent@example.com/token:{desk.token}")

    def build(**settings):
        return adapter_for(
            Destination(
                kind="zendesk",
                slug="zd",
                base_url=desk.url,
                credentials_ref="env:ZD_CREDENTIALS",
                settings={"read_timeout": 2, **settings},
            )
        )

    return build


def only_ticket(desk):
    [ticket] = desk.tickets()
    return ticket


def writes(desk, path_part: str) -> list[dict]:
    return [entry for entry in desk.requests_log() if path_part in entry["path"]]


def sha_counts(record) -> dict[str, int]:
    counts = {}
    for attachment in record["attachments"]:
        counts[attachment["sha256"]] = counts.get(attachment["sha256"], 0) + 1
    return counts


EACH_FILE_ONCE = {file.sha256: 1 for file in FILES}


def add_agent(desk, address: str) -> int:
    answer = requests.post(
        f"{desk.url}/api/v2/users/create_or_update.json",
        auth=desk.auth,
        timeout=5,
        json={"user": {"email": address, "name": "Agent Smith", "role": "agent"}},
    )
    assert answer.status_code == 201
    return answer.json()["user"]["id"]


# --- What the kind declares ----------------------------------------------------------


def test_the_capabilities_are_zendesks(zendesk):
    capabilities = zendesk().capabilities
    assert (capabilities.files, capabilities.max_file_bytes, capabilities.html) == ("with_write", 50 * MB, True)
    assert (capabilities.requester, capabilities.cc_field) == ("find_or_create", "email_ccs")
    assert capabilities.customer_authored_comments and capabilities.internal_notes
    assert capabilities.closed_policies == ("follow_up", "review")
    assert capabilities.default_closed_policy == "follow_up"
    assert capabilities.acknowledges_requester
    assert capabilities.requests_per_minute == 700
    assert UPLOAD_VALID_SECONDS < 60 * 60  # a token Zendesk keeps for 60 minutes is not reused up to the end


# --- Files and the rich body ------------------------------------------------------------


def test_two_files_and_an_inline_image_end_on_the_record_once_each(desk, zendesk):
    result = zendesk().create_ticket(RICH, "key-1", "evt-1")

    record = only_ticket(desk)
    assert str(record["id"]) == result.ticket_id
    assert sha_counts(record) == EACH_FILE_ONCE
    by_name = {a["filename"]: a for a in record["attachments"]}
    assert {name: a["inline"] for name, a in by_name.items()} == {
        "report.pdf": False,
        "crash.log": False,
        "screenshot.png": True,
    }
    assert by_name["screenshot.png"]["content_type"] == "image/png"
    assert {a["comment_id"] for a in record["attachments"]} == {record["comments"][0]["id"]}
    # The HTML body: the image points at its upload, and the list of files is there, escaped.
    body = record["comments"][0]["body"]
    assert "cid:" not in body
    assert f'src="{desk.url}/attachments/token/' in body and "screenshot.png" in body
    assert "<li>report.pdf (25 bytes)</li>" in body
    assert "<li>setup.exe (1 KB) not attached here, blocked type; kept in Mailroom: " in body
    assert [e["status"] for e in writes(desk, "/uploads")] == [201, 201, 201]


def test_a_plain_message_goes_as_body_with_its_files(desk, zendesk):
    plain = TicketRequest(
        subject="Logs", description="Logs attached." + LISTING, requester="alice@customer.test", files=FILES[:2]
    )
    zendesk().create_ticket(plain, "key-1", "evt-1")

    record = only_ticket(desk)
    assert record["comments"][0]["body"] == plain.description
    assert sha_counts(record) == {FILES[0].sha256: 1, FILES[1].sha256: 1}


@pytest.mark.parametrize("lost", [0, 1, 2])
def test_a_lost_upload_answer_still_leaves_one_copy_of_each_file(desk, zendesk, lost):
    desk.set_plan(["ok"] * lost + ["drop_after_commit"])
    adapter = zendesk()
    with pytest.raises(TransientError) as caught:
        adapter.create_ticket(RICH, "key-1", "evt-1")
    assert caught.value.reason == "connection_lost"  # nothing is on a ticket yet: safe to try again
    assert desk.tickets() == []

    adapter.create_ticket(RICH, "key-1", "evt-1")

    assert sha_counts(only_ticket(desk)) == EACH_FILE_ONCE
    # The uploads answered before the loss were reused; only the lost one was made again.
    assert len(writes(desk, "/uploads")) == 4
    assert len(writes(desk, "/tickets")) == 1


def test_a_create_retried_after_a_lost_answer_reuses_its_tokens(desk, zendesk):
    desk.set_plan(["ok", "ok", "ok", "drop_after_commit"])
    first = zendesk()
    with pytest.raises(AmbiguousOutcome):
        first.create_ticket(RICH, "key-1", "evt-1")

    # The next attempt is another adapter object with the intent's journal (as the pipeline gives it).
    retry = zendesk()
    retry.journal = first.journal
    result = retry.create_ticket(RICH, "key-1", "evt-1")

    record = only_ticket(desk)
    assert result.ticket_id == str(record["id"])
    assert sha_counts(record) == EACH_FILE_ONCE
    assert len(writes(desk, "/uploads")) == 3  # no upload made twice
    # The very same body under the key: Zendesk answers with the original ticket.
    assert [e["idempotency_lookup"] for e in writes(desk, "/tickets")] == ["miss", "hit"]


def test_an_upload_older_than_its_validity_is_made_again(desk, zendesk):
    first = zendesk()
    desk.set_plan(["ok", "ok", "ok", "error_500"])
    with pytest.raises(TransientError):
        first.create_ticket(RICH, "key-1", "evt-1")
    aged = MemoryJournal(
        {step: {**noted, "at": noted["at"] - UPLOAD_VALID_SECONDS - 1} for step, noted in first.journal.data.items()}
    )
    retry = zendesk()
    retry.journal = aged

    retry.create_ticket(RICH, "key-1", "evt-1")

    assert len(writes(desk, "/uploads")) == 6
    assert sha_counts(only_ticket(desk)) == EACH_FILE_ONCE


def test_a_file_the_upload_api_refuses_is_left_out_and_said(desk, zendesk):
    desk.set_plan(["reject_422"])
    zendesk().create_ticket(RICH, "key-1", "evt-1")

    record = only_ticket(desk)
    assert sha_counts(record) == {FILES[1].sha256: 1, FILES[2].sha256: 1}
    assert "Zendesk refused these files (kept in Mailroom): report.pdf" in record["comments"][0]["body"]


def test_refused_credentials_on_an_upload_stop_the_write(desk, zendesk):
    desk.set_plan(["unauthorized_401"])
    with pytest.raises(PermanentError) as caught:
        zendesk().create_ticket(RICH, "key-1", "evt-1")
    assert caught.value.reason == "credentials"
    assert desk.tickets() == []


def test_html_too_long_for_a_comment_goes_as_the_plain_text(desk, zendesk):
    huge = TicketRequest(
        subject="Long", description="Short text.", requester="alice@customer.test", html="<p>" + "x" * 70_000 + "</p>"
    )
    zendesk().create_ticket(huge, "key-1", "evt-1")
    assert only_ticket(desk)["comments"][0]["body"] == "Short text."


def test_the_desk_refuses_an_unknown_upload_token_and_writes_nothing(desk):
    answer = requests.post(
        f"{desk.url}/api/v2/tickets.json",
        auth=desk.auth,
        timeout=5,
        json={
            "ticket": {
                "subject": "s",
                "comment": {"body": "b", "uploads": ["no-such-token"]},
                "requester": {"email": "alice@customer.test", "name": "Alice"},
            }
        },
    )
    assert answer.status_code == 422
    assert answer.json()["error"] == "RecordInvalid" and "uploads" in answer.json()["details"]
    assert desk.tickets() == []


# --- People ------------------------------------------------------------------------------


def test_the_requester_and_two_ccs_are_on_the_record(desk, zendesk):
    zendesk().create_ticket(RICH, "key-1", "evt-1")

    record = only_ticket(desk)
    assert record["people"] == {"requester": "alice@customer.test", "cc": ["bob@customer.test", "carol@customer.test"]}
    assert {p["email"]: (p["name"], p["role"]) for p in desk.people()} == {
        "alice@customer.test": ("Alice Example", "end-user"),
        "bob@customer.test": ("bob", "end-user"),
        "carol@customer.test": ("carol", "end-user"),
    }


def test_a_customers_reply_is_a_public_comment_by_that_customer(desk, zendesk):
    ticket = zendesk().create_ticket(RICH, "key-1", "evt-1")

    zendesk().add_comment(
        ticket.ticket_id, CommentRequest(body="Still burning.", author_email="alice@customer.test"), "key-c1", "evt-2"
    )
    # Someone Zendesk does not know yet: made an end user, then the author.
    newcomer = CommentRequest(body="Me too.", author_email="Dave <dave@customer.test>", author_name="Dave Doe")
    adapter = zendesk()
    adapter.add_comment(ticket.ticket_id, newcomer, "key-c2", "evt-3")
    adapter.add_comment(ticket.ticket_id, newcomer, "key-c2", "evt-3")  # a retry: same author, same body

    record = only_ticket(desk)
    assert kit.comment_records_of(record) == [
        {"body": "Still burning.", "public": True, "author": "alice@customer.test"},
        {"body": "Me too.", "public": True, "author": "dave@customer.test"},
    ]
    assert ("dave@customer.test", "Dave Doe", "end-user") in [(p["email"], p["name"], p["role"]) for p in desk.people()]
    assert len(writes(desk, "/users/")) == 1
    assert [e["idempotency_lookup"] for e in writes(desk, "/tickets/")] == ["miss", "miss", "hit"]


def test_a_reply_with_files_and_html_carries_them_on_its_comment(desk, zendesk):
    ticket = zendesk().create_ticket(
        TicketRequest(subject="s", description="d", requester="alice@customer.test"), "key-1", "evt-1"
    )
    reply = CommentRequest(
        body="Here is the screenshot." + LISTING,
        author_email="alice@customer.test",
        html='<p>Here: <img src="cid:shot@mail"></p>',
        files=FILES[2:],
        cc=("erin@customer.test",),
    )
    zendesk().add_comment(ticket.ticket_id, reply, "key-c1", "evt-2")

    record = only_ticket(desk)
    [attachment] = record["attachments"]
    assert (attachment["sha256"], attachment["inline"]) == (FILES[2].sha256, True)
    assert attachment["comment_id"] == record["comments"][1]["id"]
    assert record["people"]["cc"] == ["erin@customer.test"]
    assert "<li>screenshot.png (22 bytes, shown inline)</li>" in record["comments"][1]["body"]


def test_an_agents_mail_is_a_private_note_by_that_agent(desk, zendesk):
    ticket = zendesk().create_ticket(RICH, "key-1", "evt-1")
    add_agent(desk, "smith@tenant.test")

    note = CommentRequest(
        body="Called the customer.",
        author_email="smith@tenant.test",
        public=False,
        from_agent=True,
        cc=("bob@customer.test",),
    )
    zendesk().add_comment(ticket.ticket_id, note, "key-c1", "evt-2")
    # An agent Zendesk does not know: still private, written as the API user, and nobody is made.
    stranger = CommentRequest(
        body="Forwarded to billing.", author_email="jones@tenant.test", public=False, from_agent=True
    )
    zendesk().add_comment(ticket.ticket_id, stranger, "key-c2", "evt-3")

    assert kit.comment_records_of(only_ticket(desk)) == [
        {"body": "Called the customer.", "public": False, "author": "smith@tenant.test"},
        {"body": "Forwarded to billing.", "public": False, "author": ""},
    ]
    assert "jones@tenant.test" not in [p["email"] for p in desk.people()]


def test_a_lost_answer_to_the_user_upsert_is_retried(desk, zendesk):
    ticket = zendesk().create_ticket(RICH, "key-1", "evt-1")
    desk.set_plan(["drop_after_commit"])
    adapter = zendesk()
    newcomer = CommentRequest(body="Hello.", author_email="dave@customer.test")
    with pytest.raises(TransientError):
        adapter.add_comment(ticket.ticket_id, newcomer, "key-c1", "evt-2")

    adapter.add_comment(ticket.ticket_id, newcomer, "key-c1", "evt-2")

    assert kit.comment_records_of(only_ticket(desk))[0]["author"] == "dave@customer.test"
    assert [p["email"] for p in desk.people()].count("dave@customer.test") == 1


def test_a_role_that_may_not_make_users_leaves_the_reply_to_the_api_user_with_a_from_line(desk, zendesk):
    ticket = zendesk().create_ticket(RICH, "key-1", "evt-1")
    desk.on_request(
        lambda request: (
            (403, {"error": "Forbidden", "description": "You do not have access"})
            if "create_or_update" in request.path
            else None
        )
    )

    zendesk().add_comment(
        ticket.ticket_id,
        CommentRequest(body="Hello.", author_email="dave@customer.test", author_name="Dave Doe"),
        "key-c1",
        "evt-2",
    )

    assert kit.comment_records_of(only_ticket(desk)) == [
        {"body": "From: Dave Doe <dave@customer.test>\n\nHello.", "public": True, "author": ""}
    ]


# --- Closed tickets and follow-ups -------------------------------------------------------


def test_an_update_to_a_closed_ticket_is_ticket_closed(desk, zendesk):
    ticket = zendesk().create_ticket(RICH, "key-1", "evt-1")
    desk.close(int(ticket.ticket_id))

    with pytest.raises(TicketClosed) as caught:
        zendesk().add_comment(
            ticket.ticket_id, CommentRequest(body="Hello?", author_email="alice@customer.test"), "key-c1", "evt-2"
        )

    assert caught.value.reason == "ticket_closed"
    assert kit.comment_records_of(only_ticket(desk)) == []


def test_the_desk_answers_a_closed_ticket_as_zendesk_does(desk, zendesk):
    ticket = zendesk().create_ticket(RICH, "key-1", "evt-1")
    desk.close(int(ticket.ticket_id))
    answer = requests.put(
        f"{desk.url}/api/v2/tickets/{ticket.ticket_id}.json",
        auth=desk.auth,
        timeout=5,
        json={"ticket": {"comment": {"body": "x"}}},
    )
    assert answer.status_code == 422
    assert answer.json() == {
        "error": "RecordInvalid",
        "description": "Record validation errors",
        "details": {"status": [{"description": "Status: closed prevents ticket update"}]},
    }


def test_a_follow_up_names_the_closed_ticket(desk, zendesk):
    closed = zendesk().create_ticket(RICH, "key-1", "evt-1")
    desk.close(int(closed.ticket_id))
    follow_up = TicketRequest(
        subject="Re: Printer on fire",
        description="It is back.",
        requester="alice@customer.test",
        follow_up_of=closed.ticket_id,
    )

    result = zendesk().create_ticket(follow_up, "key-2", "evt-2")

    first, second = desk.tickets()
    assert str(second["id"]) == result.ticket_id
    assert second["fields"]["via_followup_source_id"] == int(closed.ticket_id)
    assert (kit.follow_up_of(second), kit.follow_up_of(first)) == (closed.ticket_id, None)


# --- Zendesk's own references --------------------------------------------------------------


def find_reference(adapter, *, subject: str = "", body: str = "") -> str | None:
    texts = {"subject": subject, "body": body}
    for field in adapter.reference_fields:
        for pattern in adapter.reference_patterns:
            match = pattern.search(texts[field])
            if match:
                return match.group("ref")
    return None


def test_a_reply_to_zendesks_notification_names_its_ticket(desk, zendesk):
    adapter = zendesk()
    ticket = adapter.create_ticket(RICH, "key-1", "evt-1")
    record = only_ticket(desk)

    ref = find_reference(adapter, subject=f"Re: [Support] {kit.desk_reference(record)}: {record['subject']}")
    assert ref == ticket.ticket_id
    assert adapter.resolve_reference(ref) == ticket.ticket_id
    # The standard triggers' text, quoted in a reply.
    assert find_reference(adapter, body=f"Your request (#{ticket.ticket_id}) has been updated.") == ticket.ticket_id
    assert find_reference(adapter, body=f"Your request ({ticket.ticket_id}) has been received") == ticket.ticket_id
    # A ticket Zendesk does not have, an encoded id, and a subject without a reference.
    assert adapter.resolve_reference("999") is None
    assert find_reference(adapter, subject="Re: [Support] Printer on fire [7Q2ZZV-MYQ6]") is None
    assert find_reference(adapter, subject="Invoice 4471 charged twice") is None

"""One ticket number everywhere: the acknowledgment's `[#MR-n]` is the number the console lists and finds.

The ids of tickets and of mappings are shifted apart first, as a real database shifts them (comments take
mapping ids, failed and deleted rows leave gaps), so a number taken from the wrong table would show.
"""

import re

import pytest
from django.test import Client

from intake.models import InboxEvent
from tests.conftest import WEBHOOK_SECRET
from tests.factories import ingest_message
from tests.mail import make_message, webhook_headers
from tests.senderauth import stamped, trust_our_mta
from tests.smtp import smtp_server  # noqa: F401  (fixture)
from tests.support.api import api
from tests.support.users import make_user
from ticketing import acknowledgments, numbers
from ticketing.models import Intent, Ticket, TicketComment, TicketMapping
from ticketing.services import process_inbox_event

pytestmark = pytest.mark.usefixtures("scanner_off")
TOKEN = re.compile(r"\[#(MR-\d+)\]")


@pytest.fixture(autouse=True)
def _our_mta_is_trusted(mailbox):
    trust_our_mta(mailbox)


@pytest.fixture
def operator_client(tenant):
    client = Client()
    # An operator who may also read the built-in desk's tickets and mappings (no role grants that by default:
    # a ticket holds the customer's text).
    client.force_login(
        make_user(
            "oper",
            groups=["operator"],
            tenants=[tenant],
            perms=["ticketing.view_ticket", "ticketing.view_ticketmapping"],
        )
    )
    return client


def post(subject: str, sender: str, message_id: str, in_reply_to: str = "") -> int:
    extra = {"In-Reply-To": in_reply_to, "References": in_reply_to} if in_reply_to else None
    body = stamped(make_message(subject=subject, sender=sender, message_id=message_id, extra_headers=extra))
    response = Client().post(
        "/webhooks/raw/support/", data=body, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, body)
    )
    assert response.status_code == 202, response.content
    return response.json()["inbox_event_id"]


def acknowledge(event_id: int) -> None:
    intent = Intent.objects.get(inbox_event_id=event_id, action=Intent.Action.NOTIFY_REQUESTER)
    assert acknowledgments.send(intent.pk, "worker") == "sent"


def shift_the_ids(mailbox) -> None:
    """Comments, a deleted mapping and a ticket made and removed outside the pipeline: the two id
    sequences drift apart, as they do in a database that has lived a while."""
    root = post("Printer on fire", "jane@example.com", "<shift-root@example.com>")
    assert process_inbox_event(root) == "created"
    for n in range(3):  # each comment takes a mapping id and no ticket id
        reply = post(
            "Re: Printer on fire",
            "jane@example.com",
            f"<shift-reply-{n}@example.com>",
            in_reply_to="<shift-root@example.com>",
        )
        assert process_inbox_event(reply) == "created"  # the comment
    doomed = ingest_message(mailbox, subject="restored from backup").inbox_event_id
    assert process_inbox_event(doomed) == "created"
    TicketMapping.objects.filter(inbox_event_id=doomed).delete()  # a mapping lost to a restore
    orphan = Ticket.objects.create(
        destination=Ticket.objects.first().destination,
        idempotency_key="shift-gap",
        external_ref="shift-gap",
        created_at=Ticket.objects.first().created_at,
    )
    TicketComment.objects.filter(ticket=orphan).delete()
    Ticket.objects.filter(pk=orphan.pk).delete()


def test_twenty_acknowledgments_name_the_numbers_the_console_shows_and_finds(mailbox, smtp_server, operator_client):
    shift_the_ids(mailbox)
    assert TicketMapping.objects.order_by("-pk").first().pk != Ticket.objects.order_by("-pk").first().pk
    before = len(smtp_server.messages)
    events = []
    for n in range(20):
        event_id = post(f"Request {n}: desk lamp flickers", f"customer{n}@example.com", f"<req-{n}@example.com>")
        assert process_inbox_event(event_id) == "created"
        acknowledge(event_id)
        events.append(event_id)
    acks = smtp_server.messages[before:]
    assert len(acks) == 20
    shifted = 0
    for event_id, ack in zip(events, acks, strict=True):
        token = TOKEN.search(ack["Subject"]).group(1)
        mapping = TicketMapping.objects.get(inbox_event_id=event_id, action=Intent.Action.CREATE_TICKET)
        ticket = Ticket.objects.get(pk=int(mapping.ticket_id))
        shifted += ticket.pk != mapping.pk
        assert f"opened ticket {token}." in ack.get_content()
        assert str(ticket) == token  # the ticket's name, as every console page prints it
        # The ticket list: searching the token finds exactly that ticket, listed under that number.
        page = operator_client.get("/admin/ticketing/ticket/", {"q": token}).content.decode()
        assert page.count('class="field-number"') == 1, token
        assert f">{token}<" in page and ticket.subject in page
        # The ticket's own page, and the event's detail in the queue view, say the same number.
        assert token in operator_client.get(f"/admin/ticketing/ticket/{ticket.pk}/change/").content.decode()
        detail = operator_client.get(f"/admin/reconciliation/recoveryitem/{event_id}/change/").content.decode()
        assert f'<strong class="ticket-number">{token}</strong>' in detail
        # The mapping list finds it by number too, and the API names it.
        mappings = operator_client.get("/admin/ticketing/ticketmapping/", {"q": token.lower()}).content.decode()
        assert mappings.count('class="field-number"') == 1 and f">{token}<" in mappings
    assert shifted == 20  # every ticket's own id differs from its number: the test would catch a mix-up


def test_a_reply_with_the_number_threads_onto_that_ticket(mailbox, smtp_server):
    shift_the_ids(mailbox)
    event_id = post("Laptop will not boot", "sam@example.com", "<boot@example.com>")
    assert process_inbox_event(event_id) == "created"
    acknowledge(event_id)
    token = TOKEN.search(smtp_server.messages[-1]["Subject"]).group(1)
    reply = post(f"Re: [#{token}] Laptop will not boot", "sam@example.com", "<boot-2@example.com>")
    assert process_inbox_event(reply) == "created"  # the comment
    ticket = Ticket.objects.get(pk=int(TicketMapping.objects.get(inbox_event_id=event_id).ticket_id))
    assert ticket.comments.count() == 1 and str(ticket) == token


def test_comments_and_the_api_carry_their_tickets_number(mailbox, tenant):
    root = post("Printer on fire", "jane@example.com", "<api-root@example.com>")
    assert process_inbox_event(root) == "created"
    reply = post(
        "Re: Printer on fire", "jane@example.com", "<api-reply@example.com>", in_reply_to="<api-root@example.com>"
    )
    assert process_inbox_event(reply) == "created"  # the comment
    created = TicketMapping.objects.get(inbox_event_id=root)
    comment = TicketMapping.objects.get(inbox_event_id=reply)
    assert comment.pk != created.pk and numbers.number_of(comment) == created.pk
    user = make_user("reader", groups=["operator"], tenants=[tenant], perms=["ticketing.view_ticketmapping"])
    rows = api(user).get("/api/v1/mappings/").json()["results"]
    assert {r["inbox_event"]: r["ticket_number"] for r in rows} == {root: f"MR-{created.pk}", reply: f"MR-{created.pk}"}
    assert InboxEvent.objects.get(pk=reply).state == "completed"


@pytest.mark.parametrize(
    "typed,number",
    [
        ("MR-12", 12),
        ("mr-12", 12),
        (" #MR-12 ", 12),
        ("[#MR-12]", 12),
        ("[# mr - 12 ]", 12),
        ("MR-", None),
        ("12", None),
        ("MR-12 printer", None),
        ("JIRA-12", None),
        ("", None),
    ],
)
def test_what_a_person_types_as_a_number(typed, number):
    assert numbers.parse_number(typed) == number


def test_a_ticket_linked_to_a_second_event_keeps_one_number_and_both_tokens_find_it(
    mailbox, smtp_server, operator_client, tenant
):
    """An operator confirms a customer's second email onto the ticket of the first: the ticket keeps its
    number, the second event names that number, and a token for either create mapping finds the ticket."""
    from reconciliation import services as console
    from reconciliation.services import ActionRefused as ReplayRefused

    shift_the_ids(mailbox)
    first = post("Printer on fire again", "jane@example.com", "<dup-1@example.com>")
    assert process_inbox_event(first) == "created"
    acknowledge(first)
    token = TOKEN.search(smtp_server.messages[-1]["Subject"]).group(1)
    ticket = Ticket.objects.get(pk=int(TicketMapping.objects.get(inbox_event_id=first).ticket_id))
    assert ticket.number != ticket.pk
    second = ingest_message(mailbox, subject="Printer STILL on fire").inbox_event_id
    InboxEvent.objects.filter(pk=second).update(state="failed", reason_code="credentials")
    operator = make_user("confirmer", groups=["operator"], tenants=[tenant])
    # Bare digits that are another ticket's number are refused: "12" must not link ticket 12 for MR-12.
    with pytest.raises(ReplayRefused, match="numbered"):
        console.do_confirm_existing_ticket(operator, second, ticket_id=str(ticket.pk))
    with pytest.raises(ReplayRefused, match="has no ticket MR-999999"):
        console.do_confirm_existing_ticket(operator, second, ticket_id="MR-999999")
    console.do_confirm_existing_ticket(operator, second, ticket_id=token.lower())
    linked = TicketMapping.objects.get(inbox_event_id=second)
    assert linked.ticket_id == str(ticket.pk) and linked.pk != int(token[3:])
    assert numbers.number_of(linked) == int(token[3:]) and str(ticket) == token
    for typed in (token, f"MR-{linked.pk}"):  # the ticket's number, and the one a token of the link would name
        page = operator_client.get("/admin/ticketing/ticket/", {"q": typed}).content.decode()
        assert page.count('class="field-number"') == 1 and f">{token}<" in page, typed
    # The queue's search finds the ticket's events by its number (here the confirmed one, now completed).
    assert set(console_search(token)) == {first, second}


def console_search(term: str) -> list[int]:
    from reconciliation.selectors import search_queue

    return list(search_queue(InboxEvent.objects.all(), term).values_list("pk", flat=True))

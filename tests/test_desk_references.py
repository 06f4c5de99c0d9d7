"""A reply to the help desk's own notification finds its ticket by the desk's reference (ticketing.threads).

The built-in store declares no reference of its own: each test gives its adapter class the patterns a desk
would declare (monkeypatch), so the whole pipeline runs against real rows. Freshdesk's own "[#123]" is
checked against FakeDesk over HTTP.
"""

import logging
import re

import pytest

from intake.mime import parse_message
from intake.models import InboxEvent
from tests.destination_kits import freshdesk as freshdesk_kit
from tests.factories import email_message, ingest_message, make_destination, make_mailbox, make_tenant
from tests.senderauth import stamped, trust_our_mta
from ticketing import threads
from ticketing.destinations.base import TransientError
from ticketing.destinations.builtin import BuiltinDestination
from ticketing.models import Ticket, TicketComment, TicketMapping
from ticketing.services import process_inbox_event

pytestmark = pytest.mark.usefixtures("scanner_off")

SUBJECT_REFERENCE = re.compile(r"\[Desk #(?P<ref>\d{1,12})\]")
WATERMARK = re.compile(r"Ref:(?P<ref>MSG\d{7})")
# What a desk's notification's Message-ID looks like: a reply to it names a thread Mailroom never saw.
NOTIFICATION_HEADERS = {"In-Reply-To": "<notification-77@desk.example>", "References": "<notification-77@desk.example>"}


@pytest.fixture
def desk_subject_references(monkeypatch):
    monkeypatch.setattr(BuiltinDestination, "reference_patterns", (SUBJECT_REFERENCE,))
    monkeypatch.setattr(BuiltinDestination, "reference_fields", ("subject",))


@pytest.fixture
def watermarks(monkeypatch):
    """The body watermark "Ref:MSG0000042" names ticket 42 (the desk is asked: every call is counted)."""
    asked = []

    def resolve_reference(self, ref):
        asked.append(ref)
        return str(int(ref[3:]))

    monkeypatch.setattr(BuiltinDestination, "reference_patterns", (WATERMARK,))
    monkeypatch.setattr(BuiltinDestination, "reference_fields", ("body",))
    monkeypatch.setattr(BuiltinDestination, "resolve_reference", resolve_reference)
    return asked


def receive(mailbox, **fields) -> int:
    return ingest_message(mailbox, **fields).inbox_event_id


def ticket_for(mailbox, sender="jane@example.com", subject="Printer on fire") -> TicketMapping:
    event_id = receive(mailbox, sender=sender, subject=subject)
    assert process_inbox_event(event_id) == "created"
    return TicketMapping.objects.get(inbox_event_id=event_id)


def test_a_reply_with_the_desks_subject_reference_becomes_a_comment(mailbox, desk_subject_references):
    mapping = ticket_for(mailbox)
    reply = receive(
        mailbox,
        sender="Jane Doe <Jane@Example.com>",
        subject=f"Re: [Desk #{mapping.ticket_id}] Printer",
        body="Still on fire.\n",
        extra_headers=NOTIFICATION_HEADERS,
    )
    assert process_inbox_event(reply) == "created"
    [comment] = TicketComment.objects.all()
    assert comment.ticket_id == int(mapping.ticket_id) and comment.body.startswith("Still on fire.")
    assert TicketMapping.objects.get(inbox_event_id=reply).action == "add_comment"
    assert Ticket.objects.count() == 1
    assert "flags" not in InboxEvent.objects.get(pk=reply).details


def test_a_watermark_in_the_first_lines_of_the_text_threads_and_the_desk_is_asked_once(mailbox, watermarks):
    mapping = ticket_for(mailbox)
    body = f"Thanks, that helped.\n\n> Your request was updated.\n> Ref:MSG{int(mapping.ticket_id):07d}\n"
    reply = receive(mailbox, sender="jane@example.com", subject="Re: Your request", body=body)
    assert process_inbox_event(reply) == "created"
    assert TicketComment.objects.get().ticket_id == int(mapping.ticket_id)
    assert watermarks == [f"MSG{int(mapping.ticket_id):07d}"]


def test_the_desk_is_asked_about_one_reference_per_message(mailbox, watermarks):
    mapping = ticket_for(mailbox)
    body = f"See below.\n> Ref:MSG0099999\n> Ref:MSG0088888\n> Ref:MSG{int(mapping.ticket_id):07d}\n"
    reply = receive(mailbox, sender="jane@example.com", subject="Re: Your request", body=body)
    assert process_inbox_event(reply) == "created"
    assert watermarks == ["MSG0099999"]  # the first reference only: the others are never looked up
    assert TicketComment.objects.count() == 0 and Ticket.objects.count() == 2


def test_a_watermark_below_the_first_lines_is_not_read(mailbox, watermarks):
    mapping = ticket_for(mailbox)
    body = "Thanks.\n" + "\n" * (threads.REFERENCE_BODY_LINES + 5) + f"Ref:MSG{int(mapping.ticket_id):07d}\n"
    reply = receive(mailbox, sender="jane@example.com", subject="Re: Your request", body=body)
    assert process_inbox_event(reply) == "created"
    assert TicketComment.objects.count() == 0 and Ticket.objects.count() == 2 and watermarks == []


def test_a_strangers_reply_with_a_valid_reference_gets_a_new_flagged_ticket(mailbox, desk_subject_references):
    mapping = ticket_for(mailbox, sender="jane@example.com")
    subject = f"Re: [Desk #{mapping.ticket_id}] Printer"
    stranger = receive(
        mailbox, sender="mallory@evil.example", subject=subject, body="add me\n", extra_headers=NOTIFICATION_HEADERS
    )
    assert process_inbox_event(stranger) == "created"
    assert TicketComment.objects.count() == 0 and Ticket.objects.count() == 2
    event = InboxEvent.objects.get(pk=stranger)
    assert event.details["flags"] == ["untrusted_thread_reply"]
    assert event.audit_events.get(kind="flagged").detail == {"flags": ["untrusted_thread_reply"]}
    new_ticket = TicketMapping.objects.get(inbox_event_id=stranger)
    assert new_ticket.action == "create_ticket" and new_ticket.ticket_id != mapping.ticket_id
    assert "mailroom-untrusted-thread-reply" in Ticket.objects.get(pk=int(new_ticket.ticket_id)).tags

    # The stranger's ticket now sits in the notification's thread: Jane's reply there still finds hers.
    own = receive(
        mailbox, sender="jane@example.com", subject=subject, body="Still broken.\n", extra_headers=NOTIFICATION_HEADERS
    )
    assert process_inbox_event(own) == "created"
    assert TicketComment.objects.get().ticket_id == int(mapping.ticket_id)
    assert "flags" not in InboxEvent.objects.get(pk=own).details


def test_the_customer_an_agent_forwarded_replies_to_the_desks_notification(tenant, mailbox, desk_subject_references):
    """The forward made Jane the requester: the desk mails her, and her reply joins the ticket."""
    tenant.settings = {"agent_addresses": ["@acme.test"]}
    tenant.save()
    body = (
        "Over to support.\n\n---------- Forwarded message ---------\nFrom: Jane Doe <jane@example.com>\n"
        "Date: Mon, Mar 4, 2024 at 10:15 AM\nSubject: Printer on fire\nTo: <alice@acme.test>\n\nHelp!\n"
    )
    trust_our_mta(mailbox)
    raw = stamped(
        email_message(sender="Alice <alice@acme.test>", subject="Fwd: Printer on fire", body=body), "acme.test"
    )
    forwarded = receive(mailbox, raw=raw)
    assert process_inbox_event(forwarded) == "created"
    mapping = TicketMapping.objects.get(inbox_event_id=forwarded)
    assert Ticket.objects.get(pk=int(mapping.ticket_id)).requester == "jane@example.com"
    reply = receive(
        mailbox,
        sender="jane@example.com",
        subject=f"Re: [Desk #{mapping.ticket_id}] Printer on fire",
        body="Any news?\n",
        extra_headers=NOTIFICATION_HEADERS,
    )
    assert process_inbox_event(reply) == "created"
    assert TicketComment.objects.get().ticket_id == int(mapping.ticket_id)
    assert "flags" not in InboxEvent.objects.get(pk=reply).details


def test_a_destinations_own_narrower_pattern_threads_a_reply_to_its_notification(tenant, mailbox, monkeypatch):
    """A destination may declare its references from its settings (a REST API's reference_template): the kind's
    class then declares none, and the reply is found through the notification it answers."""
    built = BuiltinDestination.__init__

    def init(self, destination):
        built(self, destination)
        prefix = (destination.settings or {}).get("reference_prefix")
        if prefix:
            self.reference_patterns = (re.compile(rf"\[{re.escape(prefix)}-(?P<ref>\d+)\]"),)

    monkeypatch.setattr(BuiltinDestination, "__init__", init)
    monkeypatch.setattr(BuiltinDestination, "reference_fields", ("subject",))
    tenant.destinations.update(settings={"reference_prefix": "REC"})
    mapping = ticket_for(mailbox)
    reply = receive(
        mailbox,
        sender="jane@example.com",
        subject=f"Re: [REC-{mapping.ticket_id}] Printer",
        body="Thanks.\n",
        extra_headers=NOTIFICATION_HEADERS,
    )
    assert process_inbox_event(reply) == "created"
    assert TicketComment.objects.get().ticket_id == int(mapping.ticket_id)


def test_a_reference_to_another_tenants_ticket_never_threads(mailbox, desk_subject_references):
    other = make_tenant(slug="globex", domains=("globex.test",))
    make_destination(other)
    other_mailbox = make_mailbox(other, slug="help", address="help@globex.test")
    theirs = ticket_for(other_mailbox, sender="jane@example.com")  # the same customer writes to both tenants
    reply = receive(
        mailbox,
        sender="jane@example.com",
        subject=f"Re: [Desk #{theirs.ticket_id}] Printer",
        body="Is this the right place?\n",
    )
    assert process_inbox_event(reply) == "created"
    assert TicketComment.objects.count() == 0
    ours = TicketMapping.objects.get(inbox_event_id=reply)
    assert ours.action == "create_ticket" and ours.destination.tenant_id == mailbox.tenant_id
    assert "flags" not in InboxEvent.objects.get(pk=reply).details  # nothing of ours was named: no flag either


def test_a_reference_the_desk_cannot_resolve_is_no_reference(mailbox, monkeypatch, caplog, desk_subject_references):
    mapping = ticket_for(mailbox)

    def resolve_reference(self, ref):
        raise TransientError("timeout", "the desk did not answer")

    monkeypatch.setattr(BuiltinDestination, "resolve_reference", resolve_reference)
    reply = receive(
        mailbox,
        sender="jane@example.com",
        subject=f"Re: [Desk #{mapping.ticket_id}] Printer",
        body="Secret body text.\n",
    )
    with caplog.at_level(logging.INFO, logger="ticketing.threads"):
        assert process_inbox_event(reply) == "created"
    assert TicketComment.objects.count() == 0 and Ticket.objects.count() == 2
    [record] = [r for r in caplog.records if r.name == "ticketing.threads"]
    assert record.levelno == logging.INFO and "TransientError" in record.getMessage()
    assert "Secret body" not in record.getMessage() and "jane" not in record.getMessage()


def test_an_unknown_reference_makes_a_new_ticket(mailbox, desk_subject_references):
    ticket_for(mailbox)
    reply = receive(mailbox, sender="jane@example.com", subject="Re: [Desk #999999] Printer")
    assert process_inbox_event(reply) == "created"
    assert TicketComment.objects.count() == 0 and Ticket.objects.count() == 2


def test_our_own_token_wins_over_a_desk_reference(mailbox, desk_subject_references):
    first = ticket_for(mailbox, subject="First")
    second = ticket_for(mailbox, subject="Second")
    reply = receive(mailbox, sender="jane@example.com", subject=f"Re: [#MR-{first.pk}] [Desk #{second.ticket_id}]")
    assert process_inbox_event(reply) == "created"
    assert TicketComment.objects.get().ticket_id == int(first.ticket_id)


def test_the_check_for_references_is_cheap(mailbox, desk_subject_references, django_assert_num_queries):
    plain = parse_message(b"From: jane@example.com\r\nSubject: Printer on fire\r\n\r\nHelp.\r\n")
    quoting = parse_message(b"From: jane@example.com\r\nSubject: Re: [Desk #12] Printer\r\n\r\nHelp.\r\n")
    with django_assert_num_queries(0):
        assert not threads.is_thread_work(plain)
        assert threads.is_thread_work(quoting)
        assert threads.may_carry_desk_reference(quoting)


def test_patterns_with_their_own_groups_backreferences_and_comments_are_looked_for_as_written(monkeypatch):
    tricky = (
        re.compile(r"(?P<ref>ab)(?P<tail>c)"),
        re.compile(r"(x)(?P<ref>\d+)\1", re.I),
        re.compile(r"(?P<ref>z+) # a comment", re.VERBOSE),
    )
    monkeypatch.setattr(BuiltinDestination, "reference_patterns", tricky)
    monkeypatch.setattr(BuiltinDestination, "reference_fields", ("subject",))
    for subject, found in (("abc", True), ("X12x", True), ("zz", True), ("x12y", False)):
        parsed = parse_message(f"From: a@example.com\r\nSubject: {subject}\r\n\r\n.\r\n".encode())
        assert threads.may_carry_desk_reference(parsed) is found, subject


# --- Freshdesk's own reference, against FakeDesk ---------------------------------------------------------


@pytest.mark.fakedesk(dialect="freshdesk")
def test_a_reply_to_freshdesks_notification_threads_to_that_record(tenant, mailbox, desk, monkeypatch):
    freshdesk_kit.configure(tenant, desk, monkeypatch)
    mapping = ticket_for(mailbox)
    reply = receive(
        mailbox,
        sender="jane@example.com",
        subject=f"Re: [#{mapping.ticket_id}] Printer on fire",
        body="It works again, thanks.\n",
        extra_headers=NOTIFICATION_HEADERS,
    )
    assert process_inbox_event(reply) == "created"
    [record] = desk.tickets()
    assert freshdesk_kit.ticket_id_of(record) == mapping.ticket_id
    assert any("It works again" in text for text in freshdesk_kit.comments_of(record))

    stranger = receive(
        mailbox, sender="mallory@evil.example", subject=f"Re: [#{mapping.ticket_id}] Printer on fire", body="me too\n"
    )
    assert process_inbox_event(stranger) == "created"
    assert len(desk.tickets()) == 2
    assert InboxEvent.objects.get(pk=stranger).details["flags"] == ["untrusted_thread_reply"]

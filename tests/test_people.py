"""People: who a ticket is for, who is copied, and whether mail comes from one of the tenant's agents."""

from email.message import EmailMessage

import pytest

from intake import validation
from intake.mime import parse_message
from intake.models import InboxEvent
from tests.destination_kits import zendesk as zendesk_kit
from tests.factories import email_message, make_desk_destination, make_event, make_mailbox, make_tenant
from tests.senderauth import TRUSTED_AUTHSERV_ID, stamped, trust_our_mta
from ticketing.people import Requester, comment_kind, copied, is_agent, requester
from ticketing.services import process_inbox_event

AGENTS = ["alice@acme.test", "@agents.acme.test"]
GMAIL_FORWARD = """Could you take this one?

---------- Forwarded message ---------
From: Jane Doe <jane@example.com>
Date: Mon, Mar 4, 2024 at 10:15 AM
Subject: Printer on fire
To: <alice@acme.test>


The printer is on fire.
"""


@pytest.fixture
def agents(tenant):
    tenant.settings = {"agent_addresses": AGENTS}
    tenant.save()
    return tenant


def received(mailbox, raw: bytes, *, authenticated: str = ""):
    """The stored event and its parsed message, as the pipeline has them. `authenticated`: the From domain our
    MTA authenticated (its Authentication-Results on top, kept on the event as normalization keeps them)."""
    if authenticated:
        trust_our_mta(mailbox)
        raw = stamped(raw, authenticated)
    event = make_event(mailbox, raw)
    parsed = parse_message(bytes(event.raw))
    if authenticated:
        event.auth_results = validation.authentication_results(parsed, TRUSTED_AUTHSERV_ID)
        event.sender = parsed.sender
        event.save(update_fields=["auth_results", "sender"])
    return event, parsed


def test_agents_by_address_and_by_domain(agents):
    assert is_agent(agents, "alice@acme.test")
    assert is_agent(agents, "Alice+Desk@ACME.test")  # case and +tag do not matter
    assert is_agent(agents, "carol@agents.acme.test")
    assert is_agent(agents, "carol@AGENTS.acme.test.")
    assert not is_agent(agents, "bob@acme.test")  # same domain, not listed
    assert not is_agent(agents, "alice@acme.test.evil.example")
    assert not is_agent(agents, "carol@eu.agents.acme.test")  # a domain is that domain, not its subdomains
    assert not is_agent(agents, "")
    assert not is_agent(agents, "alice")


@pytest.mark.parametrize("value", [None, 7, {"alice@acme.test": True}, [None, 3, ""], "", []])
def test_a_malformed_agents_setting_names_no_agent(db, value):
    tenant = make_tenant(settings={"agent_addresses": value})
    assert not is_agent(tenant, "alice@acme.test")


def test_a_single_address_instead_of_a_list_is_one_agent(db):
    assert is_agent(make_tenant(settings={"agent_addresses": "alice@acme.test"}), "alice@acme.test")


def test_a_customers_mail_is_for_its_sender(agents, mailbox):
    event, parsed = received(mailbox, email_message(sender="Jane Doe <jane@example.com>"))
    assert requester(event, parsed) == Requester("jane@example.com", "Jane Doe")


def test_an_agents_forward_is_for_the_original_sender(agents, mailbox):
    raw = email_message(sender="Alice Agent <alice@acme.test>", subject="Fwd: Printer on fire", body=GMAIL_FORWARD)
    event, parsed = received(mailbox, raw, authenticated="acme.test")
    assert requester(event, parsed) == Requester("jane@example.com", "Jane Doe", forwarded_by="alice@acme.test")


def test_an_agents_forward_no_trusted_result_authenticates_keeps_its_sender(agents, mailbox):
    """Anyone can write an agent's From: the requester changes only on our MTA's word for it."""
    raw = email_message(sender="Alice Agent <alice@acme.test>", subject="Fwd: Printer on fire", body=GMAIL_FORWARD)
    event, parsed = received(mailbox, raw)
    assert requester(event, parsed) == Requester("alice@acme.test", "Alice Agent")


def test_an_agents_forward_as_attachment_is_for_the_original_sender(agents, mailbox):
    inner = EmailMessage()
    inner["From"], inner["To"], inner["Subject"] = "Jane Doe <jane@example.com>", "carol@agents.acme.test", "Help"
    inner.set_content("The printer is on fire.\n")
    outer = EmailMessage()
    outer["From"], outer["To"], outer["Subject"] = "carol@agents.acme.test", "support@acme.test", "FW: Help"
    outer.set_content("\n")
    outer.add_attachment(inner)
    event, parsed = received(mailbox, outer.as_bytes(), authenticated="agents.acme.test")
    assert requester(event, parsed) == Requester("jane@example.com", "Jane Doe", forwarded_by="carol@agents.acme.test")


def test_anyone_elses_forward_keeps_its_sender(agents, mailbox):
    raw = email_message(sender="Bob <bob@example.org>", subject="Fwd: Printer on fire", body=GMAIL_FORWARD)
    event, parsed = received(mailbox, raw)
    assert requester(event, parsed) == Requester("bob@example.org", "Bob")


def test_a_forward_without_agents_configured_keeps_its_sender(tenant, mailbox):
    raw = email_message(sender="Alice Agent <alice@acme.test>", subject="Fwd: Printer on fire", body=GMAIL_FORWARD)
    event, parsed = received(mailbox, raw)
    assert requester(event, parsed).email == "alice@acme.test"


@pytest.mark.parametrize(
    "original",
    [
        "Carol <carol@agents.acme.test>",  # another agent's mail
        "Support <support@acme.test>",  # the tenant's own mailbox (an acknowledgment, say)
        "Sales <Sales+eu@acme.test>",  # one of its allowed recipients, by key
        "Alice <alice@acme.test>",  # the forwarder's own mail
    ],
)
def test_an_agents_forward_of_the_tenants_own_mail_keeps_the_agent(agents, mailbox, original):
    mailbox.allowed_recipients = ["sales@acme.test"]
    mailbox.save()
    body = GMAIL_FORWARD.replace("Jane Doe <jane@example.com>", original)
    raw = email_message(sender="Alice Agent <alice@acme.test>", subject="Fwd: Printer on fire", body=body)
    event, parsed = received(mailbox, raw)
    assert requester(event, parsed) == Requester("alice@acme.test", "Alice Agent")


def test_an_agents_mail_that_is_no_forward_is_for_the_agent(agents, mailbox):
    event, parsed = received(mailbox, email_message(sender="alice@acme.test", body="The office printer is on fire.\n"))
    assert requester(event, parsed) == Requester("alice@acme.test", "")


def test_copied_people_leave_out_own_addresses_the_requester_and_agents(agents, mailbox):
    make_mailbox(agents, slug="billing", address="billing@acme.test", allowed_recipients=["invoices@acme.test"])
    raw = email_message(
        sender="jane@example.com",
        to="Support <support@acme.test>, Tom <tom@example.com>",
        extra_headers={
            "Cc": "Jane@Example.com, billing+eu@acme.test, invoices@acme.test, "
            "carol@agents.acme.test, Alice+x@acme.test, tom+copy@example.com, "
            "Ann <ann@example.net>"
        },
    )
    event, parsed = received(mailbox, raw)
    assert copied(event, parsed, "jane@example.com") == ("tom@example.com", "ann@example.net")


def test_copied_people_of_another_tenant_are_not_own_addresses(agents, mailbox):
    make_mailbox(make_tenant(domains=("other.test",)), address="help@other.test")
    raw = email_message(sender="jane@example.com", to="support@acme.test", extra_headers={"Cc": "help@other.test"})
    event, parsed = received(mailbox, raw)
    assert copied(event, parsed, "jane@example.com") == ("help@other.test",)


def test_an_agents_reply_is_an_internal_note_and_a_customers_is_public(agents, mailbox):
    event, parsed = received(mailbox, email_message(sender="carol@agents.acme.test", subject="Re: Printer"))
    assert comment_kind(event, parsed) == (False, True)
    event, parsed = received(mailbox, email_message(sender="jane@example.com", subject="Re: Printer"))
    assert comment_kind(event, parsed) == (True, False)


# --- through the pipeline ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("scanner_off")
def test_an_agents_reply_that_copies_support_is_an_internal_note_on_the_customers_ticket(
    agents, mailbox, desk, monkeypatch
):
    """An agent answers the customer and copies the support address: the copy joins the customer's ticket (agents
    take part in every ticket of their tenant), as a private note, never as a public customer comment."""
    make_desk_destination(agents, desk, monkeypatch)
    root = make_event(mailbox, sender="Jane Doe <jane@example.com>", message_id="<printer@example.com>")
    assert process_inbox_event(root.pk) == "created"
    reply = make_event(
        mailbox,
        sender="Alice Agent <alice@acme.test>",
        to="jane@example.com",
        subject="Re: Printer on fire",
        body="We are sending a technician.\n",
        extra_headers={
            "Cc": "support@acme.test",
            "In-Reply-To": "<printer@example.com>",
            "References": "<printer@example.com>",
        },
    )
    assert process_inbox_event(reply.pk) == "created"
    [record] = desk.tickets()
    [comment] = zendesk_kit.comment_records_of(record)
    assert comment["body"].startswith("We are sending a technician.") and comment["public"] is False
    assert "flags" not in InboxEvent.objects.get(pk=reply.pk).details

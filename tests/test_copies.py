"""One message delivered to several mailboxes of a tenant (To support@, Cc sales@): `ticketing.copies`.

Every delivery is its own event; by default one ticket is made and the other deliveries link to it.
"""

import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from intake.models import AuditEvent, InboxEvent
from intake.services import transition_event
from reconciliation import services as console
from tests.factories import email_message, ingest_message, make_mailbox
from tests.senderauth import stamped, trust_our_mta
from tests.support.users import make_user
from ticketing.copies import LINK_COPY
from ticketing.models import Destination, Intent, RoutingPolicy, Ticket, TicketComment, TicketMapping
from ticketing.outcomes import Outcome
from ticketing.services import process_inbox_event

pytestmark = pytest.mark.usefixtures("scanner_off")


@pytest.fixture
def sales(mailbox):
    return make_mailbox(mailbox.tenant, slug="sales", address="sales@acme.test")


def deliver(mailboxes, **fields) -> list[int]:
    """The same bytes delivered to each mailbox, as the mail server fans out To and Cc (and authenticated it)."""
    raw = stamped(email_message(to="support@acme.test", extra_headers={"Cc": "sales@acme.test"}, **fields))
    for box in mailboxes:
        trust_our_mta(box)
    return [ingest_message(box, raw).inbox_event_id for box in mailboxes]


def mappings(event_id) -> list[tuple[str, str]]:
    return list(TicketMapping.objects.filter(inbox_event_id=event_id).values_list("action", "ticket_id"))


def test_one_message_to_two_mailboxes_makes_one_ticket_and_the_copy_links_to_it(client, mailbox, sales):
    primary, copy = deliver([mailbox, sales])
    assert primary != copy and InboxEvent.objects.filter(pk__in=[primary, copy]).count() == 2
    assert process_inbox_event(primary) == "created"
    assert process_inbox_event(copy) == "linked"
    assert process_inbox_event(copy) == "done"

    [ticket] = Ticket.objects.all()
    assert mappings(primary) == [("create_ticket", str(ticket.pk))]
    assert mappings(copy) == [(LINK_COPY, str(ticket.pk))]
    event = InboxEvent.objects.get(pk=copy)
    assert (event.state, event.copy_of_id, event.mailbox_id) == ("completed", primary, sales.pk)
    [linked] = AuditEvent.objects.filter(inbox_event_id=copy, kind="linked_copy")
    assert linked.detail == {
        "primary_event": primary,
        "destination": ticket.destination_id,
        "ticket_id": str(ticket.pk),
    }
    # One acknowledgment for the requester, from the primary only.
    assert Intent.objects.filter(action="notify_requester").values_list("inbox_event_id", flat=True).get() == primary

    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests-only")
    client.force_login(root)
    page = client.get(f"/admin/intake/inboxevent/{copy}/change/").content.decode()
    assert f'href="/admin/intake/inboxevent/{primary}/change/" class="message-copy">event #{primary}</a>' in page
    assert f"#{ticket.pk}</a>" in page  # the ticket it is linked to
    page = client.get(f"/admin/intake/inboxevent/{primary}/change/").content.decode()
    assert f'class="message-copy">event #{copy}</a> (sales, completed)' in page


def test_a_reply_to_both_mailboxes_adds_one_comment_and_a_later_reply_in_the_copy_thread_finds_the_ticket(
    mailbox, sales
):
    primary, copy = deliver([mailbox, sales], message_id="<root-1@customer.test>")
    assert process_inbox_event(primary) == "created" and process_inbox_event(copy) == "linked"
    [ticket] = Ticket.objects.all()
    raw = email_message(
        to="support@acme.test",
        subject="Re: Printer on fire",
        body="Still burning.\n",
        message_id="<reply-1@customer.test>",
        extra_headers={
            "Cc": "sales@acme.test",
            "In-Reply-To": "<root-1@customer.test>",
            "References": "<root-1@customer.test>",
        },
    )
    first, second = (ingest_message(box, raw).inbox_event_id for box in (sales, mailbox))
    assert process_inbox_event(first) == "created"  # the comment, on the ticket the sales copy links to
    assert process_inbox_event(second) == "linked"
    assert TicketComment.objects.filter(ticket=ticket).count() == 1
    assert Ticket.objects.count() == 1
    assert mappings(second) == [(LINK_COPY, str(ticket.pk))]


def test_with_one_ticket_per_mailbox_each_delivery_makes_its_own_ticket(mailbox, sales):
    RoutingPolicy.objects.filter(tenant=mailbox.tenant).update(one_ticket_per_message=False)
    primary, copy = deliver([mailbox, sales])
    assert process_inbox_event(primary) == "created"
    assert process_inbox_event(copy) == "created"
    assert Ticket.objects.count() == 2
    assert not TicketMapping.objects.filter(action=LINK_COPY).exists()
    assert InboxEvent.objects.get(pk=copy).copy_of_id is None


def test_a_copy_of_an_event_in_review_goes_to_review_and_links_once_the_primary_is_settled(mailbox, sales):
    tenant = mailbox.tenant
    builtin = Destination.objects.get(tenant=tenant, slug="builtin")
    Destination.objects.filter(tenant=tenant).update(is_default=False)
    primary, copy = deliver([mailbox, sales])
    assert process_inbox_event(primary) == Outcome.AWAITING_REVIEW  # no destination
    assert process_inbox_event(copy) == Outcome.AWAITING_REVIEW
    event = InboxEvent.objects.get(pk=copy)
    assert (event.state, event.reason_code, event.copy_of_id) == ("awaiting_review", "copy_of_unresolved", primary)
    [sent] = AuditEvent.objects.filter(inbox_event_id=copy, kind="awaiting_review")
    assert sent.detail["primary_event"] == primary and sent.detail["primary_state"] == "awaiting_review"
    assert Ticket.objects.count() == 0

    # The operator settles the primary, then replays the copy: nothing is lost, one ticket.
    operator = make_user("oper", groups=["operator"], tenants=[tenant])
    Destination.objects.filter(pk=builtin.pk).update(is_default=True)
    assert console.do_replay(operator, primary) == "rerouted"
    assert process_inbox_event(primary) == "created"
    assert console.do_replay(operator, copy) == "rerouted"
    assert process_inbox_event(copy) == "linked"
    [ticket] = Ticket.objects.all()
    assert mappings(copy) == [(LINK_COPY, str(ticket.pk))]


def test_a_copy_waits_while_its_primary_is_open_and_takes_over_when_it_is_closed(mailbox, sales):
    primary, copy = deliver([mailbox, sales])
    Destination.objects.filter(tenant=mailbox.tenant).update(paused=True)
    assert process_inbox_event(primary) == "paused"  # claimed as primary, then parked by the pause
    assert process_inbox_event(copy) == "waiting_for_copy"
    assert InboxEvent.objects.get(pk=copy).retry_at is not None
    assert transition_event(
        primary,
        InboxEvent.OPEN_STATES,
        "suppressed",
        actor="user:oper",
        kind="closed_not_a_request",
        reason_code="not_a_request",
        reason_detail="test",
    )
    Destination.objects.filter(tenant=mailbox.tenant).update(paused=False)
    assert process_inbox_event(copy) == "created"  # the primary was closed: this delivery is sent on
    assert Ticket.objects.count() == 1 and mappings(copy)[0][0] == "create_ticket"


def race(event_ids) -> dict:
    """Each event processed by its own thread (its own database connection), released at once."""
    barrier, results, errors = threading.Barrier(len(event_ids)), {}, []

    def work(event_id):
        try:
            barrier.wait()
            results[event_id] = process_inbox_event(event_id, worker=f"w{event_id}")
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(event_id,)) for event_id in event_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results


@pytest.mark.django_db(transaction=True)
def test_two_workers_processing_both_copies_at_once_make_one_ticket(mailbox, sales):
    for round_ in range(5):
        ids = deliver([mailbox, sales], subject=f"Race {round_}")
        results = race(ids)
        assert sorted(results.values()) in (["created", "waiting_for_copy"], ["created", "linked"]), results
        for event_id, outcome in results.items():
            if outcome == "waiting_for_copy":  # what the sweep does once the wait is over
                assert process_inbox_event(event_id) == "linked"
        assert Ticket.objects.filter(subject=f"Race {round_}").count() == 1
        actions = sorted(a for event_id in ids for a, _ in mappings(event_id))
        assert actions == ["create_ticket", LINK_COPY]
        assert len({t for event_id in ids for _, t in mappings(event_id)}) == 1

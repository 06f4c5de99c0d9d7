"""A task's group reads the tenant's routing rules, own addresses and sender lists once (intake.groupcache),
and decides every event of the group as the per-event reads would; outside a task nothing is remembered."""

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from intake import sender_lists
from intake.models import InboxEvent
from intake.sender_lists import add_sender_list_entry
from intake.vocabulary import ReasonCode
from tests.factories import make_destination, make_event, make_mailbox
from ticketing import people
from ticketing.tasks import process_inbox_events


@pytest.fixture
def two_mailboxes(tenant):
    make_destination(tenant)
    relaxed = {"acknowledge": False, "sender_rate_limit": {"count": 1000, "seconds": 600}}
    return (
        make_mailbox(tenant, slug="support", address="support@acme.test", settings=relaxed),
        make_mailbox(tenant, slug="sales", address="sales@acme.test", settings=relaxed),
    )


def listed_group(support, sales):
    """Entries on the tenant's list and on the support mailbox's, and a group of events across both."""
    root = get_user_model().objects.create_superuser("root", "root@staff.test", "pw-root-root")
    add_sender_list_entry(tenant=support.tenant, mailbox=None, kind="block", pattern="@spam.example", actor=root)
    add_sender_list_entry(tenant=support.tenant, mailbox=support, kind="allow", pattern="news@spam.example", actor=root)
    return {
        "blocked": make_event(sales, to=sales.address, sender="deals@spam.example", subject="Deals"),
        "allowed on its mailbox": make_event(support, sender="news@spam.example", subject="Newsletter"),
        "not allowed on the other": make_event(
            sales, to=sales.address, sender="news@spam.example", subject="Newsletter"
        ),
        "plain": make_event(support, sender="jane@example.com", subject="Printer on fire"),
    }


def outcomes(events) -> dict:
    return {
        name: InboxEvent.objects.values_list("state", "reason_code").get(pk=event.pk) for name, event in events.items()
    }


EXPECTED = {
    "blocked": ("suppressed", ReasonCode.SENDER_BLOCKED),
    "allowed on its mailbox": ("completed", ""),
    "not allowed on the other": ("suppressed", ReasonCode.SENDER_BLOCKED),
    "plain": ("completed", ""),
}


def test_a_group_decides_each_sender_as_its_mailbox_and_tenant_lists_say(two_mailboxes, scanner_off):
    events = listed_group(*two_mailboxes)
    process_inbox_events([event.pk for event in events.values()])
    assert outcomes(events) == EXPECTED


def test_a_tenant_with_more_entries_than_a_group_holds_is_read_per_event_with_the_same_decisions(
    two_mailboxes, scanner_off, monkeypatch
):
    monkeypatch.setattr(sender_lists, "GROUP_LOAD_LIMIT", 1)
    events = listed_group(*two_mailboxes)
    with CaptureQueriesContext(connection) as queries:
        process_inbox_events([event.pk for event in events.values()])
    assert outcomes(events) == EXPECTED
    reads = [q for q in queries.captured_queries if 'FROM "intake_senderlistentry"' in q["sql"]]
    assert len(reads) == 1 + len(events)  # the bounded load that found too many, then one per event


def test_a_group_of_plain_mail_reads_rules_addresses_and_lists_once(two_mailboxes, scanner_off):
    support, _ = two_mailboxes
    events = [
        make_event(
            support,
            sender=f"customer{n}@example.com",
            subject=f"Printer {n}",
            extra_headers={"Cc": "colleague@example.com"},
        )
        for n in range(10)
    ]
    with CaptureQueriesContext(connection) as queries:
        process_inbox_events([event.pk for event in events])
    assert set(InboxEvent.objects.filter(pk__in=[e.pk for e in events]).values_list("state", flat=True)) == {
        "completed"
    }

    def reads(table: str) -> int:
        return sum(1 for q in queries.captured_queries if q["sql"].startswith(f'SELECT "{table}".'))

    assert reads("ticketing_routingrule") == 1
    assert reads("intake_senderlistentry") == 1
    assert reads("intake_mailbox") == 1  # own addresses; the events' mailboxes come with them
    assert reads("intake_tenant") == 0  # with the events too


def test_outside_a_task_every_call_reads_what_is_stored_now(two_mailboxes):
    support, _ = two_mailboxes
    assert "help@acme.test" not in people.own_addresses(support.tenant_id)
    make_mailbox(support.tenant, slug="help", address="help@acme.test")
    assert "help@acme.test" in people.own_addresses(support.tenant_id)

"""A spam wave: 1,000 messages scored `X-Spam-Score: 12` by the MTA's filter and a rule "spam score > 8 ->
mark_spam" make 1,000 tickets in the spam queue, one per event, and not one acknowledgment; the people
writing in the same minutes are acknowledged as usual. Processed as the worker does (the task's groups: the
set-based path, `ticketing.batch`)."""

import time

import pytest

from intake.models import AuditEvent, InboxEvent, OutboxMessage
from intake.vocabulary import AuditKind, ReasonCode
from tests.factories import email_message, ingest_message
from tests.senderauth import stamped, trust_our_mta
from ticketing import intents, tasks
from ticketing.models import Intent, RoutingRule, Ticket

pytestmark = pytest.mark.usefixtures("scanner_off")

WAVE = 1_000
PEOPLE = 10
GROUP = 50  # the relay publishes groups of events to the task


def spam(n: int) -> bytes:
    """What a bulk mailer sends (HTML with a text part), as our MTA hands it on: scored and authenticated."""
    raw = email_message(
        subject=f"You won! Claim prize #{n}",
        sender=f"Winner Desk <claims{n}@prizes.example.com>",
        body="Click the link to claim your prize.\n",
        html="<p>Click <a href='https://prizes.example.com/'>here</a> to claim.</p>",
        extra_headers={"X-Spam-Score": "12", "X-Spam-Status": "Yes, score=12.0 required=5.0"},
    )
    return stamped(raw, domain="prizes.example.com")


def person(n: int) -> bytes:
    return stamped(email_message(subject=f"Printer {n} is on fire", sender=f"Jane {n} <jane{n}@example.com>"))


def test_a_thousand_spam_messages_make_a_thousand_spam_tickets_and_no_acknowledgment(mailbox, capsys):
    trust_our_mta(mailbox)
    policy = mailbox.tenant.routing_policy
    policy.queues, policy.default_queue = ["support"], "support"
    policy.save()
    rule = RoutingRule.objects.create(
        tenant=mailbox.tenant,
        name="spam wave",
        position=1,
        action="mark_spam",
        conditions={"spam_score": {"op": "gt", "value": 8}},
    )
    ids, people = [], []
    for n in range(WAVE):
        ids.append(ingest_message(mailbox, spam(n)).inbox_event_id)
        if n % (WAVE // PEOPLE) == 0:
            people.append(ingest_message(mailbox, person(n)).inbox_event_id)
    spam_ids = set(ids)
    ids = sorted([*ids, *people])

    started = time.monotonic()
    outcomes: dict = {}
    for start in range(0, len(ids), GROUP):
        for outcome, count in tasks.process_inbox_events(ids[start : start + GROUP]).items():
            outcomes[outcome] = outcomes.get(outcome, 0) + count
    seconds = time.monotonic() - started
    with capsys.disabled():
        print(
            f"\nspam wave: {WAVE} spam + {PEOPLE} people processed in {seconds:.1f} s "
            f"({(WAVE + PEOPLE) / seconds:.0f} messages/s), outcomes {outcomes}"
        )

    assert outcomes == {"created": WAVE + PEOPLE}
    assert InboxEvent.objects.filter(pk__in=spam_ids, state="completed").count() == WAVE
    # One ticket per spam event, every one of them in the spam queue and tagged spam.
    spam_intents = Intent.objects.filter(inbox_event_id__in=spam_ids, action="create_ticket")
    assert spam_intents.count() == WAVE
    keys = list(spam_intents.values_list("idempotency_key", flat=True))
    tickets = Ticket.objects.filter(idempotency_key__in=keys)
    assert tickets.count() == WAVE
    assert set(tickets.values_list("queue", flat=True)) == {"spam"}
    assert all(t == ["mailroom", "spam"] for t in tickets.values_list("tags", flat=True))
    assert Ticket.objects.filter(queue="spam").count() == WAVE
    rule.refresh_from_db()
    assert rule.hits == WAVE
    # Not one acknowledgment: no intent, no outbox row, no acknowledged row; each skip says why.
    assert not Intent.objects.filter(inbox_event_id__in=spam_ids, action="notify_requester").exists()
    assert not AuditEvent.objects.filter(inbox_event_id__in=spam_ids, kind=AuditKind.ACKNOWLEDGED).exists()
    skips = AuditEvent.objects.filter(inbox_event_id__in=spam_ids, kind=AuditKind.ACKNOWLEDGMENT_SKIPPED)
    assert skips.count() == WAVE
    assert set(skips.values_list("detail__reason", flat=True)) == {ReasonCode.MARKED_SPAM}
    acks = Intent.objects.filter(action="notify_requester")
    assert set(acks.values_list("inbox_event_id", flat=True)) == set(people)
    assert OutboxMessage.objects.filter(topic=intents.NOTIFY_TOPIC).count() == PEOPLE
    # The people's tickets are in their own queue.
    people_keys = Intent.objects.filter(inbox_event_id__in=people, action="create_ticket").values_list(
        "idempotency_key", flat=True
    )
    assert set(Ticket.objects.filter(idempotency_key__in=list(people_keys)).values_list("queue", flat=True)) == {
        "support"
    }

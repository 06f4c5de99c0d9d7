"""Set-based processing of a task's group (`ticketing.batch`): the same rows as the per-event path.

Each comparison processes one set of stored events twice from the same starting point: once event by
event (`services.process_inbox_event`, the path as it was) and once as the task does it now (plain
events set-based, the rest per event), each inside a transaction rolled back afterwards, and compares
everything the pipeline writes with ids and timestamps replaced by what they point at.
"""

import threading

import pytest
from django.db import connection, transaction

from intake.models import AuditEvent, InboxEvent, OutboxMessage
from tests.factories import email_message, ingest_message, make_desk_destination, make_destination, make_mailbox
from tests.senderauth import stamped, trust_our_mta
from tests.support.batch import assert_same, snapshot
from ticketing import batch, services, tasks, workers
from ticketing.models import Intent, RoutingRule, Ticket, TicketMapping

pytestmark = pytest.mark.usefixtures("scanner_off")


class _Undo(Exception):
    pass


def both_ways(event_ids: list[int], monkeypatch) -> tuple[dict, dict, dict, list[int]]:
    """(per-event snapshot, set-based snapshot, outcomes (the same both ways), the ids the task left to the
    per-event path), from the same start."""
    left = []
    one_event = services.process_inbox_event

    def spy(event_id, *args, **kwargs):
        left.append(event_id)
        return one_event(event_id, *args, **kwargs)

    outbox_after = OutboxMessage.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    results = []
    for run in (_per_event, tasks.process_inbox_events):
        if run is tasks.process_inbox_events:
            monkeypatch.setattr(services, "process_inbox_event", spy)
        try:
            with transaction.atomic():
                outcomes = run(event_ids)
                results.append((snapshot(event_ids, outbox_after), outcomes))
                raise _Undo
        except _Undo:
            pass
    monkeypatch.undo()
    (old, old_outcomes), (new, new_outcomes) = results
    assert new_outcomes == old_outcomes
    return old, new, new_outcomes, left


def _per_event(event_ids: list[int]) -> dict:
    worker, cache, outcomes = workers.worker_identity(), {}, {}
    for event_id in event_ids:
        outcome = services.process_inbox_event(event_id, worker=worker, group_cache=cache)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes


def receive(mailbox, **fields) -> int:
    """A message from an example.com sender our MTA authenticated (acknowledged where the mailbox trusts it)."""
    return ingest_message(mailbox, stamped(email_message(**fields))).inbox_event_id


def test_plain_mail_makes_the_same_rows_as_the_per_event_path(mailbox, monkeypatch):
    trust_our_mta(mailbox)
    RoutingRule.objects.create(
        tenant=mailbox.tenant,
        name="billing",
        position=1,
        queue="billing",
        priority="high",
        conditions={"subject_regex": "invoice"},
        stop_processing=True,
    )
    ids = [receive(mailbox, subject=f"Printer {n} on fire", sender=f"person{n}@example.com") for n in range(5)]
    ids.append(receive(mailbox, subject="Where is my invoice?", sender="payer@example.com"))
    ids.append(receive(mailbox, subject="no reply please", sender="noreply@example.com"))  # acknowledgment skipped
    ids.append(receive(mailbox, subject="", sender="Jane Doe <jane@example.com>", body="x" * 5000))

    old, new, outcomes, left = both_ways(ids, monkeypatch)

    assert_same(old, new)
    assert outcomes == {"created": len(ids)} and left == []  # all of them set-based
    assert [e["state"] for e in new["events"]] == ["completed"] * len(ids)
    kinds = [a[0] for a in new["events"][0]["audit"]]
    assert kinds == ["received", "classified", "ticket_created"]
    assert any(a[0] == "acknowledgment_skipped" for a in new["events"][6]["audit"])
    assert sum(1 for i in new["intents"] if i[1] == "notify_requester") == len(ids) - 1


def test_a_mixed_group_has_the_same_outcome_per_event_as_the_per_event_path(mailbox, desk, monkeypatch):
    tenant = mailbox.tenant
    mailbox.settings = {"sender_rate_limit": {"count": 2, "seconds": 600}}
    mailbox.save()
    paused = make_mailbox(tenant, slug="paused", address="paused@acme.test", paused=True)
    sales = make_mailbox(tenant, slug="sales", address="sales@acme.test")
    desk_destination = make_desk_destination(tenant, desk, monkeypatch, is_default=False)
    RoutingRule.objects.create(
        tenant=tenant,
        name="to the desk",
        position=1,
        destination=desk_destination,
        conditions={"subject_regex": "escalate"},
    )
    first = email_message(subject="Original question", sender="jane@example.com")
    ids = [ingest_message(mailbox, first).inbox_event_id]
    message_id = first.split(b"Message-ID: <", 1)[1].split(b">", 1)[0].decode()
    ids += [
        receive(
            mailbox,
            subject="Re: Original question",
            sender="jane@example.com",
            extra_headers={"In-Reply-To": f"<{message_id}>", "References": f"<{message_id}>"},
        ),
        receive(
            mailbox,
            subject="Out of office",
            sender="away@example.com",
            extra_headers={"Auto-Submitted": "auto-replied"},
        ),  # suppressed
        receive(
            mailbox,
            subject="Invoice attached",
            sender="bob@example.com",
            attachments=[("run.exe", "application/octet-stream", b"MZ\x90\x00" + b"\x00" * 200)],
        ),  # quarantined
        receive(mailbox, subject="Please escalate", sender="carol@example.com"),  # external
        receive(paused, subject="Waiting mail", sender="dave@example.com"),  # paused
        *[receive(mailbox, subject=f"Flood {n}", sender="flood@example.com") for n in range(4)],  # rate limit
    ]
    shared = email_message(
        subject="To both of you",
        sender="erin@example.com",
        to="support@acme.test",
        extra_headers={"Cc": "sales@acme.test"},
    )
    ids += [ingest_message(mailbox, shared).inbox_event_id, ingest_message(sales, shared).inbox_event_id]  # copies
    raw_without_sender = b"To: support@acme.test\r\nSubject: who am I\r\nMessage-ID: <anon@x>\r\n\r\nhello\r\n"
    ids.append(ingest_message(mailbox, raw_without_sender).inbox_event_id)  # review

    old, new, outcomes, left = both_ways(ids, monkeypatch)

    assert_same(old, new)
    # The reply, the external destination, the paused mailbox and the second copy go their own way.
    assert left == [ids[1], ids[4], ids[5], ids[11]]
    assert outcomes == {"created": 6, "suppressed": 1, "quarantined": 1, "awaiting_review": 3, "paused": 1, "linked": 1}
    states = [e["state"] for e in new["events"]]
    assert states == [
        "completed",
        "completed",
        "suppressed",
        "quarantined",
        "completed",
        "received",
        "completed",
        "completed",
        "awaiting_review",
        "awaiting_review",
        "completed",
        "completed",
        "awaiting_review",
    ]
    assert new["events"][1]["mappings"][0][0] == "add_comment"
    assert new["events"][11]["copy_of"] == "event10"


def test_a_group_processed_twice_makes_nothing_twice(mailbox):
    trust_our_mta(mailbox)
    ids = [receive(mailbox, subject=f"Question {n}", sender=f"p{n}@example.com") for n in range(6)]
    assert tasks.process_inbox_events(ids) == {"created": 6}
    rows = _counts()
    assert tasks.process_inbox_events(ids) == {"done": 6}
    assert _counts() == rows
    assert rows["Ticket"] == rows["TicketMapping"] == 6 and rows["notify_requester"] == 6


def _counts() -> dict:
    return {
        "Ticket": Ticket.objects.count(),
        "TicketMapping": TicketMapping.objects.count(),
        "create_ticket": Intent.objects.filter(action="create_ticket").count(),
        "notify_requester": Intent.objects.filter(action="notify_requester").count(),
        "AuditEvent": AuditEvent.objects.count(),
        "OutboxMessage": OutboxMessage.objects.count(),
    }


def test_a_conflict_rolls_the_group_back_to_the_per_event_path(mailbox, monkeypatch):
    """A conditional write that does not land (here: a route stored meanwhile) undoes the whole set-based write."""
    ids = [receive(mailbox, subject=f"Question {n}", sender=f"p{n}@example.com") for n in range(3)]
    real = batch._store_routes

    def someone_else_classified_first(plain, actor, now):
        InboxEvent.objects.filter(pk=plain[0].event.pk).update(route={"fields": {}, "rules": [], "ai": {}})
        return real(plain, actor, now)

    monkeypatch.setattr(batch, "_store_routes", someone_else_classified_first)
    handled, rest = batch.process_plain(ids, workers.worker_identity(), {})
    assert handled == {} and rest == ids
    assert not Ticket.objects.exists() and not Intent.objects.exists()
    assert set(InboxEvent.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"ready"}
    monkeypatch.undo()
    assert tasks.process_inbox_events(ids) == {"created": 3}
    assert Ticket.objects.count() == 3


def test_an_intent_made_by_someone_else_leaves_that_event_to_the_per_event_path(mailbox):
    ids = [receive(mailbox, subject=f"Question {n}", sender=f"p{n}@example.com") for n in range(3)]
    # Another worker got the middle one as far as its intent (pending, not yet carried out).
    event = InboxEvent.objects.get(pk=ids[1])
    from ticketing import intents

    intents.create_if_missing(event, action=Intent.Action.CREATE_TICKET, destination=event.tenant.destinations.get())
    handled, rest = batch.process_plain(ids, workers.worker_identity(), {})
    assert handled == {ids[0]: "created", ids[2]: "created"} and rest == [ids[1]]
    assert services.process_inbox_event(ids[1]) == "created"
    assert Ticket.objects.count() == 3 and TicketMapping.objects.count() == 3


def _work(ids, barrier, errors):
    try:
        barrier.wait()
        tasks.process_inbox_events(ids)
    except Exception as exc:  # reported by the test
        errors.append(exc)
    finally:
        connection.close()  # each thread had its own connection


@pytest.mark.django_db(transaction=True)
def test_two_workers_processing_the_same_group_concurrently_make_every_ticket_once(monkeypatch):
    from tests.conftest import WEBHOOK_SECRET
    from tests.factories import WEBHOOK_SECRET_VAR, make_tenant

    monkeypatch.setattr("django.conf.settings.MAILROOM_CLAMD", "off")
    monkeypatch.setenv(WEBHOOK_SECRET_VAR, WEBHOOK_SECRET)
    tenant = make_tenant(slug="race")
    make_destination(tenant)
    box = trust_our_mta(make_mailbox(tenant, slug="race-support", address="support@race.test"))
    for round_ in range(3):
        ids = [receive(box, subject=f"Race {round_}/{n}", sender=f"r{n}@example.com") for n in range(20)]
        barrier, errors = threading.Barrier(3), []
        threads = [threading.Thread(target=_work, args=(ids, barrier, errors)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        for event_id in ids:
            assert InboxEvent.objects.get(pk=event_id).state == "completed"
            assert TicketMapping.objects.filter(inbox_event_id=event_id).count() == 1
            [intent] = Intent.objects.filter(inbox_event_id=event_id, action="create_ticket")
            assert intent.state == "succeeded"
            assert Ticket.objects.filter(idempotency_key=intent.idempotency_key).count() == 1
            assert Intent.objects.filter(inbox_event_id=event_id, action="notify_requester").count() == 1
            assert AuditEvent.objects.filter(inbox_event_id=event_id, kind="ticket_created").count() == 1
            assert AuditEvent.objects.filter(inbox_event_id=event_id, kind="classified").count() == 1
    assert Ticket.objects.count() == 60

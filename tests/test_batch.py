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
from ticketing import batch, services, tasks, workers
from ticketing.models import CopiedMessage, Intent, RoutingRule, Ticket, TicketMapping

pytestmark = pytest.mark.usefixtures("scanner_off")


class _Undo(Exception):
    pass


def _canonical(value, names: dict):
    """`value` with every id in `names` (intent, ticket and event ids, as ints or strings) replaced."""
    if isinstance(value, dict):
        return {k: _canonical(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v, names) for v in value]
    if isinstance(value, str) and value.startswith("/admin/ticketing/ticket/"):
        number = value.split("/")[-3]
        tickets = {pk: n for (kind, *key), n in names.items() if kind == "ticket" for pk in key[1:]}
        return value.replace(f"/{number}/", f"/{tickets.get(number, number)}/")
    return value


def snapshot(event_ids: list[int], outbox_after: int) -> dict:
    """Everything the pipeline stored for these events, ids replaced by stable names."""
    index = {pk: f"event{n:02d}" for n, pk in enumerate(event_ids)}
    intents = list(Intent.objects.filter(inbox_event_id__in=event_ids).order_by("inbox_event_id", "action",
                                                                                 "action_version"))
    tickets = {str(t.pk): t for t in Ticket.objects.filter(idempotency_key__in=[i.idempotency_key for i in intents])}
    names = {("intent", i.pk): f"intent:{index[i.inbox_event_id]}:{i.action}:{i.action_version}" for i in intents}
    names.update({("ticket", t.destination_id, pk): f"ticket:{t.idempotency_key[:12]}" for pk, t in tickets.items()})

    def name(kind, value, destination=None):
        return names.get((kind, value) if destination is None else (kind, destination, value), value)

    def audit_detail(detail):
        detail = dict(detail)
        if "intent" in detail:
            detail["intent"] = name("intent", detail["intent"])
        if "ticket_id" in detail:
            detail["ticket_id"] = name("ticket", detail["ticket_id"], detail.get("destination"))
        for key in ("primary_event", "first_event"):
            if key in detail:
                detail[key] = index.get(detail[key], detail[key])
        return _canonical(detail, names)

    events = []
    for event in InboxEvent.objects.filter(pk__in=event_ids):
        events.append({
            "event": index[event.pk], "state": event.state, "reason_code": event.reason_code,
            "reason_detail": event.reason_detail, "sender": event.sender, "subject": event.subject,
            "message_id_header": event.message_id_header, "thread_key": event.thread_key, "details": event.details,
            "auth_results": event.auth_results, "route": event.route, "waits": event.retry_at is not None,
            "dispatch_count": event.dispatch_count, "copy_of": index.get(event.copy_of_id),
            "escalates": event.escalate_at is not None,
            "audit": [(a.kind, a.actor, audit_detail(a.detail)) for a in
                      AuditEvent.objects.filter(inbox_event_id=event.pk).order_by("pk")],
            "mappings": sorted((m.action, m.destination_id, name("ticket", m.ticket_id, m.destination_id),
                                _canonical(m.ticket_url, names))
                               for m in TicketMapping.objects.filter(inbox_event_id=event.pk)),
        })
    return {
        "events": sorted(events, key=lambda e: e["event"]),
        "intents": [(index[i.inbox_event_id], i.action, i.action_version, i.destination_id, i.state, i.attempts,
                     i.claimed_by, i.claimed_until is None, i.next_attempt_at is None, i.completed_at is None,
                     i.last_error_kind, i.last_error, i.external_ref, i.idempotency_key,
                     name("ticket", i.result_ref, i.destination_id))
                    for i in intents],
        "tickets": sorted((names[("ticket", t.destination_id, pk)], t.destination_id, t.external_ref, t.subject,
                           t.requester, t.description, t.status, t.tags, t.queue, t.priority, t.request_type,
                           t.assignee)
                          for pk, t in tickets.items()),
        "outbox": sorted((o.topic, str(_canonical({k: (index.get(v, v) if k == "inbox_event_id" else name("intent", v))
                                                   for k, v in o.payload.items()}, names)), o.published_at is None)
                         for o in OutboxMessage.objects.filter(pk__gt=outbox_after)),
        "rule_hits": sorted(RoutingRule.objects.values_list("pk", "hits")),
        "copies": sorted((c.fingerprint, index.get(c.primary_id)) for c in CopiedMessage.objects.all()),
    }


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


def assert_same(old: dict, new: dict) -> None:
    """Part by part and event by event, so a difference names where it is."""
    assert new.keys() == old.keys()
    for part in old:
        if part == "events":
            for before, after in zip(old[part], new[part], strict=True):
                for key in before:
                    assert after[key] == before[key], (before["event"], key)
        else:
            assert new[part] == old[part], part


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
    RoutingRule.objects.create(tenant=mailbox.tenant, name="billing", position=1, queue="billing", priority="high",
                               conditions={"subject_regex": "invoice"}, stop_processing=True)
    ids = [receive(mailbox, subject=f"Printer {n} on fire", sender=f"person{n}@example.com") for n in range(5)]
    ids.append(receive(mailbox, subject="Where is my invoice?", sender="payer@example.com"))
    ids.append(receive(mailbox, subject="no reply please", sender="noreply@example.com"))   # acknowledgment skipped
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
    RoutingRule.objects.create(tenant=tenant, name="to the desk", position=1, destination=desk_destination,
                               conditions={"subject_regex": "escalate"})
    first = email_message(subject="Original question", sender="jane@example.com")
    ids = [ingest_message(mailbox, first).inbox_event_id]
    message_id = first.split(b"Message-ID: <", 1)[1].split(b">", 1)[0].decode()
    ids += [
        receive(mailbox, subject="Re: Original question", sender="jane@example.com",
                extra_headers={"In-Reply-To": f"<{message_id}>", "References": f"<{message_id}>"}),
        receive(mailbox, subject="Out of office", sender="away@example.com",
                extra_headers={"Auto-Submitted": "auto-replied"}),                                    # suppressed
        receive(mailbox, subject="Invoice attached", sender="bob@example.com",
                attachments=[("run.exe", "application/octet-stream", b"MZ\x90\x00" + b"\x00" * 200)]),  # quarantined
        receive(mailbox, subject="Please escalate", sender="carol@example.com"),                     # external
        receive(paused, subject="Waiting mail", sender="dave@example.com"),                          # paused
        *[receive(mailbox, subject=f"Flood {n}", sender="flood@example.com") for n in range(4)],     # rate limit
    ]
    shared = email_message(subject="To both of you", sender="erin@example.com", to="support@acme.test",
                           extra_headers={"Cc": "sales@acme.test"})
    ids += [ingest_message(mailbox, shared).inbox_event_id, ingest_message(sales, shared).inbox_event_id]  # copies
    raw_without_sender = b"To: support@acme.test\r\nSubject: who am I\r\nMessage-ID: <anon@x>\r\n\r\nhello\r\n"
    ids.append(ingest_message(mailbox, raw_without_sender).inbox_event_id)                          # review

    old, new, outcomes, left = both_ways(ids, monkeypatch)

    assert_same(old, new)
    # The reply, the external destination, the paused mailbox and the second copy go their own way.
    assert left == [ids[1], ids[4], ids[5], ids[11]]
    assert outcomes == {"created": 6, "suppressed": 1, "quarantined": 1, "awaiting_review": 3, "paused": 1,
                        "linked": 1}
    states = [e["state"] for e in new["events"]]
    assert states == ["completed", "completed", "suppressed", "quarantined", "completed", "received",
                      "completed", "completed", "awaiting_review", "awaiting_review", "completed", "completed",
                      "awaiting_review"]
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
    return {"Ticket": Ticket.objects.count(), "TicketMapping": TicketMapping.objects.count(),
            "create_ticket": Intent.objects.filter(action="create_ticket").count(),
            "notify_requester": Intent.objects.filter(action="notify_requester").count(),
            "AuditEvent": AuditEvent.objects.count(), "OutboxMessage": OutboxMessage.objects.count()}


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
    intents.create_if_missing(event, Intent.Action.CREATE_TICKET, event.tenant.destinations.get())
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

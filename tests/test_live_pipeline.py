"""The whole pipeline with real processes: live web server -> PostgreSQL -> relay -> Redis -> Celery worker.

Nothing is faked: the webhook is reached over HTTP, the relay and the worker are
separate OS processes on the test database, and Redis carries the tasks.
"""

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from intake.signing import signed_headers
from tests.live import (  # noqa: F401  (fixtures)
    LIVE_SECRET,
    PROCESS_TASK,
    audit_kinds,
    event_states,
    live_broker,
    live_mailbox,
    live_processes,
    make_email,
    subprocess_env,
    wait_for,
)

pytestmark = pytest.mark.live

N_EMAILS = 50


def post_email(url: str, body: bytes) -> requests.Response:
    return requests.post(
        url, data=body, timeout=15, headers={**signed_headers(LIVE_SECRET, body), "Content-Type": "message/rfc822"}
    )


def webhook_url(live_server, mailbox) -> str:
    return f"{live_server.url}/webhooks/raw/{mailbox.slug}/"


def test_fifty_signed_emails_become_fifty_tickets(live_server, live_mailbox, live_broker, live_processes):
    from intake.models import AuditEvent, InboxEvent, OutboxMessage
    from ticketing.models import Intent, Ticket, TicketMapping

    env = subprocess_env(live_broker.url)
    live_processes.worker(env)
    live_processes.relay(env)

    url = webhook_url(live_server, live_mailbox)
    bodies = [make_email(f"Live request #{n}") for n in range(N_EMAILS)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        responses = list(pool.map(lambda body: post_email(url, body), bodies))
    assert [r.status_code for r in responses] == [202] * N_EMAILS, [r.text for r in responses if r.status_code != 202]
    assert all(r.json()["duplicate"] is False for r in responses)
    ids = [r.json()["inbox_event_id"] for r in responses]
    assert len(set(ids)) == N_EMAILS

    wait_for(
        lambda: event_states(ids).get("completed", 0) == N_EMAILS,
        timeout=60,
        interval=0.25,
        describe=lambda: f"states {dict(event_states(ids))}\n{live_processes.logs()}",
    )

    # Exactly one ticket, one mapping and one succeeded intent per event.
    assert InboxEvent.objects.filter(pk__in=ids).count() == N_EMAILS
    tickets = Ticket.objects.filter(destination__tenant=live_mailbox.tenant)
    assert tickets.count() == N_EMAILS
    mappings = TicketMapping.objects.filter(inbox_event_id__in=ids)
    assert mappings.count() == N_EMAILS
    assert sorted(mappings.values_list("inbox_event_id", flat=True)) == sorted(ids)
    assert {int(t) for t in mappings.values_list("ticket_id", flat=True)} == set(tickets.values_list("pk", flat=True))
    assert sorted(tickets.values_list("subject", flat=True)) == sorted(f"Live request #{n}" for n in range(N_EMAILS))
    intents = Intent.objects.filter(inbox_event_id__in=ids)
    assert intents.count() == N_EMAILS
    assert set(intents.values_list("state", "attempts")) == {("succeeded", 1)}

    # The audit trail: received by the webhook, ticket created by the worker process (not by us).
    for event_id in ids:
        kinds = audit_kinds(event_id)
        assert kinds["received"] == 1 and kinds["ticket_created"] == 1, (event_id, kinds)
    creators = set(
        AuditEvent.objects.filter(inbox_event_id__in=ids, kind="ticket_created").values_list("actor", flat=True)
    )
    assert creators and all(not actor.endswith(f":{os.getpid()}") for actor in creators), creators
    # Every outbox row was published by the relay.
    assert not OutboxMessage.objects.filter(published_at__isnull=True).exists()

    # The same messages again: recognised as duplicates, nothing new is stored or created.
    again = [post_email(url, bodies[n]) for n in range(5)]
    assert [(r.status_code, r.json()) for r in again] == [
        (200, {"inbox_event_id": ids[n], "duplicate": True}) for n in range(5)
    ]
    assert OutboxMessage.objects.count() == N_EMAILS
    assert tickets.count() == N_EMAILS


def test_message_lost_after_publishing_is_recovered_by_the_stale_event_sweep(
    live_server, live_mailbox, live_broker, live_processes
):
    from intake.models import AuditEvent, InboxEvent, OutboxMessage
    from intake.services import requeue_stale_events
    from ticketing.models import Intent, Ticket, TicketMapping

    env = subprocess_env(live_broker.url)
    relay = live_processes.relay(env)

    response = post_email(webhook_url(live_server, live_mailbox), make_email("Lost in the broker"))
    assert response.status_code == 202, response.text
    event_id = response.json()["inbox_event_id"]

    # The relay publishes it (no worker runs yet, so the message waits in Redis) ...
    wait_for(
        lambda: OutboxMessage.objects.filter(payload__inbox_event_id=event_id, published_at__isnull=False).exists(),
        timeout=20,
        describe=live_processes.logs,
    )
    queued = live_broker.queued_messages()
    assert any(m["headers"]["task"] == PROCESS_TASK and str(event_id) in m["headers"]["argsrepr"] for m in queued), (
        queued
    )
    assert relay.stop() == 0, relay.tail()

    # ... and the broker loses it before any worker took it.
    assert live_broker.drop_queued_messages() == len(queued)
    assert live_broker.queued_messages() == []

    node = f"live-lost-{uuid.uuid4().hex[:8]}@mailroom-test"
    live_processes.worker(env, node=node)
    wait_for(lambda: live_broker.ping_worker(node), timeout=30, interval=0.2, describe=live_processes.logs)
    # A running, idle worker has nothing to do: without the sweep the event would wait forever.
    time.sleep(2)
    assert InboxEvent.objects.get(pk=event_id).state == "received"
    assert not Intent.objects.filter(inbox_event_id=event_id).exists()
    assert Ticket.objects.count() == 0

    assert requeue_stale_events(older_than_seconds=0) == {"requeued": 1, "poisoned": 0}
    assert InboxEvent.objects.get(pk=event_id).dispatch_count == 0, "no worker took it: not a step to poison"

    # A relay (started after the sweep, so it finds the new row by its start-up sweep, not by NOTIFY) publishes it.
    live_processes.relay(env)
    wait_for(
        lambda: InboxEvent.objects.get(pk=event_id).state == "completed",
        timeout=30,
        interval=0.2,
        describe=lambda: f"state {InboxEvent.objects.get(pk=event_id).state}\n{live_processes.logs()}",
    )

    assert Ticket.objects.count() == 1
    assert TicketMapping.objects.filter(inbox_event_id=event_id).count() == 1
    assert list(Intent.objects.filter(inbox_event_id=event_id).values_list("state", "attempts")) == [("succeeded", 1)]
    kinds = audit_kinds(event_id)
    assert (kinds["received"], kinds["requeued"], kinds["ticket_created"]) == (1, 1, 1), kinds
    order = list(
        AuditEvent.objects.filter(inbox_event_id=event_id, kind__in=["received", "requeued", "ticket_created"])
        .order_by("at", "pk")
        .values_list("kind", flat=True)
    )
    assert order == ["received", "requeued", "ticket_created"]
    outbox = OutboxMessage.objects.filter(payload__inbox_event_id=event_id)
    assert outbox.count() == 2 and not outbox.filter(published_at__isnull=True).exists()

    # A completed event is never swept again.
    assert requeue_stale_events(older_than_seconds=0) == {"requeued": 0, "poisoned": 0}

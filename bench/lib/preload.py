"""The bench database's tenant, raw mailbox and default destination, and its preloaded history.

Not imported: lib.db.prepare_database passes this file's text to `manage.py shell -c` (Django set
up, the app's environment), with BENCH_PRELOAD (how many events) and BENCH_MAILBOX (the mailbox
slug) set. Prints one line "BENCH_SETUP {json}" with the ids it created.
"""

import json
import os
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from intake.keys import dedupe_key, stable_key
from intake.models import AuditEvent, InboxEvent, Mailbox, OutboxMessage, Tenant
from ticketing.intents.creation import external_ref
from ticketing.models import Destination, Intent, Ticket, TicketMapping

preload = int(os.environ["BENCH_PRELOAD"])
tenant = Tenant.objects.create(slug="bench", name="Benchmark tenant")
mailbox = Mailbox.objects.create(
    tenant=tenant,
    slug=os.environ["BENCH_MAILBOX"],
    address="support@bench.test",
    provider="raw",
    webhook_secret_ref="env:BENCH_SECRET",
)
destination = Destination.objects.create(tenant=tenant, slug="builtin", kind="builtin", is_default=True)
# History, so that PostgreSQL plans for tables of a realistic shape (SETUP.md: never benchmark on
# empty tables). Completed events with their audit rows, published outbox rows, intents, tickets
# and mappings, as the pipeline itself would have left them a while ago.
then = timezone.now() - timedelta(days=1)
raw = b"From: old@example.com\r\nSubject: old\r\n\r\nold message\r\n"
B = 2000
for start in range(0, preload, B):
    n = min(B, preload - start)
    events = InboxEvent.objects.bulk_create(
        [
            InboxEvent(
                tenant=tenant,
                mailbox=mailbox,
                provider_message_id=f"preload-{i}@bench",
                dedupe_key=dedupe_key(tenant.pk, mailbox.pk, f"preload-{i}@bench"),
                source="raw",
                state="completed",
                received_at=then,
                updated_at=then,
                raw=raw,
                size=len(raw),
                dispatch_count=1,
                sender="old@example.com",
                subject="old",
            )
            for i in range(start, start + n)
        ]
    )
    AuditEvent.objects.bulk_create(
        [AuditEvent(inbox_event=e, actor="provider:raw", kind="received", detail={}, at=then) for e in events]
    )
    OutboxMessage.objects.bulk_create(
        [
            OutboxMessage(
                topic="inbox_event.process",
                payload={"inbox_event_id": e.pk},
                created_at=then,
                published_at=then,
                attempts=1,
            )
            for e in events
        ]
    )
    keys = [stable_key(tenant.pk, mailbox.pk, e.provider_message_id, "create_ticket", 1) for e in events]
    tickets = Ticket.objects.bulk_create(
        [
            Ticket(
                destination=destination,
                idempotency_key=k,
                external_ref=external_ref(k),
                subject="old",
                requester="old@example.com",
                description="old message",
                created_at=then,
            )
            for k in keys
        ]
    )
    Intent.objects.bulk_create(
        [
            Intent(
                idempotency_key=k,
                inbox_event=e,
                action="create_ticket",
                action_version=1,
                destination=destination,
                state="succeeded",
                attempts=1,
                external_ref=external_ref(k),
                result_ref=str(t.pk),
                created_at=then,
                completed_at=then,
            )
            for k, e, t in zip(keys, events, tickets, strict=True)
        ]
    )
    TicketMapping.objects.bulk_create(
        [
            TicketMapping(
                inbox_event=e,
                action="create_ticket",
                destination=destination,
                ticket_id=str(t.pk),
                ticket_url="",
                created_at=then,
            )
            for e, t in zip(events, tickets, strict=True)
        ]
    )
    AuditEvent.objects.bulk_create(
        [AuditEvent(inbox_event=e, actor="worker:preload", kind="ticket_created", detail={}, at=then) for e in events]
    )
with connection.cursor() as cursor:
    cursor.execute("VACUUM ANALYZE")
print(
    "BENCH_SETUP "
    + json.dumps({"tenant": tenant.pk, "mailbox": mailbox.pk, "destination": destination.pk, "preloaded": preload})
)

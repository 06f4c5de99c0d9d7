"""The pause page and what the relay and a worker do with the outbox meanwhile."""

from collections import Counter

from django.utils import timezone

from intake.models import OutboxMessage
from intake.services import PROCESS_TOPIC
from ticketing.services import process_inbox_event

PAUSES_URL = "/admin/reconciliation/pauseswitch/"


def drain_outbox(times: int = 1) -> Counter:
    """What the relay and a worker do: every unpublished process message is handed to process_inbox_event.

    `times` > 1 delivers each message again (at-least-once delivery).
    """
    outcomes = Counter()
    rows = list(OutboxMessage.objects.filter(topic=PROCESS_TOPIC, published_at__isnull=True).order_by("pk"))
    OutboxMessage.objects.filter(pk__in=[r.pk for r in rows]).update(published_at=timezone.now())
    for _ in range(times):
        for row in rows:
            outcomes[process_inbox_event(row.payload["inbox_event_id"])] += 1
    return outcomes


def toggle(client, target, paused, object_id="", reason="a test pause"):
    return client.post(
        PAUSES_URL,
        {"target": target, "paused": "1" if paused else "0", "id": object_id, "reason": reason if paused else ""},
    )

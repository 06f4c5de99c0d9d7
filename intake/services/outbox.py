"""The transactional outbox: a row written in the caller's transaction, published by the relay after the
commit (intake.relay), woken by a NOTIFY on `NOTIFY_CHANNEL`."""

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from ..models import OutboxMessage

PROCESS_TOPIC = "inbox_event.process"


POLL_TOPIC = "mailbox.poll"


NOTIFY_CHANNEL = "mailroom_outbox"


def enqueue_outbox(topic: str, payload: dict[str, Any], now: datetime | None = None) -> OutboxMessage:
    """Write an outbox row; call inside the transaction whose change it announces."""
    message = OutboxMessage.objects.create(topic=topic, payload=payload, created_at=now or timezone.now())
    if settings.USING_POSTGRES:
        # Delivered at commit (and dropped on rollback): the relay's fast path.
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {NOTIFY_CHANNEL}")
    return message

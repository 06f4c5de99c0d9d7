"""The one INSERT of an intent (`insert_intent`) and the ways callers create one. Below the transitions
(ticketing.intents.core) so that what an intent's success plans (ticketing.intents.followups) can create
intents without importing them."""

from datetime import datetime

from django.utils import timezone

from intake.keys import stable_key
from intake.models import InboxEvent

from ..models import Destination, Intent

IntentState = Intent.State
NOTIFY_TOPIC = "intent.notify"
ATTACH_TOPIC = "intent.attach_files"
EXTERNAL_REF_PREFIX = "mailroom-"


def external_ref(key: str) -> str:
    """The reference a desk keeps for an intent's record (searchable, stable across attempts)."""
    return f"{EXTERNAL_REF_PREFIX}{key[:40]}"


def intent_key(event: InboxEvent, action: str, action_version: int) -> str:
    return stable_key(event.tenant_id, event.mailbox_id, event.provider_message_id, action, action_version)


def insert_intent(
    event: InboxEvent,
    action: str,
    destination: Destination,
    action_version: int,
    state: str,
    now: datetime,
    *,
    if_missing: bool,
) -> Intent:
    """The one INSERT of an intent: its key, its external reference and the state it starts in.

    `if_missing`: `ON CONFLICT DO NOTHING` (no savepoint; the unique key decides who
    created it, and the row returned may not be the stored one). Otherwise a plain
    INSERT that raises IntegrityError on a second row for the key.
    """
    key = intent_key(event, action, action_version)
    row = Intent(
        idempotency_key=key,
        inbox_event=event,
        action=action,
        action_version=action_version,
        destination=destination,
        state=state,
        external_ref=external_ref(key),
        created_at=now,
        # Entering pending says when it was handed over (core._ENTRY), so a lost hand-over is seen.
        next_attempt_at=now if state == IntentState.PENDING else None,
    )
    Intent.objects.bulk_create([row], ignore_conflicts=if_missing)
    return row


def create_if_missing(event: InboxEvent, *, action: str, destination: Destination, action_version: int = 1) -> str:
    """INSERT ... ON CONFLICT DO NOTHING (pending). Returns the idempotency key."""
    return insert_intent(
        event, action, destination, action_version, IntentState.PENDING, timezone.now(), if_missing=True
    ).idempotency_key


def ensure_intent(event: InboxEvent, action: str, destination: Destination, action_version: int = 1) -> Intent:
    """The intent for this event, action and version: created once, whoever asks first."""
    key = create_if_missing(event, action=action, destination=destination, action_version=action_version)
    return Intent.objects.select_related("destination").get(idempotency_key=key)


def create_intent(event: InboxEvent, action: str, destination: Destination, action_version: int = 1) -> Intent:
    """A plain INSERT (pending), for callers whose own unique write already proves it is the first."""
    return insert_intent(
        event, action, destination, action_version, IntentState.PENDING, timezone.now(), if_missing=False
    )

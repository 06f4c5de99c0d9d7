"""The shared destination contract suite's intent helpers: the event's intent, an unknown outcome settled."""

import time

from django.utils import timezone

from ticketing import intents
from ticketing.models import Intent
from ticketing.services import process_inbox_event


def intent_of(event_id, action="create_ticket") -> Intent:
    return Intent.objects.filter(inbox_event_id=event_id, action=action).order_by("-action_version").first()


def settle_unknown(event_id, seconds: float = 15.0) -> str:
    """What the sweeps do with an unknown intent, repeated until it leaves `unknown` for good (a lagging
    search waits for its settle delay; a reopened intent is carried out again)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        intent = intent_of(event_id)
        if intent.state == "unknown":
            intents.resolve_unknown(intent.pk)
        elif intent.state in ("pending", "retry_wait"):
            Intent.objects.filter(pk=intent.pk).update(next_attempt_at=timezone.now())
            process_inbox_event(event_id)
        else:
            return intent.state
        time.sleep(0.1)
    raise AssertionError(f"intent still {intent_of(event_id).state} after {seconds}s")

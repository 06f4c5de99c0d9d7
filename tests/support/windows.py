"""Failure windows with real worker processes: the workers' environment, a sweeper thread, event states."""

import threading
from contextlib import contextmanager

from django.db import connection

from intake.keys import provider_message_id_for_raw
from intake.services import ingest, requeue_stale_events
from tests.live import make_email, subprocess_env
from ticketing import intents


def worker_env(broker, **extra):
    # Short claims so a killed worker's claim expires within the test.
    return subprocess_env(broker.url, MAILROOM_CLAIM_SECONDS=4, MAILROOM_BROKER_VISIBILITY_TIMEOUT=10, **extra)


@contextmanager
def sweeper(stale_seconds: float = 3.0, every: float = 0.3):
    """What beat does, on a short period: stale events, expired claims, due retries, unknown outcomes."""
    stop = threading.Event()
    errors = []

    def run():
        try:
            while not stop.is_set():
                requeue_stale_events(older_than_seconds=stale_seconds)
                intents.expire_claims()
                intents.enqueue_due(lost_after_seconds=stale_seconds)
                intents.resolve_unknown_intents()
                stop.wait(every)
        except Exception as exc:  # surfaced by the test, not swallowed by the thread
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)
    assert not errors, errors


def new_event(mailbox, subject="Help") -> int:
    raw = make_email(subject)
    return ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id


def state_of(event_id):
    from intake.models import InboxEvent
    from ticketing.models import Intent

    event = InboxEvent.objects.get(pk=event_id)
    intent = Intent.objects.filter(inbox_event_id=event_id).first()
    return event.state, event.reason_code, intent.state if intent else None


def settled(event_id):
    event_state, _, intent_state = state_of(event_id)
    return event_state in ("completed", "failed", "awaiting_review", "quarantined") or intent_state == "held"

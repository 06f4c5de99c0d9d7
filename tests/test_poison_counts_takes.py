"""A poison message is one that workers take again and again without progress; mail that only waits in a
busy broker is never taken, so no backlog, however long, sends it to the recovery queue as poison.

The stale-event sweep (intake.services.requeue_stale_events) requeues what made no progress; the count it
poisons by is the workers' takes (intake.services.record_taken, at the start of every process task), not
its own requeues.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from intake.models import AuditEvent, InboxEvent
from intake.services import record_progress, record_taken, requeue_stale_events, transition_event, wait_event
from tests.factories import make_event
from ticketing import intents, tasks
from ticketing.models import Destination, Intent

pytestmark = pytest.mark.django_db


@pytest.fixture
def few_takes(settings):
    settings.MAILROOM_MAX_DISPATCHES = 3
    return 3


def test_an_event_that_only_waits_in_the_broker_is_requeued_every_sweep_and_never_poisoned(mailbox, few_takes):
    event = make_event(mailbox)
    for _ in range(few_takes * 4):
        assert requeue_stale_events(older_than_seconds=0) == {"requeued": 1, "poisoned": 0}
    event.refresh_from_db()
    assert (event.state, event.dispatch_count, event.reason_code) == ("received", 0, "")
    assert AuditEvent.objects.filter(inbox_event_id=event.pk, kind="requeued").count() == few_takes * 4


def test_an_event_taken_as_often_as_the_cap_without_progress_is_poison(mailbox, few_takes):
    event = make_event(mailbox)
    for take in range(few_takes):
        assert record_taken([event.pk]) == 1  # a worker took it ... and died before it got anywhere
        last = take == few_takes - 1
        assert requeue_stale_events(older_than_seconds=0) == {"requeued": 0 if last else 1, "poisoned": int(last)}
    event.refresh_from_db()
    assert (event.state, event.reason_code) == ("failed", "poison")
    assert event.reason_detail == f"dispatched {few_takes} times without progress"
    assert AuditEvent.objects.filter(inbox_event_id=event.pk, kind="poison").count() == 1


def test_a_deliberate_wait_is_progress_and_starts_the_count_again(mailbox, few_takes):
    event = make_event(mailbox)
    for _ in range(few_takes - 1):
        record_taken([event.pk])
    wait_event(event.pk, 0)  # e.g. the scanner is unreachable: the worker chose to wait
    event.refresh_from_db()
    assert event.dispatch_count == 0 and event.retry_at is not None
    assert record_taken([event.pk]) == 0, "a waiting event is not taken before its wait is over"
    assert requeue_stale_events(older_than_seconds=0) == {"requeued": 1, "poisoned": 0}
    record_taken([event.pk])
    assert requeue_stale_events(older_than_seconds=0) == {"requeued": 1, "poisoned": 0}


def test_the_process_task_counts_one_take_per_open_event_and_none_for_finished_ones(mailbox):
    event = make_event(mailbox)
    assert tasks.process_inbox_events.run([event.pk]) == {"created": 1}
    event.refresh_from_db()
    assert (event.state, event.dispatch_count) == ("completed", 1)
    # A redelivery of the same task after the event completed takes nothing.
    assert tasks.process_inbox_events.run([event.pk]) == {"done": 1}
    event.refresh_from_db()
    assert event.dispatch_count == 1


def test_a_call_handed_to_the_destination_pool_is_progress(mailbox, few_takes):
    event = make_event(mailbox)
    for _ in range(few_takes * 2):  # each take hands the call over again while it waits in the pool's queue
        record_taken([event.pk])
        record_progress(event.pk)
        assert requeue_stale_events(older_than_seconds=0) == {"requeued": 1, "poisoned": 0}
    event.refresh_from_db()
    assert (event.state, event.dispatch_count) == ("received", 0)


def test_a_requeue_no_worker_took_doubles_the_wait_before_the_next_and_a_take_resets_it(mailbox):
    event = make_event(mailbox)
    window = 60
    InboxEvent.objects.filter(pk=event.pk).update(updated_at=timezone.now() - timedelta(seconds=window + 1))
    assert requeue_stale_events(older_than_seconds=window)["requeued"] == 1
    # Still waiting in the broker 1.5 windows later: not copied into the backlog again yet.
    InboxEvent.objects.filter(pk=event.pk).update(updated_at=timezone.now() - timedelta(seconds=window * 1.5))
    assert requeue_stale_events(older_than_seconds=window)["requeued"] == 0
    InboxEvent.objects.filter(pk=event.pk).update(updated_at=timezone.now() - timedelta(seconds=window * 2 + 1))
    assert requeue_stale_events(older_than_seconds=window)["requeued"] == 1
    event.refresh_from_db()
    assert event.requeues == 2
    record_taken([event.pk])  # a worker took it (and died): one window again
    event.refresh_from_db()
    assert event.requeues == 0
    InboxEvent.objects.filter(pk=event.pk).update(updated_at=timezone.now() - timedelta(seconds=window + 1))
    assert requeue_stale_events(older_than_seconds=window)["requeued"] == 1


def test_a_ready_event_whose_call_waits_in_the_pool_is_left_to_its_intents_sweep(mailbox):
    event = make_event(mailbox)
    transition_event(event.pk, ["received"], "ready", actor="test", kind=None)
    destination = Destination.objects.get(tenant=mailbox.tenant, is_default=True)
    # Handed to the pool, not taken yet.
    intents.create_if_missing(event, action=Intent.Action.CREATE_TICKET, destination=destination)
    assert requeue_stale_events(older_than_seconds=0) == {"requeued": 0, "poisoned": 0}
    assert InboxEvent.objects.get(pk=event.pk).requeues == 0
    assert intents.enqueue_due(lost_after_seconds=0) == 1  # a lost hand-over is the intent's sweep's to find


def test_the_database_refuses_a_requeue_count_past_the_backoff_cap(mailbox):
    from django.db import IntegrityError, transaction

    from intake.models import MAX_REQUEUE_DOUBLINGS

    event_id = make_event(mailbox).pk
    InboxEvent.objects.filter(pk=event_id).update(requeues=MAX_REQUEUE_DOUBLINGS)  # the cap itself is kept
    with pytest.raises(IntegrityError), transaction.atomic():
        InboxEvent.objects.filter(pk=event_id).update(requeues=MAX_REQUEUE_DOUBLINGS + 1)
    assert InboxEvent.objects.get(pk=event_id).requeues == MAX_REQUEUE_DOUBLINGS

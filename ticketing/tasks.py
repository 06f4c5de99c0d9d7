"""Celery tasks of the ticketing app: thin, take ids, safe to run twice."""

import logging
from collections.abc import Callable, Hashable
from typing import Any, cast

from celery import shared_task

from intake import groupcache
from intake.selectors import drill_event_ids

from . import execution, intents, services, workers
from .outcomes import Outcome

logger = logging.getLogger(__name__)


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def process_inbox_events(inbox_event_ids: list[int]) -> dict[str, int]:
    """Process a group of events (the relay publishes groups); each keeps its own guarantees."""
    # A drill's events are driven by the drill itself, in its own process (reconciliation.drills): dropped here.
    drill = drill_event_ids(inbox_event_ids)
    kept = [event_id for event_id in inbox_event_ids if event_id not in drill]
    outcomes: dict[str, int] = {Outcome.DRILL: len(inbox_event_ids) - len(kept)} if drill else {}
    inbox_event_ids = kept
    worker = workers.worker_identity()
    group_cache: dict[Hashable, Any] = {}  # the pause switch, policies and default destinations, read once per group
    with groupcache.scope(group_cache):  # and the lookups deep in normalization and ticket building
        outcomes.update(_process_group(inbox_event_ids, worker, group_cache))
    return outcomes


def _process_group(inbox_event_ids: list[int], worker: str, group_cache: dict[Hashable, Any]) -> dict[str, int]:
    from django.conf import settings

    from . import batch

    outcomes: dict[str, int] = {}
    try:
        # Plain mail to the built-in store, set-based; everything else (and any conflict) per event.
        handled, rest = (
            batch.process_plain(inbox_event_ids, worker, group_cache)
            if settings.MAILROOM_SET_BASED
            else ({}, list(inbox_event_ids))
        )
    except Exception:
        logger.exception("set-based processing of %d events failed; each goes its own way", len(inbox_event_ids))
        handled, rest = {}, list(inbox_event_ids)
    left = set(rest)
    for event_id in inbox_event_ids:  # in order; an id listed twice is seen twice, as it always was
        if event_id not in left:
            outcomes[handled[event_id]] = outcomes.get(handled[event_id], 0) + 1
            continue
        try:
            outcome = services.process_inbox_event(event_id, worker=worker, group_cache=group_cache)
        except Exception:
            # One bad event must not stall its group; the stale-event sweep
            # brings it back and, past the dispatch cap, to the recovery queue.
            logger.exception("processing event %s failed", event_id)
            outcome = Outcome.ERROR
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def process_inbox_event(inbox_event_id: int) -> dict[str, int]:
    # Calling the task object runs process_inbox_events here, in this process: its dict[str, int].
    return cast(dict[str, int], process_inbox_events([inbox_event_id]))


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def expire_claims() -> int:
    return intents.expire_claims()


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def enqueue_due_intents() -> int:
    return intents.enqueue_due()


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def resolve_unknown_intents() -> dict[str, int]:
    return intents.resolve_unknown_intents()


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def send_acknowledgment(intent_id: int) -> str:
    from . import acknowledgments

    return acknowledgments.send(intent_id, workers.worker_identity())


def _each_intent(intent_ids: list[int], carry_out: Callable[[int, str], str], what: str) -> dict[str, int]:
    """One group's intents carried out one by one, each keeping its own intent (a failure is logged, and that
    intent's sweeps bring it back); {outcome: count}."""
    outcomes: dict[str, int]
    worker, outcomes = workers.worker_identity(), {}
    for intent_id in intent_ids:
        try:
            outcome = carry_out(intent_id, worker)
        except Exception:
            logger.exception("%s %s failed", what, intent_id)
            outcome = Outcome.ERROR
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def send_acknowledgments(intent_ids: list[int]) -> dict[str, int]:
    """A group of acknowledgments (the relay publishes them in groups), sent over one SMTP connection."""
    from . import acknowledgments

    return acknowledgments.send_group(intent_ids, worker=workers.worker_identity())


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def attach_files(intent_ids: list[int]) -> dict[str, int]:
    """A group of `attach_files` intents (ticketing.attachments)."""
    from . import attachments

    return _each_intent(intent_ids, attachments.deliver, "attach_files")


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def prune_breaker_attempts() -> int:
    from . import breaker

    return breaker.prune()


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def send_mailbox_alerts(mailbox_audit_ids: list[int]) -> int:
    """Emails for mailbox link transitions (the outbox's `mailbox.alert`, right after the transition)."""
    from . import mailbox_alerts

    return mailbox_alerts.send_pending(audit_ids=mailbox_audit_ids)


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def check_mailbox_health() -> dict[str, int]:
    """Beat: raise or clear quiet-mailbox alarms, then email whatever transition is not emailed yet."""
    from intake import mailbox_health

    from . import mailbox_alerts

    counts = mailbox_health.check_quiet_mailboxes()
    counts["emailed"] = mailbox_alerts.send_pending()
    return counts


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def warn_expiring_credentials() -> int:
    """Beat: email the tenant's admins a week before a mailbox's OAuth credentials expire (once per expiry)."""
    from . import credential_warnings

    return credential_warnings.warn_expiring_credentials()


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def call_destination(intent_id: int) -> str:
    """One external destination call (ticketing.bulkhead), on the destinations queue's thread pool."""
    from . import bulkhead

    outcome = execution.call(intent_id, bulkhead.worker_identity())
    if outcome == Outcome.OVER_CAP:  # the destination's cap is full: come back shortly, the intent waits pending
        bulkhead.hand_over(intent_id, countdown=bulkhead.cap_wait_seconds())
    return outcome

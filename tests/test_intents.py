"""The intent state machine against FakeDesk over real HTTP (in-process worker calls).

The same windows with separate worker processes and SIGKILL are in
test_failure_windows.py; these pin down each transition's rules.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from intake.models import AuditEvent, InboxEvent
from tests.factories import make_desk_destination, make_event
from ticketing import budget, intents
from ticketing.models import Intent, TicketMapping
from ticketing.services import process_inbox_event


@pytest.fixture
def zendesk(tenant, mailbox, desk, monkeypatch):
    """Make FakeDesk (speaking Zendesk; `desk` is the FakeDesk plugin's fixture) the tenant's default destination."""
    return make_desk_destination(tenant, desk, monkeypatch)


def new_event(mailbox) -> int:
    return make_event(mailbox).pk


def intent_of(event_id) -> Intent:
    return Intent.objects.get(inbox_event_id=event_id, action="create_ticket")


def make_due(event_id):
    Intent.objects.filter(inbox_event_id=event_id).update(next_attempt_at=timezone.now() - timedelta(seconds=1))


def creates(desk):
    return [r for r in desk.requests_log() if r["method"] == "POST"]


def test_happy_path_creates_one_ticket_with_our_external_ref(zendesk, mailbox, desk):
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "created"
    assert process_inbox_event(event_id) == "done"
    intent = intent_of(event_id)
    [ticket] = desk.tickets()
    assert ticket["external_id"] == intent.external_ref
    assert TicketMapping.objects.get(inbox_event_id=event_id).ticket_id == str(ticket["id"])
    assert InboxEvent.objects.get(pk=event_id).state == "completed"
    assert intent.state == "succeeded" and intent.attempts == 1


def test_422_fails_with_invalid_fields_kept_and_no_retry(zendesk, mailbox, desk):
    desk.set_plan(["reject_422"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "failed"
    event, intent = InboxEvent.objects.get(pk=event_id), intent_of(event_id)
    assert (event.state, event.reason_code) == ("failed", "invalid_fields")
    assert "Requester email is invalid" in event.reason_detail
    assert intent.state == "failed" and intent.next_attempt_at is None
    assert intents.enqueue_due(lost_after_seconds=0) == 0
    assert process_inbox_event(event_id) == "done"
    assert desk.tickets() == [] and len(creates(desk)) == 1


def test_401_fails_with_credentials_and_no_retry(zendesk, mailbox, desk):
    desk.set_plan(["unauthorized_401"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "failed"
    assert InboxEvent.objects.get(pk=event_id).reason_code == "credentials"
    assert intents.enqueue_due(lost_after_seconds=0) == 0
    assert len(creates(desk)) == 1


def test_429_waits_at_least_retry_after_then_succeeds(zendesk, mailbox, desk):
    desk.set_plan(["rate_limit:2"])
    event_id = new_event(mailbox)
    before = timezone.now()
    assert process_inbox_event(event_id) == "retry_wait"
    intent = intent_of(event_id)
    assert intent.next_attempt_at >= before + timedelta(seconds=2)
    assert process_inbox_event(event_id) == "busy"  # not due yet: no request sent
    assert intents.enqueue_due() == 0
    make_due(event_id)
    budget.forget(zendesk)  # the Retry-After has passed for every worker too (ticketing.budget)
    assert intents.enqueue_due() == 1
    assert process_inbox_event(event_id) == "created"
    assert len(desk.tickets()) == 1 and len(creates(desk)) == 2


def test_transient_failures_past_the_cap_fail_with_retries_exhausted(zendesk, mailbox, desk):
    zendesk.settings["max_attempts"] = 3
    zendesk.save()
    desk.set_plan(["unavailable_503:0"] * 3)
    event_id = new_event(mailbox)
    outcomes = []
    for _ in range(3):
        outcomes.append(process_inbox_event(event_id))
        make_due(event_id)
    assert outcomes == ["retry_wait", "retry_wait", "failed"]
    event = InboxEvent.objects.get(pk=event_id)
    assert (event.state, event.reason_code) == ("failed", "retries_exhausted")


def test_drop_after_commit_with_idempotency_retries_with_the_same_key(zendesk, mailbox, desk):
    desk.set_plan(["drop_after_commit"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"
    assert InboxEvent.objects.get(pk=event_id).state == "unknown"
    assert intents.resolve_unknown(intent_of(event_id).pk) == "pending"
    assert process_inbox_event(event_id) == "created"
    log = creates(desk)
    assert len(log) == 2 and log[0]["idempotency_key"] == log[1]["idempotency_key"]
    assert log[1]["idempotency_lookup"] == "hit"
    assert len(desk.tickets()) == 1
    assert TicketMapping.objects.get(inbox_event_id=event_id).ticket_id == str(desk.tickets()[0]["id"])


def test_drop_after_commit_without_idempotency_is_found_by_external_id(zendesk, mailbox, desk):
    zendesk.settings["idempotency_supported"] = False
    zendesk.save()
    desk.set_idempotency(enabled=False)
    desk.set_plan(["drop_after_commit"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"
    assert intents.resolve_unknown(intent_of(event_id).pk) == "succeeded"
    assert process_inbox_event(event_id) == "done"
    assert len(creates(desk)) == 1 and len(desk.tickets()) == 1
    assert InboxEvent.objects.get(pk=event_id).state == "completed"


def test_drop_before_commit_without_idempotency_is_retried_after_lookup_finds_nothing(zendesk, mailbox, desk):
    zendesk.settings["idempotency_supported"] = False
    zendesk.save()
    desk.set_idempotency(enabled=False)
    desk.set_plan(["drop_before_commit"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"
    assert intents.resolve_unknown(intent_of(event_id).pk) == "pending"
    assert process_inbox_event(event_id) == "created"
    assert len(desk.tickets()) == 1


def test_idempotency_window_passed_resolves_by_lookup_not_by_retry(zendesk, mailbox, desk):
    desk.set_plan(["drop_after_commit"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"
    Intent.objects.filter(inbox_event_id=event_id).update(created_at=timezone.now() - timedelta(hours=3))
    assert intents.resolve_unknown(intent_of(event_id).pk) == "succeeded"
    assert len(creates(desk)) == 1


def test_no_idempotency_and_no_lookup_is_held_with_one_create(zendesk, mailbox, desk):
    zendesk.settings.update({"idempotency_supported": False, "lookup_supported": False})
    zendesk.save()
    desk.set_idempotency(enabled=False)
    desk.set_plan(["stall_after_commit:2"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"
    assert intents.resolve_unknown(intent_of(event_id).pk) == "held"
    assert intents.resolve_unknown(intent_of(event_id).pk) == ""
    assert intents.enqueue_due(lost_after_seconds=0) == 0
    assert process_inbox_event(event_id) == "done"
    event = InboxEvent.objects.get(pk=event_id)
    assert (event.state, event.reason_code) == ("unknown", "outcome_unknown")
    assert intent_of(event_id).state == "held"
    assert len(creates(desk)) == 1


def test_expired_claim_becomes_unknown_and_a_late_success_still_counts(zendesk, mailbox, desk):
    event_id = new_event(mailbox)
    process_inbox_event(event_id)  # completes
    other = new_event(mailbox)
    intent = intents.ensure_intent(InboxEvent.objects.get(pk=other), "create_ticket", zendesk)
    assert intents.claim(intent.pk, worker="worker-a")
    Intent.objects.filter(pk=intent.pk).update(claimed_until=timezone.now() - timedelta(seconds=1))
    assert intents.expire_claims() == 1
    assert intents.expire_claims() == 0
    assert intent_of(other).state == "unknown"
    assert InboxEvent.objects.get(pk=other).reason_code == "claim_expired"
    # Nothing was sent for it: the lookup finds nothing, the intent is retried with its key.
    assert intents.resolve_unknown(intent.pk) == "pending"
    assert process_inbox_event(other) == "created"
    assert len(desk.tickets()) == 2


def test_a_worker_whose_claim_was_taken_over_sends_nothing(zendesk, mailbox, desk):
    event_id = new_event(mailbox)
    event = InboxEvent.objects.get(pk=event_id)
    intent = intents.ensure_intent(event, "create_ticket", zendesk)
    assert intents.claim(intent.pk, worker="worker-a")
    assert not intents.claim(intent.pk, worker="worker-b")
    Intent.objects.filter(pk=intent.pk).update(claimed_until=timezone.now() + timedelta(seconds=0.5))
    # worker-a's claim is about to run out: it must not start a request it cannot finish in time.
    assert not intents.still_claimed(intent.pk, "worker-a", margin_seconds=1.0)
    assert intents.still_claimed(intent.pk, "worker-a", margin_seconds=0)
    assert not intents.still_claimed(intent.pk, "worker-b")


def test_every_transition_leaves_an_audit_row(zendesk, mailbox, desk):
    desk.set_plan(["rate_limit:0", "drop_after_commit"])
    event_id = new_event(mailbox)
    process_inbox_event(event_id)
    make_due(event_id)
    intents.enqueue_due()
    process_inbox_event(event_id)
    intents.resolve_unknown(intent_of(event_id).pk)
    process_inbox_event(event_id)
    kinds = list(AuditEvent.objects.filter(inbox_event_id=event_id).order_by("at", "pk").values_list("kind", flat=True))
    # The test mail carries no trusted authentication results: its acknowledgment is skipped, and says so.
    assert kinds == [
        "received",
        "classified",
        "intent_retry_wait",
        "intent_unknown",
        "intent_pending",
        "ticket_created",
        "acknowledgment_skipped",
    ]

"""The circuit breaker per destination (ticketing.breaker): it pauses a broken destination by itself, the
items wait instead of failing one by one, the tenant's admins are emailed, and only a person resumes."""

import pytest
from django.test import Client

from intake.failures import TransientError
from intake.models import InboxEvent
from intake.vocabulary import ReasonCode
from tests.smtp import smtp_server  # noqa: F401  (fixture)
from tests.support.pause import PAUSES_URL, drain_outbox, toggle
from tests.support.queue import new_event, set_default, zendesk_destinations
from tests.support.users import make_user
from ticketing import breaker, intents
from ticketing.models import Destination, DestinationAttempt, Intent, Notification
from ticketing.services import process_inbox_event


@pytest.fixture
def bad_desk(tenant, mailbox, desk, monkeypatch, scanner_off):
    good, bad = zendesk_destinations(tenant, desk, monkeypatch)
    set_default(tenant, bad)
    return bad


def test_credential_failures_pause_the_destination_items_wait_and_a_persons_resume_lets_them_through(
    tenant, mailbox, bad_desk, desk, monkeypatch, smtp_server
):
    admin = make_user("boss", groups=["mailroom-admin"], tenants=[tenant])
    make_user("stranger", groups=["mailroom-admin"])  # another tenant's admin: not told
    ids = [new_event(mailbox, subject=f"Help #{n}", sender="jane.doe@customer.test") for n in range(5)]

    # The first two fail as before; the third trips the breaker and waits; later ones wait on the pause.
    assert drain_outbox() == {"failed": 2, "retry_wait": 1, "paused": 2}
    bad = Destination.objects.get(pk=bad_desk.pk)
    assert bad.paused and bad.paused_by == "system:breaker" and bad.paused_at is not None
    assert "3 consecutive credentials failures" in bad.paused_reason
    states = dict(InboxEvent.objects.filter(pk__in=ids).values_list("pk", "reason_code"))
    assert [states[i] for i in ids] == ["credentials", "credentials", "", "", ""]
    assert Intent.objects.get(inbox_event_id=ids[2]).state == Intent.State.RETRY_WAIT
    assert not Intent.objects.filter(inbox_event_id__in=ids[2:], state=Intent.State.FAILED).exists()
    assert len(desk.requests_log()) == 3  # nothing called after the trip

    # Once, to the tenant's admins: no message content, no full address.
    [email] = smtp_server.messages
    assert email["To"] == admin.email and "desk-bad" in email["Subject"]
    text = email.get_content()
    assert "credentials" in text and "/admin/reconciliation/pauseswitch/" in text
    assert "jane.doe@customer.test" not in text and "Help #" not in text
    assert Notification.objects.filter(kind="breaker", destination=bad).count() == 1

    # Later failures while paused (a call that was already in flight) wait too, and trip nothing again.
    assert breaker.observe_failure(bad, TransientError(ReasonCode.UNAVAILABLE)) is True
    assert len(smtp_server.messages) == 1

    # The console shows who paused it and why; nothing drains until a person resumes.
    client = Client()
    client.force_login(make_user("fixer", groups=["mailroom-admin", "operator"], tenants=[tenant]))
    assert "system:breaker" in client.get(PAUSES_URL).content.decode()
    assert drain_outbox() == {}
    monkeypatch.setenv("FAKEDESK_BAD_CREDENTIALS", f"agent@acme.test/token:{desk.token}")  # fixed
    assert toggle(client, "destination", False, bad.pk).status_code == 302
    bad.refresh_from_db()
    assert not bad.paused and bad.paused_reason == "" and bad.paused_by == "" and bad.paused_at is None
    assert not DestinationAttempt.objects.filter(destination=bad).exists()
    intents.enqueue_due()  # beat: the waiting intent is due at once
    assert drain_outbox() == {"created": 3}
    completed = InboxEvent.objects.filter(pk__in=ids, state=InboxEvent.State.COMPLETED)
    assert set(completed.values_list("pk", flat=True)) == set(ids[2:])


def test_a_persons_pause_is_recorded_and_the_breaker_can_be_turned_off(tenant, mailbox, bad_desk, smtp_server):
    Destination.objects.filter(pk=bad_desk.pk).update(settings={**bad_desk.settings, "breaker": {"enabled": False}})
    ids = [new_event(mailbox, subject=f"Help #{n}") for n in range(4)]
    assert [process_inbox_event(event_id) for event_id in ids] == ["failed"] * 4
    assert not Destination.objects.get(pk=bad_desk.pk).paused and not smtp_server.messages

    client = Client()
    client.force_login(make_user("boss", groups=["mailroom-admin"], tenants=[tenant]))
    toggle(client, "destination", True, bad_desk.pk)
    bad = Destination.objects.get(pk=bad_desk.pk)
    assert bad.paused and bad.paused_by == "user:boss" and bad.paused_at is not None


def test_a_high_failure_rate_over_the_window_trips_the_breaker(tenant, mailbox, smtp_server):
    destination = Destination.objects.get(tenant=tenant)
    destination.settings = {"breaker": {"min_attempts": 10, "failure_rate": 0.5, "window_seconds": 600}}
    for _ in range(5):
        breaker.record_success(destination)
    for n in range(4):
        assert breaker.observe_failure(destination, TransientError(ReasonCode.UNAVAILABLE)) is False, n
    assert breaker.observe_failure(destination, TransientError(ReasonCode.UNAVAILABLE)) is True  # 5 of 10
    destination.refresh_from_db()
    assert destination.paused and destination.paused_by == "system:breaker"
    assert "5 of the last 10 attempts failed" in destination.paused_reason


def test_failures_that_say_nothing_about_the_destination_never_trip_it(tenant):
    from intake.failures import AmbiguousOutcome, PermanentError

    destination = Destination.objects.create(
        tenant=tenant, slug="busy-desk", kind="zendesk", base_url="http://127.0.0.1:9", is_default=False
    )
    # What a busy but healthy desk answers (the seeded soak's mix): 429s, timeouts after the
    # request was sent, one message's invalid fields — and a few successes.
    for _ in range(6):
        assert not breaker.observe_failure(destination, TransientError(ReasonCode.RATE_LIMITED, "HTTP 429"))
        assert not breaker.observe_failure(destination, AmbiguousOutcome(ReasonCode.TIMEOUT, "read timed out"))
        assert not breaker.observe_failure(destination, PermanentError(ReasonCode.INVALID_FIELDS, "HTTP 422"))
    breaker.record_success(destination)
    destination.refresh_from_db()
    assert not destination.paused
    assert DestinationAttempt.objects.filter(destination=destination, ok=False).count() == 0
    # A real outage does: 5xx before processing, over half of at least ten calls.
    for _ in range(10):
        tripped = breaker.observe_failure(destination, TransientError(ReasonCode.UNAVAILABLE, "HTTP 503"))
    destination.refresh_from_db()
    assert tripped and destination.paused and destination.paused_by == "system:breaker"

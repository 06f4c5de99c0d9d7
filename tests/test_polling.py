"""The polling service with providers defined here (no network): cursor, backoff, credentials, lock,
beat schedules, the Celery task and the admin's "poll now" and health display."""

import json
import threading
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from intake import services
from intake.channels import polling, schedules
from intake.failures import PermanentError, TransientError
from intake.keys import message_id_from_raw
from intake.models import InboxEvent, Mailbox, OutboxMessage, PollCursor, Tenant
from intake.providers.base import FetchedMessage, PollBatch, Provider
from tests.mail import make_message
from tests.support.locks import IN_THIS_DATABASE


class ScriptedProvider(Provider):
    """Answers each `poll` with the next step of a script: a PollBatch, or an exception to raise.

    Every cursor it was handed is recorded, to prove where each poll started.
    """

    name = "scripted"
    supports_polling = True

    def __init__(self, mailbox, script):
        super().__init__(mailbox)
        self.script = script
        self.cursors_seen = []
        self.closed = 0

    def poll(self, cursor):
        self.cursors_seen.append(dict(cursor))
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def close(self):
        self.closed += 1


def batch(messages, position, more=False):
    return PollBatch(
        [FetchedMessage(message_id_from_raw(raw), raw) for raw in messages], {"position": position}, more=more
    )


@pytest.fixture
def polled_mailbox(tenant):
    return Mailbox.objects.create(
        tenant=tenant,
        slug="polled",
        address="help@acme.test",
        provider="imap",
        poll_enabled=True,
        settings={"host": "imap.invalid"},
    )


@pytest.fixture
def use_provider(monkeypatch):
    """Make the polling service use a ScriptedProvider with the given script; returns it."""

    def install(script):
        provider_holder = {}

        def provider_for(mailbox):
            provider = ScriptedProvider(mailbox, script)
            provider_holder.setdefault("all", []).append(provider)
            return provider

        monkeypatch.setattr(polling, "provider_for", provider_for)
        return provider_holder

    return install


def cursor_of(mailbox):
    return PollCursor.objects.get(mailbox=mailbox).value


def test_503_three_times_then_200_backs_off_keeps_the_cursor_and_then_delivers(polled_mailbox, use_provider):
    messages = [make_message(subject=f"Request {n}") for n in range(4)]
    script = [TransientError("http 503", "service unavailable") for _ in range(3)] + [batch(messages, 4)]
    providers = use_provider(script)

    delays = []
    for _attempt in range(3):
        report = polling.poll_mailbox(polled_mailbox.pk, trigger="manual")
        assert report.status == "backoff" and "http 503" in report.detail
        mailbox = Mailbox.objects.get(pk=polled_mailbox.pk)
        assert mailbox.health == "backoff" and mailbox.poll_backoff_until > timezone.now()
        assert cursor_of(mailbox) == {}  # never skipped past anything
        assert not InboxEvent.objects.exists()
        delays.append((mailbox.poll_backoff_until - mailbox.last_polled_at).total_seconds())
    # Each failure in a row waits about twice as long as the one before.
    assert delays[0] >= polling.BACKOFF_BASE_SECONDS
    assert delays[1] >= 1.9 * delays[0] and delays[2] >= 1.9 * delays[1]

    report = polling.poll_mailbox(polled_mailbox.pk, trigger="manual")
    assert (report.status, report.new) == ("ok", 4)
    assert [p.cursors_seen for p in providers["all"]] == [[{}], [{}], [{}], [{}]]
    assert cursor_of(polled_mailbox) == {"position": 4}
    assert sorted(InboxEvent.objects.values_list("provider_message_id", flat=True)) == sorted(
        message_id_from_raw(m) for m in messages
    )
    mailbox = Mailbox.objects.get(pk=polled_mailbox.pk)
    assert (mailbox.health, mailbox.health_detail, mailbox.poll_backoff_until) == ("ok", "", None)
    assert all(p.closed == 1 for p in providers["all"])


def test_scheduled_and_pushed_polls_wait_for_the_backoff_manual_ones_do_not(polled_mailbox, use_provider):
    use_provider([TransientError("http 429", retry_after=600), batch([], 0), batch([], 0)])
    report = polling.poll_mailbox(polled_mailbox.pk, trigger="schedule")
    assert report.status == "backoff"
    # Retry-After is honoured.
    assert report.backoff_until - timezone.now() > timedelta(seconds=590)

    for trigger in ("schedule", "push"):
        skipped = polling.poll_mailbox(polled_mailbox.pk, trigger=trigger)
        assert skipped.status == "skipped" and "backing off" in skipped.detail and skipped.batches == 0
    assert polling.poll_mailbox(polled_mailbox.pk, trigger="manual").status == "ok"
    # Healthy again: the schedule polls.
    assert polling.poll_mailbox(polled_mailbox.pk, trigger="schedule").status == "ok"


def test_refused_credentials_mark_the_mailbox_and_stop_polling_until_reset(polled_mailbox, use_provider):
    providers = use_provider(
        [PermanentError("credentials", "AUTHENTICATIONFAILED for help@acme.test"), batch([make_message()], 1)]
    )
    report = polling.poll_mailbox(polled_mailbox.pk)
    assert report.status == "credentials_invalid"
    mailbox = Mailbox.objects.get(pk=polled_mailbox.pk)
    assert mailbox.health == "credentials_invalid" and mailbox.poll_backoff_until is None
    assert "AUTHENTICATIONFAILED" in mailbox.health_detail and "help@acme.test" not in mailbox.health_detail
    assert cursor_of(mailbox) == {} and not InboxEvent.objects.exists()

    for trigger in ("schedule", "push", "manual"):
        assert polling.poll_mailbox(polled_mailbox.pk, trigger=trigger).status == "credentials_invalid"
    assert len(providers["all"]) == 1, "no provider was even built for a mailbox with refused credentials"

    polling.reset_health([mailbox.pk])
    assert polling.poll_mailbox(polled_mailbox.pk).new == 1


def test_other_permanent_failures_back_off_the_longest(polled_mailbox, use_provider):
    use_provider([PermanentError("folder", "folder 'Support' does not exist")])
    report = polling.poll_mailbox(polled_mailbox.pk)
    assert report.status == "backoff" and "folder" in report.detail
    assert report.backoff_until - timezone.now() > timedelta(seconds=polling.BACKOFF_MAX_SECONDS - 5)


def test_cursor_advances_batch_by_batch_and_never_past_a_failed_batch(polled_mailbox, use_provider):
    first, second = [make_message() for _ in range(3)], [make_message() for _ in range(3)]
    providers = use_provider(
        [batch(first, 3, more=True), batch(second, 6, more=True), TransientError("connection", "reset by peer")]
    )
    report = polling.poll_mailbox(polled_mailbox.pk)
    assert report.status == "backoff" and report.new == 6
    assert cursor_of(polled_mailbox) == {"position": 6}
    assert providers["all"][0].cursors_seen == [{}, {"position": 3}, {"position": 6}]


def test_a_crash_while_ingesting_a_batch_leaves_the_cursor_before_it(polled_mailbox, use_provider, monkeypatch):
    messages = [make_message(subject=f"Request {n}") for n in range(5)]
    use_provider([batch(messages, 5), batch(messages, 5)])
    real_ingest = services.ingest_batch

    def failing_ingest(**kwargs):
        real_ingest(**kwargs)
        raise RuntimeError("worker died here")

    monkeypatch.setattr(services, "ingest_batch", failing_ingest)
    with pytest.raises(RuntimeError):
        polling.poll_mailbox(polled_mailbox.pk)
    # The batch and its cursor are one transaction: the messages ingested before the crash went with it.
    assert InboxEvent.objects.count() == 0
    assert cursor_of(polled_mailbox) == {}

    monkeypatch.setattr(services, "ingest_batch", real_ingest)
    report = polling.poll_mailbox(polled_mailbox.pk)
    assert (report.new, report.duplicates) == (5, 0)
    assert InboxEvent.objects.count() == 5 and cursor_of(polled_mailbox) == {"position": 5}


def test_a_poll_is_bounded_and_queues_a_follow_up_for_the_rest(polled_mailbox, use_provider):
    use_provider([batch([make_message()], n, more=True) for n in range(1, 4)])
    report = polling.poll_mailbox(polled_mailbox.pk, max_batches=2)
    assert (report.status, report.batches, report.new, report.more) == ("ok", 2, 2, True)
    assert cursor_of(polled_mailbox) == {"position": 2}
    follow_up = OutboxMessage.objects.filter(topic=services.POLL_TOPIC).get()
    assert follow_up.payload == {"mailbox_id": polled_mailbox.pk}


def test_mailboxes_whose_provider_does_not_poll_are_not_polled(tenant):
    raw = Mailbox.objects.create(tenant=tenant, slug="raw-only", address="raw@acme.test", provider="raw")
    assert polling.poll_mailbox(raw.pk, trigger="manual").status == "unsupported"
    assert polling.poll_mailbox(10**9).status == "missing"


def test_schedule_trigger_respects_poll_enabled(polled_mailbox, use_provider):
    use_provider([batch([], 0)])
    Mailbox.objects.filter(pk=polled_mailbox.pk).update(poll_enabled=False)
    assert polling.poll_mailbox(polled_mailbox.pk, trigger="schedule").status == "skipped"
    assert polling.poll_mailbox(polled_mailbox.pk, trigger="push").status == "ok"


@pytest.mark.django_db(transaction=True)
def test_two_polls_of_one_mailbox_never_overlap(monkeypatch):
    tenant = Tenant.objects.create(slug="locks")
    mailbox = Mailbox.objects.create(
        tenant=tenant, slug="locked", address="l@locks.test", provider="imap", poll_enabled=True
    )
    other = Mailbox.objects.create(
        tenant=tenant, slug="unlocked", address="u@locks.test", provider="imap", poll_enabled=True
    )
    entered, release = threading.Event(), threading.Event()
    active, peak = [], []

    class SlowProvider(Provider):
        supports_polling = True

        def poll(self, cursor):
            active.append(self.mailbox.pk)
            peak.append(active.count(self.mailbox.pk))
            if self.mailbox.pk == mailbox.pk:
                entered.set()
                assert release.wait(10)
            active.remove(self.mailbox.pk)
            return PollBatch([FetchedMessage(f"id-{cursor.get('n', 0)}", make_message())], {"n": 1})

    monkeypatch.setattr(polling, "provider_for", SlowProvider)
    results = {}

    def first_poll():
        try:
            results["first"] = polling.poll_mailbox(mailbox.pk)
        finally:
            connection.close()

    thread = threading.Thread(target=first_poll)
    thread.start()
    try:
        assert entered.wait(10)
        second = polling.poll_mailbox(mailbox.pk, trigger="manual")
        assert (second.status, second.batches) == ("locked", 0)
        assert polling.poll_mailbox(other.pk).status == "ok", "the lock is per mailbox"
    finally:
        release.set()
        thread.join(10)
    assert results["first"].status == "ok" and max(peak) == 1
    # Released with the poll: the next one runs.
    assert polling.poll_mailbox(mailbox.pk).status == "ok"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND {IN_THIS_DATABASE}",
            [polling.LOCK_NAMESPACE],
        )
        assert cursor.fetchone()[0] == 0


# --- beat -----------------------------------------------------------------------------------------


def test_a_polling_mailbox_gets_one_periodic_poll_kept_in_step_with_it(tenant):
    mailbox = Mailbox.objects.create(
        tenant=tenant, slug="beat", address="b@acme.test", provider="imap", poll_enabled=True
    )
    task = PeriodicTask.objects.get(name=schedules.task_name(mailbox.pk))
    assert task.task == "intake.tasks.poll_mailbox" and task.enabled
    assert json.loads(task.kwargs) == {"mailbox_id": mailbox.pk, "trigger": "schedule"}
    assert (task.interval.every, task.interval.period) == (60, "seconds")

    mailbox.settings = {"poll_seconds": 15}
    mailbox.save()
    task.refresh_from_db()
    assert (task.interval.every, task.enabled, task.expire_seconds) == (15, True, 15)

    mailbox.poll_enabled = False
    mailbox.save()
    task.refresh_from_db()
    assert not task.enabled
    mailbox.poll_enabled = True
    mailbox.save()
    task.refresh_from_db()
    assert task.enabled
    assert PeriodicTask.objects.filter(task="intake.tasks.poll_mailbox").count() == 1

    mailbox.delete()
    assert not PeriodicTask.objects.filter(name=schedules.task_name(mailbox.pk)).exists()


def test_no_periodic_poll_for_mailboxes_that_do_not_poll(tenant):
    raw = Mailbox.objects.create(tenant=tenant, slug="raw", address="r@acme.test", provider="raw", poll_enabled=True)
    quiet = Mailbox.objects.create(tenant=tenant, slug="quiet", address="q@acme.test", provider="imap")
    assert not PeriodicTask.objects.filter(
        name__in=[schedules.task_name(raw.pk), schedules.task_name(quiet.pk)]
    ).exists()


def test_the_celery_task_runs_the_service_with_beat_and_outbox_payloads(polled_mailbox, use_provider):
    from intake import tasks

    use_provider([batch([make_message()], 1), batch([], 1)])
    beat_kwargs = json.loads(PeriodicTask.objects.get(name=schedules.task_name(polled_mailbox.pk)).kwargs)
    result = tasks.poll_mailbox.apply(kwargs=beat_kwargs).get()
    assert (result["status"], result["new"]) == ("ok", 1)
    # The outbox's mailbox.poll payload (the relay passes it as kwargs).
    result = tasks.poll_mailbox.apply(kwargs={"mailbox_id": polled_mailbox.pk}).get()
    assert (result["status"], result["new"], result["cursor"]) == ("ok", 0, {"position": 1})


# --- admin ----------------------------------------------------------------------------------------


@pytest.fixture
def admin_client(db):
    user = get_user_model().objects.create_superuser("root", "root@acme.test", "pw")
    client = Client()
    client.force_login(user)
    return client


def test_admin_poll_now_queues_a_manual_poll_and_shows_health(admin_client, polled_mailbox, tenant):
    raw = Mailbox.objects.create(tenant=tenant, slug="raw-box", address="raw@acme.test", provider="raw")
    response = admin_client.post(
        "/admin/intake/mailbox/", {"action": "poll_now", "_selected_action": [polled_mailbox.pk, raw.pk]}, follow=True
    )
    assert response.status_code == 200
    payloads = list(OutboxMessage.objects.filter(topic=services.POLL_TOPIC).values_list("payload", flat=True))
    assert payloads == [{"mailbox_id": polled_mailbox.pk, "trigger": "manual"}]
    text = response.content.decode()
    assert "Poll queued for polled" in text and "raw-box (provider raw does not poll)" in text

    Mailbox.objects.filter(pk=polled_mailbox.pk).update(
        health="credentials_invalid", health_detail="permanent: credentials: refused"
    )
    page = admin_client.get("/admin/intake/mailbox/").content.decode()
    assert "Credentials Invalid: polling stopped" in page and "permanent: credentials: refused" in page
    response = admin_client.post(
        "/admin/intake/mailbox/", {"action": "poll_now", "_selected_action": [polled_mailbox.pk]}, follow=True
    )
    assert "credentials invalid" in response.content.decode()
    assert OutboxMessage.objects.filter(topic=services.POLL_TOPIC).count() == 1

    admin_client.post("/admin/intake/mailbox/", {"action": "reset_health", "_selected_action": [polled_mailbox.pk]})
    mailbox = Mailbox.objects.get(pk=polled_mailbox.pk)
    assert (mailbox.health, mailbox.health_detail) == ("ok", "")
    detail = admin_client.get(f"/admin/intake/mailbox/{polled_mailbox.pk}/change/").content.decode()
    assert "last polled" in detail.lower()


def test_admin_saving_new_credentials_lifts_credentials_invalid(admin_client, polled_mailbox):
    Mailbox.objects.filter(pk=polled_mailbox.pk).update(health="credentials_invalid", health_detail="refused")
    form = {
        "tenant": polled_mailbox.tenant_id,
        "slug": "polled",
        "address": "help@acme.test",
        "provider": "imap",
        "webhook_secret_ref": "",
        "settings": json.dumps({"host": "imap.invalid"}),
        "allowed_recipients": "[]",
        "poll_enabled": "on",
        "credentials_ref": "env:SOME_OTHER_PASSWORD",
    }
    response = admin_client.post(f"/admin/intake/mailbox/{polled_mailbox.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[-2000:]
    mailbox = Mailbox.objects.get(pk=polled_mailbox.pk)
    assert (mailbox.credentials_ref, mailbox.health, mailbox.health_detail) == ("env:SOME_OTHER_PASSWORD", "ok", "")

    # Any other edit leaves a refused mailbox refused.
    Mailbox.objects.filter(pk=polled_mailbox.pk).update(health="credentials_invalid", health_detail="refused")
    admin_client.post(f"/admin/intake/mailbox/{polled_mailbox.pk}/change/", {**form, "poll_enabled": ""})
    mailbox.refresh_from_db()
    assert not mailbox.poll_enabled and mailbox.health == "credentials_invalid"


def test_unusable_settings_back_off_instead_of_crashing(polled_mailbox):
    Mailbox.objects.filter(pk=polled_mailbox.pk).update(settings={"host": "imap.invalid", "port": "not-a-port"})
    report = polling.poll_mailbox(polled_mailbox.pk)
    assert report.status == "backoff" and "settings" in report.detail

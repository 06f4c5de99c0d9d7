"""A mailbox's link state (intake.mailbox_health), its emails (ticketing.mailbox_alerts), the quiet-mailbox alarm
(intake.quiet) and the per-mailbox series of /metrics (reconciliation.mailbox_metrics)."""

import threading
from datetime import timedelta

import pytest
from django.core import mail
from django.db import connection
from django.test import Client
from django.utils import timezone

from intake import mailbox_health, quiet
from intake.models import InboxEvent, Mailbox, MailboxAudit, OutboxMessage
from intake.providers.settings_schema import settings_errors
from intake.relay import TOPIC_TASKS
from tests.factories import make_event, make_mailbox, make_tenant
from tests.support.metrics import TOKEN, scrape, value
from tests.support.users import make_user
from ticketing import mailbox_alerts, tasks
from ticketing.models import Notification

Link, Kind = Mailbox.Link, MailboxAudit.Kind
LINK_KINDS = (Kind.LINK_FAILING, Kind.LINK_DOWN, Kind.LINK_RECOVERED)


@pytest.fixture
def admins(tenant):
    """The tenant's admin (emailed) and an agent of the tenant (not emailed)."""
    return make_user("ann", groups=["mailroom-admin"], tenants=[tenant]), make_user("otto", tenants=[tenant])


def fail(mailbox, at=None, permanent=False, detail="connection: [Errno 111] Connection refused"):
    return mailbox_health.record_poll_failure(mailbox, at=at or timezone.now(), detail=detail, permanent=permanent)


def succeed(mailbox, at=None, messages=0):
    return mailbox_health.record_poll_success(mailbox, at=at or timezone.now(), messages=messages)


def link_rows(mailbox):
    return list(
        MailboxAudit.objects.filter(mailbox=mailbox, kind__in=LINK_KINDS).order_by("pk").values_list("kind", flat=True)
    )


def fresh(mailbox):
    return Mailbox.objects.get(pk=mailbox.pk)


# --- transitions ------------------------------------------------------------------------------------------


def test_the_first_failure_makes_the_mailbox_failing_with_one_audit_row_and_counters_moved_in_sql(mailbox):
    audit = fail(mailbox)
    assert audit.kind == Kind.LINK_FAILING and audit.detail["from"] == "up" and audit.detail["failures"] == 1
    box = fresh(mailbox)
    assert (box.link_state, box.poll_failures, box.poll_errors_total) == ("failing", 1, 1)
    assert box.link_state_since == audit.at
    assert OutboxMessage.objects.filter(topic="mailbox.alert", payload={"mailbox_audit_id": audit.pk}).count() == 1


def test_three_failures_in_a_row_make_it_down_and_further_failures_only_count(mailbox):
    assert fail(mailbox).kind == Kind.LINK_FAILING
    assert fail(mailbox) is None
    assert fail(mailbox).kind == Kind.LINK_DOWN
    assert fail(mailbox) is None and fail(mailbox) is None
    box = fresh(mailbox)
    assert (box.link_state, box.poll_failures, box.poll_errors_total) == ("down", 5, 5)
    assert link_rows(mailbox) == [Kind.LINK_FAILING, Kind.LINK_DOWN]


def test_a_refused_credential_makes_it_down_at_once_and_twice_is_still_one_audit_row(mailbox):
    assert fail(mailbox, permanent=True, detail="credentials: AUTHENTICATIONFAILED").kind == Kind.LINK_DOWN
    assert fail(mailbox, permanent=True) is None
    assert link_rows(mailbox) == [Kind.LINK_DOWN]
    assert fresh(mailbox).link_state == "down"


def test_failing_for_longer_than_the_limit_makes_it_down_before_the_third_failure(mailbox, settings):
    settings.MAILROOM_MAILBOX_DOWN_AFTER_MINUTES = 30
    start = timezone.now() - timedelta(hours=1)
    fail(mailbox, at=start)
    assert fail(mailbox, at=start + timedelta(minutes=10)) is None
    assert fail(mailbox, at=start + timedelta(minutes=31)).kind == Kind.LINK_DOWN


def test_failing_after_can_ask_for_more_failures_before_failing(mailbox, settings):
    settings.MAILROOM_MAILBOX_FAILING_AFTER, settings.MAILROOM_MAILBOX_DOWN_AFTER = 2, 4
    assert fail(mailbox) is None and fresh(mailbox).link_state == "up"
    assert fail(mailbox).kind == Kind.LINK_FAILING
    assert fail(mailbox) is None
    assert fail(mailbox).kind == Kind.LINK_DOWN


def test_a_success_after_down_recovers_then_up_silently_once_the_recovered_period_is_over(mailbox, settings):
    settings.MAILROOM_MAILBOX_RECOVERED_SECONDS = 600
    start = timezone.now() - timedelta(hours=1)
    for minute in range(3):
        fail(mailbox, at=start + timedelta(minutes=minute))
    audit = succeed(mailbox, at=start + timedelta(minutes=5), messages=2)
    assert audit.kind == Kind.LINK_RECOVERED and audit.detail == {"from": "down", "to": "recovered", "failures": 3}
    box = fresh(mailbox)
    assert (box.link_state, box.poll_failures, box.poll_errors_total) == ("recovered", 0, 3)
    assert box.last_success_at == start + timedelta(minutes=5)
    assert succeed(mailbox, at=start + timedelta(minutes=10)) is None and fresh(mailbox).link_state == "recovered"
    assert succeed(mailbox, at=start + timedelta(minutes=16)) is None and fresh(mailbox).link_state == "up"
    assert link_rows(mailbox) == [Kind.LINK_FAILING, Kind.LINK_DOWN, Kind.LINK_RECOVERED]
    assert succeed(mailbox) is None  # up stays up: nothing written
    assert len(link_rows(mailbox)) == 3


def test_a_failure_while_recovered_counts_as_from_up(mailbox):
    fail(mailbox)
    succeed(mailbox)
    audit = fail(mailbox)
    assert audit.kind == Kind.LINK_FAILING and audit.detail["from"] == "recovered"


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_failure_reports_make_one_transition(tenant, monkeypatch):
    mailbox = make_mailbox(tenant, slug="racy", address="racy@acme.test")
    barrier, results = threading.Barrier(2), []

    def report():
        try:
            barrier.wait()
            results.append(fail(Mailbox.objects.get(pk=mailbox.pk)))
        finally:
            connection.close()

    threads = [threading.Thread(target=report) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(str(getattr(r, "kind", None)) for r in results) == ["None", "link_failing"]
    box = fresh(mailbox)
    assert (box.link_state, box.poll_failures, box.poll_errors_total) == ("failing", 2, 2)
    assert link_rows(mailbox) == [Kind.LINK_FAILING]


# --- emails -----------------------------------------------------------------------------------------------


def test_down_and_recovered_are_emailed_once_each_to_the_tenant_s_admins_and_failing_is_not(mailbox, admins):
    fail(mailbox)
    assert mailbox_alerts.send_pending() == 0 and mail.outbox == []  # failing: not by default
    fail(mailbox)
    fail(mailbox)
    assert mailbox_alerts.send_pending() == 1
    assert mailbox_alerts.send_pending() == 0  # a second run (two beats) sends nothing more
    succeed(mailbox)
    assert tasks.check_mailbox_health()["emailed"] == 1
    assert mailbox_alerts.send_pending() == 0
    assert [m.subject for m in mail.outbox] == [
        "[Mailroom] mailbox acme/support is down",
        "[Mailroom] mailbox acme/support recovered",
    ]
    assert all(m.to == ["ann@staff.test"] for m in mail.outbox)
    down = mail.outbox[0].body
    assert "Failed polls in a row: 3" in down and "Connection refused" in down
    assert f"/admin/intake/mailbox/{mailbox.pk}/change/" in down
    assert all(mailbox.address not in m.body and mailbox.address not in m.subject for m in mail.outbox)
    notes = Notification.objects.filter(kind=Notification.Kind.MAILBOX_HEALTH).order_by("pk")
    assert [n.key for n in notes] == [
        f"mailbox-link:{pk}"
        for pk in MailboxAudit.objects.filter(kind__in=(Kind.LINK_DOWN, Kind.LINK_RECOVERED))
        .order_by("pk")
        .values_list("pk", flat=True)
    ]
    assert all(n.mailbox_id == mailbox.pk for n in notes)


def test_failing_is_emailed_when_configured_and_a_recovery_from_failing_only_then(mailbox, admins, settings):
    fail(mailbox)
    succeed(mailbox)
    assert mailbox_alerts.send_pending() == 0  # a blip: failing then recovered, nobody bothered
    settings.MAILROOM_MAILBOX_ALERT_FAILING = True
    fail(mailbox)
    succeed(mailbox)
    assert mailbox_alerts.send_pending() == 4  # the earlier pair is still within the day, then the new pair
    assert [m.subject for m in mail.outbox] == [
        "[Mailroom] mailbox acme/support is failing",
        "[Mailroom] mailbox acme/support recovered",
    ] * 2


def test_an_error_detail_with_an_address_is_masked_in_the_audit_and_the_email(mailbox, admins):
    audit = fail(mailbox, permanent=True, detail="credentials: login refused for jane.doe@acme.test")
    assert "jane.doe@acme.test" not in str(audit.detail)
    mailbox_alerts.send_pending()
    assert len(mail.outbox) == 1 and "jane.doe@acme.test" not in mail.outbox[0].body


def test_the_outbox_topic_runs_the_alert_task_for_just_that_row(mailbox, admins):
    assert TOPIC_TASKS["mailbox.alert"] == ("ticketing.tasks.send_mailbox_alerts", "mailbox_audit_id")
    first = fail(mailbox, permanent=True)
    other = make_mailbox(mailbox.tenant, slug="other", address="other@acme.test")
    fail(other, permanent=True)
    assert tasks.send_mailbox_alerts([first.pk]) == 1
    assert [m.subject for m in mail.outbox] == ["[Mailroom] mailbox acme/support is down"]


def test_a_drill_tenant_s_mailboxes_are_never_emailed_about(db, admins):
    drill = make_tenant(slug="drill-x", is_drill=True)
    box = make_mailbox(drill, slug="drill-box", address="box@drill-x.test")
    make_user("dora", groups=["mailroom-admin"], tenants=[drill])
    fail(box, permanent=True)
    assert mailbox_alerts.send_pending() == 0 and mail.outbox == []


# --- the quiet-mailbox alarm ------------------------------------------------------------------------------


def synthetic_history(mailbox, *, every: timedelta, count: int, last_at):
    """`count` events `every` apart, the newest at `last_at` (stored through ingest, then dated)."""
    for n in range(count):
        event = make_event(mailbox, subject=f"Order {n}")
        InboxEvent.objects.filter(pk=event.pk).update(received_at=last_at - every * (count - 1 - n))


def test_the_time_weighted_percentile_sees_the_long_night_among_many_short_gaps():
    day = [300.0] * 168 + [36000.0]  # every 5 minutes for 14 hours, then a 10-hour night
    assert quiet.weighted_percentile(day, 0.95) == 36000.0
    assert quiet.weighted_percentile([3600.0] * 10, 0.95) == 3600.0
    assert quiet.weighted_percentile([], 0.95) == 0.0


def test_a_quiet_alarm_is_raised_from_the_mailbox_s_own_rhythm_emailed_once_and_cleared_by_new_mail(
    mailbox, admins, settings
):
    settings.MAILROOM_QUIET_MIN_HOURS, settings.MAILROOM_QUIET_FACTOR = 1, 1.5
    now = timezone.now()
    synthetic_history(mailbox, every=timedelta(hours=2), count=168, last_at=now - timedelta(hours=2))
    assert quiet.threshold_hours(mailbox, now=now) == pytest.approx(3.0)
    assert mailbox_health.check_quiet_mailboxes(now=now)["raised"] == 0  # 2 h silent: usual

    later = now + timedelta(hours=1, minutes=5)  # 3 h 5 min silent
    Mailbox.objects.filter(pk=mailbox.pk).update(link_state=Link.DOWN)
    assert mailbox_health.check_quiet_mailboxes(now=later)["raised"] == 0  # down is the alarm already
    Mailbox.objects.filter(pk=mailbox.pk).update(link_state=Link.UP)
    assert mailbox_health.check_quiet_mailboxes(now=later)["raised"] == 1
    assert mailbox_health.check_quiet_mailboxes(now=later)["raised"] == 0  # raised once
    assert fresh(mailbox).quiet_alarm_since == later
    mailbox_alerts.send_pending(now=later)
    mailbox_alerts.send_pending(now=later)
    assert [m.subject for m in mail.outbox] == ["[Mailroom] mailbox acme/support has been unusually quiet"]
    assert "No message for more than 3.0 hours" in mail.outbox[0].body
    assert Notification.objects.get().kind == Notification.Kind.QUIET_MAILBOX

    make_event(mailbox, subject="Finally, an order")
    assert mailbox_health.check_quiet_mailboxes()["cleared"] == 1
    assert fresh(mailbox).quiet_alarm_since is None
    mailbox_alerts.send_pending()
    assert mail.outbox[-1].subject == "[Mailroom] mailbox acme/support receives mail again"
    assert list(MailboxAudit.objects.filter(mailbox=mailbox).order_by("pk").values_list("kind", flat=True)) == [
        Kind.QUIET_ALARM,
        Kind.QUIET_CLEARED,
    ]


def test_a_polled_message_clears_the_quiet_alarm_at_once(mailbox):
    mailbox_health.raise_quiet_alarm(mailbox, at=timezone.now(), last_message_at=None, threshold_hours=6)
    succeed(mailbox, messages=0)
    assert fresh(mailbox).quiet_alarm_since is not None
    succeed(mailbox, messages=1)
    assert fresh(mailbox).quiet_alarm_since is None


def test_a_low_traffic_mailbox_has_no_quiet_alarm_unless_its_settings_ask_for_one(mailbox):
    now = timezone.now()
    synthetic_history(mailbox, every=timedelta(hours=12), count=28, last_at=now - timedelta(days=3))  # 2 a day
    assert quiet.threshold_hours(mailbox, now=now) is None
    assert mailbox_health.check_quiet_mailboxes(now=now) == {"raised": 0, "cleared": 0, "watched": 0}

    Mailbox.objects.filter(pk=mailbox.pk).update(settings={"quiet_alarm": {"after_hours": 48}})
    assert quiet.threshold_hours(fresh(mailbox), now=now) == 48
    assert mailbox_health.check_quiet_mailboxes(now=now)["raised"] == 1

    Mailbox.objects.filter(pk=mailbox.pk).update(settings={"quiet_alarm": {"enabled": False}})
    assert mailbox_health.check_quiet_mailboxes(now=now)["cleared"] == 1
    assert MailboxAudit.objects.get(kind=Kind.QUIET_CLEARED).detail == {"reason": "alarm off for this mailbox"}


def test_the_quiet_alarm_settings_are_checked_like_every_mailbox_setting():
    assert settings_errors("raw", {"quiet_alarm": {"enabled": True, "after_hours": 8}}) == {}
    errors = settings_errors("raw", {"quiet_alarm": {"enabled": "yes", "after_hours": -1, "when": 1}})
    assert list(errors) == ["quiet_alarm"] and len(errors["quiet_alarm"]) == 3


# --- /metrics and the admin -------------------------------------------------------------------------------


def test_metrics_show_each_mailbox_s_link_errors_messages_and_last_success_but_no_drill_mailbox(mailbox, settings):
    settings.MAILROOM_METRICS_TOKEN = TOKEN
    drill = make_tenant(slug="drill-y", is_drill=True)
    make_mailbox(drill, slug="drill-box", address="box@drill-y.test")
    make_event(mailbox)
    make_event(mailbox)
    at = timezone.now()
    succeed(mailbox, at=at)
    samples = scrape()
    labels = {"tenant": "acme", "mailbox": "support"}
    assert value(samples, "mailroom_mailbox_up", **labels) == 1
    assert value(samples, "mailroom_mailbox_messages_total", **labels) == 2
    assert value(samples, "mailroom_mailbox_poll_errors_total", **labels) == 0
    assert value(samples, "mailroom_mailbox_last_success_timestamp_seconds", **labels) == pytest.approx(at.timestamp())
    fail(mailbox, permanent=True)
    samples = scrape()
    assert value(samples, "mailroom_mailbox_up", **labels) == 0
    assert value(samples, "mailroom_mailbox_poll_errors_total", **labels) == 1
    assert value(samples, "mailroom_mailbox_link_state", **labels, state="down") == 1
    assert value(samples, "mailroom_mailbox_link_state", **labels, state="up") == 0
    assert value(samples, "mailroom_mailbox_quiet", **labels) == 0
    assert not any(dict(key[1]).get("tenant") == "drill-y" for key in samples)


def test_the_mailbox_admin_list_and_page_show_the_connection(mailbox, admins):
    fail(mailbox)
    fail(mailbox)
    client = Client()
    client.force_login(admins[0])
    listing = client.get("/admin/intake/mailbox/").content.decode()
    assert "mailbox-link-failing" in listing and "(2 failed in a row)" in listing
    page = client.get(f"/admin/intake/mailbox/{mailbox.pk}/change/").content.decode()
    assert "failed polls (total)" in page.lower() and "mailbox-link-failing" in page
    assert 'name="link_state"' not in page  # moved only by intake.mailbox_health

"""The acceptance of issue 25 for mailbox health, against a real Dovecot: a mailbox polled from a stopped server goes
failing -> down (one email) -> recovered (one email), and /metrics shows each step."""

import pytest
from celery import current_app
from django.core import mail

from intake.models import Mailbox, MailboxAudit, OutboxMessage
from intake.relay import TOPIC_TASKS
from tests.conftest import WEBHOOK_SECRET
from tests.dovecot import private_dovecot  # noqa: F401  (fixture)
from tests.mail import make_message
from tests.support.imap import make_imap_box
from tests.support.metrics import TOKEN, scrape, value
from tests.support.users import make_user
from ticketing import mailbox_alerts, tasks  # noqa: F401  (tasks: registered, as a worker's autodiscovery does)
from ticketing.models import Notification

pytestmark = pytest.mark.django_db(transaction=True)
LABELS = {"tenant": "acme", "mailbox": "imap-support"}


def step(box) -> tuple:
    """(link state, up, poll errors) after a manual poll (manual: the backoff does not skip it)."""
    samples = scrape()
    state = Mailbox.objects.get(pk=box.mailbox.pk).link_state
    return (
        state,
        value(samples, "mailroom_mailbox_up", **LABELS),
        value(samples, "mailroom_mailbox_poll_errors_total", **LABELS),
    )


def test_a_mailbox_polled_from_a_stopped_dovecot_goes_failing_down_and_recovered_with_one_email_each(
    private_dovecot, tenant, monkeypatch, settings
):  # noqa: F811
    settings.MAILROOM_METRICS_TOKEN = TOKEN
    monkeypatch.setenv("MAILROOM_TEST_WEBHOOK_SECRET", WEBHOOK_SECRET)
    make_user("ann", groups=["mailroom-admin"], tenants=[tenant])
    box = make_imap_box(private_dovecot, tenant, monkeypatch)
    box.append([make_message(subject="Before the outage")])

    assert box.poll(trigger="manual").new == 1
    assert step(box) == ("up", 1, 0)
    assert value(scrape(), "mailroom_mailbox_messages_total", **LABELS) == 1

    private_dovecot.stop()
    assert box.poll(trigger="manual").status == "backoff"
    assert step(box) == ("failing", 0, 1)
    mailbox_alerts.send_pending()
    assert mail.outbox == []  # failing alone is not emailed (MAILROOM_MAILBOX_ALERT_FAILING)
    for _attempt in range(2):
        assert box.poll(trigger="manual").status == "backoff"
    assert step(box) == ("down", 0, 3)
    assert box.poll(trigger="manual").status == "backoff"
    assert step(box) == ("down", 0, 4)
    mailbox_alerts.send_pending()
    mailbox_alerts.send_pending()  # the beat's run and the outbox's: still one email
    assert [m.subject for m in mail.outbox] == ["[Mailroom] mailbox acme/imap-support is down"]
    assert box.username not in mail.outbox[0].body and box.password not in mail.outbox[0].body

    private_dovecot.start()
    box.append([make_message(subject="During the outage")])
    report = box.poll(trigger="manual")
    assert (report.status, report.new) == ("ok", 1)
    assert step(box) == ("recovered", 1, 4)
    mailbox_alerts.send_pending()
    assert [m.subject for m in mail.outbox] == [
        "[Mailroom] mailbox acme/imap-support is down",
        "[Mailroom] mailbox acme/imap-support recovered",
    ]
    samples = scrape()
    assert value(samples, "mailroom_mailbox_messages_total", **LABELS) == 2
    assert value(samples, "mailroom_mailbox_last_success_timestamp_seconds", **LABELS) == pytest.approx(
        Mailbox.objects.get(pk=box.mailbox.pk).last_success_at.timestamp()
    )
    assert list(MailboxAudit.objects.filter(mailbox=box.mailbox).order_by("pk").values_list("kind", flat=True)) == [
        "link_failing",
        "link_down",
        "link_recovered",
    ]
    assert Notification.objects.filter(kind=Notification.Kind.MAILBOX_HEALTH).count() == 2


def test_refused_credentials_make_the_mailbox_down_at_once_and_its_outbox_row_emails_the_admins(
    private_dovecot, tenant, monkeypatch, settings
):  # noqa: F811
    """The email right after the transition: the outbox row `mailbox.alert` names the task (by name, as the relay
    publishes it) that sends, as a worker would run it, before any beat."""
    monkeypatch.setenv("MAILROOM_TEST_WEBHOOK_SECRET", WEBHOOK_SECRET)
    make_user("ann", groups=["mailroom-admin"], tenants=[tenant])
    box = make_imap_box(private_dovecot, tenant, monkeypatch)
    monkeypatch.setenv(box.password_var, "not-the-password")
    assert box.poll(trigger="manual").status == "credentials_invalid"
    assert Mailbox.objects.get(pk=box.mailbox.pk).link_state == "down"  # refused credentials: down at once
    rows = OutboxMessage.objects.filter(topic="mailbox.alert", published_at__isnull=True)
    task_name, id_field = TOPIC_TASKS["mailbox.alert"]
    assert current_app.tasks[task_name]([row.payload[id_field] for row in rows]) == 1
    assert [m.subject for m in mail.outbox] == ["[Mailroom] mailbox acme/imap-support is down"]
    assert "AUTHENTICATIONFAILED" in mail.outbox[0].body and "not-the-password" not in mail.outbox[0].body

"""IMAP polling against a real Dovecot on 127.0.0.1 (tests/dovecot.py).

Read-only (EXAMINE, BODY.PEEK[]), cursor (UIDVALIDITY, last UID) stored after
each committed batch, overlap, date-bounded resync after a UIDVALIDITY change,
a poll SIGKILLed mid-batch, the same message by the raw webhook and by IMAP,
a server that is down, refused credentials, and `manage.py poll_mailbox`.
"""

import io
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from intake.keys import message_id_from_raw
from intake.models import InboxEvent, Mailbox, PollCursor
from tests.conftest import WEBHOOK_SECRET
from tests.dovecot import dovecot, private_dovecot  # noqa: F401  (fixtures)
from tests.live import MANAGE, PYTHON, REPO_ROOT, subprocess_env, wait_for, wait_for_other_sessions_to_end
from tests.mail import make_message, webhook_headers
from tests.support.imap import FOLDER, make_imap_box


@pytest.fixture
def imap_box(dovecot, tenant, monkeypatch):  # noqa: F811
    monkeypatch.setenv("MAILROOM_TEST_WEBHOOK_SECRET", WEBHOOK_SECRET)
    return make_imap_box(dovecot, tenant, monkeypatch)


def message_ids(messages) -> list[str]:
    return [message_id_from_raw(raw) for raw in messages]


def stored_ids(mailbox) -> list[str]:
    return list(InboxEvent.objects.filter(mailbox=mailbox).values_list("provider_message_id", flat=True))


def test_poll_takes_every_message_once_in_bounded_batches_and_leaves_them_unseen(imap_box):
    imap_box.mailbox.settings["batch_size"] = 12
    imap_box.mailbox.save()
    first, second = (
        [make_message(subject=f"Request {n}") for n in range(30)],
        [make_message(subject=f"Later request {n}") for n in range(10)],
    )
    imap_box.append(first)

    report = imap_box.poll()
    assert (report.status, report.new, report.duplicates, report.batches) == ("ok", 30, 0, 3)
    assert sorted(stored_ids(imap_box.mailbox)) == sorted(message_ids(first))

    imap_box.append(second)
    again, idle = imap_box.poll(), imap_box.poll()
    assert (again.status, again.new, again.duplicates) == ("ok", 10, 0)
    assert (idle.status, idle.new, idle.duplicates, idle.batches) == ("ok", 0, 0, 1)

    ids = stored_ids(imap_box.mailbox)
    assert len(ids) == 40 and sorted(ids) == sorted(message_ids(first + second))
    uidvalidity, flags = imap_box.server_state()
    assert len(flags) == 40, "nothing was moved or deleted"
    assert all(b"\\Seen" not in f and b"\\Deleted" not in f for f in flags.values()), flags
    cursor = imap_box.cursor()
    assert (cursor["uidvalidity"], cursor["last_uid"]) == (uidvalidity, 40)
    # What is stored is exactly what the server holds.
    with imap_box.client() as client:
        client.select_folder(FOLDER, readonly=True)
        served = client.fetch([17], ["BODY.PEEK[]"])[17][b"BODY[]"]
    event = InboxEvent.objects.get(mailbox=imap_box.mailbox, provider_message_id=message_id_from_raw(served))
    assert bytes(event.raw) == served and event.source == "imap"
    mailbox = Mailbox.objects.get(pk=imap_box.mailbox.pk)
    assert mailbox.health == "ok" and mailbox.last_polled_at is not None


def test_recreated_folder_with_new_uidvalidity_resyncs_by_date_without_new_events(imap_box):
    messages = [make_message(subject=f"Request {n}") for n in range(40)]
    imap_box.append(messages)
    assert imap_box.poll().new == 40
    old_validity, _ = imap_box.server_state()

    with imap_box.client() as client:
        client.delete_folder(FOLDER)
        client.create_folder(FOLDER)
    imap_box.append(messages)
    # Never ingested, but received long before the resync window (sync_days, default 7): left alone.
    ancient = [make_message(subject=f"Old thread {n}") for n in range(2)]
    imap_box.append(ancient, when=datetime.now() - timedelta(days=30))
    new_validity, flags = imap_box.server_state()
    assert new_validity != old_validity and len(flags) == 42

    report = imap_box.poll()
    assert (report.status, report.new, report.duplicates) == ("ok", 0, 40)
    assert InboxEvent.objects.filter(mailbox=imap_box.mailbox).count() == 40
    cursor = imap_box.cursor()
    assert (cursor["uidvalidity"], cursor["last_uid"]) == (new_validity, 40)

    # After the resync, a message that arrives is taken as usual; the old ones still are not.
    fresh = make_message(subject="Arrived after the resync")
    imap_box.append([fresh])
    report = imap_box.poll()
    assert (report.new, report.duplicates) == (1, 0)
    assert message_id_from_raw(fresh) in stored_ids(imap_box.mailbox)
    assert not set(message_ids(ancient)) & set(stored_ids(imap_box.mailbox))
    assert all(b"\\Seen" not in f for f in imap_box.server_state()[1].values())


def test_each_poll_rereads_an_overlap_of_the_last_uids(imap_box):
    imap_box.mailbox.settings["overlap"] = 5
    imap_box.mailbox.save()
    imap_box.append([make_message(subject=f"Request {n}") for n in range(12)])
    assert imap_box.poll().new == 12
    cursor = imap_box.cursor()
    assert cursor["seen"] == [8, 9, 10, 11, 12]

    # A cursor that does not know which of the last UIDs it holds (as after a message that showed up
    # late under an old UID): the overlap is fetched again, and dedupe makes it free.
    PollCursor.objects.filter(mailbox=imap_box.mailbox).update(
        value={"uidvalidity": cursor["uidvalidity"], "last_uid": 12}
    )
    report = imap_box.poll()
    assert (report.new, report.duplicates) == (0, 5)
    assert sorted(m.provider_message_id for m in report.messages) == sorted(
        InboxEvent.objects.filter(mailbox=imap_box.mailbox)
        .order_by("-id")
        .values_list("provider_message_id", flat=True)[:5]
    )
    assert imap_box.cursor()["seen"] == [8, 9, 10, 11, 12]
    assert imap_box.poll().messages == []  # known overlap UIDs are not fetched again
    assert InboxEvent.objects.filter(mailbox=imap_box.mailbox).count() == 12


@pytest.mark.django_db(transaction=True)
def test_poll_sigkilled_mid_batch_then_run_again_loses_nothing_and_doubles_nothing(dovecot, monkeypatch, tmp_path):  # noqa: F811
    from intake.models import Tenant

    tenant = Tenant.objects.create(slug="killed", name="Killed")
    box = make_imap_box(dovecot, tenant, monkeypatch, slug="imap-killed")
    messages = [make_message(subject=f"Request {n}") for n in range(40)]
    box.append(messages)

    pause = tmp_path / "pause"
    env = subprocess_env(MAILROOM_PAUSE_AT=f"poll.ingested.7:{pause}", **{box.password_var: box.password})
    log = open(tmp_path / "poll.log", "wb")
    poller = subprocess.Popen(
        [PYTHON, MANAGE, "poll_mailbox", "imap-killed", "--batch-size", "5"],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(lambda: Path(f"{pause}.reached").exists() or poller.poll() is not None, timeout=30)
        assert poller.poll() is None, (tmp_path / "poll.log").read_text()
        # Paused in the second batch: the first batch and its cursor are committed; the second batch is one
        # transaction with its cursor, so its two ingested messages are not visible (nor stored, once killed).
        assert InboxEvent.objects.filter(mailbox=box.mailbox).count() == 5
        assert box.cursor()["last_uid"] == 5
        poller.kill()
        poller.wait(timeout=10)
    finally:
        if poller.poll() is None:
            poller.kill()
            poller.wait(timeout=10)
        log.close()
    wait_for_other_sessions_to_end()  # the killed poller's session, and with it its poll lock, is gone
    assert box.cursor()["last_uid"] == 5

    out = io.StringIO()
    call_command("poll_mailbox", "imap-killed", "--batch-size", "5", stdout=out)
    assert "35 new, 0 duplicate" in out.getvalue()
    ids = stored_ids(box.mailbox)
    assert len(ids) == 40 and sorted(ids) == sorted(message_ids(messages))
    assert box.cursor()["last_uid"] == 40
    assert all(b"\\Seen" not in f for f in box.server_state()[1].values())


def test_the_raw_webhook_refuses_an_imap_mailbox_and_the_poll_stores_the_message_once(imap_box):
    # The raw webhook is only for raw mailboxes: pushing into an IMAP mailbox with its secret is a 404
    # (as for an unknown mailbox), nothing stored; the mailbox's own channel, the poll, delivers it once.
    client, url = Client(), f"/webhooks/raw/{imap_box.mailbox.slug}/"
    pushed = make_message(subject="Sent to both channels")
    response = client.post(url, data=pushed, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, pushed))
    assert response.status_code == 404 and response.json() == {"error": "unknown mailbox"}
    assert not InboxEvent.objects.filter(mailbox=imap_box.mailbox).exists()
    imap_box.append([pushed])
    report = imap_box.poll()
    assert (report.new, report.duplicates) == (1, 0)
    imap_box.append([pushed])  # the same message again (a client's second copy): one event
    report = imap_box.poll()
    assert (report.new, report.duplicates) == (0, 1)
    assert InboxEvent.objects.filter(mailbox=imap_box.mailbox).count() == 1


def test_server_down_backs_off_with_the_cursor_untouched_then_messages_arrive(private_dovecot, tenant, monkeypatch):  # noqa: F811
    box = make_imap_box(private_dovecot, tenant, monkeypatch)
    messages = [make_message(subject=f"Request {n}") for n in range(5)]
    box.append(messages[:2])
    assert box.poll().new == 2
    cursor_before = box.cursor()
    box.append(messages[2:])

    private_dovecot.stop()
    for _attempt in range(3):
        report = box.poll(trigger="manual")
        assert report.status == "backoff" and "connection" in report.detail
        assert box.cursor() == cursor_before
    mailbox = Mailbox.objects.get(pk=box.mailbox.pk)
    assert mailbox.health == "backoff" and mailbox.poll_backoff_until > timezone.now()
    assert "connection" in mailbox.health_detail
    # The beat's poll waits for the backoff to pass instead of hammering the provider.
    assert box.poll(trigger="schedule").status == "skipped"
    with pytest.raises(CommandError, match="backoff.*connection"):
        call_command("poll_mailbox", box.mailbox.slug, stdout=io.StringIO())
    assert box.cursor() == cursor_before

    private_dovecot.start()
    Mailbox.objects.filter(pk=box.mailbox.pk).update(poll_backoff_until=timezone.now() - timedelta(seconds=1))
    report = box.poll(trigger="schedule")
    assert (report.status, report.new, report.duplicates) == ("ok", 3, 0)
    assert sorted(stored_ids(box.mailbox)) == sorted(message_ids(messages))
    assert box.cursor()["last_uid"] == 5
    mailbox.refresh_from_db()
    assert (mailbox.health, mailbox.health_detail, mailbox.poll_backoff_until) == ("ok", "", None)


def test_refused_credentials_stop_polling_until_health_is_reset(imap_box, monkeypatch):
    imap_box.append([make_message(subject="Waiting behind a bad password")])
    monkeypatch.setenv(imap_box.password_var, "not-the-password")

    report = imap_box.poll()
    assert report.status == "credentials_invalid"
    mailbox = Mailbox.objects.get(pk=imap_box.mailbox.pk)
    assert mailbox.health == "credentials_invalid" and "AUTHENTICATIONFAILED" in mailbox.health_detail
    assert "not-the-password" not in mailbox.health_detail and imap_box.username not in mailbox.health_detail
    assert not InboxEvent.objects.filter(mailbox=mailbox).exists()
    assert imap_box.cursor() == {}

    # Fixing the secret alone changes nothing: nobody polls a mailbox whose credentials were refused…
    monkeypatch.setenv(imap_box.password_var, imap_box.password)
    for trigger in ("schedule", "push", "manual"):
        skipped = imap_box.poll(trigger=trigger)
        assert skipped.status == "credentials_invalid" and skipped.batches == 0
    assert not InboxEvent.objects.filter(mailbox=mailbox).exists()

    # …until an admin resets its health.
    from intake.channels.polling import reset_health

    reset_health([mailbox.pk])
    assert imap_box.poll().new == 1
    assert Mailbox.objects.get(pk=mailbox.pk).health == "ok"
    assert all(b"\\Seen" not in f for f in imap_box.server_state()[1].values())


def test_poll_mailbox_command_prints_what_it_ingested(imap_box):
    messages = [make_message(subject=f"Request {n}") for n in range(3)]
    imap_box.append(messages)
    out = io.StringIO()
    call_command("poll_mailbox", imap_box.mailbox.slug, stdout=out)
    lines = out.getvalue().splitlines()
    events = InboxEvent.objects.filter(mailbox=imap_box.mailbox).order_by("id")
    assert [line.split()[:3] for line in lines[:3]] == [["new", "event", str(e.pk)] for e in events]
    assert lines[-1] == f"mailbox {imap_box.mailbox.slug}: ok, 3 new, 0 duplicate, 1 batch(es)"
    for message_id in message_ids(messages):  # Message-IDs look like addresses: printed masked
        assert message_id not in out.getvalue()

    out = io.StringIO()
    call_command("poll_mailbox", imap_box.mailbox.slug, stdout=out)
    assert out.getvalue().strip() == f"mailbox {imap_box.mailbox.slug}: ok, 0 new, 0 duplicate, 1 batch(es)"
    with pytest.raises(CommandError, match="no mailbox"):
        call_command("poll_mailbox", "no-such-mailbox")

"""`intake.services.ingest_batch`, the poller's one statement per batch: each message stored once with one
`received` audit row and one outbox row, whatever repeats inside the batch or meets stored events; a crash
before the batch's commit stores none of it. And the per-event INFO line, sampled and off by default."""

import logging

import pytest
from django.test import Client

from intake import services
from intake.channels import polling
from intake.keys import message_id_from_raw
from intake.models import AuditEvent, InboxEvent, Mailbox, OutboxMessage, PollCursor
from intake.providers.base import FetchedMessage, PollBatch, Provider
from tests.conftest import WEBHOOK_SECRET
from tests.mail import make_message, webhook_headers


def item(raw):
    return services.IngestItem(message_id_from_raw(raw), raw)


def stored_rows(mailbox):
    events = list(InboxEvent.objects.filter(mailbox=mailbox).order_by("pk").values_list("pk", flat=True))
    audits = sorted(
        AuditEvent.objects.filter(inbox_event_id__in=events, kind="received").values_list("inbox_event_id", flat=True)
    )
    outbox = sorted(
        p["inbox_event_id"]
        for p in OutboxMessage.objects.filter(topic=services.PROCESS_TOPIC).values_list("payload", flat=True)
    )
    return events, audits, outbox


@pytest.fixture
def polled(tenant):
    return Mailbox.objects.create(
        tenant=tenant,
        slug="batched",
        address="batched@acme.test",
        provider="imap",
        poll_enabled=True,
        settings={"host": "imap.invalid"},
    )


@pytest.mark.parametrize("embedded", [False, True], ids=["postgresql", "per-row (the SQLite path)"])
def test_duplicates_inside_the_batch_and_against_stored_events_are_stored_once(polled, settings, embedded):
    stored, new, twice = make_message(subject="Stored"), make_message(subject="New"), make_message(subject="Twice")
    reused_id = message_id_from_raw(twice).join("<>")
    other = make_message(subject="Another alert", message_id=reused_id)  # same Message-ID, other content
    first = services.ingest(polled, message_id_from_raw(stored), stored, source="imap")
    settings.USING_POSTGRES = not embedded  # the embedded default's path, here on PostgreSQL's tables

    results = services.ingest_batch(
        mailbox=polled, source="imap", items=[item(new), item(stored), item(twice), item(twice), item(other), item(new)]
    )

    assert [r.duplicate for r in results] == [False, True, False, True, False, True]
    assert results[1].inbox_event_id == first.inbox_event_id
    assert results[3].inbox_event_id == results[2].inbox_event_id
    assert results[5].inbox_event_id == results[0].inbox_event_id
    events, audits, outbox = stored_rows(polled)
    assert len(events) == 4 and sorted({r.inbox_event_id for r in results}) == events
    assert audits == events and outbox == events  # one audit and one outbox row per stored event
    reused = InboxEvent.objects.get(pk=results[4].inbox_event_id)
    assert reused.message_id_reused and reused.provider_message_id.startswith(message_id_from_raw(twice) + "#")
    assert AuditEvent.objects.get(inbox_event_id=reused.pk).detail == {
        "size": len(other),
        "message_id_reused": True,
        "first_event": results[2].inbox_event_id,
    }
    assert bytes(InboxEvent.objects.get(pk=results[0].inbox_event_id).raw) == new

    again = services.ingest_batch(mailbox=polled, source="imap", items=[item(new), item(other), item(stored)])
    assert [(r.inbox_event_id, r.duplicate) for r in again] == [
        (results[0].inbox_event_id, True),
        (results[4].inbox_event_id, True),
        (first.inbox_event_id, True),
    ]
    assert stored_rows(polled) == (events, audits, outbox)


def test_a_batch_of_history_keeps_the_flag_in_the_event_and_its_audit_row(polled):
    raw = make_message(subject="Old mail")
    (result,) = services.ingest_batch(
        mailbox=polled, source="imap", items=[services.IngestItem(message_id_from_raw(raw), raw, history=True)]
    )
    assert InboxEvent.objects.get(pk=result.inbox_event_id).history
    assert AuditEvent.objects.get(inbox_event_id=result.inbox_event_id).detail == {"size": len(raw), "history": True}


class OneBatchProvider(Provider):
    name = "one-batch"
    supports_polling = True
    messages: list[bytes] = []

    def poll(self, cursor):
        return PollBatch([FetchedMessage(message_id_from_raw(raw), raw) for raw in self.messages], {"position": 1})


def test_a_crash_between_the_statement_and_the_cursor_commit_stores_nothing(polled, monkeypatch):
    stored = make_message(subject="Already here")
    services.ingest(polled, message_id_from_raw(stored), stored, source="imap")
    fresh = [make_message(subject=f"Request {n}") for n in range(4)]
    OneBatchProvider.messages = [fresh[0], stored, fresh[1], fresh[0], fresh[2], fresh[3]]
    monkeypatch.setattr(polling, "provider_for", OneBatchProvider)
    real_batch = services.ingest_batch

    def statement_then_crash(**kwargs):
        real_batch(**kwargs)  # the statement ran; the poller dies before the cursor and the commit
        raise RuntimeError("poller died here")

    monkeypatch.setattr(services, "ingest_batch", statement_then_crash)
    with pytest.raises(RuntimeError):
        polling.poll_mailbox(polled.pk)
    assert InboxEvent.objects.filter(mailbox=polled).count() == 1
    assert PollCursor.objects.get(mailbox=polled).value == {}

    monkeypatch.setattr(services, "ingest_batch", real_batch)
    report = polling.poll_mailbox(polled.pk)
    assert (report.status, report.new, report.duplicates) == ("ok", 4, 2)
    events, audits, outbox = stored_rows(polled)
    assert len(events) == 5 and audits == events and outbox == events
    assert PollCursor.objects.get(mailbox=polled).value == {"position": 1}


def stored_lines(caplog):
    return [
        r
        for r in caplog.records
        if r.name == "intake.services.ingestion" and r.getMessage().startswith(("stored event", "duplicate delivery"))
    ]


def post_raw(body):
    return Client().post(
        "/webhooks/raw/support/", data=body, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, body)
    )


def test_the_door_logs_no_line_per_event_unless_sampled(mailbox, settings, caplog):
    caplog.set_level(logging.INFO)
    assert settings.MAILROOM_LOG_EVENT_SAMPLE == 0
    body = make_message()
    assert [post_raw(body).status_code for _ in range(2)] == [202, 200]
    assert stored_lines(caplog) == []

    settings.MAILROOM_LOG_EVENT_SAMPLE = 1  # every event
    body = make_message()
    assert [post_raw(body).status_code for _ in range(2)] == [202, 200]
    lines = [r.getMessage() for r in stored_lines(caplog)]
    assert len(lines) == 2 and lines[0].startswith("stored event") and lines[1].startswith("duplicate delivery")
    assert all(r.levelno == logging.INFO for r in stored_lines(caplog))

    caplog.clear()
    settings.MAILROOM_LOG_EVENT_SAMPLE = 3  # one event in three
    assert [post_raw(make_message()).status_code for _ in range(6)] == [202] * 6
    assert len(stored_lines(caplog)) == 2

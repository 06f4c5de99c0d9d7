"""The raw webhook contract (docs/design.md §2, step 1): one event per message, 401 stores nothing."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.test import Client

from intake.models import AuditEvent, InboxEvent, OutboxMessage
from intake.signing import sign
from tests.conftest import WEBHOOK_SECRET
from tests.mail import make_message, webhook_headers
from ticketing.models import Ticket, TicketMapping
from ticketing.services import process_inbox_event

URL = "/webhooks/raw/support/"


def post(client, body, **headers):
    return client.post(URL, data=body, content_type="message/rfc822", **headers)


def post_signed(client, body):
    return post(client, body, **webhook_headers(WEBHOOK_SECRET, body))


def test_first_delivery_is_accepted_and_stored_with_its_outbox_row(mailbox):
    body = make_message()
    response = post_signed(Client(), body)
    assert response.status_code == 202
    event_id = response.json()["inbox_event_id"]
    assert response.json() == {"inbox_event_id": event_id, "duplicate": False}
    event = InboxEvent.objects.get(pk=event_id)
    assert bytes(event.raw) == body and event.state == "received" and event.size == len(body)
    assert OutboxMessage.objects.get().payload == {"inbox_event_id": event_id}
    assert list(AuditEvent.objects.values_list("kind", flat=True)) == ["received"]


@pytest.mark.django_db(transaction=True)
def test_same_message_three_times_then_eight_concurrently_gives_one_event_and_one_ticket(mailbox):
    body = make_message()
    client = Client()
    sequential = [post_signed(client, body) for _ in range(3)]
    assert [r.status_code for r in sequential] == [202, 200, 200]
    event_id = sequential[0].json()["inbox_event_id"]
    assert all(r.json() == {"inbox_event_id": event_id, "duplicate": True} for r in sequential[1:])

    barrier = threading.Barrier(8)

    def concurrent_post(_):
        try:
            barrier.wait()
            return post_signed(Client(), body)
        finally:
            connection.close()

    with ThreadPoolExecutor(8) as pool:
        concurrent = list(pool.map(concurrent_post, range(8)))
    assert [r.status_code for r in concurrent] == [200] * 8
    assert {r.json()["inbox_event_id"] for r in concurrent} == {event_id}

    for _ in range(3):  # the task may be delivered more than once
        process_inbox_event(event_id)
    assert InboxEvent.objects.count() == 1
    assert Ticket.objects.count() == 1
    assert TicketMapping.objects.count() == 1
    assert InboxEvent.objects.get().state == "completed"


@pytest.mark.django_db(transaction=True)
def test_eight_concurrent_first_deliveries_store_one_event(mailbox):
    body = make_message()
    barrier = threading.Barrier(8)

    def concurrent_post(_):
        try:
            barrier.wait()
            return post_signed(Client(), body)
        finally:
            connection.close()

    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(concurrent_post, range(8)))
    assert sorted(r.status_code for r in responses) == [200] * 7 + [202]
    assert len({r.json()["inbox_event_id"] for r in responses}) == 1
    assert InboxEvent.objects.count() == 1 and OutboxMessage.objects.count() == 1


def test_distinct_messages_with_identical_subject_and_sender_are_two_events(mailbox):
    client = Client()
    first = post_signed(client, make_message(subject="Same"))
    second = post_signed(client, make_message(subject="Same"))
    assert first.status_code == second.status_code == 202
    assert first.json()["inbox_event_id"] != second.json()["inbox_event_id"]


def test_message_without_message_id_is_keyed_by_its_bytes(mailbox):
    body = b"From: a@example.com\r\nTo: support@acme.test\r\nSubject: no id\r\n\r\nhello\r\n"
    client = Client()
    assert post_signed(client, body).status_code == 202
    assert post_signed(client, body).status_code == 200
    assert post_signed(client, body + b"again\r\n").status_code == 202
    assert InboxEvent.objects.filter(provider_message_id__startswith="sha256:").count() == 2


def _bad_requests(body):
    now = int(time.time())
    good = webhook_headers(WEBHOOK_SECRET, body, now)
    return {
        "forged signature": {**good, "HTTP_X_MAILROOM_SIGNATURE": sign("not-the-secret", now, body)},
        "signature over another body": webhook_headers(WEBHOOK_SECRET, body + b"tampered", now),
        "timestamp 301 s old": webhook_headers(WEBHOOK_SECRET, body, now - 301),
        "timestamp 301 s ahead": webhook_headers(WEBHOOK_SECRET, body, now + 301),
        "missing signature": {"HTTP_X_MAILROOM_TIMESTAMP": str(now)},
        "missing timestamp": {"HTTP_X_MAILROOM_SIGNATURE": good["HTTP_X_MAILROOM_SIGNATURE"]},
        "missing both headers": {},
        "garbage timestamp": {**good, "HTTP_X_MAILROOM_TIMESTAMP": "yesterday"},
    }


@pytest.mark.parametrize("case", list(_bad_requests(b"x")))
def test_bad_signatures_get_401_and_store_nothing(mailbox, count_rows, case):
    body = make_message()
    before = count_rows()
    response = post(Client(), body, **_bad_requests(body)[case])
    assert response.status_code == 401
    assert count_rows() == before


def test_timestamp_299_seconds_old_is_still_accepted(mailbox):
    body = make_message()
    response = post(Client(), body, **webhook_headers(WEBHOOK_SECRET, body, int(time.time()) - 299))
    assert response.status_code == 202


def test_mailbox_whose_secret_is_missing_fails_closed(mailbox, count_rows, monkeypatch):
    monkeypatch.delenv("MAILROOM_TEST_WEBHOOK_SECRET")
    before = count_rows()
    body = make_message()
    assert post_signed(Client(), body).status_code == 401
    assert count_rows() == before


def test_unknown_mailbox_is_404(mailbox, count_rows):
    before = count_rows()
    body = make_message()
    response = Client().post("/webhooks/raw/nope/", data=body, content_type="message/rfc822",
                             **webhook_headers(WEBHOOK_SECRET, body))
    assert response.status_code == 404
    assert count_rows() == before


def test_body_over_the_limit_is_413_and_stores_nothing(mailbox, count_rows, settings):
    settings.MAILROOM_MAX_MESSAGE_BYTES = 4096
    body = make_message(body="x" * 5000)
    before = count_rows()
    response = post_signed(Client(), body)
    assert response.status_code == 413
    assert count_rows() == before
    small = make_message(body="small")
    assert post_signed(Client(), small).status_code == 202


def test_get_is_not_allowed(mailbox):
    assert Client().get(URL).status_code == 405


def test_paused_mailbox_still_stores_but_processing_waits(mailbox):
    mailbox.paused = True
    mailbox.save()
    response = post_signed(Client(), make_message())
    assert response.status_code == 202
    event_id = response.json()["inbox_event_id"]
    assert process_inbox_event(event_id) == "paused"
    assert InboxEvent.objects.get(pk=event_id).state == "received"
    mailbox.paused = False
    mailbox.save()
    assert process_inbox_event(event_id) == "created"
    assert Ticket.objects.count() == 1


def test_the_database_refuses_an_unknown_state_and_a_success_without_a_result(mailbox):
    from django.db import IntegrityError, transaction

    from ticketing.models import Intent

    event_id = post_signed(Client(), make_message()).json()["inbox_event_id"]
    with pytest.raises(IntegrityError), transaction.atomic():
        InboxEvent.objects.filter(pk=event_id).update(state="done-ish")
    process_inbox_event(event_id)
    intent = Intent.objects.get(inbox_event_id=event_id, action="create_ticket")
    with pytest.raises(IntegrityError), transaction.atomic():
        Intent.objects.filter(pk=intent.pk).update(result_ref="")
    with pytest.raises(IntegrityError), transaction.atomic():
        TicketMapping.objects.filter(inbox_event_id=event_id).update(ticket_id="")

"""The raw webhook contract (docs/design.md §2, step 1): one event per message, 401 stores nothing."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.test import Client

from intake.keys import content_fingerprint
from intake.models import AuditEvent, InboxEvent, OutboxMessage
from intake.signing import sign, sign_v2
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
    response = Client().post(
        "/webhooks/raw/nope/", data=body, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, body)
    )
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


def test_a_body_of_several_read_pieces_is_stored_byte_identical(mailbox, settings):
    from intake.models import InboxEvent
    from intake.views import BODY_PIECE_BYTES

    settings.MAILROOM_MAX_MESSAGE_BYTES = 3 * BODY_PIECE_BYTES
    body = make_message(body="line of a long report\n" * (BODY_PIECE_BYTES // 10))
    assert 2 * BODY_PIECE_BYTES < len(body) < 3 * BODY_PIECE_BYTES
    response = post_signed(Client(), body)
    assert response.status_code == 202
    assert bytes(InboxEvent.objects.get(pk=response.json()["inbox_event_id"]).raw) == body


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


# --- the v2 signature: the message id is signed too -------------------------------------------------------


def v1_headers(body, timestamp=None, **extra) -> dict:
    ts = int(time.time()) if timestamp is None else timestamp
    return {"HTTP_X_MAILROOM_TIMESTAMP": str(ts), "HTTP_X_MAILROOM_SIGNATURE": sign(WEBHOOK_SECRET, ts, body), **extra}


def v2_headers(body, message_id=None, timestamp=None) -> dict:
    return webhook_headers(WEBHOOK_SECRET, body, timestamp, message_id=message_id)


def test_v2_is_what_clients_send_and_it_signs_the_message_id(mailbox):
    body = make_message()
    headers = v2_headers(body, message_id="crm-4711")
    assert headers["HTTP_X_MAILROOM_SIGNATURE"].startswith("v2=")
    assert headers["HTTP_X_MAILROOM_MESSAGE_ID"] == "crm-4711"
    response = post(Client(), body, **headers)
    assert response.status_code == 202
    event = InboxEvent.objects.get(pk=response.json()["inbox_event_id"])
    assert "crm-4711" in event.provider_message_id  # the id the client chose, because it signed it
    assert post(Client(), body, **headers).json() == {"inbox_event_id": event.pk, "duplicate": True}


def test_v1_without_a_message_id_still_works_exactly_as_before(mailbox):
    body = make_message()
    first = post(Client(), body, **v1_headers(body))
    assert first.status_code == 202 and first.json()["duplicate"] is False
    event = InboxEvent.objects.get(pk=first.json()["inbox_event_id"])
    # The same key as v2 without the header gives: one message, one event, whichever scheme signed it.
    again = post(Client(), body, **v2_headers(body))
    assert again.status_code == 200 and again.json() == {"inbox_event_id": event.pk, "duplicate": True}


def test_a_captured_request_replayed_under_a_new_message_id_makes_no_new_event(mailbox, count_rows):
    client = Client()
    body = make_message()
    captured_v2 = v2_headers(body, message_id="crm-1")
    assert post(client, body, **captured_v2).status_code == 202
    other = make_message()
    captured_v1 = v1_headers(other)
    assert post(client, other, **captured_v1).status_code == 202
    unsigned_id = make_message()
    captured_v2_without_id = v2_headers(unsigned_id)
    assert post(client, unsigned_id, **captured_v2_without_id).status_code == 202
    before = count_rows()
    replays = {
        "v2, another id": {**captured_v2, "HTTP_X_MAILROOM_MESSAGE_ID": "crm-2"},
        "v2, the id dropped": {k: v for k, v in captured_v2.items() if k != "HTTP_X_MAILROOM_MESSAGE_ID"},
        "v2 signed without an id, one added": {**captured_v2_without_id, "HTTP_X_MAILROOM_MESSAGE_ID": "crm-3"},
    }
    bodies = {"v2, another id": body, "v2, the id dropped": body, "v2 signed without an id, one added": unsigned_id}
    for case, headers in replays.items():
        response = post(client, bodies[case], **headers)
        assert response.status_code == 401, case
        assert "inbox_event_id" not in response.json(), case
    # v1 does not sign the id, so the same bytes under an id added are the duplicate of the captured message.
    first_v1 = InboxEvent.objects.get(fingerprint=content_fingerprint(other)).pk
    for message_id in ("crm-4", "crm-5"):
        response = post(client, other, **{**captured_v1, "HTTP_X_MAILROOM_MESSAGE_ID": message_id})
        assert response.status_code == 200
        assert response.json() == {"inbox_event_id": first_v1, "duplicate": True}
    assert count_rows() == before
    # Replayed as captured (within the tolerance window), each is the duplicate it is.
    assert post(client, body, **captured_v2).json()["duplicate"] is True
    assert post(client, other, **v1_headers(other)).json()["duplicate"] is True
    assert InboxEvent.objects.count() == 3


def test_v1_with_a_message_id_keeps_the_contract_and_a_replay_under_another_id_is_a_duplicate(mailbox, count_rows):
    """The contract's v1 client sends its own X-Mailroom-Message-Id: that id is used, and the same request again is
    the duplicate. The same bytes under another id within the signature's window are the first's duplicate too
    (v1 does not cover the id); a different message under a new id is a new event."""
    client = Client()
    body = make_message()
    headers = v1_headers(body, HTTP_X_MAILROOM_MESSAGE_ID="crm-77")
    first = post(client, body, **headers)
    assert first.status_code == 202
    event = InboxEvent.objects.get(pk=first.json()["inbox_event_id"])
    assert "crm-77" in event.provider_message_id
    assert post(client, body, **headers).json() == {"inbox_event_id": event.pk, "duplicate": True}
    before = count_rows()
    replay = post(client, body, **{**headers, "HTTP_X_MAILROOM_MESSAGE_ID": "crm-78"})
    assert replay.status_code == 200 and replay.json() == {"inbox_event_id": event.pk, "duplicate": True}
    assert count_rows() == before
    other = make_message(subject="Another request")
    fresh = post(client, other, **v1_headers(other, HTTP_X_MAILROOM_MESSAGE_ID="crm-79"))
    assert fresh.status_code == 202 and fresh.json()["inbox_event_id"] != event.pk


def test_v1_and_v2_sent_together_verify_as_v2(mailbox):
    # A client during the deprecation period may send both (comma-separated): the v2 one must cover the id.
    body = make_message()
    ts = int(time.time())
    both = f"{sign(WEBHOOK_SECRET, ts, body)}, {sign_v2(WEBHOOK_SECRET, ts, 'crm-9', body)}"
    headers = {
        "HTTP_X_MAILROOM_TIMESTAMP": str(ts),
        "HTTP_X_MAILROOM_SIGNATURE": both,
        "HTTP_X_MAILROOM_MESSAGE_ID": "crm-9",
    }
    assert post(Client(), body, **headers).status_code == 202
    assert post(Client(), body, **{**headers, "HTTP_X_MAILROOM_MESSAGE_ID": "crm-10"}).status_code == 401


def test_a_forged_v2_signature_is_refused(mailbox, count_rows):
    body = make_message()
    ts = int(time.time())
    before = count_rows()
    for forged in (
        sign_v2("not-the-secret", ts, "", body),
        sign_v2(WEBHOOK_SECRET, ts, "", body + b"x"),
        "v2=" + "0" * 64,
        "v3=" + sign_v2(WEBHOOK_SECRET, ts, "", body)[3:],
    ):
        response = post(Client(), body, HTTP_X_MAILROOM_TIMESTAMP=str(ts), HTTP_X_MAILROOM_SIGNATURE=forged)
        assert response.status_code == 401 and response.json() == {"error": "invalid signature"}
    assert count_rows() == before


# --- only raw mailboxes take the raw webhook -------------------------------------------------------------


def test_the_raw_webhook_of_an_imap_mailbox_is_404_and_counted(mailbox, count_rows):
    from intake.models import Mailbox, WebhookRejectionCount

    Mailbox.objects.filter(pk=mailbox.pk).update(provider="imap")  # same slug and secret, another provider
    from intake import selectors

    selectors.forget_cached_mailboxes()
    before = count_rows()
    body = make_message()
    response = post_signed(Client(), body)
    assert response.status_code == 404 and response.json() == {"error": "unknown mailbox"}
    assert count_rows() == before
    assert WebhookRejectionCount.objects.get(provider="raw", reason="unknown_mailbox").count == 1


# --- what every webhook answer says about itself -----------------------------------------------------------


def assert_plain_answer(response, media_type="application/json"):
    assert response["Content-Type"] == f"{media_type}; charset=utf-8", response["Content-Type"]
    assert response["X-Content-Type-Options"] == "nosniff"


def test_webhook_answers_name_their_charset_and_are_never_sniffed(mailbox, settings, tenant):
    from intake.models import Mailbox

    client = Client()
    body = make_message()
    answers = {
        202: post_signed(client, body),
        200: post_signed(client, body),
        401: post(client, body, HTTP_X_MAILROOM_TIMESTAMP="1", HTTP_X_MAILROOM_SIGNATURE="v2=00"),
        404: client.post("/webhooks/raw/nope/", data=body, content_type="message/rfc822"),
        400: post(client, b"", **webhook_headers(WEBHOOK_SECRET, b"")),
    }
    for status, response in answers.items():
        assert response.status_code == status
        assert_plain_answer(response)
    settings.MAILROOM_MAX_MESSAGE_BYTES = 10
    assert_plain_answer(post_signed(client, body))
    # The provider webhook and what an adapter answers itself (Graph's handshake is text/plain).
    assert_plain_answer(client.post("/webhooks/mailgun/nope/mime", data=b"x", content_type="text/plain"))
    Mailbox.objects.create(tenant=tenant, slug="graph-box", address="graph-box@acme.test", provider="graph")
    handshake = client.post(
        "/webhooks/graph/graph-box/?validationToken=token%3C1%3E", data=b"", content_type="text/plain"
    )
    assert handshake.status_code == 200 and handshake.content == b"token<1>"
    assert_plain_answer(handshake, "text/plain")


def test_the_sample_command_signs_with_v2_and_only_for_raw_mailboxes(mailbox, live_server, caplog, monkeypatch):
    import io
    import logging

    from django.core.management import CommandError, call_command

    from intake import views
    from intake.models import Mailbox

    monkeypatch.setattr(views, "_v1_seen", set())  # the server says so (once) when a mailbox is signed with v1
    out = io.StringIO()
    with caplog.at_level(logging.WARNING, logger="intake.views"):
        call_command("send_test_email", "support", url=live_server.url, stdout=out)
        assert out.getvalue().startswith("202 ")
        assert "deprecated v1" not in caplog.text
        body = make_message()
        assert post(Client(), body, **v1_headers(body)).status_code == 202
        assert "mailbox support: raw webhook signed with the deprecated v1 scheme" in caplog.text
    assert InboxEvent.objects.filter(mailbox=mailbox).count() == 2
    Mailbox.objects.filter(pk=mailbox.pk).update(provider="imap")
    with pytest.raises(CommandError, match="only a raw mailbox takes the raw webhook"):
        call_command("send_test_email", "support", url=live_server.url, stdout=io.StringIO())

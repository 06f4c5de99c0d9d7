"""Inbound-parse webhooks (Mailgun, Postmark, SendGrid) and the generic provider webhook view.

Valid -> stored once; forged, stale or replayed -> 401 and nothing stored.
"""

import base64
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.http import HttpResponse
from django.test import Client

from intake import services
from intake.keys import message_id_from_raw
from intake.models import AuditEvent, InboxEvent, Mailbox, OutboxMessage, WebhookNonce
from intake.providers.base import FetchedMessage, Provider, WebhookRejected, WebhookResult
from intake.providers.inbound import parse_form
from tests.mail import make_message, webhook_headers
from tests.support.inbound import (
    BASIC_PASSWORD,
    BASIC_USER,
    MAILGUN_KEY,
    basic,
    mailgun_fields,
    multipart,
    post_mailgun,
    post_postmark,
    post_sendgrid,
    postmark_payload,
)


def with_latin1_byte(raw: bytes) -> bytes:
    # Not UTF-8: whatever decodes the field as text would change the stored bytes.
    return raw.replace(b"Please help.", b"Please help, Bj\xf6rn.")


@pytest.fixture
def provider_mailbox(tenant, monkeypatch):
    monkeypatch.setenv("MAILROOM_TEST_MAILGUN_KEY", MAILGUN_KEY)
    monkeypatch.setenv("MAILROOM_TEST_BASIC", f"{BASIC_USER}:{BASIC_PASSWORD}")

    def create(provider):
        secret = "MAILROOM_TEST_MAILGUN_KEY" if provider == "mailgun" else "MAILROOM_TEST_BASIC"
        return Mailbox.objects.create(
            tenant=tenant,
            slug=f"{provider}-box",
            address=f"{provider}@acme.test",
            provider=provider,
            webhook_secret_ref=f"env:{secret}",
        )

    return create


def stored():
    return InboxEvent.objects.count(), OutboxMessage.objects.count(), AuditEvent.objects.count()


# --- Mailgun --------------------------------------------------------------------------------------


def test_mailgun_valid_is_stored_once_byte_exact(provider_mailbox):
    mailbox = provider_mailbox("mailgun")
    raw = with_latin1_byte(make_message())
    response = post_mailgun(Client(), mailgun_fields(raw))
    assert response.status_code == 202, response.content
    [entry] = response.json()["inbox_events"]
    event = InboxEvent.objects.get(pk=entry["inbox_event_id"])
    assert bytes(event.raw) == raw and event.source == "mailgun" and event.mailbox == mailbox
    assert event.provider_message_id == message_id_from_raw(raw)
    assert OutboxMessage.objects.get().payload == {"inbox_event_id": event.pk}

    # Mailgun delivering the same message again (a new token, as on its retries): one event.
    again = post_mailgun(Client(), mailgun_fields(raw), url="/webhooks/mailgun/mailgun-box/")
    assert again.status_code == 200
    assert again.json()["inbox_events"] == [{"inbox_event_id": event.pk, "duplicate": True}]
    assert InboxEvent.objects.count() == 1


def test_mailgun_forged_stale_and_replayed_requests_are_refused_and_store_nothing(provider_mailbox, monkeypatch):
    provider_mailbox("mailgun")
    client = Client()
    accepted = mailgun_fields(make_message())
    assert post_mailgun(client, accepted).status_code == 202
    before, nonces = stored(), WebhookNonce.objects.count()

    forged = mailgun_fields(make_message(), key="not-the-signing-key")
    tampered = {**mailgun_fields(make_message()), "timestamp": str(int(time.time()) + 1)}
    stale = mailgun_fields(make_message(), timestamp=int(time.time()) - 301)
    replayed = {**accepted, "body-mime": make_message(subject="Replayed with another body")}
    unsigned = {k: v for k, v in mailgun_fields(make_message()).items() if k != "signature"}
    for name, fields in [
        ("forged", forged),
        ("tampered", tampered),
        ("stale", stale),
        ("replayed", replayed),
        ("exact replay", accepted),
        ("unsigned", unsigned),
    ]:
        response = post_mailgun(client, fields)
        assert response.status_code == 401, name
        assert stored() == before, name
    assert WebhookNonce.objects.count() == nonces

    # No usable signing key: fail closed.
    monkeypatch.delenv("MAILROOM_TEST_MAILGUN_KEY")
    assert post_mailgun(client, mailgun_fields(make_message())).status_code == 401
    assert stored() == before


def test_mailgun_without_body_mime_is_refused_without_burning_the_token(provider_mailbox):
    provider_mailbox("mailgun")
    fields = mailgun_fields(make_message())
    response = post_mailgun(Client(), {k: v for k, v in fields.items() if k != "body-mime"})
    assert response.status_code == 400 and "mime" in response.json()["error"]
    assert stored() == (0, 0, 0) and not WebhookNonce.objects.exists()
    assert post_mailgun(Client(), fields).status_code == 202


def test_mailgun_urlencoded_body_is_accepted(provider_mailbox):
    from urllib.parse import urlencode

    provider_mailbox("mailgun")
    raw = make_message()
    response = Client().post(
        "/webhooks/mailgun/mailgun-box/mime",
        data=urlencode(mailgun_fields(raw)),
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 202
    assert bytes(InboxEvent.objects.get().raw) == raw


@pytest.mark.django_db(transaction=True)
def test_mailgun_concurrent_replays_of_one_token_store_one_event(monkeypatch):
    from intake.models import Tenant

    monkeypatch.setenv("MAILROOM_TEST_MAILGUN_KEY", MAILGUN_KEY)
    tenant = Tenant.objects.create(slug="race")
    Mailbox.objects.create(
        tenant=tenant,
        slug="mailgun-box",
        address="m@race.test",
        provider="mailgun",
        webhook_secret_ref="env:MAILROOM_TEST_MAILGUN_KEY",
    )
    fields = mailgun_fields(make_message())
    barrier = threading.Barrier(6)

    def send(_):
        try:
            barrier.wait()
            return post_mailgun(Client(), fields).status_code
        finally:
            connection.close()

    with ThreadPoolExecutor(6) as pool:
        statuses = sorted(pool.map(send, range(6)))
    assert statuses == [202] + [401] * 5
    assert InboxEvent.objects.count() == 1 and WebhookNonce.objects.count() == 1


@pytest.mark.django_db
def test_the_beats_nonce_purge_drops_tokens_older_than_twice_the_tolerance_and_keeps_fresh_ones(mailbox, settings):
    from datetime import timedelta

    from django.utils import timezone

    from intake.tasks import purge_webhook_nonces

    now = timezone.now()
    keep = timedelta(seconds=2 * settings.MAILROOM_SIGNATURE_TOLERANCE_SECONDS)
    WebhookNonce.objects.create(mailbox=mailbox, provider="mailgun", nonce="old", seen_at=now - keep - timedelta(1))
    WebhookNonce.objects.create(mailbox=mailbox, provider="mailgun", nonce="fresh", seen_at=now - keep / 2)
    assert purge_webhook_nonces.apply().get() == 1
    assert list(WebhookNonce.objects.values_list("nonce", flat=True)) == ["fresh"]


# --- Postmark -------------------------------------------------------------------------------------


def test_postmark_raw_email_is_stored_once_with_its_message_id_as_metadata(provider_mailbox):
    provider_mailbox("postmark")
    raw = make_message(body="Bitte helfen Sie, Jürgen.\n")
    payload = postmark_payload(raw)
    response = post_postmark(Client(), payload, **basic())
    assert response.status_code == 202, response.content
    event = InboxEvent.objects.get()
    assert bytes(event.raw) == raw and event.provider_message_id == message_id_from_raw(raw)
    audit = AuditEvent.objects.get(inbox_event=event, kind="provider_metadata")
    assert audit.detail["postmark_message_id"] == payload["MessageID"] and audit.detail["rebuilt"] is False

    # Postmark retrying the same delivery: 200, still one event.
    again = post_postmark(Client(), payload, **basic())
    assert again.status_code == 200 and again.json()["inbox_events"][0]["duplicate"] is True
    assert InboxEvent.objects.count() == 1


def test_postmark_without_raw_email_is_rebuilt_deterministically(provider_mailbox):
    provider_mailbox("postmark")
    payload = postmark_payload(
        Headers=[
            {"Name": "Message-ID", "Value": "<rebuilt-1@customer.example>"},
            {"Name": "X-Spam-Status", "Value": "No"},
        ],
        HtmlBody="<p>Please help.</p>",
        Attachments=[
            {
                "Name": "printer.txt",
                "Content": base64.b64encode(b"smoke").decode(),
                "ContentType": "text/plain",
                "ContentLength": 5,
            }
        ],
    )
    assert post_postmark(Client(), payload, **basic()).status_code == 202
    event = InboxEvent.objects.get()
    assert event.provider_message_id == "rebuilt-1@customer.example"
    from email import message_from_bytes, policy

    message = message_from_bytes(bytes(event.raw), policy=policy.default)
    assert message["Subject"] == "Printer on fire" and message["X-Spam-Status"] == "No"
    assert message.get_body(("plain",)).get_content().strip() == "Please help."
    assert message.get_body(("html",)).get_content().strip() == "<p>Please help.</p>"
    [attachment] = list(message.iter_attachments())
    assert attachment.get_filename() == "printer.txt" and attachment.get_content() == "smoke"

    # Without a Message-ID the id is the sha256 of the rebuilt bytes, which a retry reproduces exactly.
    bare = postmark_payload()
    first = post_postmark(Client(), bare, **basic())
    second = post_postmark(Client(), bare, **basic())
    assert (first.status_code, second.status_code) == (202, 200)
    assert first.json()["inbox_events"] == [{**second.json()["inbox_events"][0], "duplicate": False}]
    assert InboxEvent.objects.get(pk=first.json()["inbox_events"][0]["inbox_event_id"]).provider_message_id.startswith(
        "sha256:"
    )


def test_postmark_forged_credentials_are_refused_and_store_nothing(provider_mailbox):
    provider_mailbox("postmark")
    payload = postmark_payload(make_message())
    for headers in (
        {},
        basic(password="guess"),
        basic(user="someone-else"),
        {"HTTP_AUTHORIZATION": "Bearer abc"},
        {"HTTP_AUTHORIZATION": "Basic !!!"},
    ):
        assert post_postmark(Client(), payload, **headers).status_code == 401
    assert stored() == (0, 0, 0)


# --- SendGrid -------------------------------------------------------------------------------------


def test_sendgrid_raw_email_field_is_stored_once_byte_exact(provider_mailbox):
    provider_mailbox("sendgrid")
    raw = with_latin1_byte(make_message())
    fields = {
        "to": "sendgrid@acme.test",
        "from": "customer@example.com",
        "email": raw,
        "charsets": json.dumps({"to": "UTF-8", "email": "iso-8859-1"}),
        "spam_score": "0.1",
    }
    response = post_sendgrid(Client(), fields, **basic())
    assert response.status_code == 202, response.content
    event = InboxEvent.objects.get()
    assert bytes(event.raw) == raw and event.source == "sendgrid"
    assert event.provider_message_id == message_id_from_raw(raw)
    assert post_sendgrid(Client(), fields, **basic()).status_code == 200  # a replay is a duplicate
    assert InboxEvent.objects.count() == 1


def test_sendgrid_forged_credentials_and_parsed_mode_store_nothing(provider_mailbox):
    provider_mailbox("sendgrid")
    fields = {"email": make_message()}
    assert post_sendgrid(Client(), fields).status_code == 401
    assert post_sendgrid(Client(), fields, **basic(password="nope")).status_code == 401
    parsed_mode = post_sendgrid(Client(), {"text": "Please help.", "subject": "Hi"}, **basic())
    assert parsed_mode.status_code == 400 and "raw" in parsed_mode.json()["error"]
    assert stored() == (0, 0, 0)


def test_the_raw_webhook_is_no_second_door_into_a_mailgun_mailbox(provider_mailbox):
    from intake.models import WebhookRejectionCount

    mailbox = provider_mailbox("mailgun")
    raw = make_message()
    assert post_mailgun(Client(), mailgun_fields(raw)).status_code == 202
    # Signed with the mailbox's own (Mailgun) key, a raw delivery is still refused: the raw webhook is only
    # for raw mailboxes, and a mailbox of another provider is unknown there (as on the provider webhook).
    for body in (raw, make_message(subject="A new message through the wrong door")):
        response = Client().post(
            f"/webhooks/raw/{mailbox.slug}/",
            data=body,
            content_type="message/rfc822",
            **webhook_headers(MAILGUN_KEY, body),
        )
        assert response.status_code == 404 and response.json() == {"error": "unknown mailbox"}
    assert InboxEvent.objects.count() == 1
    assert WebhookRejectionCount.objects.get(provider="raw", reason="unknown_mailbox").count == 2


# --- the generic view -----------------------------------------------------------------------------


class FakeProvider(Provider):
    supports_webhook = True
    result = None
    error = None
    calls = 0

    def handle_webhook(self, request, body):
        type(self).calls += 1
        if self.error:
            raise self.error
        return self.result


@pytest.fixture
def fake_provider(monkeypatch, tenant):
    FakeProvider.result, FakeProvider.error, FakeProvider.calls = WebhookResult(), None, 0
    monkeypatch.setattr("intake.channels.webhooks.provider_for", FakeProvider)
    Mailbox.objects.create(tenant=tenant, slug="pushed", address="p@acme.test", provider="gmail")
    return FakeProvider


def test_unknown_mailbox_or_another_providers_mailbox_is_404(fake_provider, provider_mailbox):
    provider_mailbox("sendgrid")
    client = Client()
    assert client.post("/webhooks/gmail/nobody/", data=b"{}", content_type="application/json").status_code == 404
    assert client.post("/webhooks/graph/pushed/", data=b"{}", content_type="application/json").status_code == 404
    assert client.post("/webhooks/mailgun/sendgrid-box/", data=b"x", content_type="text/plain").status_code == 404
    assert fake_provider.calls == 0


def test_webhook_for_a_provider_without_webhooks_is_404(tenant):
    Mailbox.objects.create(tenant=tenant, slug="imap-only", address="i@acme.test", provider="imap")
    assert Client().post("/webhooks/imap/imap-only/", data=b"x", content_type="text/plain").status_code == 404


def test_oversized_body_is_413_before_the_provider_sees_it(fake_provider, settings):
    settings.MAILROOM_MAX_MESSAGE_BYTES = 1000
    response = Client().post("/webhooks/gmail/pushed/", data=b"x" * 1001, content_type="text/plain")
    assert response.status_code == 413 and fake_provider.calls == 0


def test_rejected_webhook_is_401_and_rolls_back_what_the_provider_wrote(fake_provider, monkeypatch):
    mailbox = Mailbox.objects.get(slug="pushed")

    class Rejecting(FakeProvider):
        def handle_webhook(self, request, body):
            WebhookNonce.objects.create(mailbox=mailbox, provider="gmail", nonce="n-1", seen_at=mailbox.created_at)
            raise WebhookRejected("bad token")

    monkeypatch.setattr("intake.channels.webhooks.provider_for", Rejecting)
    assert Client().post("/webhooks/gmail/pushed/", data=b"{}", content_type="application/json").status_code == 401
    assert stored() == (0, 0, 0) and not WebhookNonce.objects.exists()


def test_push_that_asks_for_a_poll_writes_a_durable_poll_request(fake_provider):
    fake_provider.result = WebhookResult(poll=True)
    response = Client().post("/webhooks/gmail/pushed/", data=b"{}", content_type="application/json")
    assert response.status_code == 202 and response.json() == {"inbox_events": [], "poll": True}
    mailbox = Mailbox.objects.get(slug="pushed")
    assert [(m.topic, m.payload) for m in OutboxMessage.objects.all()] == [("mailbox.poll", {"mailbox_id": mailbox.pk})]


def test_handshake_response_is_returned_as_is_and_nothing_is_stored(fake_provider):
    fake_provider.result = WebhookResult(
        response=HttpResponse("token-123", content_type="text/plain"), messages=[FetchedMessage("x", make_message())]
    )
    response = Client().post("/webhooks/gmail/pushed/", data=b"", content_type="text/plain")
    assert (response.status_code, response.content) == (200, b"token-123")
    assert stored() == (0, 0, 0)


def test_all_messages_of_a_webhook_are_stored_in_one_transaction(fake_provider, monkeypatch):
    messages = [make_message(subject=f"Part {n}") for n in range(3)]
    fake_provider.result = WebhookResult(
        messages=[FetchedMessage(message_id_from_raw(m), m) for m in messages], poll=True
    )
    real_ingest, calls = services.ingest, []

    def ingest_then_fail(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("database went away")
        return real_ingest(*args, **kwargs)

    monkeypatch.setattr(services, "ingest", ingest_then_fail)
    client = Client(raise_request_exception=False)
    assert client.post("/webhooks/gmail/pushed/", data=b"{}", content_type="application/json").status_code == 500
    assert stored() == (0, 0, 0), "no acknowledgment, and nothing half-stored"

    monkeypatch.setattr(services, "ingest", real_ingest)
    response = client.post("/webhooks/gmail/pushed/", data=b"{}", content_type="application/json")
    assert response.status_code == 202
    assert [e["duplicate"] for e in response.json()["inbox_events"]] == [False] * 3
    assert InboxEvent.objects.count() == 3


def test_transient_provider_failure_is_503_with_retry_after(fake_provider):
    from intake.failures import TransientError

    fake_provider.error = TransientError("certificates unavailable", retry_after=30)
    response = Client().post("/webhooks/gmail/pushed/", data=b"{}", content_type="application/json")
    assert response.status_code == 503 and response["Retry-After"] == "30"
    assert stored() == (0, 0, 0)


def test_form_parser_keeps_values_byte_exact():
    content_type, body = multipart({"a": b"x\r\ny\xff", "b": "", "c": b"--not-a-boundary"})
    assert parse_form(content_type, body) == {"a": b"x\r\ny\xff", "b": b"", "c": b"--not-a-boundary"}

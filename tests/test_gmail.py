"""Gmail against FakeGoogle over real HTTP: push (OIDC or URL token) -> durable poll -> history walk -> ingest."""

import json
import logging

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from intake import tasks
from intake.channels import polling
from intake.channels.graph_subscriptions import ensure_gmail_watch, renew_due_subscriptions
from intake.failures import PermanentError, TransientError
from intake.models import InboxEvent, Mailbox, OutboxMessage, PollCursor, ProviderSubscription
from intake.providers import oidc, provider_for
from intake.providers.gmail import GmailProvider, parse_push
from intake.providers.oauth import clear_token_cache
from intake.services import POLL_TOPIC
from tests.fake_google import FakeGoogle, http_date
from tests.support.gmail import make_raw

AUDIENCE = "https://mailroom.example/webhooks/gmail/support-gmail/"
SERVICE_ACCOUNT = "gmail-push@acme-project.iam.gserviceaccount.com"
URL_TOKEN = "push-url-token-0123456789"


@pytest.fixture(autouse=True)
def fresh_caches():
    clear_token_cache()
    oidc.clear_jwks_cache()
    yield
    clear_token_cache()
    oidc.clear_jwks_cache()


@pytest.fixture
def google():
    server = FakeGoogle().start()
    yield server
    server.stop()


@pytest.fixture
def gmail(tenant, google, monkeypatch):
    """A Gmail mailbox pointed at FakeGoogle, credentials and URL token referenced from the environment."""
    monkeypatch.setenv(
        "GMAIL_TEST_CREDENTIALS",
        json.dumps({"refresh_token": google.refresh_token, "client_secret": google.client_secret}),
    )
    monkeypatch.setenv("GMAIL_TEST_URL_TOKEN", URL_TOKEN)
    return Mailbox.objects.create(
        tenant=tenant,
        slug="support-gmail",
        address="support@acme.test",
        provider="gmail",
        credentials_ref="env:GMAIL_TEST_CREDENTIALS",
        webhook_secret_ref="env:GMAIL_TEST_URL_TOKEN",
        poll_enabled=True,
        settings={
            "api_base": google.url,
            "token_url": f"{google.url}/token",
            "client_id": google.client_id,
            "jwks_url": f"{google.url}/oauth2/v3/certs",
            "push_audience": AUDIENCE,
            "page_size": 2,
            "resync_days": 7,
            "push_topic": "projects/acme/topics/mailroom",
        },
    )


def push(client, mailbox, body: bytes, token: str | None = None, query: str = ""):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.post(f"/webhooks/gmail/{mailbox.slug}/{query}", data=body, content_type="application/json", **headers)


def poll(mailbox, **kwargs) -> polling.PollReport:
    return polling.poll_mailbox(mailbox.pk, **kwargs)


def events(mailbox) -> dict[str, bytes]:
    return {e.provider_message_id: bytes(e.raw) for e in InboxEvent.objects.filter(mailbox=mailbox)}


def cursor(mailbox) -> dict:
    return PollCursor.objects.get(mailbox=mailbox).value


def poll_requests(mailbox) -> int:
    return OutboxMessage.objects.filter(topic=POLL_TOPIC, payload__mailbox_id=mailbox.pk).count()


def test_first_poll_syncs_the_window_in_pages_then_stores_the_history_id(gmail, google):
    recent = [google.add_message(make_raw(n), age_days=1) for n in range(3)]
    google.add_message(make_raw(99), age_days=30)  # outside resync_days
    google.add_message(make_raw(98), labels=["SENT"])  # not in the inbox
    history_id_before_sync = google.history_id

    report = poll(gmail)

    assert report.status == "ok"
    assert report.batches == 2  # page_size 2: a page of two, then one
    assert set(events(gmail)) == set(recent)
    assert events(gmail)[recent[0]] == make_raw(0)  # the raw bytes, decoded from unpadded base64url
    assert cursor(gmail) == {"history_id": str(history_id_before_sync)}
    assert google.count("GET", "/profile") == 1


def test_a_push_with_a_valid_oidc_token_leads_to_the_new_messages_ingested_once(gmail, google, client, count_rows):
    old = google.add_message(make_raw(1))
    assert poll(gmail).new == 1
    new = [google.add_message(make_raw(n)) for n in (2, 3, 4)]
    before = count_rows()

    response = push(client, gmail, google.push_body(), google.mint(AUDIENCE))

    assert response.status_code == 202
    assert response.json()["poll"] is True
    # The push only asks for a poll, durably, in the outbox; nothing is fetched inside the request.
    assert poll_requests(gmail) == 1
    assert count_rows()["InboxEvent"] == before["InboxEvent"]

    # What the worker runs for that outbox row (the relay publishes its payload as the task's kwargs).
    [request] = OutboxMessage.objects.filter(topic=POLL_TOPIC)
    report = tasks.poll_mailbox(**request.payload)
    assert report["status"] == "ok" and report["new"] == 3 and report["duplicates"] == 0
    assert set(events(gmail)) == {old, *new}
    assert cursor(gmail) == {"history_id": str(google.history_id)}

    # The same push again (Pub/Sub delivers at least once): a poll that finds nothing new.
    assert push(client, gmail, google.push_body(), google.mint(AUDIENCE)).status_code == 202
    assert poll(gmail).messages == []
    assert InboxEvent.objects.filter(mailbox=gmail).count() == 4
    assert all(google.raw_fetches(message_id) == 1 for message_id in [old, *new])


def test_history_is_walked_page_by_page_with_the_cursor_stored_after_each_batch(gmail, google):
    poll(gmail)
    start = cursor(gmail)["history_id"]
    ids = [google.add_message(make_raw(n)) for n in range(5)]
    provider = provider_for(gmail)

    first = provider.poll({"history_id": start})
    assert first.more and first.cursor["history_id"] == start and first.cursor["history_page_token"]
    assert [m.provider_message_id for m in first.messages] == ids[:2]

    report = poll(gmail)
    assert report.batches == 3 and report.new == 5
    assert set(events(gmail)) == set(ids)
    assert cursor(gmail) == {"history_id": str(google.history_id)}


def test_a_message_labelled_into_the_inbox_later_is_ingested_and_other_labels_are_not(gmail, google):
    poll(gmail)
    sent = google.add_message(make_raw(1), labels=["SENT"])
    archived = google.add_message(make_raw(2), labels=["CATEGORY_UPDATES"])
    assert poll(gmail).messages == []

    google.add_label(archived, "INBOX")

    assert poll(gmail).new == 1
    assert set(events(gmail)) == {archived}
    assert google.raw_fetches(sent) == 0


def test_a_stale_history_id_resyncs_the_window_without_duplicates(gmail, google):
    first = [google.add_message(make_raw(n)) for n in range(3)]
    poll(gmail)
    assert set(events(gmail)) == set(first)
    google.expire_history()  # Gmail no longer has history from our stored id
    later = [google.add_message(make_raw(n)) for n in range(3, 6)]

    report = poll(gmail)

    assert report.status == "ok"
    assert report.new == 3 and report.duplicates == 0
    assert set(events(gmail)) == set(first + later)
    assert InboxEvent.objects.filter(mailbox=gmail).count() == 6
    # Already-stored messages are not even downloaded again.
    assert all(google.raw_fetches(message_id) == 1 for message_id in first + later)
    assert google.count("GET", "/profile") == 2
    assert cursor(gmail) == {"history_id": str(google.history_id)}
    # And the history walk goes on from there.
    newest = google.add_message(make_raw(7))
    assert [m.provider_message_id for m in poll(gmail).messages] == [newest]


def test_provider_message_id_is_gmails_id_for_push_and_for_scheduled_polls(gmail, google, client):
    message_id = google.add_message(make_raw(1))
    push(client, gmail, google.push_body(), google.mint(AUDIENCE))
    poll(gmail, trigger=polling.PUSH)
    assert list(events(gmail)) == [message_id]

    # A scheduled window sync from scratch (cursor lost) sees the same message under the same id.
    PollCursor.objects.filter(mailbox=gmail).update(value={})
    report = poll(gmail, trigger=polling.SCHEDULE)
    assert report.status == "ok"
    assert list(events(gmail)) == [message_id]


def test_a_message_deleted_before_the_fetch_is_skipped_and_the_cursor_moves_on(gmail, google):
    poll(gmail)
    gone = google.add_message(make_raw(1))
    kept = google.add_message(make_raw(2))
    google.delete_message(gone)

    report = poll(gmail)

    assert report.status == "ok"
    assert set(events(gmail)) == {kept}
    assert cursor(gmail) == {"history_id": str(google.history_id)}


def test_resync_days_zero_starts_from_now_without_backfill(gmail, google):
    google.add_message(make_raw(1))
    gmail.settings = {**gmail.settings, "resync_days": 0}
    gmail.save()

    report = poll(gmail)

    assert report.status == "ok" and report.messages == []
    assert cursor(gmail) == {"history_id": str(google.history_id)}
    assert google.count("GET", "/messages") == 0


# --- Push authentication --------------------------------------------------------------------


def _other_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.mark.parametrize(
    "make_token, reason",
    [
        (lambda g: None, "no bearer token"),
        (lambda g: g.mint("https://someone-else.example/push"), "wrong audience"),
        (lambda g: g.mint(AUDIENCE, iss="https://evil.example"), "wrong issuer"),
        (lambda g: g.mint(AUDIENCE, expires_in=-600), "token expired"),
        (lambda g: g.mint(AUDIENCE, key=_other_key()), "bad signature"),
        (lambda g: g.mint(AUDIENCE, key=_other_key(), kid="not-published"), "unknown signing key"),
        (lambda g: "not.a.jwt", "malformed token"),
    ],
)
def test_a_push_without_a_valid_token_is_refused_and_nothing_is_stored(
    gmail, google, client, count_rows, caplog, make_token, reason
):
    before = count_rows()
    token = make_token(google)

    with caplog.at_level(logging.WARNING):
        response = push(client, gmail, google.push_body(), token)

    assert response.status_code == 401
    assert count_rows() == before
    assert poll_requests(gmail) == 0
    assert reason in caplog.text
    if token:
        assert token not in caplog.text  # never log a token


def test_a_token_signed_with_hs256_is_refused(gmail, google, client):
    import jwt

    forged = jwt.encode(
        {"iss": google.issuer, "aud": AUDIENCE, "iat": 1, "exp": 4_000_000_000},
        "the-public-key-used-as-an-hmac-secret",
        algorithm="HS256",
        headers={"kid": google.kid},
    )
    assert push(client, gmail, google.push_body(), forged).status_code == 401


def test_without_a_configured_audience_every_push_is_refused(gmail, google, client):
    gmail.settings = {k: v for k, v in gmail.settings.items() if k != "push_audience"}
    gmail.save()
    assert push(client, gmail, google.push_body(), google.mint(AUDIENCE)).status_code == 401


def test_the_service_account_email_is_checked_when_configured(gmail, google, client):
    gmail.settings = {**gmail.settings, "push_service_account": SERVICE_ACCOUNT}
    gmail.save()

    assert push(client, gmail, google.push_body(), google.mint(AUDIENCE)).status_code == 401
    assert (
        push(
            client, gmail, google.push_body(), google.mint(AUDIENCE, email=SERVICE_ACCOUNT, email_verified=False)
        ).status_code
        == 401
    )
    assert push(client, gmail, google.push_body(), google.mint(AUDIENCE, email=SERVICE_ACCOUNT)).status_code == 202
    assert poll_requests(gmail) == 1


def test_signing_keys_are_cached_and_fetched_again_for_a_new_key_id(gmail, google, client, monkeypatch):
    assert push(client, gmail, google.push_body(), google.mint(AUDIENCE)).status_code == 202
    assert push(client, gmail, google.push_body(), google.mint(AUDIENCE)).status_code == 202
    assert google.count("GET", "/oauth2/v3/certs") == 1

    monkeypatch.setattr(oidc, "JWKS_REFETCH_SECONDS", 0)
    google.key, google.kid = _other_key(), "fake-key-2"  # Google rotated its keys

    assert push(client, gmail, google.push_body(), google.mint(AUDIENCE)).status_code == 202
    assert google.count("GET", "/oauth2/v3/certs") == 2


def test_an_authenticated_push_with_an_unreadable_body_still_asks_for_a_poll(gmail, google, client):
    response = push(client, gmail, b'{"message": {"data": "%%% not base64"}}', google.mint(AUDIENCE))
    assert response.status_code == 202
    assert poll_requests(gmail) == 1


def test_url_token_mode_accepts_only_the_configured_token(gmail, google, client, count_rows):
    gmail.settings = {**gmail.settings, "push_auth": "url_token"}
    gmail.save()
    before = count_rows()

    assert push(client, gmail, google.push_body(), query="?token=wrong").status_code == 401
    assert push(client, gmail, google.push_body()).status_code == 401
    # An OIDC token is no substitute in this mode.
    assert push(client, gmail, google.push_body(), google.mint(AUDIENCE)).status_code == 401
    assert count_rows() == before

    assert push(client, gmail, google.push_body(), query=f"?token={URL_TOKEN}").status_code == 202
    assert poll_requests(gmail) == 1


def test_parse_push_reads_wrapped_and_unwrapped_payloads(google):
    assert parse_push(google.push_body(history_id=42)) == {"emailAddress": google.email, "historyId": 42}
    assert parse_push(b'{"emailAddress": "a@b.test", "historyId": "7"}') == {
        "emailAddress": "a@b.test",
        "historyId": "7",
    }
    assert parse_push(b"[]") is None and parse_push(b"nope") is None


# --- Failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make_fault, reason, retry_after",
    [
        (lambda: {"status": 429, "headers": {"Retry-After": "7"}}, "rate_limited", 7.0),
        (
            lambda: {"status": 403, "body": {"error": {"code": 403, "errors": [{"reason": "userRateLimitExceeded"}]}}},
            "rate_limited",
            None,
        ),
        (lambda: {"status": 503, "headers": {"Retry-After": http_date(120)}}, "server_error", 120.0),
        (lambda: {"status": 500}, "server_error", None),
        (lambda: {"drop": True}, "connection", None),
    ],
    ids=["429", "403-rate-limit", "503-date", "500", "dropped"],
)
def test_throttling_server_errors_and_dropped_connections_back_off_with_the_cursor_untouched(
    gmail, google, make_fault, reason, retry_after
):
    fault = make_fault()
    poll(gmail)
    stored = cursor(gmail)
    message_id = google.add_message(make_raw(1))
    google.fail("/history", **fault)

    with pytest.raises(TransientError) as caught:
        provider_for(gmail).poll(stored)
    assert caught.value.reason == reason
    if retry_after is None:
        assert caught.value.retry_after is None
    else:
        assert caught.value.retry_after == pytest.approx(retry_after, abs=2)

    google.fail("/history", **fault)
    report = poll(gmail)
    gmail.refresh_from_db()
    assert report.status == "backoff" and gmail.health == "backoff"
    assert cursor(gmail) == stored
    assert not InboxEvent.objects.filter(mailbox=gmail).exists()
    if retry_after:
        assert (gmail.poll_backoff_until - gmail.last_polled_at).total_seconds() >= retry_after - 2

    # Once the provider recovers, the manual poll fetches what waited.
    report = poll(gmail, trigger=polling.MANUAL)
    assert report.status == "ok" and [m.provider_message_id for m in report.messages] == [message_id]


def test_a_failure_while_fetching_a_message_fails_the_whole_batch_and_leaves_the_cursor(gmail, google):
    poll(gmail)
    stored = cursor(gmail)
    ids = [google.add_message(make_raw(n)) for n in range(2)]
    google.fail(f"/messages/{ids[1]}", 502)

    assert poll(gmail).status == "backoff"
    assert cursor(gmail) == stored
    assert not InboxEvent.objects.filter(mailbox=gmail).exists()  # a batch is returned whole or not at all

    report = poll(gmail, trigger=polling.MANUAL)
    assert report.status == "ok" and report.new == 2
    assert set(events(gmail)) == set(ids)
    assert cursor(gmail) == {"history_id": str(google.history_id)}


def test_a_refused_refresh_token_marks_the_credentials_invalid(gmail, google, monkeypatch):
    monkeypatch.setenv(
        "GMAIL_TEST_CREDENTIALS", json.dumps({"refresh_token": "revoked", "client_secret": google.client_secret})
    )

    with pytest.raises(PermanentError) as caught:
        provider_for(gmail).poll({})
    assert caught.value.reason == "credentials"

    report = poll(gmail)
    gmail.refresh_from_db()
    assert report.status == "credentials_invalid" and gmail.health == "credentials_invalid"
    assert "invalid_grant" in gmail.health_detail and "revoked" not in gmail.health_detail
    assert PollCursor.objects.get(mailbox=gmail).value == {}


def test_an_api_that_keeps_refusing_the_token_is_a_credentials_failure(gmail, google):
    google.fail("/profile", 401, times=2)
    with pytest.raises(PermanentError) as caught:
        provider_for(gmail).poll({})
    assert caught.value.reason == "credentials"
    assert google.token_requests == 2  # refreshed once after the first 401, then gave up

    google.fail("/profile", 403, body={"error": {"code": 403, "errors": [{"reason": "insufficientPermissions"}]}})
    with pytest.raises(PermanentError) as caught:
        provider_for(gmail).poll({})
    assert caught.value.reason == "credentials"


@pytest.mark.parametrize("secret", [None, "not json", '["a list"]', '{"client_secret": "only"}'])
def test_missing_or_unusable_credentials_are_a_credentials_failure(gmail, monkeypatch, secret):
    if secret is None:
        monkeypatch.delenv("GMAIL_TEST_CREDENTIALS")
    else:
        monkeypatch.setenv("GMAIL_TEST_CREDENTIALS", secret)
        gmail.settings = {k: v for k, v in gmail.settings.items() if k != "client_id"}
    with pytest.raises(PermanentError) as caught:
        GmailProvider(gmail).poll({})
    assert caught.value.reason == "credentials"


def test_access_tokens_are_cached_in_memory_and_refreshed_when_expired(gmail, google):
    from intake.providers import oauth

    poll(gmail)
    poll(gmail)
    assert google.token_requests == 1
    assert not any(token in json.dumps(cursor(gmail)) for token in google.access_tokens)

    with oauth._cache_lock:  # the token's lifetime has run out
        for key, (token, _expires) in list(oauth._cache.items()):
            oauth._cache[key] = (token, 0.0)
    google.revoke_tokens()  # ... and Google no longer accepts it
    mark = len(google.requests)

    google.add_message(make_raw(1))
    assert poll(gmail).new == 1
    assert google.token_requests == 2
    # Refreshed before the call, not after a refusal: every API call carried the new token.
    api_calls = [r for r in google.requests[mark:] if r["path"].startswith("/gmail/")]
    assert api_calls and all(r["headers"]["Authorization"].split(" ")[-1] in google.access_tokens for r in api_calls)


def test_a_token_revoked_early_is_refreshed_once_and_the_call_retried(gmail, google):
    poll(gmail)
    google.revoke_tokens()
    google.add_message(make_raw(1))

    report = poll(gmail)

    assert report.status == "ok" and report.new == 1
    assert google.token_requests == 2


def test_nothing_logged_holds_a_token_a_body_or_a_full_address(gmail, google, client, caplog):
    google.add_message(make_raw(1))
    with caplog.at_level(logging.DEBUG):
        push(client, gmail, google.push_body(), google.mint(AUDIENCE))
        poll(gmail)
    assert "support@acme.test" not in caplog.text
    assert "Please help" not in caplog.text
    assert not any(token in caplog.text for token in google.access_tokens)
    assert google.refresh_token not in caplog.text


# --- Watch ---------------------------------------------------------------------------------------


def test_the_watch_is_created_then_renewed_daily(gmail, google):
    from datetime import timedelta

    from django.utils import timezone

    outcome, row = ensure_gmail_watch(gmail)
    assert outcome == "created"
    assert google.watches == [
        {"topicName": "projects/acme/topics/mailroom", "labelIds": ["INBOX"], "labelFilterBehavior": "INCLUDE"}
    ]
    assert timedelta(days=6.9) < row.expires_at - timezone.now() < timedelta(days=7.1)

    assert ensure_gmail_watch(gmail)[0] == "current"
    assert renew_due_subscriptions(now=timezone.now() + timedelta(days=1, minutes=5))["renewed"] == 1
    assert len(google.watches) == 2
    assert ProviderSubscription.objects.get(mailbox=gmail, provider="gmail").renewed_at is not None

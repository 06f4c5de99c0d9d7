"""Microsoft Graph against FakeGraph over real HTTP: validation, clientState, delta polling, subscriptions."""

import json
import logging
from datetime import timedelta
from urllib.parse import parse_qs

import pytest
from django.utils import timezone

from intake import tasks
from intake.channels import polling
from intake.channels.graph_subscriptions import ensure_graph_subscription, renew_due_subscriptions
from intake.failures import PermanentError, TransientError
from intake.models import InboxEvent, Mailbox, OutboxMessage, PollCursor, ProviderSubscription
from intake.providers import provider_for
from intake.providers.oauth import clear_token_cache
from intake.services import POLL_TOPIC
from tests.fake_google import http_date
from tests.fake_graph import FakeGraph

CLIENT_STATE = "graph-client-state-7f3a9c"


def make_raw(n: int) -> bytes:
    return (
        f"From: Customer {n} <customer{n}@example.com>\r\nTo: support@acme.test\r\n"
        f"Subject: Graph request {n}\r\nMessage-ID: <graph-{n}@example.com>\r\n\r\nHelp with {n}.\r\n"
    ).encode()


@pytest.fixture(autouse=True)
def fresh_tokens():
    clear_token_cache()
    yield
    clear_token_cache()


@pytest.fixture
def graph():
    server = FakeGraph().start()
    yield server
    server.stop()


@pytest.fixture
def outlook(tenant, graph, monkeypatch):
    """A Graph mailbox (app-only client credentials) pointed at FakeGraph."""
    monkeypatch.setenv("GRAPH_TEST_CREDENTIALS", json.dumps({"client_secret": graph.client_secret}))
    monkeypatch.setenv("GRAPH_TEST_CLIENT_STATE", CLIENT_STATE)
    return Mailbox.objects.create(
        tenant=tenant,
        slug="support-graph",
        address="support@acme.test",
        provider="graph",
        credentials_ref="env:GRAPH_TEST_CREDENTIALS",
        webhook_secret_ref="env:GRAPH_TEST_CLIENT_STATE",
        poll_enabled=True,
        settings={
            "api_base": graph.api_base,
            "token_url": graph.token_url,
            "client_id": graph.client_id,
            "tenant_id": graph.tenant,
            "user": graph.user,
            "folder": "inbox",
            "page_size": 2,
            "notification_url": "https://mailroom.example/webhooks/graph/support-graph/",
        },
    )


def notify(client, mailbox, body: bytes, query: str = ""):
    return client.post(f"/webhooks/graph/{mailbox.slug}/{query}", data=body, content_type="application/json")


def poll(mailbox, **kwargs) -> polling.PollReport:
    return polling.poll_mailbox(mailbox.pk, **kwargs)


def events(mailbox) -> dict[str, bytes]:
    return {e.provider_message_id: bytes(e.raw) for e in InboxEvent.objects.filter(mailbox=mailbox)}


def cursor(mailbox) -> dict:
    return PollCursor.objects.get(mailbox=mailbox).value


def poll_requests(mailbox) -> int:
    return OutboxMessage.objects.filter(topic=POLL_TOPIC, payload__mailbox_id=mailbox.pk).count()


# --- Webhook: validation and clientState -------------------------------------------------------


def test_the_validation_handshake_echoes_the_token_as_text_plain(outlook, client, count_rows):
    token = "Validation: Testing client application reachability for subscription Request-Id: 3c5a&x=<b>"
    before = count_rows()

    response = client.post(
        f"/webhooks/graph/{outlook.slug}/?" + "validationToken=" + _quote(token), data=b"", content_type="text/plain"
    )

    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"  # the echoed token is never sniffed as HTML
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response.content.decode() == token
    assert count_rows() == before and poll_requests(outlook) == 0


def test_a_notification_with_the_right_client_state_leads_to_new_messages_ingested_once(
    outlook, graph, client, count_rows
):
    first = graph.add_message(make_raw(1))
    assert poll(outlook).new == 1
    new = [graph.add_message(make_raw(n)) for n in (2, 3, 4)]
    before = count_rows()

    response = notify(client, outlook, graph.notification(CLIENT_STATE, count=3))

    assert response.status_code == 202 and response.json()["poll"] is True
    assert poll_requests(outlook) == 1
    assert count_rows()["InboxEvent"] == before["InboxEvent"]  # the delta runs in the poll, not the request

    # What the worker runs for that outbox row (the relay publishes its payload as the task's kwargs).
    [request] = OutboxMessage.objects.filter(topic=POLL_TOPIC)
    report = tasks.poll_mailbox(**request.payload)
    assert report["status"] == "ok" and report["new"] == 3 and report["duplicates"] == 0
    assert set(events(outlook)) == {first, *new}
    assert events(outlook)[new[0]] == make_raw(2)
    assert "delta_link" in cursor(outlook)

    # Graph may deliver a notification twice: the second poll finds nothing new.
    assert notify(client, outlook, graph.notification(CLIENT_STATE)).status_code == 202
    assert poll(outlook).messages == []
    assert InboxEvent.objects.filter(mailbox=outlook).count() == 4
    assert all(graph.value_fetches(message_id) == 1 for message_id in [first, *new])


@pytest.mark.parametrize(
    "body",
    [
        lambda g: g.notification("wrong-client-state"),
        lambda g: g.notification(None),
        lambda g: g.notification(CLIENT_STATE[:-1]),
        lambda g: json.dumps(
            {
                "value": [
                    json.loads(g.notification(CLIENT_STATE))["value"][0],
                    json.loads(g.notification("forged"))["value"][0],
                ]
            }
        ).encode(),
        lambda g: b"not json",
        lambda g: b'{"value": []}',
        lambda g: b'{"value": ["a string"]}',
    ],
    ids=["wrong", "missing", "prefix", "one-of-two-wrong", "not-json", "empty", "not-objects"],
)
def test_a_notification_that_fails_the_client_state_check_is_refused_and_nothing_is_stored(
    outlook, graph, client, count_rows, body
):
    graph.add_message(make_raw(1))
    before = count_rows()

    response = notify(client, outlook, body(graph))

    assert response.status_code == 401
    assert count_rows() == before
    assert poll_requests(outlook) == 0
    assert graph.requests == []  # not even a token was fetched


def test_without_a_client_state_secret_every_notification_is_refused(outlook, graph, client, monkeypatch):
    monkeypatch.delenv("GRAPH_TEST_CLIENT_STATE")
    assert notify(client, outlook, graph.notification(CLIENT_STATE)).status_code == 401
    assert poll_requests(outlook) == 0


def test_a_lifecycle_notification_marks_the_subscription_due_for_renewal(outlook, graph, client):
    outcome, row = ensure_graph_subscription(outlook)
    assert outcome == "created" and row.expires_at > timezone.now() + timedelta(days=2)

    forged = notify(client, outlook, graph.notification("forged", lifecycle="reauthorizationRequired"))
    assert forged.status_code == 401
    row.refresh_from_db()
    assert row.expires_at > timezone.now() + timedelta(days=2)

    response = notify(client, outlook, graph.notification(CLIENT_STATE, lifecycle="reauthorizationRequired"))
    assert response.status_code == 202 and poll_requests(outlook) == 1
    row.refresh_from_db()
    assert row.expires_at <= timezone.now()
    assert renew_due_subscriptions()["renewed"] == 1
    assert graph.subscriptions[row.external_id]["renewals"] == 1


# --- Delta polling ----------------------------------------------------------------------------------


def test_the_first_poll_runs_a_delta_round_in_pages_with_immutable_ids(outlook, graph):
    inbox = [graph.add_message(make_raw(n), age_days=1) for n in range(5)]
    graph.add_message(make_raw(50), age_days=30)  # older than resync_days
    graph.add_message(make_raw(51), folder="archive")

    report = poll(outlook)

    assert report.status == "ok"
    assert report.batches == 3  # odata.maxpagesize=2
    assert set(events(outlook)) == set(inbox)
    assert all(message_id.startswith("AAkALgAAAAAAHYQDEapmEc2byACqAC-EWg0AImm") for message_id in inbox)
    delta_calls = [r for r in graph.requests if r["path"].endswith("/messages/delta")]
    assert delta_calls and all('IdType="ImmutableId"' in r["headers"]["Prefer"] for r in delta_calls)
    assert "odata.maxpagesize=2" in delta_calls[0]["headers"]["Prefer"]
    assert delta_calls[0]["query"]["$filter"][0].startswith("receivedDateTime ge ")
    assert "$deltatoken=" in cursor(outlook)["delta_link"]


def test_a_round_in_progress_is_stored_as_the_next_link(outlook, graph):
    ids = [graph.add_message(make_raw(n)) for n in range(3)]
    provider = provider_for(outlook)

    first = provider.poll({})
    assert first.more and "$skiptoken=" in first.cursor["next_link"]
    second = provider.poll(first.cursor)
    assert not second.more and "$deltatoken=" in second.cursor["delta_link"]
    assert [m.provider_message_id for m in first.messages + second.messages] == ids


def test_a_message_moved_away_and_back_keeps_its_immutable_id_and_is_not_fetched_again(outlook, graph):
    message_id = graph.add_message(make_raw(1))
    poll(outlook)
    graph.move_message(message_id, "archive")
    assert poll(outlook).messages == []  # an @removed entry: skipped
    graph.move_message(message_id, "inbox")
    graph.mark_read(message_id)

    report = poll(outlook)

    assert report.status == "ok" and report.messages == []
    assert list(events(outlook)) == [message_id]
    assert graph.value_fetches(message_id) == 1


@pytest.mark.parametrize(
    "status, code", [(410, "syncStateNotFound"), (400, "resyncRequired"), (400, "SyncStateInvalid")]
)
def test_a_stale_delta_link_resyncs_without_duplicates(outlook, graph, status, code):
    first = [graph.add_message(make_raw(n)) for n in range(3)]
    poll(outlook)
    stale = cursor(outlook)
    graph.expire_sync_states(status, code)
    later = [graph.add_message(make_raw(n)) for n in range(3, 6)]

    report = poll(outlook)

    assert report.status == "ok"
    assert report.new == 3 and report.duplicates == 0
    assert set(events(outlook)) == set(first + later)
    assert all(graph.value_fetches(message_id) == 1 for message_id in first + later)
    assert cursor(outlook) != stale and "$deltatoken=" in cursor(outlook)["delta_link"]
    # The new delta link works.
    newest = graph.add_message(make_raw(9))
    assert [m.provider_message_id for m in poll(outlook).messages] == [newest]


def test_an_expired_next_link_mid_round_restarts_the_round(outlook, graph):
    ids = [graph.add_message(make_raw(n)) for n in range(4)]
    provider = provider_for(outlook)
    first = provider.poll({})
    graph.expire_sync_states()

    batches = [provider.poll(first.cursor)]
    while batches[-1].more:
        batches.append(provider.poll(batches[-1].cursor))

    assert [m.provider_message_id for b in batches for m in b.messages] == ids  # a whole new round
    assert "delta_link" in batches[-1].cursor


def test_an_unrelated_400_on_the_delta_link_is_not_a_resync(outlook, graph):
    graph.add_message(make_raw(1))
    poll(outlook)
    graph.fail("/messages/delta", 400, body={"error": {"code": "BadRequest"}})
    with pytest.raises(PermanentError) as caught:
        provider_for(outlook).poll(cursor(outlook))
    assert caught.value.reason == "rejected"


def test_a_message_deleted_before_the_fetch_is_skipped(outlook, graph):
    poll(outlook)
    gone = graph.add_message(make_raw(1))
    kept = graph.add_message(make_raw(2))
    graph.fail(f"/messages/{gone}/$value", 404, body={"error": {"code": "ErrorItemNotFound"}})

    report = poll(outlook)

    assert report.status == "ok"
    assert set(events(outlook)) == {kept}


def test_links_to_another_origin_are_refused_before_the_token_is_sent(outlook, graph):
    elsewhere = FakeGraph().start()
    try:
        with pytest.raises(PermanentError) as caught:
            provider_for(outlook).poll({"delta_link": f"{elsewhere.api_base}/users/x/messages/delta?$deltatoken=a"})
        assert caught.value.reason == "configuration"
        assert elsewhere.requests == []
    finally:
        elsewhere.stop()


# --- Failures -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make_fault, reason, retry_after",
    [
        (lambda: {"status": 429, "headers": {"Retry-After": "11"}}, "rate_limited", 11.0),
        (lambda: {"status": 503, "headers": {"Retry-After": http_date(90)}}, "server_error", 90.0),
        (lambda: {"status": 504}, "server_error", None),
        (lambda: {"drop": True}, "connection", None),
    ],
    ids=["429", "503-date", "504", "dropped"],
)
def test_throttling_server_errors_and_dropped_connections_back_off_with_the_cursor_untouched(
    outlook, graph, make_fault, reason, retry_after
):
    graph.add_message(make_raw(1))
    poll(outlook)
    stored = cursor(outlook)
    message_id = graph.add_message(make_raw(2))

    graph.fail("/messages/delta", **make_fault())
    with pytest.raises(TransientError) as caught:
        provider_for(outlook).poll(stored)
    assert caught.value.reason == reason
    assert caught.value.retry_after == (None if retry_after is None else pytest.approx(retry_after, abs=2))

    graph.fail("/$value", **make_fault())  # now the MIME fetch fails
    report = poll(outlook)
    outlook.refresh_from_db()
    assert report.status == "backoff" and outlook.health == "backoff"
    assert cursor(outlook) == stored
    assert InboxEvent.objects.filter(mailbox=outlook).count() == 1

    report = poll(outlook, trigger=polling.MANUAL)
    assert report.status == "ok" and [m.provider_message_id for m in report.messages] == [message_id]


def test_refused_client_credentials_mark_the_mailbox_credentials_invalid(outlook, graph, monkeypatch):
    monkeypatch.setenv("GRAPH_TEST_CREDENTIALS", json.dumps({"client_secret": "rotated-away"}))

    report = poll(outlook)

    outlook.refresh_from_db()
    assert report.status == "credentials_invalid" and outlook.health == "credentials_invalid"
    assert "invalid_client" in outlook.health_detail and "rotated-away" not in outlook.health_detail
    assert poll(outlook).status == "credentials_invalid"  # not polled again until an admin resets it
    assert graph.token_requests == 1


def test_a_token_endpoint_outage_is_transient(outlook, graph):
    graph.fail("/oauth2/v2.0/token", 503, headers={"Retry-After": "30"})
    with pytest.raises(TransientError) as caught:
        provider_for(outlook).poll({})
    assert caught.value.retry_after == 30.0


@pytest.mark.parametrize("status, times", [(401, 2), (403, 1)])
def test_graph_refusing_the_token_is_a_credentials_failure(outlook, graph, status, times):
    graph.fail("/messages/delta", status, times=times, body={"error": {"code": "ErrorAccessDenied"}})
    with pytest.raises(PermanentError) as caught:
        provider_for(outlook).poll({})
    assert caught.value.reason == "credentials"


def test_an_expired_token_is_refreshed_once_and_the_call_retried(outlook, graph):
    graph.add_message(make_raw(1))
    poll(outlook)
    graph.revoke_tokens()
    graph.add_message(make_raw(2))

    assert poll(outlook).new == 1
    assert graph.token_requests == 2


def test_a_delegated_refresh_token_works_too(outlook, graph, monkeypatch):
    graph.refresh_token = "delegated-refresh"
    monkeypatch.setenv(
        "GRAPH_TEST_CREDENTIALS",
        json.dumps({"refresh_token": "delegated-refresh", "client_secret": graph.client_secret}),
    )
    graph.add_message(make_raw(1))

    assert poll(outlook).new == 1
    [token_call] = [r for r in graph.requests if r["path"].endswith("/token")]
    form = {k: v[0] for k, v in parse_qs(token_call["body"].decode()).items()}
    assert form["grant_type"] == "refresh_token" and "offline_access" in form["scope"]


def test_nothing_logged_holds_a_token_a_body_or_a_full_address(outlook, graph, client, caplog):
    graph.add_message(make_raw(1))
    with caplog.at_level(logging.DEBUG):
        notify(client, outlook, graph.notification(CLIENT_STATE))
        poll(outlook)
        ensure_graph_subscription(outlook)
    assert "support@acme.test" not in caplog.text
    assert "Help with" not in caplog.text
    assert CLIENT_STATE not in caplog.text and graph.client_secret not in caplog.text
    assert not any(token in caplog.text for token in graph.access_tokens)


# --- Subscriptions ---------------------------------------------------------------------------------


def test_a_subscription_is_created_renewed_before_expiry_and_recreated_when_gone(outlook, graph):
    outcome, row = ensure_graph_subscription(outlook)

    assert outcome == "created"
    [created] = graph.subscriptions.values()
    assert created["changeType"] == "created"
    assert created["resource"] == "users/support@acme.test/mailFolders('inbox')/messages"
    assert created["clientState"] == CLIENT_STATE
    assert created["notificationUrl"] == created["lifecycleNotificationUrl"] == outlook.settings["notification_url"]
    assert row.external_id == created["id"]
    assert timedelta(minutes=4220) < row.expires_at - timezone.now() < timedelta(minutes=4240)

    assert ensure_graph_subscription(outlook)[0] == "current"
    assert renew_due_subscriptions() == {"created": 0, "renewed": 0, "current": 1, "busy": 0, "failed": 0}

    later = timezone.now() + timedelta(minutes=4230 - 60 * 23)  # less than a day left
    assert renew_due_subscriptions(now=later)["renewed"] == 1
    assert graph.subscriptions[row.external_id]["renewals"] == 1
    row.refresh_from_db()
    assert row.renewed_at == later and row.expires_at > later + timedelta(minutes=4200)

    graph.subscriptions.clear()  # Graph dropped it
    outcome, replacement = ensure_graph_subscription(outlook, force=True)
    assert outcome == "created" and replacement.external_id != row.external_id
    assert ProviderSubscription.objects.filter(mailbox=outlook, provider="graph").count() == 1


def test_renewal_skips_polling_only_mailboxes_and_records_refused_credentials(outlook, graph, monkeypatch, tenant):
    Mailbox.objects.create(
        tenant=tenant, slug="poll-only", address="p@acme.test", provider="graph", settings={"api_base": graph.api_base}
    )
    monkeypatch.setenv("GRAPH_TEST_CREDENTIALS", json.dumps({"client_secret": "wrong"}))

    assert renew_due_subscriptions()["failed"] == 1
    outlook.refresh_from_db()
    assert outlook.health == "credentials_invalid"
    assert renew_due_subscriptions()["failed"] == 0  # not tried again until an admin resets it
    assert not ProviderSubscription.objects.exists()


def test_subscription_settings_are_checked_before_calling_graph(outlook, graph, monkeypatch):
    monkeypatch.setenv("GRAPH_TEST_CLIENT_STATE", "x" * 129)
    with pytest.raises(PermanentError) as caught:
        ensure_graph_subscription(outlook)
    assert caught.value.reason == "configuration"
    assert graph.requests == []


@pytest.mark.django_db(transaction=True)
def test_graph_validates_our_webhook_when_the_subscription_is_created(outlook, graph, live_server):
    """Graph POSTs a validationToken to the notification URL during the create: our webhook must echo it."""
    graph.validate = True
    outlook.settings = {**outlook.settings, "notification_url": f"{live_server.url}/webhooks/graph/{outlook.slug}/"}
    outlook.save()

    outcome, row = ensure_graph_subscription(outlook)

    assert outcome == "created"
    assert graph.validations == [{"ok": True, "status": 200, "content_type": "text/plain; charset=utf-8"}]

    # A URL that does not answer the handshake (another mailbox's, unknown here) makes the create fail.
    outlook.settings = {**outlook.settings, "notification_url": f"{live_server.url}/webhooks/graph/nobody/"}
    graph.subscriptions.clear()
    with pytest.raises(PermanentError):
        ensure_graph_subscription(outlook, force=True)
    assert graph.validations[-1]["ok"] is False and graph.validations[-1]["status"] == 404


def _quote(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")

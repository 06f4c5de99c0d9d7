"""The web door's shortcuts keep the raw webhook's contract (docs/design.md §2, step 1).

The mailbox is cached per process for a few seconds; these tests stand in for another process whose
cache still holds a mailbox that changed (no signal reaches it): a deleted mailbox stores nothing and
answers 404, a rotated secret is honoured in this process at once, a new mailbox answers at once.
"""

import pytest
from django.db import connection
from django.test import Client

from intake import selectors
from intake.models import InboxEvent, Mailbox, WebhookRejectionCount
from tests.conftest import WEBHOOK_SECRET
from tests.factories import make_mailbox
from tests.mail import make_message, webhook_headers


def post(slug: str, body: bytes, secret: str = WEBHOOK_SECRET):
    return Client().post(
        f"/webhooks/raw/{slug}/", data=body, content_type="message/rfc822", **webhook_headers(secret, body)
    )


@pytest.mark.django_db(transaction=True)  # the foreign key is checked at commit: commit for real
def test_a_mailbox_deleted_behind_a_cached_copy_stores_nothing_and_answers_404(mailbox):
    # A mailbox with events cannot be deleted (evidence is PROTECTed); one without can.
    empty = make_mailbox(mailbox.tenant, slug="empty", address="empty@acme.test")
    assert selectors.mailbox_by_slug("empty").pk == empty.pk  # cached
    with connection.cursor() as cursor:  # deleted by another process: no signal reaches this one
        cursor.execute("DELETE FROM intake_mailbox WHERE id = %s", [empty.pk])
    assert selectors.mailbox_by_slug("empty") is not None  # still cached: the case under test

    response = post("empty", make_message())

    assert response.status_code == 404
    assert not InboxEvent.objects.filter(mailbox_id=empty.pk).exists()
    assert WebhookRejectionCount.objects.get(provider="raw", reason="unknown_mailbox").count == 1
    assert selectors.mailbox_by_slug("empty") is None  # forgotten


def test_a_rotated_secret_is_used_at_once_and_the_old_one_refused(mailbox, monkeypatch):
    assert post("support", make_message()).status_code == 202  # cached with the old reference
    monkeypatch.setenv("MAILROOM_T_ACME_WEBHOOK", "the-new-secret")
    mailbox.webhook_secret_ref = "env:MAILROOM_T_ACME_WEBHOOK"
    mailbox.save()

    assert post("support", make_message()).status_code == 401
    assert post("support", make_message(), secret="the-new-secret").status_code == 202


def test_a_new_mailbox_answers_at_once_after_its_slug_was_asked_for(mailbox):
    assert post("later", make_message()).status_code == 404  # an unknown slug is not cached
    with connection.cursor() as cursor:  # created by another process: no signal here either
        cursor.execute(
            "INSERT INTO intake_mailbox (tenant_id, slug, address, address_key, provider, "
            "webhook_secret_ref, credentials_ref, settings, allowed_recipients, poll_enabled, paused, "
            "created_at, health, health_detail) SELECT tenant_id, 'later', 'later@acme.test', "
            "'later@acme.test', 'raw', webhook_secret_ref, '', '{}', '[]', false, false, now(), 'ok', '' "
            "FROM intake_mailbox WHERE id = %s",
            [mailbox.pk],
        )
    response = post("later", make_message())
    assert response.status_code == 202
    assert InboxEvent.objects.get(pk=response.json()["inbox_event_id"]).mailbox.slug == "later"


@pytest.mark.parametrize("path", ["/webhooks/raw/support/", "/healthz"])
def test_every_answer_carries_a_request_id_and_webhooks_skip_the_browser_middleware(mailbox, path):
    client = Client()
    body = make_message()
    if path.startswith("/webhooks/"):
        response = client.post(
            path,
            data=body,
            content_type="message/rfc822",
            HTTP_X_REQUEST_ID="abc-123",
            **webhook_headers(WEBHOOK_SECRET, body),
        )
        assert response.status_code == 202
        assert "X-Frame-Options" not in response and "Set-Cookie" not in response  # no browser middleware
    else:
        response = client.get(path, HTTP_X_REQUEST_ID="abc-123")
        assert response.status_code == 200 and response["X-Frame-Options"] == "DENY"
    assert response["X-Request-ID"] == "abc-123"
    assert Mailbox.objects.filter(slug="support").exists()

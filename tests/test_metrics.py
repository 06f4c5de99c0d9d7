"""GET /metrics (the documented contract, reconciliation.metrics): bearer token, Prometheus text from the database."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from intake.models import InboxEvent, OutboxMessage
from intake.services import transition_event
from intake.vocabulary import ReasonCode
from tests.factories import make_destination, make_event
from tests.mail import make_message
from tests.support.metrics import TOKEN, scrape, value
from ticketing.services import process_inbox_event

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token(settings):
    settings.MAILROOM_METRICS_TOKEN = TOKEN


def test_404_without_the_token_setting_and_for_a_missing_or_wrong_token(db, settings):
    settings.MAILROOM_METRICS_TOKEN = ""
    client = Client()
    assert client.get("/metrics").status_code == 404
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 404
    settings.MAILROOM_METRICS_TOKEN = TOKEN
    assert client.get("/metrics").status_code == 404
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 404
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Token {TOKEN}").status_code == 404
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200


def test_every_metric_with_values_read_from_the_database(token, mailbox, scanner_off):
    done = make_event(mailbox)
    process_inbox_event(done.pk)
    review = make_event(mailbox)
    transition_event(
        review.pk,
        [InboxEvent.State.RECEIVED],
        InboxEvent.State.AWAITING_REVIEW,
        actor="test",
        kind=None,
        reason_code=ReasonCode.NO_DESTINATION,
    )
    InboxEvent.objects.filter(pk=review.pk).update(received_at=timezone.now() - timedelta(hours=2))
    stuck = make_event(mailbox)  # received, never processed
    InboxEvent.objects.filter(pk=stuck.pk).update(received_at=timezone.now() - timedelta(minutes=10))
    make_destination(mailbox.tenant, slug="desk", kind="builtin", is_default=False, paused=True)

    samples = scrape()

    assert value(samples, "mailroom_events", state="completed") == 1
    assert value(samples, "mailroom_events", state="awaiting_review") == 1
    assert value(samples, "mailroom_events", state="received") == 1
    assert value(samples, "mailroom_events", state="failed") == 0
    assert value(samples, "mailroom_intents", state="succeeded") >= 1
    assert value(samples, "mailroom_recovery_queue_items") == 1
    assert 7190 < value(samples, "mailroom_recovery_queue_oldest_seconds") < 7300
    first_unmapped = value(samples, "mailroom_oldest_unmapped_seconds")
    assert 590 < first_unmapped < 700
    assert value(samples, "mailroom_destination_paused", destination="acme/desk") == 1
    assert value(samples, "mailroom_destination_paused", destination="acme/builtin") == 0
    assert value(samples, "mailroom_outbox_lag_seconds") >= 0
    # No ReconciliationRun yet (or none finished): the family is there, without samples.
    assert not [key for key in samples if key[0] == "mailroom_last_reconciliation_timestamp_seconds"]

    # The stuck event keeps ageing: the gauge rises with it.
    InboxEvent.objects.filter(pk=stuck.pk).update(received_at=timezone.now() - timedelta(minutes=30))
    assert value(scrape(), "mailroom_oldest_unmapped_seconds") > first_unmapped + 1000

    # Outbox lag: the age of the oldest unpublished row.
    OutboxMessage.objects.update(published_at=timezone.now())
    assert value(scrape(), "mailroom_outbox_lag_seconds") == 0
    OutboxMessage.objects.create(topic="test", payload={}, created_at=timezone.now() - timedelta(seconds=120))
    assert 119 < value(scrape(), "mailroom_outbox_lag_seconds") < 200


def test_a_refused_webhook_is_counted_by_provider_and_reason(token, mailbox):
    client = Client()
    body = make_message()
    response = client.post(
        "/webhooks/raw/support/",
        data=body,
        content_type="message/rfc822",
        HTTP_X_MAILROOM_TIMESTAMP=str(int(timezone.now().timestamp())),
        HTTP_X_MAILROOM_SIGNATURE="v1=" + "0" * 64,
    )
    assert response.status_code == 401
    assert client.post("/webhooks/raw/nope/", data=body, content_type="message/rfc822").status_code == 404
    # A provider name made up in the URL is folded, so labels stay a fixed set.
    assert client.post("/webhooks/made-up/support/", data=body, content_type="message/rfc822").status_code == 404
    client.post(
        "/webhooks/raw/support/",
        data=body,
        content_type="message/rfc822",
        HTTP_X_MAILROOM_TIMESTAMP="1",
        HTTP_X_MAILROOM_SIGNATURE="v1=00",
    )

    samples = scrape()
    assert value(samples, "mailroom_webhook_rejections_total", provider="raw", reason="bad_signature") == 2
    assert value(samples, "mailroom_webhook_rejections_total", provider="raw", reason="unknown_mailbox") == 1
    assert value(samples, "mailroom_webhook_rejections_total", provider="unknown", reason="unknown_mailbox") == 1
    assert InboxEvent.objects.count() == 0


def test_last_reconciliation_per_kind_and_scope(token, db):
    from reconciliation.models import ReconciliationRun as run

    now = timezone.now()
    run.objects.create(
        kind="unmapped", scope="(all)", started_at=now - timedelta(hours=1), finished_at=now - timedelta(minutes=59)
    )
    run.objects.create(
        kind="unmapped", scope="(all)", started_at=now - timedelta(minutes=2), finished_at=now - timedelta(minutes=1)
    )
    run.objects.create(kind="outbox", scope="(all)", started_at=now)  # still running: not a finished run
    samples = scrape()
    assert value(
        samples, "mailroom_last_reconciliation_timestamp_seconds", kind="unmapped", scope="(all)"
    ) == pytest.approx((now - timedelta(minutes=1)).timestamp())
    assert value(samples, "mailroom_last_reconciliation_timestamp_seconds", kind="outbox", scope="(all)") is None


def test_a_stuck_event_is_found_unmapped_the_gauge_rises_and_falls_once_it_is_resolved(token, mailbox, scanner_off):
    from reconciliation.models import Finding
    from reconciliation.reconcilers import reconcile

    stuck = make_event(mailbox)  # stored, never processed: a lost broker message
    InboxEvent.objects.filter(pk=stuck.pk).update(received_at=timezone.now() - timedelta(minutes=40))
    reconcile(mailbox=mailbox.slug)
    finding = Finding.objects.get(kind="unmapped")
    assert finding.resolved_at is None
    rising = value(scrape(), "mailroom_oldest_unmapped_seconds")
    assert rising > 2000
    assert value(scrape(), "mailroom_recovery_queue_items") == 1  # the open finding puts it in the queue

    assert process_inbox_event(stuck.pk) == "created"
    reconcile(mailbox=mailbox.slug)
    finding.refresh_from_db()
    assert finding.resolved_at is not None
    samples = scrape()
    assert value(samples, "mailroom_oldest_unmapped_seconds") == 0
    assert value(samples, "mailroom_recovery_queue_items") == 0
    assert value(samples, "mailroom_last_reconciliation_timestamp_seconds", kind="unmapped", scope=mailbox.slug) > 0

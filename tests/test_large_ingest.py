"""A message above the spool threshold reaches PostgreSQL a piece at a time (a large object the ingest
statement reads into the row, unlinked before the commit): stored byte-identical with its audit and outbox
rows, a duplicate is still a duplicate, and neither a commit nor a rollback leaves a large object behind."""

import pytest
from django.db import IntegrityError, connection
from django.test import Client

from intake import services
from intake.models import AuditEvent, InboxEvent, Mailbox, OutboxMessage
from intake.services import ingestion
from tests.conftest import WEBHOOK_SECRET
from tests.mail import make_message, webhook_headers

URL = "/webhooks/raw/support/"


@pytest.fixture
def small_pieces(settings, monkeypatch):
    """Anything over 4 KiB is large here, and goes up in 1,000-byte pieces (the last one shorter)."""
    settings.MAILROOM_SPOOL_THRESHOLD_BYTES = 4096
    monkeypatch.setattr(ingestion, "UPLOAD_PIECE_BYTES", 1000)


def large_objects() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_largeobject_metadata")
        return cursor.fetchone()[0]


def a_large_message() -> bytes:
    body = make_message(body="a line of the attached report\n" * 400)
    assert len(body) > 4096 and len(body) % 1000
    return body


def test_a_large_message_is_stored_byte_identical_in_pieces_and_leaves_no_large_object(mailbox, small_pieces):
    body = a_large_message()
    before = large_objects()
    response = Client().post(URL, data=body, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, body))
    assert response.status_code == 202
    event = InboxEvent.objects.get(pk=response.json()["inbox_event_id"])
    assert bytes(event.raw) == body and event.size == len(body)
    assert AuditEvent.objects.filter(inbox_event=event, kind="received", detail__size=len(body)).count() == 1
    assert OutboxMessage.objects.filter(payload__inbox_event_id=event.pk).count() == 1
    assert large_objects() == before

    again = Client().post(URL, data=body, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, body))
    assert (again.status_code, again.json()) == (200, {"inbox_event_id": event.pk, "duplicate": True})
    assert InboxEvent.objects.count() == 1 and large_objects() == before


def test_a_large_message_that_cannot_be_stored_rolls_back_its_pieces_too(transactional_db, mailbox, small_pieces):
    body = a_large_message()
    before = large_objects()
    gone = Mailbox(pk=mailbox.pk + 1000, tenant=mailbox.tenant, slug="gone", address="gone@acme.test")
    with pytest.raises(IntegrityError):
        services.ingest(gone, "<gone@acme.test>", body, source="raw")
    assert not InboxEvent.objects.exists()
    assert large_objects() == before

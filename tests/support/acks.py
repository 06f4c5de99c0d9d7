"""Mail posted to the raw webhook as our MTA delivers it, and the acknowledgment intent it leads to."""

from django.test import Client

from tests.conftest import WEBHOOK_SECRET
from tests.mail import webhook_headers
from tests.senderauth import stamped
from ticketing.models import Intent


def post(body, authenticated: bool = True) -> int:
    if authenticated:
        body = stamped(body)  # authenticated for example.com: the senders of the tests that use this write from it
    response = Client().post(
        "/webhooks/raw/support/", data=body, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, body)
    )
    assert response.status_code == 202
    return response.json()["inbox_event_id"]


def notify_intent(event_id) -> Intent:
    return Intent.objects.get(inbox_event_id=event_id, action="notify_requester")

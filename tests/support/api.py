"""The REST API (/api/v1/): a token-authenticated client, RFC 9457 problem answers, queue items made for it."""

from rest_framework.test import APIClient

from intake.failures import PermanentError
from intake.models import InboxEvent
from tests.support.queue import new_event
from tests.support.users import token_for
from ticketing import intents
from ticketing.models import Destination
from ticketing.outcomes import Outcome
from ticketing.services import process_inbox_event

API = "/api/v1"
PROBLEM = "application/problem+json"


def api(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(user)}")
    return client


def review_item(mailbox, **fields) -> int:
    """An item in the queue: awaiting_review/no_destination (the tenant had no default destination)."""
    default = Destination.objects.filter(tenant=mailbox.tenant, is_default=True).first()
    Destination.objects.filter(tenant=mailbox.tenant).update(is_default=False)
    event_id = new_event(mailbox, **fields)
    assert process_inbox_event(event_id) == Outcome.AWAITING_REVIEW
    if default:
        Destination.objects.filter(pk=default.pk).update(is_default=True)
    return event_id


def failed_item(mailbox, destination, **fields) -> int:
    """An item whose create_ticket intent failed permanently at `destination` (event failed/rejected)."""
    event_id = review_item(mailbox, **fields)
    intent = intents.ensure_intent(InboxEvent.objects.get(pk=event_id), "create_ticket", destination)
    assert intents.claim(intent.pk, worker="test")
    rejected = PermanentError("rejected", "422 from the desk")
    assert intents.record_failure(intent, exc=rejected, worker="test") == "failed"
    return event_id


def assert_problem(response, status):
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith(PROBLEM)
    body = response.json()
    assert {"type", "title", "status", "detail"} <= set(body) and body["status"] == status
    return body

"""The AI proposal in the recovery console: shown on a low-confidence item, accepted in one click.

The worker is `process_inbox_event` called in-process; the destination is the built-in store.
"""

import pytest

from intake.models import AuditEvent, InboxEvent
from intake.services import transition_event
from reconciliation import services
from tests.factories import make_event
from tests.support.queue import normalize
from tests.support.users import make_user
from ticketing.models import RoutingPolicy, Ticket
from ticketing.services import process_inbox_event

ITEM_URL = "/admin/reconciliation/recoveryitem/{}/change/"
ACT_URL = "/admin/reconciliation/recoveryitem/{}/act/{}/"
PROPOSAL = {
    "fields": {"queue": "billing", "priority": "high", "request_type": "refund"},
    "confidence": 0.42,
    "rationale": "Asks for a refund of invoice 42.",
    "failure": "",
}


@pytest.fixture
def low_confidence_item(mailbox, scanner_off):
    RoutingPolicy.objects.filter(tenant=mailbox.tenant).update(
        queues=["billing", "tech"], request_types=["refund", "outage"]
    )
    event = make_event(mailbox, subject="Refund please", body="Invoice 42 was charged twice.\n")
    normalize(event.pk)
    route = {"fields": {"assignee": {"value": "", "origin": "default"}}, "ai": PROPOSAL}
    assert transition_event(
        event.pk,
        InboxEvent.OPEN_STATES,
        InboxEvent.State.AWAITING_REVIEW,
        actor="system:test",
        kind="awaiting_review",
        reason_code="low_confidence",
        reason_detail="AI confidence 0.42 below 0.7",
        extra={"route": route},
    )
    return event


@pytest.fixture
def operator(mailbox, client):
    user = make_user("olga", groups=["operator"], tenants=[mailbox.tenant])
    client.force_login(user)  # the axes backend wants a request: force_login
    return user


def test_the_item_page_shows_the_proposal_and_prefills_the_correction(low_confidence_item, operator, client):
    page = client.get(ITEM_URL.format(low_confidence_item.pk)).content.decode()
    assert 'id="ai-proposal"' in page and 'id="accept-proposal"' in page
    assert "billing" in page and "Asks for a refund of invoice 42." in page and "0.42" in page
    form = page[page.index('id="form-correct"') :]
    form = form[: form.index("</form>")]
    assert 'value="billing"' in form
    assert '<option value="high" selected>' in form and '<option value="refund" selected>' in form


def test_accept_replays_with_the_proposal_and_the_ticket_has_its_fields(low_confidence_item, operator, client):
    response = client.post(ACT_URL.format(low_confidence_item.pk, "accept_proposal"))
    assert response.status_code == 302
    event = InboxEvent.objects.get(pk=low_confidence_item.pk)
    assert event.state == InboxEvent.State.READY
    assert event.route_override == {"queue": "billing", "priority": "high", "request_type": "refund"}
    audit = AuditEvent.objects.filter(inbox_event_id=event.pk, kind="replayed").get()
    assert audit.actor == "user:olga" and audit.detail["route"] == event.route_override

    process_inbox_event(event.pk)
    assert InboxEvent.objects.get(pk=event.pk).state == InboxEvent.State.COMPLETED
    ticket = Ticket.objects.get()
    assert (ticket.queue, ticket.priority, ticket.request_type) == ("billing", "high", "refund")


def test_accept_is_refused_without_a_usable_proposal(low_confidence_item, operator, client):
    InboxEvent.objects.filter(pk=low_confidence_item.pk).update(
        route={"ai": {**PROPOSAL, "fields": {}, "failure": "ai_timeout"}}
    )
    client.post(ACT_URL.format(low_confidence_item.pk, "accept_proposal"))
    assert InboxEvent.objects.get(pk=low_confidence_item.pk).state == InboxEvent.State.AWAITING_REVIEW
    assert 'id="ai-proposal"' not in client.get(ITEM_URL.format(low_confidence_item.pk)).content.decode()


def test_accept_needs_the_replay_permission(low_confidence_item, mailbox, client):
    user = make_user("vera", groups=["security"], tenants=[mailbox.tenant])
    with pytest.raises(services.access.PermissionDenied):
        services.do_accept_proposal(user, low_confidence_item.pk)
    client.force_login(user)
    assert client.post(ACT_URL.format(low_confidence_item.pk, "accept_proposal")).status_code == 403

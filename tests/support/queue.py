"""The recovery queue: events to put in it, items in each state, FakeDesk destinations, the queue's URL."""

from datetime import timedelta

import pytest
from django.utils import timezone

from intake.keys import provider_message_id_for_raw
from intake.mime import parse_message
from intake.models import AuditEvent, InboxEvent
from intake.services import ingest, transition_event
from tests.mail import make_message
from ticketing.models import Destination, Intent
from ticketing.services import process_inbox_event

QUEUE_URL = "/admin/reconciliation/recoveryitem/"


def new_event(mailbox, **fields) -> int:
    """A stored event (the raw webhook's path): `raw` bytes as given, or a message made from `fields`."""
    raw = fields.pop("raw", None) or make_message(**fields)
    return ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id


def set_default(tenant, destination):
    Destination.objects.filter(tenant=tenant).update(is_default=False)
    Destination.objects.filter(pk=destination.pk).update(is_default=True)


def age(event_id, hours):
    InboxEvent.objects.filter(pk=event_id).update(received_at=timezone.now() - timedelta(hours=hours))


def normalize(event_id):
    """What the pipeline stores before validation decides: sender, subject, Message-ID."""
    parsed = parse_message(bytes(InboxEvent.objects.get(pk=event_id).raw))
    InboxEvent.objects.filter(pk=event_id).update(
        sender=parsed.sender, subject=parsed.subject, message_id_header=parsed.message_id
    )


def quarantine(event_id, reason="attachment_type"):
    normalize(event_id)
    assert transition_event(
        event_id,
        InboxEvent.OPEN_STATES,
        InboxEvent.State.QUARANTINED,
        actor="system:test",
        kind="quarantined",
        reason_code=reason,
        reason_detail="invoice.exe: extension .exe",
    )


def intent_of(event_id, version=None) -> Intent:
    intents_ = Intent.objects.filter(inbox_event_id=event_id, action="create_ticket").order_by("-action_version")
    return intents_.get(action_version=version) if version else intents_.first()


def tickets_for(desk, intent) -> list:
    return [t for t in desk.tickets() if t["external_id"] == intent.external_ref]


def act(client, event_id, action, **data):
    return client.post(f"{QUEUE_URL}{event_id}/act/{action}/", data)


def audit(event_id, kind):
    return list(AuditEvent.objects.filter(inbox_event_id=event_id, kind=kind).order_by("at", "pk"))


class RequestSpy:
    """Every HTTP request FakeDesk receives on its API (reads included; the control API excluded)."""

    def __init__(self):
        self.requests = []

    def __len__(self):
        return len(self.requests)


@pytest.fixture
def desk_calls(desk):
    spy = RequestSpy()
    desk.on_request(lambda request: spy.requests.append((request.method, request.path)))
    return spy


def zendesk_destinations(tenant, desk, monkeypatch):
    """`desk` (good credentials) and `desk-bad` (a revoked token): both FakeDesk, speaking Zendesk."""
    monkeypatch.setenv("FAKEDESK_CREDENTIALS", f"agent@acme.test/token:{desk.token}")
    monkeypatch.setenv("FAKEDESK_BAD_CREDENTIALS", "agent@acme.test/token:revoked")
    settings = {"read_timeout": 2.0, "retry_base_seconds": 0.01, "retry_cap_seconds": 0.05}
    good = Destination.objects.create(
        tenant=tenant,
        slug="desk",
        kind="zendesk",
        base_url=desk.url,
        credentials_ref="env:FAKEDESK_CREDENTIALS",
        settings=settings,
    )
    bad = Destination.objects.create(
        tenant=tenant,
        slug="desk-bad",
        kind="zendesk",
        base_url=desk.url,
        credentials_ref="env:FAKEDESK_BAD_CREDENTIALS",
        settings=settings,
    )
    return good, bad


def seed_three(mailbox, good, bad, desk):
    """Three items, oldest first: failed on a revoked token, quarantined, and unknown (ticket exists)."""
    tenant = mailbox.tenant
    set_default(tenant, bad)
    failed = new_event(mailbox, subject="Printer on fire", sender="alice@customer.test")
    assert process_inbox_event(failed) == "failed"
    quarantined = new_event(mailbox, subject="Invoice attached", sender="mallory@customer.test")
    quarantine(quarantined)
    set_default(tenant, good)
    desk.set_plan(["drop_after_commit"])
    unknown = new_event(mailbox, subject="Cannot log in", sender="bob@customer.test")
    assert process_inbox_event(unknown) == "unknown"
    for event_id, hours in ((failed, 3), (quarantined, 2), (unknown, 1)):
        age(event_id, hours)
    return failed, quarantined, unknown


@pytest.fixture
def destinations(tenant, mailbox, desk, monkeypatch):
    return zendesk_destinations(tenant, desk, monkeypatch)


@pytest.fixture
def seeded(mailbox, destinations, desk):
    good, bad = destinations
    return seed_three(mailbox, good, bad, desk)

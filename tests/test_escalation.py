"""Escalation that acts (reconciliation.services.escalation): a default escalation time per reason on
entering the recovery queue, overdue items first and flagged, one email per item per escalation (no
body, no full address), and a daily digest per tenant."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from intake.models import InboxEvent
from intake.services import transition_event
from reconciliation.services import do_assign, escalation
from tests.smtp import smtp_server  # noqa: F401  (fixture)
from tests.support.queue import QUEUE_URL, new_event, normalize, quarantine
from tests.support.users import make_user
from ticketing.models import Notification

BODY = "My password is hunter2 and the server room is on fire.\n"
SENDER = "jane.doe@customer.test"


def escalate_in(event_id, hours):
    InboxEvent.objects.filter(pk=event_id).update(escalate_at=timezone.now() + timedelta(hours=hours))


@pytest.fixture
def operators(tenant):
    return [make_user(name, groups=["operator"], tenants=[tenant]) for name in ("olga", "otto")]


def review(event_id, reason="encrypted"):
    normalize(event_id)
    assert transition_event(
        event_id,
        InboxEvent.OPEN_STATES,
        InboxEvent.State.AWAITING_REVIEW,
        actor="system:test",
        kind="awaiting_review",
        reason_code=reason,
        reason_detail="test",
    )


def hours_until_escalation(event_id) -> float:
    event = InboxEvent.objects.get(pk=event_id)
    return (event.escalate_at - event.updated_at).total_seconds() / 3600


def test_entering_the_queue_sets_the_default_escalation_time_per_reason_and_tenant(tenant, mailbox, settings):
    malware, encrypted, typed = (new_event(mailbox) for _ in range(3))
    quarantine(malware, reason="malware")
    review(encrypted)
    quarantine(typed)
    assert hours_until_escalation(malware) == 1
    assert hours_until_escalation(encrypted) == 24  # awaiting_review
    assert hours_until_escalation(typed) == 4  # quarantined

    # A move inside the queue keeps the time; the tenant's own hours win over the instance's.
    before = InboxEvent.objects.get(pk=malware).escalate_at
    assert transition_event(
        malware,
        [InboxEvent.State.QUARANTINED],
        InboxEvent.State.FAILED,
        actor="system:test",
        kind="poison",
        reason_code="poison",
    )
    assert InboxEvent.objects.get(pk=malware).escalate_at == before
    tenant.settings = {"escalate_after_hours": {"awaiting_review": 2}}
    tenant.save()
    later = new_event(mailbox)
    review(later)
    assert hours_until_escalation(later) == 2
    tenant.settings = {"escalate_after_hours": 5}
    tenant.save()
    last = new_event(mailbox)
    quarantine(last, reason="malware")
    assert hours_until_escalation(last) == 5


def test_an_overdue_item_is_emailed_once_without_body_or_address(tenant, mailbox, operators, smtp_server):
    make_user("outsider", groups=["operator"])  # not a member of the tenant
    item = new_event(mailbox, sender=SENDER, body=BODY, subject="Secret subject")
    quarantine(item, reason="malware")
    not_yet = new_event(mailbox)
    quarantine(not_yet)

    assert escalation.send_escalations() == 0  # nothing is overdue yet
    escalate_in(item, -1)
    assert escalation.send_escalations() == 1
    assert escalation.send_escalations() == 0  # once per escalation, however often beat runs
    [email] = smtp_server.messages
    assert sorted(a.strip() for a in email["To"].split(",")) == sorted(u.email for u in operators)
    text = email["Subject"] + email.get_content()
    assert f"#{item}" in text and "malware" in text and f"/admin/reconciliation/recoveryitem/{item}/change/" in text
    assert "Age:" in text and "j***@c***.test" in text
    assert SENDER not in text and "hunter2" not in text and "Secret subject" not in text
    [row] = Notification.objects.filter(kind="escalation")
    assert row.inbox_event_id == item and sorted(row.recipients) == ["olga", "otto"]

    # Assigned and escalated again by an operator: a new escalation, to the owner only.
    do_assign(make_user("lead", groups=["operator"], tenants=[tenant], is_superuser=True), item, operators[0])
    escalate_in(item, -0.5)
    assert escalation.send_escalations() == 1
    assert smtp_server.messages[-1]["To"] == operators[0].email
    assert escalation.send_escalations() == 0 and len(smtp_server.messages) == 2


def test_overdue_items_come_first_and_are_flagged_in_the_queue(tenant, mailbox, operators):
    older, overdue = new_event(mailbox), new_event(mailbox)
    quarantine(older)
    quarantine(overdue)
    InboxEvent.objects.filter(pk=older).update(received_at=timezone.now() - timedelta(hours=3))
    escalate_in(overdue, -1)
    client = Client()
    client.force_login(operators[0])
    page = client.get(QUEUE_URL).content.decode()
    assert page.index(f'#{overdue} <span class="overdue-mark"') < page.index(f"#{older}<")
    assert page.count('class="overdue"') == 1 and 'id="overdue-count">1<' in page


def test_the_daily_digest_goes_once_per_tenant_and_day(tenant, mailbox, operators, smtp_server):
    items = [new_event(mailbox, sender=SENDER, body=BODY) for _ in range(3)]
    quarantine(items[0], reason="malware")
    quarantine(items[1], reason="malware")
    review(items[2])
    escalate_in(items[1], -1)
    assert escalation.send_daily_digests() == 1
    assert escalation.send_daily_digests() == 0
    [email] = smtp_server.messages
    text = email["Subject"] + email.get_content()
    assert "3 open item(s)" in text and "overdue: 1" in text
    assert "malware: 2" in text and "encrypted: 1" in text and "Oldest:" in text
    assert all(f"/admin/reconciliation/recoveryitem/{i}/change/" in text for i in items)
    assert text.index(f"#{items[1]} ") < text.index(f"#{items[0]} ")  # overdue first
    assert SENDER not in text and "hunter2" not in text
    assert Notification.objects.filter(kind="digest", tenant=tenant).count() == 1


def test_the_escalation_input_holds_whole_minutes_so_the_browser_accepts_a_picked_time():
    """A value with seconds makes a datetime-local input's step base fall between minutes: the browser then
    refuses every whole-minute time a person picks. The form renders minutes and takes them back."""
    from datetime import UTC, datetime

    from reconciliation.admin.forms import EscalationForm

    html = str(EscalationForm(initial={"escalate_at": datetime(2026, 12, 1, 21, 19, 47, tzinfo=UTC)})["escalate_at"])
    assert 'value="2026-12-01T21:19"' in html and 'step="60"' in html
    posted = EscalationForm({"escalate_at": "2026-12-02T09:30"})
    assert posted.is_valid(), posted.errors
    assert posted.cleaned_data["escalate_at"].replace(tzinfo=None) == datetime(2026, 12, 2, 9, 30)

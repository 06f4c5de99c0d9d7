"""The operators' dashboard: backlog, oldest item, throughput and failures as inline SVG, tenant-scoped."""

import re
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from intake.models import InboxEvent
from intake.services import transition_event
from reconciliation import charts
from reconciliation.dashboard import run_model
from tests.factories import make_destination, make_mailbox, make_tenant
from tests.support.users import make_user
from ticketing.models import Destination, Intent

URL = "/admin/reconciliation/recoveryitem/dashboard/"


def make_event(mailbox, subject):
    """An event row as intake stores it (the ORM, so the test reads only what the dashboard reads)."""
    now = timezone.now()
    return InboxEvent.objects.create(
        tenant_id=mailbox.tenant_id,
        mailbox=mailbox,
        provider_message_id=subject,
        dedupe_key=f"{mailbox.pk}-{subject}",
        source="raw",
        received_at=now,
        updated_at=now,
        size=1,
        subject=subject,
    )


def move(event, state, reason="", hours_ago=0):
    at = timezone.now() - timedelta(hours=hours_ago)
    assert transition_event(event.pk, [event.state], state, actor="system:test", kind=None, reason_code=reason, now=at)
    InboxEvent.objects.filter(pk=event.pk).update(updated_at=at)


def failing_intent(event, kind):
    return Intent.objects.create(
        idempotency_key=f"key-{event.pk}",
        inbox_event=event,
        action="create_ticket",
        destination=Destination.objects.get(tenant_id=event.tenant_id, is_default=True),
        state="failed",
        last_error_kind=kind,
        external_ref=f"mr-{event.pk}",
        created_at=timezone.now(),
    )


def titles(html: str, plot: str) -> list[str]:
    block = re.search(rf'<div[^>]*id="plot-{plot}">(.*?)</svg>', html, re.S).group(1)
    return re.findall(r"<rect[^>]*><title>([^<]*)</title>", block)


def backlog_row(html: str, state: str) -> int:
    return int(re.search(rf'<tr class="backlog-{state}"><td>{state}</td><td>(\d+)</td>', html).group(1))


@pytest.fixture
def operator(tenant):
    return make_user("oper", groups=["operator"], tenants=[tenant])


@pytest.fixture
def seeded(mailbox):
    """acme: 2 received, 1 ready, 1 completed today, 1 quarantined (attachment_type) with a failed intent;
    another tenant: 3 received and 1 failed, which acme's operator must never count."""
    events = [make_event(mailbox, f"acme {n}") for n in range(5)]
    move(events[2], "ready")
    move(events[3], "completed", hours_ago=1)
    move(events[4], "quarantined", reason="attachment_type")
    failing_intent(events[4], "credentials")
    InboxEvent.objects.filter(pk=events[0].pk).update(received_at=timezone.now() - timedelta(hours=5))

    other = make_tenant(slug="globex")
    make_destination(other)
    other_box = make_mailbox(other, slug="globex-support")
    others = [make_event(other_box, f"globex {n}") for n in range(4)]
    move(others[3], "failed", reason="credentials")
    failing_intent(others[3], "credentials")
    return events


def test_dashboard_shows_backlog_throughput_and_failures_of_the_users_tenants(client, operator, seeded):
    client.force_login(operator)
    response = client.get(URL)
    assert response.status_code == 200
    html = response.content.decode()

    assert backlog_row(html, "received") == 2
    assert backlog_row(html, "ready") == 1
    assert backlog_row(html, "quarantined") == 1
    assert backlog_row(html, "failed") == 0  # globex's failed event is not ours
    assert re.search(r'id="backlog-total">4<', html)
    assert re.search(r'id="queue-open">1<', html)
    assert re.search(r'id="pipeline-oldest">5\xa0hours<', html)

    backlog = titles(html, "backlog")
    assert "received: 2" in backlog and "quarantined: 1" in backlog and "failed: 0" in backlog

    hourly = titles(html, "hourly")
    assert len(hourly) == 48  # 24 hours x (received, completed)
    assert sum(int(t.rsplit(": ", 1)[1]) for t in hourly if t.startswith("received")) == 5
    assert sum(int(t.rsplit(": ", 1)[1]) for t in hourly if t.startswith("completed")) == 1
    daily = titles(html, "daily")
    assert len(daily) == 60
    # Each received event on the day it arrived (one arrived 5 hours ago: yesterday, shortly after midnight).
    received_days = Counter(
        f"{at:%m-%d}"
        for at in InboxEvent.objects.filter(pk__in=[e.pk for e in seeded]).values_list("received_at", flat=True)
    )
    assert sum(received_days.values()) == 5
    for day, count in received_days.items():
        assert f"received {day}: {count}" in daily
    assert f"completed {timezone.now() - timedelta(hours=1):%m-%d}: 1" in daily

    assert titles(html, "events-24h") == ["attachment_type: 1"]
    assert titles(html, "intents-24h") == ["credentials: 1"]  # globex's credentials failure is not counted
    assert titles(html, "events-30d") == ["attachment_type: 1"]
    main = html[html.index('id="content-main"') :]
    assert "<script" not in main and "http" not in main.replace("http://www.w3.org/2000/svg", "")


def test_dashboard_with_no_data_at_all(client, operator):
    client.force_login(operator)
    html = client.get(URL).content.decode()
    assert re.search(r'id="backlog-total">0<', html)
    assert re.search(r'id="pipeline-oldest">—<', html)
    assert all(t.endswith(": 0") for t in titles(html, "hourly"))
    assert titles(html, "events-30d") == [] and "nothing" in html
    assert html.count('<svg xmlns="http://www.w3.org/2000/svg" role="img" class="chart"') == 7
    if run_model() is None:
        assert "No reconciliation has run yet." in html
    else:
        assert "No mailboxes." in html


def test_last_reconciliation_per_mailbox(client, operator, mailbox):
    make_mailbox(mailbox.tenant, slug="sales")
    other_box = make_mailbox(make_tenant(slug="globex"), slug="globex-support")
    client.force_login(operator)
    model = run_model()
    if model is None:  # the runs' model is not there yet
        assert "No reconciliation has run yet." in client.get(URL).content.decode()
        return
    now = timezone.now()
    model.objects.create(
        kind="provider", scope="support", started_at=now - timedelta(days=2), finished_at=now, scanned=1, findings=0
    )
    model.objects.create(
        kind="provider",
        scope="support",
        started_at=now - timedelta(hours=1),
        finished_at=now,
        scanned=40,
        findings=3,
        repaired=2,
    )
    model.objects.create(kind="provider", scope=other_box.slug, started_at=now, scanned=99)
    html = client.get(URL).content.decode()
    row = re.search(r'<tr class="reconciliation-support">(.*?)</tr>', html, re.S).group(1)
    assert "<td>provider</td><td>40</td><td>3</td><td>2</td>" in row
    assert re.search(r'<tr class="reconciliation-sales">.*?<td>never</td>', html, re.S)
    assert "globex-support" not in html and "<td>99</td>" not in html


def test_dashboard_needs_the_queue_permission_and_is_linked_from_queue_and_index(client, operator, tenant):
    outsider = make_user("nobody", tenants=[tenant])
    client.force_login(outsider)
    assert client.get(URL).status_code == 403
    client.force_login(operator)
    assert URL in client.get("/admin/reconciliation/recoveryitem/").content.decode()
    assert URL in client.get("/admin/").content.decode()


def test_charts_escape_and_carry_numbers():
    svg = charts.bar_chart("A <b> title", ["x&y"], [("s", [3])])
    assert "<title>A &lt;b&gt; title</title>" in svg and "<title>s x&amp;y: 3</title>" in svg
    assert "<title>k: 0</title>" in charts.hbar_chart("t", [("k", 0)])

"""Pause switches (global, per mailbox, per destination), edited on the admin's pause page.

While paused, intake still stores every message and workers make no destination
writes; resuming drains the backlog, each message exactly once. The in-process
tests deliver the outbox the way the relay and a worker would; the live one runs
the real relay and Celery worker processes against FakeDesk.
"""

from collections import Counter

import pytest
import requests
from django.test import Client

from config.test_settings import redis_database
from intake.models import InboxEvent, Mailbox, Switch, Tenant
from intake.signing import signed_headers
from tests.conftest import WEBHOOK_SECRET
from tests.live import (  # noqa: F401  (fixtures)
    LIVE_SECRET,
    event_states,
    flushed_broker,
    live_mailbox,
    live_processes,
    make_email,
    subprocess_env,
    wait_for,
)
from tests.mail import make_message, webhook_headers
from tests.support.pause import PAUSES_URL, drain_outbox, toggle
from tests.support.queue import QUEUE_URL, desk_calls, set_default, zendesk_destinations  # noqa: F401  (fixtures)
from tests.support.users import make_user
from ticketing.models import Destination, Intent, TicketMapping

N = 20
# Not tests.live's database 13: a suite running elsewhere on this Redis must not take our tasks.
PAUSE_REDIS_DB = redis_database("pause")


def post_email(client, mailbox, body):
    return client.post(
        f"/webhooks/raw/{mailbox.slug}/",
        data=body,
        content_type="message/rfc822",
        **webhook_headers(WEBHOOK_SECRET, body),
    )


def assert_each_completed_once(desk, ids):
    assert Counter(InboxEvent.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"completed": len(ids)}
    refs = set(
        Intent.objects.filter(inbox_event_id__in=ids, action="create_ticket").values_list("external_ref", flat=True)
    )
    tickets = desk.tickets()
    assert len(refs) == len(ids)
    assert Counter(t["external_id"] for t in tickets if t["external_id"] in refs) == {ref: 1 for ref in refs}
    assert TicketMapping.objects.filter(inbox_event_id__in=ids, action="create_ticket").count() == len(ids)
    writes = [r for r in desk.requests_log() if r["external_id"] in refs]
    assert len(writes) == len(ids), "one create per message, no retries needed"


@pytest.fixture
def pause_broker():
    with flushed_broker(PAUSE_REDIS_DB) as broker:
        yield broker


@pytest.fixture
def zendesk(tenant, mailbox, desk, monkeypatch):
    good, _ = zendesk_destinations(tenant, desk, monkeypatch)
    set_default(tenant, good)
    return good


@pytest.fixture
def admin_client(tenant):
    client = Client()
    client.force_login(make_user("boss", groups=["mailroom-admin", "operator"], tenants=[tenant]))
    return client


@pytest.fixture
def platform_client(db):
    """The platform operator: the global pause is theirs alone."""
    client = Client()
    client.force_login(make_user("root", is_superuser=True))
    return client


def test_global_pause_stores_every_message_writes_nothing_and_resume_drains_each_once(
    admin_client, platform_client, zendesk, mailbox, desk, desk_calls
):
    assert toggle(platform_client, "global", True).status_code == 302
    switch = Switch.objects.get(name=Switch.GLOBAL_PAUSE)
    assert switch.on and switch.changed_by == "user:root"

    webhook = Client()
    responses = [post_email(webhook, mailbox, make_message(subject=f"Paused #{n}")) for n in range(N)]
    assert [r.status_code for r in responses] == [202] * N
    ids = [r.json()["inbox_event_id"] for r in responses]
    assert drain_outbox(times=2) == {"paused": 2 * N}
    assert len(desk_calls) == 0 and desk.tickets() == []
    stored = InboxEvent.objects.filter(pk__in=ids)
    assert stored.count() == N and not stored.filter(raw__isnull=True).exists()
    assert stored.filter(retry_at__isnull=False).count() == N  # parked, waiting for the resume
    assert not Intent.objects.filter(inbox_event_id__in=ids).exists()

    queue_page = admin_client.get(QUEUE_URL).content.decode()  # a tenant's admin sees why nothing moves
    assert 'id="paused-global"' in queue_page and "by user:root" in queue_page
    pause_page = admin_client.get(PAUSES_URL).content.decode()
    assert f'id="waiting-total">{N}<' in pause_page and 'id="toggle-global"' not in pause_page

    response = toggle(platform_client, "global", False)
    assert f"{N} waiting event(s) released" in platform_client.get(response.url).content.decode()
    assert drain_outbox(times=2) == {"created": N, "done": N}
    assert_each_completed_once(desk, ids)
    assert 'id="pause-banner-none"' in admin_client.get(QUEUE_URL).content.decode()


def test_a_paused_mailbox_waits_while_the_others_run(admin_client, zendesk, tenant, mailbox, desk):
    other = Mailbox.objects.create(
        tenant=tenant, slug="sales", address="sales@acme.test", webhook_secret_ref="env:MAILROOM_TEST_WEBHOOK_SECRET"
    )
    assert toggle(admin_client, "mailbox", True, mailbox.pk).status_code == 302
    assert Mailbox.objects.get(pk=mailbox.pk).paused
    assert "mailbox support (acme)" in admin_client.get(QUEUE_URL).content.decode()
    webhook = Client()
    held = [post_email(webhook, mailbox, make_message()).json()["inbox_event_id"] for _ in range(3)]
    running = [
        post_email(webhook, other, make_message(to="sales@acme.test")).json()["inbox_event_id"] for _ in range(2)
    ]
    assert drain_outbox() == {"paused": 3, "created": 2}
    assert_each_completed_once(desk, running)

    toggle(admin_client, "mailbox", False, mailbox.pk)
    assert drain_outbox() == {"created": 3}
    assert_each_completed_once(desk, held)


def test_a_paused_destination_gets_no_calls_until_resumed(admin_client, zendesk, mailbox, desk, desk_calls):
    toggle(admin_client, "destination", True, zendesk.pk)
    assert Destination.objects.get(pk=zendesk.pk).paused
    assert "destination desk (acme)" in admin_client.get(QUEUE_URL).content.decode()
    webhook = Client()
    ids = [post_email(webhook, mailbox, make_message()).json()["inbox_event_id"] for _ in range(3)]
    assert drain_outbox() == {"paused": 3}
    assert len(desk_calls) == 0

    toggle(admin_client, "destination", False, zendesk.pk)
    assert drain_outbox() == {"created": 3}
    assert_each_completed_once(desk, ids)


def test_global_pause_wins_over_a_resumed_mailbox(admin_client, platform_client, zendesk, mailbox, desk, desk_calls):
    assert toggle(platform_client, "global", True).status_code == 302
    toggle(admin_client, "mailbox", True, mailbox.pk)
    ids = [post_email(Client(), mailbox, make_message()).json()["inbox_event_id"] for _ in range(2)]
    drain_outbox()
    toggle(admin_client, "mailbox", False, mailbox.pk)  # the global pause still holds everything
    assert drain_outbox() == {} and len(desk_calls) == 0
    toggle(platform_client, "global", False)
    assert drain_outbox() == {"created": 2}
    assert_each_completed_once(desk, ids)


def test_pauses_need_their_permissions_and_stay_within_the_users_tenants(client, tenant, mailbox, zendesk):
    other = Tenant.objects.create(slug="globex")
    other_mailbox = Mailbox.objects.create(tenant=other, slug="globex-support", address="help@globex.test")
    other_destination = Destination.objects.create(tenant=other, slug="globex-desk", kind="builtin", is_default=True)

    client.force_login(make_user("oper", groups=["operator"], tenants=[tenant]))
    assert client.get(PAUSES_URL).status_code == 403
    assert toggle(client, "global", True).status_code == 403
    assert not Switch.objects.filter(on=True).exists()

    client.force_login(make_user("acme-admin", groups=["mailroom-admin"], tenants=[tenant]))
    page = client.get(PAUSES_URL).content.decode()
    assert "support" in page and "globex" not in page
    assert toggle(client, "mailbox", True, other_mailbox.pk).status_code == 404
    assert toggle(client, "destination", True, other_destination.pk).status_code == 404
    assert not Mailbox.objects.get(pk=other_mailbox.pk).paused
    assert not Destination.objects.get(pk=other_destination.pk).paused


@pytest.mark.live
def test_global_pause_with_the_real_relay_and_worker(
    live_server, live_mailbox, pause_broker, live_processes, desk, desk_calls, monkeypatch
):
    """20 signed emails over HTTP while paused: all stored, FakeDesk hears nothing; resumed: 20 tickets, once each."""
    monkeypatch.setenv("CELERY_BROKER_URL", pause_broker.url)
    good, _ = zendesk_destinations(live_mailbox.tenant, desk, monkeypatch)
    set_default(live_mailbox.tenant, good)
    admin = Client()
    admin.force_login(make_user("root", is_superuser=True))  # the global pause is the platform's
    assert toggle(admin, "global", True).status_code == 302

    env = subprocess_env(pause_broker.url)
    live_processes.worker(env)
    live_processes.relay(env)
    url = f"{live_server.url}/webhooks/raw/{live_mailbox.slug}/"
    ids = []
    for n in range(N):
        body = make_email(f"Paused live #{n}")
        response = requests.post(url, data=body, timeout=15, headers=signed_headers(LIVE_SECRET, body))
        assert response.status_code == 202, response.text
        ids.append(response.json()["inbox_event_id"])

    # The worker saw each one and parked it: no intent, no call.
    wait_for(
        lambda: InboxEvent.objects.filter(pk__in=ids, retry_at__isnull=False).count() == N,
        timeout=30,
        interval=0.2,
        describe=lambda: f"{event_states(ids)}\n{live_processes.logs()}",
    )
    assert len(desk_calls) == 0 and desk.tickets() == []
    assert InboxEvent.objects.filter(pk__in=ids, raw__isnull=False).count() == N

    assert toggle(admin, "global", False).status_code == 302
    wait_for(
        lambda: event_states(ids).get("completed", 0) == N,
        timeout=60,
        interval=0.25,
        describe=lambda: f"{event_states(ids)}\n{live_processes.logs()}",
    )
    assert_each_completed_once(desk, ids)

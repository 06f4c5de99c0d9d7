"""The console's boundaries (issue 20, findings 5-7 and two lower ones), each attack replayed as it was made:
through the admin (Django's test client on the admin URLs) and the REST API (`/api/v1/`, a token) where both
exist, on real PostgreSQL, with the worker (`process_inbox_event`) run in process into the built-in store.

- 5: quarantine stays a security decision: an operator cannot close a quarantined item, and a replay of one
     that was ever quarantined (and not released by security) is judged again, never sent on.
- 6: the global pause is the platform's (superusers); a tenant's admin pauses only their own tenant.
- 7: a dry run of a rule that reads bodies needs the body permission, is audited, and has a total time budget.
- 9: the assign action gives one answer for every user it will not take (no username enumeration).
"""

import time

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.core.exceptions import PermissionDenied
from django.test import Client
from django.utils import timezone

from intake.models import AuditEvent, InboxEvent, OutboxMessage, Switch
from intake.selectors import tenant_pause_name
from intake.services import PROCESS_TOPIC, transition_event
from reconciliation import services
from tests.factories import ingest_message, make_destination, make_mailbox, make_tenant
from tests.support.api import API, api
from tests.support.users import make_user, operator, security  # noqa: F401  (fixtures: the two roles of one tenant)
from ticketing import replay, tasks
from ticketing.models import Intent, RoutingRule, Ticket, TicketMapping
from ticketing.services import process_inbox_event

pytestmark = pytest.mark.usefixtures("scanner_off")

QUEUE_URL = "/admin/reconciliation/recoveryitem/"
PAUSES_URL = "/admin/reconciliation/pauseswitch/"
RULES_URL = "/admin/ticketing/routingrule/"
# Sniffs as an executable and ends in .exe: validation quarantines it (attachment_type) before any scan.
EXE = b"MZ\x90\x00\x03\x00\x00\x00\x04\x00\x00\x00\xff\xff\x00\x00" + b"\x00" * 48 + b"PE\x00\x00" + b"\x00" * 64


# --- helpers ----------------------------------------------------------------------------------------------


def console(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def act(client, event_id, action, **data):
    return client.post(f"{QUEUE_URL}{event_id}/act/{action}/", data)


def messages_of(client, response) -> str:
    return client.get(response.url).content.decode() if response.status_code == 302 else response.content.decode()


def receive(mailbox, **fields) -> int:
    return ingest_message(mailbox, **fields).inbox_event_id


def quarantined_exe(mailbox) -> int:
    """A message the pipeline itself quarantines (an .exe attachment), judged by the real worker path."""
    event_id = receive(
        mailbox,
        subject="Your invoice",
        sender="mallory@evil.example",
        attachments=[("invoice.exe", "application/octet-stream", EXE)],
    )
    assert process_inbox_event(event_id) == "quarantined"
    return event_id


def kinds(event_id) -> list[str]:
    return list(AuditEvent.objects.filter(inbox_event_id=event_id).order_by("pk").values_list("kind", flat=True))


def nothing_sent_on(event_id) -> bool:
    """No intent (no ticket, no acknowledgment) and no ticket mapping for the event."""
    return (
        not Intent.objects.filter(inbox_event_id=event_id).exists()
        and not TicketMapping.objects.filter(inbox_event_id=event_id).exists()
    )


def ticket_count(event_ids) -> int:
    """Tickets in the built-in store made for these events (each mapping names its store row)."""
    ids = TicketMapping.objects.filter(inbox_event_id__in=list(event_ids), action="create_ticket").values_list(
        "ticket_id", flat=True
    )
    return Ticket.objects.filter(pk__in=[int(i) for i in ids]).count()


def state(event_id) -> str:
    return InboxEvent.objects.get(pk=event_id).state


@pytest.fixture
def tenant_admin(tenant):
    return make_user("ada", groups=["mailroom-admin", "operator"], tenants=[tenant])


@pytest.fixture
def platform(db):
    return make_user("root", is_superuser=True)


# --- 5: quarantine stays a security decision ---------------------------------------------------------------


def test_an_operator_cannot_close_a_quarantined_item_in_the_console_or_the_api(mailbox, operator):
    event_id = quarantined_exe(mailbox)
    client = console(operator)
    assert 'id="form-close"' not in client.get(f"{QUEUE_URL}{event_id}/change/").content.decode()
    assert act(client, event_id, "close", reason="not a request").status_code == 403
    response = api(operator).post(f"{API}/queue/{event_id}/close/", {"reason": "not a request"}, format="json")
    assert response.status_code == 403 and "security role" in response.json()["detail"]
    with pytest.raises(PermissionDenied):
        services.do_close_not_a_request(operator, event_id, reason="not a request")
    # Nor does the layer below close it for a caller that did not check the security role.
    with pytest.raises(replay.ReplayRefused, match="security role"):
        replay.close_not_a_request(event_id, actor="user:oper", reason="not a request")
    assert state(event_id) == "quarantined" and "closed_not_a_request" not in kinds(event_id)


def test_close_then_replay_judges_the_message_again_instead_of_making_a_ticket(mailbox, operator, security):
    """The attack: close-as-not-a-request on a quarantined item, then replay -> ticket and acknowledgment.

    Only security may close it now; and a replay after that close (console, API, corrected route) sends
    it back through validation and the scan, which quarantine it again.
    """
    event_id = quarantined_exe(mailbox)
    sec, oper = console(security), console(operator)
    assert 'id="form-close"' in sec.get(f"{QUEUE_URL}{event_id}/change/").content.decode()
    assert act(sec, event_id, "close", reason="spam, keep the evidence").status_code == 302
    assert state(event_id) == "suppressed"

    response = act(oper, event_id, "replay")
    assert "sent back to validation and the malware scan" in messages_of(oper, response)
    assert state(event_id) == "received"
    assert process_inbox_event(event_id) == "quarantined"
    assert nothing_sent_on(event_id)

    # The same through the API, with the close made there too (by security) and a corrected route.
    sec_api, oper_api = api(security), api(operator)
    assert sec_api.post(f"{API}/queue/{event_id}/close/", {"reason": "still spam"}, format="json").status_code == 200
    response = oper_api.post(f"{API}/queue/{event_id}/replay/", format="json")
    assert response.status_code == 200 and response.json()["outcome"] == "rejudged"
    assert process_inbox_event(event_id) == "quarantined"
    sec_api.post(f"{API}/queue/{event_id}/close/", {"reason": "still spam"}, format="json")
    builtin = mailbox.tenant.destinations.get(slug="builtin")
    response = oper_api.post(f"{API}/queue/{event_id}/correct-and-replay/", {"destination": builtin.pk}, format="json")
    assert response.status_code == 200 and response.json()["outcome"] == "rejudged"
    assert process_inbox_event(event_id) == "quarantined"
    assert nothing_sent_on(event_id)
    replays = AuditEvent.objects.filter(inbox_event_id=event_id, kind="replayed").order_by("pk")
    assert [(r.actor, r.detail["outcome"]) for r in replays] == [("user:oper", "rejudged")] * 3


def test_confirm_and_replay_as_new_are_no_way_out_of_quarantine(mailbox, operator, security):
    event_id = quarantined_exe(mailbox)
    services.do_close_not_a_request(security, event_id, reason="spam")
    ticket = Ticket.objects.create(
        destination=mailbox.tenant.destinations.get(slug="builtin"),
        idempotency_key="k" * 64,
        external_ref="manual",
        created_at=timezone.now(),
    )
    client = console(operator)
    response = act(client, event_id, "confirm", ticket_id=str(ticket.pk))
    assert response.status_code == 302 and "Not done: it was quarantined" in messages_of(client, response)
    response = api(operator).post(f"{API}/queue/{event_id}/confirm/", {"ticket_id": str(ticket.pk)}, format="json")
    assert response.status_code == 409 and "no security user released it" in response.json()["detail"]
    with pytest.raises(replay.ReplayRefused, match="replayed as a new action"):
        replay.replay_as_new_action(event_id, actor="user:oper", approved_by="user:oper", reason="x")
    assert state(event_id) == "suppressed" and nothing_sent_on(event_id)


def test_bulk_replay_judges_an_unreleased_item_again(mailbox, operator, security):
    """An item the old close-and-replay got past quarantine (now awaiting review) is in a bulk replay."""
    closed_by_operator = quarantined_exe(mailbox)
    assert transition_event(
        closed_by_operator,
        ["quarantined"],
        "awaiting_review",
        actor="system:test",
        kind="awaiting_review",
        reason_code="no_destination",
        reason_detail="the old way out",
    )
    client = console(operator)
    selection = {"action": "bulk_replay", "_selected_action": [closed_by_operator]}
    preview = client.post(QUEUE_URL, selection)
    assert "rejudge" in preview.content.decode()
    client.post(QUEUE_URL, {**selection, "confirmed": "yes"})
    assert state(closed_by_operator) == "received"
    assert process_inbox_event(closed_by_operator) == "quarantined"

    replay.close_not_a_request(closed_by_operator, actor="user:sec", reason="x", may_close_quarantined=True)
    response = api(operator).post(f"{API}/queue/bulk-replay/", {"event_ids": [closed_by_operator]}, format="json")
    [item] = response.json()
    assert (item["plan"], item["outcome"]) == ("rejudge", "rejudged")
    assert process_inbox_event(closed_by_operator) == "quarantined"
    assert nothing_sent_on(closed_by_operator)


def test_a_replay_that_judges_again_goes_on_when_the_verdict_is_clean(mailbox, operator, security):
    """Judged again means judged: a message quarantined by an earlier verdict that no longer holds goes on."""
    event_id = receive(mailbox, subject="Quarterly report", sender="jane@example.com")
    assert transition_event(
        event_id,
        InboxEvent.OPEN_STATES,
        "quarantined",
        actor="system:test",
        kind="quarantined",
        reason_code="malware",
        reason_detail="a scanner false positive",
    )
    services.do_close_not_a_request(security, event_id, reason="looks harmless")
    assert services.do_replay(operator, event_id) == "rejudged"
    assert process_inbox_event(event_id) == "created"
    assert state(event_id) == "completed" and ticket_count([event_id]) == 1


def test_a_security_release_still_makes_the_ticket_in_the_console_and_the_api(mailbox, operator, security):
    by_console, by_api = quarantined_exe(mailbox), quarantined_exe(mailbox)
    # Not the operator's to do, in either.
    assert act(console(operator), by_console, "release").status_code == 403
    assert api(operator).post(f"{API}/queue/{by_api}/release/", {}, format="json").status_code == 403

    assert act(console(security), by_console, "release", note="a signed installer").status_code == 302
    response = api(security).post(f"{API}/queue/{by_api}/release/", {"note": "ours"}, format="json")
    assert response.status_code == 200 and response.json()["event"]["state"] == "ready"
    for event_id in (by_console, by_api):
        assert OutboxMessage.objects.filter(topic=PROCESS_TOPIC, payload={"inbox_event_id": event_id}).exists()
        assert process_inbox_event(event_id) == "created"
        assert state(event_id) == "completed"
        assert ticket_count([event_id]) == 1
        assert "quarantine_released" in kinds(event_id)


# --- 6: the global pause is the platform's -------------------------------------------------------------------


def toggle(client, target, paused, object_id="", reason="a test pause"):
    return client.post(
        PAUSES_URL,
        {"target": target, "paused": "1" if paused else "0", "id": object_id, "reason": reason if paused else ""},
    )


def test_a_tenant_admin_can_neither_set_nor_lift_the_global_pause(mailbox, tenant_admin, platform):
    admin = console(tenant_admin)
    page = admin.get(PAUSES_URL).content.decode()
    assert 'id="toggle-global"' not in page and 'id="global-platform-only"' in page
    assert toggle(admin, "global", True).status_code == 403
    assert not Switch.objects.filter(name=Switch.GLOBAL_PAUSE, on=True).exists()

    assert toggle(console(platform), "global", True).status_code == 302
    assert toggle(admin, "global", False).status_code == 403  # the platform's pause holds
    switch = Switch.objects.get(name=Switch.GLOBAL_PAUSE)
    assert switch.on and switch.changed_by == "user:root"

    # Not through the service either, not even with every permission of the app granted one by one.
    strong = make_user("ada2", groups=["mailroom-admin"], tenants=[mailbox.tenant])
    strong.user_permissions.add(*Permission.objects.filter(content_type__app_label="reconciliation"))
    with pytest.raises(PermissionDenied, match="platform operator"):
        services.do_set_global_pause(strong, False)
    # And the REST API has no pause to set at all.
    assert api(tenant_admin).post(f"{API}/pauses/", {"global": False}, format="json").status_code == 404
    assert Switch.objects.get(name=Switch.GLOBAL_PAUSE).on


def test_a_tenant_pause_holds_only_that_tenant_and_its_resume_drains_it_once(tenant, mailbox, tenant_admin):
    globex = make_tenant(slug="globex")
    make_destination(globex)
    theirs = make_mailbox(globex, slug="globex-support", address="help@globex.test")
    admin = console(tenant_admin)
    assert toggle(admin, "tenant", True, tenant.pk).status_code == 302
    assert Switch.objects.get(name=tenant_pause_name(tenant.pk)).changed_by == "user:ada"
    entry = LogEntry.objects.filter(user=tenant_admin).latest("pk")
    assert entry.change_message == "tenant acme pause on (was off); reason: a test pause"
    assert toggle(admin, "tenant", True, globex.pk).status_code == 404  # not theirs to pause
    assert not Switch.objects.filter(name=tenant_pause_name(globex.pk), on=True).exists()

    ours = [receive(mailbox, subject=f"Held #{n}") for n in range(3)]
    other = [receive(theirs, to="help@globex.test", subject=f"Runs #{n}") for n in range(2)]
    assert [process_inbox_event(e) for e in ours[:1]] == ["paused"]
    # The set-based group path (plain mail to the built-in store) honours it too.
    assert tasks.process_inbox_events(ours[1:] + other) == {"paused": 2, "created": 2}
    assert not Intent.objects.filter(inbox_event_id__in=ours).exists()
    assert InboxEvent.objects.filter(pk__in=ours, retry_at__isnull=False).count() == 3  # parked

    queue = admin.get(QUEUE_URL).content.decode()
    assert 'class="paused-tenant">tenant acme' in queue
    assert 'data-tenant="acme"' in admin.get(PAUSES_URL).content.decode()

    response = toggle(admin, "tenant", False, tenant.pk)
    assert "3 waiting event(s) released" in admin.get(response.url).content.decode()
    assert [process_inbox_event(e) for e in ours] == ["created"] * 3
    assert [process_inbox_event(e) for e in ours] == ["done"] * 3
    assert ticket_count(ours) == 3


def test_a_tenant_resume_does_not_lift_the_global_pause(tenant, mailbox, tenant_admin, platform):
    admin = console(tenant_admin)
    toggle(admin, "tenant", True, tenant.pk)
    event_id = receive(mailbox)
    assert process_inbox_event(event_id) == "paused"
    toggle(console(platform), "global", True)
    assert services.do_set_tenant_pause(tenant_admin, tenant.pk, False) == 0  # nothing released: global holds
    assert process_inbox_event(event_id) == "paused"
    assert services.do_set_global_pause(platform, False) == 1
    assert process_inbox_event(event_id) == "created"


# --- 7: the dry run of a body condition ---------------------------------------------------------------------


def body_rule(tenant, **conditions) -> RoutingRule:
    return RoutingRule.objects.create(
        tenant=tenant, name="Leaks", position=10, enabled=False, queue="", conditions=conditions
    )


def test_a_body_dry_run_needs_the_body_permission(tenant, mailbox, tenant_admin):
    secret = receive(mailbox, subject="Reset", body="my password is hunter2\n")
    receive(mailbox, subject="Hello", body="nothing here\n")
    admin = console(tenant_admin)
    for conditions in ({"body_regex": "hunter2"}, {"keywords": ["hunter2"]}):
        rule = body_rule(tenant, **conditions)
        response = admin.get(f"{RULES_URL}{rule.pk}/dry-run/")
        text = response.content.decode()
        assert response.status_code == 403 and 'id="dry-run-denied"' in text
        assert "message-body permission" in text and "dry-run-match" not in text and f"#{secret}" not in text
    assert not AuditEvent.objects.filter(kind="body_searched").exists()
    # A rule that reads no body runs as before.
    subject_rule = body_rule(tenant, subject_regex="^reset")
    response = admin.get(f"{RULES_URL}{subject_rule.pk}/dry-run/")
    assert response.status_code == 200 and [m.event.pk for m in response.context["result"].matches] == [secret]


def test_a_body_dry_run_by_a_user_with_the_permission_is_audited_per_message(tenant, mailbox):
    secret = receive(mailbox, subject="Reset", sender="jane@example.com", body="my password is hunter2\n")
    other = receive(mailbox, subject="Hello", sender="jane@example.com", body="nothing here\n")
    stranger = receive(mailbox, subject="Hello", sender="bob@example.com", body="hunter2 too\n")
    user = make_user("sam", groups=["mailroom-admin", "security"], tenants=[tenant])
    rule = body_rule(tenant, sender="jane@example.com", body_regex="hunter2")
    response = console(user).get(f"{RULES_URL}{rule.pk}/dry-run/")
    assert response.status_code == 200
    assert [m.event.pk for m in response.context["result"].matches] == [secret]
    rows = {row.inbox_event_id: row for row in AuditEvent.objects.filter(kind="body_searched")}
    # Bob's body was never searched: the sender condition ruled his message out first.
    assert set(rows) == {secret, other} and stranger not in rows
    assert all(r.actor == "user:sam" and r.detail["rule"] == rule.pk for r in rows.values())
    assert (rows[secret].detail["matched"], rows[other].detail["matched"]) == (True, False)


def test_a_dry_run_stops_at_its_total_time_budget_and_says_so(tenant, mailbox, settings):
    settings.MAILROOM_DRY_RUN_SECONDS = 1.0
    slow_body = "a" * 60 + "!\n"  # (a|aa)+$ backtracks until the regex timeout on each of these
    for n in range(20):
        receive(mailbox, subject=f"Slow #{n}", body=slow_body)
    user = make_user("sam", groups=["mailroom-admin", "security"], tenants=[tenant])
    rule = body_rule(tenant, body_regex="(a|aa)+$")
    started = time.monotonic()
    response = console(user).get(f"{RULES_URL}{rule.pk}/dry-run/")
    elapsed = time.monotonic() - started
    result = response.context["result"]
    assert response.status_code == 200 and result.stopped_for_time
    assert result.total == 20 and 0 < result.scanned < 20
    assert f"stopped after {result.scanned} of 20 messages (time budget)" in response.content.decode()
    assert elapsed < 5, f"the dry run took {elapsed:.1f} s"  # without the budget: ~20 s (one regex timeout each)


# --- 9: one answer for every user the assign action will not take --------------------------------------------


def test_assign_gives_one_answer_for_unknown_foreign_and_unqualified_users(tenant, mailbox, operator):
    event_id = quarantined_exe(mailbox)
    foreign = make_user("otto", groups=["operator"], tenants=[make_tenant(slug="globex")])
    no_queue = make_user("mia", groups=["mailroom-admin"], tenants=[tenant])  # a member who cannot see the queue
    client = console(operator)
    pages = []
    for pk in (foreign.pk, no_queue.pk, 999_999):
        response = act(client, event_id, "assign", assignee=pk)
        assert response.status_code == 400
        pages.append("Not an assignable user" in response.content.decode())
    assert pages == [True, True, True]
    answers = set()
    for name in ("otto", "mia", "nobody-at-all"):
        response = api(operator).post(f"{API}/queue/{event_id}/assign/", {"assignee": name}, format="json")
        assert response.status_code == 400
        answers.add(response.json()["detail"].replace(repr(name), "<name>"))
    assert len(answers) == 1
    with pytest.raises(services.ActionRefused, match="no assignable user 'otto'"):
        services.do_assign(operator, event_id, foreign)
    assert InboxEvent.objects.get(pk=event_id).owner is None and "assigned" not in kinds(event_id)

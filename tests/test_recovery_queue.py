"""The recovery queue in the admin: what it lists, who may do what, and what each action writes.

Destinations are FakeDesk over real HTTP (the `desk` fixture of fakedesk.pytest_plugin);
the worker is `process_inbox_event` called in-process (what a Celery worker would
run for the outbox row an action writes). "Exactly one ticket" is always checked
against FakeDesk's own list.
"""

import importlib
import re
from email.message import EmailMessage

import pytest
from django.apps import apps as django_apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from intake.keys import provider_message_id_for_raw
from intake.models import AuditEvent, InboxEvent, Mailbox, OutboxMessage, Tenant
from intake.services import PROCESS_TOPIC, ingest, transition_event
from reconciliation import services
from reconciliation.selectors import recovery_queue
from tests.mail import make_message
from tests.support.queue import (  # noqa: F401  (fixtures)
    QUEUE_URL,
    act,
    age,
    audit,
    desk_calls,
    destinations,
    intent_of,
    new_event,
    quarantine,
    seeded,
    set_default,
    tickets_for,
)
from tests.support.users import PASSWORD, make_user, operator, operator_client, security  # noqa: F401  (fixtures)
from ticketing import intents
from ticketing.models import Destination, Intent, Ticket, TicketMapping
from ticketing.outcomes import Outcome
from ticketing.services import process_inbox_event

# --- helpers ---------------------------------------------------------------------------


def queue_ids(response) -> list[int]:
    return [int(n) for n in re.findall(r'<th class="field-item"><a href="[^"]+">#(\d+)[ <]', response.content.decode())]


# --- fixtures --------------------------------------------------------------------------


@pytest.fixture
def other_tenant(db):
    """Tenant B with one failed item (its own builtin destination and a second one it routes to)."""
    tenant = Tenant.objects.create(slug="globex", name="Globex")
    Destination.objects.create(tenant=tenant, slug="builtin", kind="builtin", is_default=True)
    mailbox = Mailbox.objects.create(tenant=tenant, slug="globex-support", address="help@globex.test")
    event_id = new_event(mailbox, subject="Globex secret outage", sender="ceo@globex.test", to="help@globex.test")
    assert transition_event(
        event_id,
        InboxEvent.OPEN_STATES,
        InboxEvent.State.FAILED,
        actor="system:test",
        kind="failed",
        reason_code="poison",
        reason_detail="test",
    )
    return tenant, mailbox, event_id


# --- roles -----------------------------------------------------------------------------


def test_the_data_migration_creates_the_three_roles(db):
    # The migration's own step, run on a database without the groups: the rows the migrations wrote may have been
    # flushed by a transactional test that ran earlier in this process (pytest-xdist runs files in any order).
    Group.objects.all().delete()
    migration = importlib.import_module("reconciliation.migrations.0002_role_groups")
    migration.create_role_groups(django_apps, connection.schema_editor())
    groups = {
        g.name: {f"{p.content_type.app_label}.{p.codename}" for p in g.permissions.all()}
        for g in Group.objects.prefetch_related("permissions__content_type")
    }
    assert {"operator", "security", "mailroom-admin"} <= set(groups)
    assert groups["operator"] >= {
        "reconciliation.view_recoveryitem",
        "reconciliation.assign_recoveryitem",
        "reconciliation.replay_recoveryitem",
    }
    assert not groups["operator"] & {
        "intake.view_message_body",
        "intake.release_quarantine",
        "reconciliation.replay_new_action",
    }
    assert groups["security"] >= {"intake.view_message_body", "intake.release_quarantine"}
    assert groups["mailroom-admin"] >= {
        "intake.change_mailbox",
        "ticketing.change_destination",
        "reconciliation.change_pauseswitch",
    }
    # The global pause stops every tenant: no role grants it (superusers only), and the permission is gone.
    assert not Permission.objects.filter(content_type__app_label="reconciliation", codename="set_global_pause")
    evidence = {
        "intake.delete_inboxevent",
        "intake.delete_auditevent",
        "ticketing.delete_intent",
        "ticketing.delete_ticketmapping",
    }
    assert not any(perms & evidence for perms in groups.values())
    assert not Permission.objects.filter(content_type__app_label="reconciliation", codename__startswith="delete_")


# --- the list ----------------------------------------------------------------------------


def test_queue_lists_every_recovery_item_oldest_first_with_its_columns(operator_client, seeded, mailbox, desk):
    failed, quarantined, unknown = seeded
    done = new_event(mailbox, subject="Fine")
    assert process_inbox_event(done) == "created"
    suppressed = new_event(mailbox)
    transition_event(
        suppressed, InboxEvent.OPEN_STATES, "suppressed", actor="t", kind="s", reason_code="auto_submitted"
    )
    review = new_event(mailbox, subject="Who am I")
    transition_event(
        review, InboxEvent.OPEN_STATES, "awaiting_review", actor="t", kind="r", reason_code="missing_sender"
    )
    age(review, 4)

    response = operator_client.get(QUEUE_URL)
    assert response.status_code == 200
    assert queue_ids(response) == [review, failed, quarantined, unknown]
    html = response.content.decode()
    assert re.search(r'id="open-count">4<', html)
    assert re.search(r'id="oldest-age">4\xa0hours<', html)
    assert "The destination refused our credentials" in html  # the reason's human text
    # The destination reference left the list (too wide for a screen): the item page has it.
    assert "desk-bad v1" not in html and intent_of(failed).external_ref not in html
    assert intent_of(failed).external_ref in operator_client.get(f"{QUEUE_URL}{failed}/change/").content.decode()
    assert "Nothing is paused" in html


def test_an_intent_held_for_investigation_is_in_the_queue_until_superseded(operator, seeded, destinations):
    failed, _, unknown = seeded
    Intent.objects.filter(inbox_event_id=failed).update(state="held")
    InboxEvent.objects.filter(pk=failed).update(state="write_pending", reason_code="")
    assert failed in {e.pk for e in recovery_queue()}
    operator.user_permissions.add(Permission.objects.get(codename="replay_new_action"))
    operator = get_user_model().objects.get(pk=operator.pk)  # permissions are cached per user object
    InboxEvent.objects.filter(pk=failed).update(state="failed", reason_code="credentials")
    services.do_replay_as_new_action(operator, failed, reason="key burnt", destination_id=destinations[0].pk)
    assert failed not in {e.pk for e in recovery_queue()}  # v1 held, v2 pending: a worker's, not a person's


def test_queue_page_makes_the_same_number_of_queries_for_3_or_30_items(operator_client, operator, mailbox, tenant):
    def page_queries():
        with CaptureQueriesContext(connection) as ctx:
            assert operator_client.get(QUEUE_URL).status_code == 200
        return len(ctx.captured_queries)

    def add_items(n):
        for i in range(n):
            event_id = new_event(mailbox, subject=f"item {i}")
            transition_event(event_id, InboxEvent.OPEN_STATES, "failed", actor="t", kind="f", reason_code="poison")
            InboxEvent.objects.filter(pk=event_id).update(owner=operator)
            intents.ensure_intent(
                InboxEvent.objects.get(pk=event_id),
                "create_ticket",
                Destination.objects.get(tenant=tenant, slug="builtin"),
            )

    add_items(3)
    few = page_queries()
    add_items(27)
    assert page_queries() == few


def test_filters_by_reason_state_mailbox_owner_tenant(operator_client, operator, seeded, tenant, mailbox):
    failed, quarantined, unknown = seeded
    InboxEvent.objects.filter(pk=quarantined).update(owner=operator)
    assert queue_ids(operator_client.get(QUEUE_URL, {"reason": "credentials"})) == [failed]
    assert queue_ids(operator_client.get(QUEUE_URL, {"state": "quarantined"})) == [quarantined]
    assert queue_ids(operator_client.get(QUEUE_URL, {"state": "unknown"})) == [unknown]
    assert queue_ids(operator_client.get(QUEUE_URL, {"owner": "mine"})) == [quarantined]
    assert queue_ids(operator_client.get(QUEUE_URL, {"owner": "unassigned"})) == [failed, unknown]
    assert queue_ids(operator_client.get(QUEUE_URL, {"mailbox": mailbox.pk})) == [failed, quarantined, unknown]
    assert queue_ids(operator_client.get(QUEUE_URL, {"tenant": tenant.pk})) == [failed, quarantined, unknown]


def test_search_by_sender_subject_message_id_and_ticket_id(operator_client, seeded, desk):
    failed, quarantined, unknown = seeded
    search = lambda term: queue_ids(operator_client.get(QUEUE_URL, {"q": term}))  # noqa: E731
    assert search("alice@customer") == [failed]
    assert search("invoice") == [quarantined]
    message_id = InboxEvent.objects.get(pk=unknown).message_id_header
    assert search(f"<{message_id}>") == [unknown]
    [orphan] = desk.tickets()  # the unknown item's ticket, written before the connection dropped
    services.do_confirm_existing_ticket(
        get_user_model().objects.get(username="oper"), unknown, ticket_id=str(orphan["id"])
    )
    # A mapped event is normally complete; put it back in the queue to search for its ticket id.
    InboxEvent.objects.filter(pk=unknown).update(state="unknown", reason_code="claim_expired")
    assert search(str(orphan["id"])) == [unknown]
    assert search(intent_of(failed).external_ref) == [failed]


# --- triage --------------------------------------------------------------------------------


def test_assign_and_escalation_are_audited_with_the_user(operator_client, operator, seeded, tenant):
    failed = seeded[0]
    colleague = make_user("colleague", groups=["operator"], tenants=[tenant])
    assert act(operator_client, failed, "assign_me").status_code == 302
    assert InboxEvent.objects.get(pk=failed).owner == operator
    act(operator_client, failed, "assign", assignee=colleague.pk)
    assert InboxEvent.objects.get(pk=failed).owner == colleague
    outsider = make_user("outsider", groups=["operator"])
    response = act(operator_client, failed, "assign", assignee=outsider.pk)
    assert response.status_code == 400 and InboxEvent.objects.get(pk=failed).owner == colleague
    act(operator_client, failed, "escalate", escalate_at="2031-01-02T03:04")
    assert InboxEvent.objects.get(pk=failed).escalate_at.isoformat() == "2031-01-02T03:04:00+00:00"
    assigned = audit(failed, "assigned")
    assert [(a.actor, a.detail["owner"]) for a in assigned] == [("user:oper", "oper"), ("user:oper", "colleague")]
    [escalation] = audit(failed, "escalation_set")
    assert escalation.actor == "user:oper" and escalation.detail["escalate_at"].startswith("2031-01-02T03:04")


# --- replays -------------------------------------------------------------------------------


def test_correct_route_and_replay_keeps_the_key_and_makes_exactly_one_ticket(
    operator_client, seeded, destinations, desk, desk_calls
):
    good, bad = destinations
    failed = seeded[0]
    before = intent_of(failed)
    response = act(
        operator_client, failed, "correct", destination=good.pk, priority="high", request_type="incident", queue=""
    )
    assert response.status_code == 302
    after = intent_of(failed)
    assert (after.pk, after.idempotency_key, after.action_version) == (before.pk, before.idempotency_key, 1)
    assert (after.state, after.destination_id) == ("pending", good.pk)
    event = InboxEvent.objects.get(pk=failed)
    assert event.state == "write_pending" and event.route_override == {
        "destination_id": good.pk,
        "priority": "high",
        "request_type": "incident",
    }
    assert OutboxMessage.objects.filter(
        topic=PROCESS_TOPIC, payload={"inbox_event_id": failed}, published_at__isnull=True
    ).exists()
    [replayed] = audit(failed, "replayed")
    assert replayed.actor == "user:oper" and replayed.detail["previous_destination"] == bad.pk

    assert process_inbox_event(failed) == "created"
    assert process_inbox_event(failed) == "done"
    assert len(tickets_for(desk, after)) == 1
    assert InboxEvent.objects.get(pk=failed).state == "completed"
    assert failed not in queue_ids(operator_client.get(QUEUE_URL))


def test_replaying_the_same_item_again_creates_no_second_ticket(operator_client, seeded, destinations, desk):
    good, _ = destinations
    failed = seeded[0]
    act(operator_client, failed, "correct", destination=good.pk)
    second = act(operator_client, failed, "correct", destination=good.pk)  # a double submit
    assert second.status_code == 302
    assert len(audit(failed, "replayed")) == 1
    assert process_inbox_event(failed) == "created"
    act(operator_client, failed, "replay")  # after completion: refused, nothing enqueued
    response = operator_client.get(f"{QUEUE_URL}{failed}/change/")
    assert "Not done: the event is completed" in response.content.decode()
    assert process_inbox_event(failed) == "done"
    assert len(tickets_for(desk, intent_of(failed))) == 1
    external_ref = intent_of(failed).external_ref
    assert len([r for r in desk.requests_log() if r["external_id"] == external_ref]) == 1  # one create ever


def test_an_unknown_intent_is_not_replayed_blindly(operator, seeded):
    unknown = seeded[2]
    with pytest.raises(services.ActionRefused, match="intent is unknown"):
        services.do_replay(operator, unknown)
    assert intent_of(unknown).state == "unknown"


def test_replay_without_an_intent_sends_the_event_back_to_routing(operator, mailbox, destinations, desk):
    good, _ = destinations
    Destination.objects.filter(tenant=mailbox.tenant).update(is_default=False)
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == Outcome.AWAITING_REVIEW  # no destination at all
    set_default(mailbox.tenant, good)
    assert services.do_replay(operator, event_id) == "rerouted"
    assert InboxEvent.objects.get(pk=event_id).state == "ready"
    assert process_inbox_event(event_id) == "created"
    assert len(tickets_for(desk, intent_of(event_id))) == 1


def test_replay_as_new_action_needs_its_own_permission_and_records_the_approver(
    operator_client, operator, seeded, destinations
):
    failed = seeded[0]
    response = act(operator_client, failed, "replay_new", reason="the key was reused with another body")
    assert response.status_code == 403
    assert Intent.objects.filter(inbox_event_id=failed).count() == 1
    operator.user_permissions.add(Permission.objects.get(codename="replay_new_action"))
    page = operator_client.get(f"{QUEUE_URL}{failed}/change/").content.decode()
    assert 'id="form-replay-new"' in page
    assert act(operator_client, failed, "replay_new", reason="").status_code == 400  # the reason is mandatory
    act(
        operator_client,
        failed,
        "replay_new",
        reason="the key was reused with another body",
        destination=destinations[0].pk,
    )
    v1, v2 = intent_of(failed, 1), intent_of(failed, 2)
    assert v1.state == "failed" and v2.state == "pending"
    assert v2.idempotency_key != v1.idempotency_key and v2.external_ref != v1.external_ref
    assert v2.idempotency_key == intents.intent_key(InboxEvent.objects.get(pk=failed), "create_ticket", 2)
    assert v2.destination == destinations[0]
    [approval] = audit(failed, "replayed_as_new_action")
    assert approval.actor == "user:oper" and approval.detail["approved_by"] == "user:oper"
    assert approval.detail["action_version"] == 2 and approval.detail["reason"]
    assert InboxEvent.objects.get(pk=failed).state == "write_pending"
    operator = get_user_model().objects.get(pk=operator.pk)
    with pytest.raises(services.ActionRefused):  # the same approval twice makes no third version
        services.do_replay_as_new_action(operator, failed, reason="again")


def test_a_new_action_and_a_corrected_non_default_route_are_carried_out_by_the_worker(
    operator, seeded, destinations, desk
):
    good, bad = destinations
    failed, _, unknown = seeded
    set_default(good.tenant, bad)  # the default stays the broken one: only the correction leads to `desk`
    operator.user_permissions.add(Permission.objects.get(codename="replay_new_action"))
    operator = get_user_model().objects.get(pk=operator.pk)
    services.do_replay_as_new_action(operator, failed, reason="new body", destination_id=good.pk, priority="high")
    assert process_inbox_event(failed) == "created"
    assert len(tickets_for(desk, intent_of(failed, 2))) == 1
    assert tickets_for(desk, intent_of(failed, 1)) == []
    assert intent_of(failed, 1).state == "failed"


# --- confirm, close, release -----------------------------------------------------------------


def test_confirm_existing_ticket_completes_the_item_with_zero_destination_calls(
    operator_client, seeded, desk, desk_calls
):
    unknown = seeded[2]
    [orphan] = desk.tickets()
    assert orphan["external_id"] == intent_of(unknown).external_ref
    calls_before = len(desk_calls)
    response = act(operator_client, unknown, "confirm", ticket_id=str(orphan["id"]))
    assert response.status_code == 302
    assert len(desk_calls) == calls_before  # not a single request, not even a read
    event, intent = InboxEvent.objects.get(pk=unknown), intent_of(unknown)
    assert (event.state, intent.state, intent.result_ref) == ("completed", "succeeded", str(orphan["id"]))
    mapping = TicketMapping.objects.get(inbox_event_id=unknown)
    assert mapping.ticket_id == str(orphan["id"]) and mapping.ticket_url.endswith(f"/agent/tickets/{orphan['id']}")
    [confirmed] = audit(unknown, "ticket_confirmed")
    assert confirmed.actor == "user:oper" and confirmed.detail["destination_calls"] == 0
    page = operator_client.get(f"{QUEUE_URL}{unknown}/change/").content.decode()
    assert f'class="ticket-link" target="_blank" rel="noopener noreferrer">desk #{orphan["id"]}<' in page
    assert len(desk.tickets()) == 1


def test_confirm_into_the_builtin_store_needs_a_real_ticket(operator, mailbox, tenant):
    builtin = Destination.objects.get(tenant=tenant, slug="builtin")
    event_id = new_event(mailbox)
    transition_event(event_id, InboxEvent.OPEN_STATES, "awaiting_review", actor="t", kind="r", reason_code="empty")
    with pytest.raises(services.ActionRefused, match="has no ticket 999"):
        services.do_confirm_existing_ticket(operator, event_id, ticket_id="999", destination_id=builtin.pk)
    ticket = Ticket.objects.create(
        destination=builtin, idempotency_key="k" * 64, external_ref="manual", created_at=timezone.now()
    )
    services.do_confirm_existing_ticket(operator, event_id, ticket_id=str(ticket.pk))
    assert InboxEvent.objects.get(pk=event_id).state == "completed"
    assert intent_of(event_id).state == "succeeded"


def test_close_as_not_a_request_needs_a_reason_and_deletes_nothing(operator_client, seeded, count_rows):
    failed, _, unknown = seeded
    rows = count_rows()
    assert act(operator_client, unknown, "close", reason="  ").status_code == 400
    act(operator_client, unknown, "close", reason="a vendor newsletter")
    event = InboxEvent.objects.get(pk=unknown)
    assert (event.state, event.reason_code, event.reason_detail) == (
        "suppressed",
        "not_a_request",
        "a vendor newsletter",
    )
    assert intent_of(unknown).state == "held"  # reconciliation will not reopen it behind the reviewer's back
    assert intents.resolve_unknown(intent_of(unknown).pk) == ""
    assert unknown not in queue_ids(operator_client.get(QUEUE_URL))
    after = count_rows()
    assert after["AuditEvent"] == rows["AuditEvent"] + 1
    assert {k: v for k, v in after.items() if k not in ("AuditEvent",)} == {
        k: v for k, v in rows.items() if k not in ("AuditEvent",)
    }
    [closed] = audit(unknown, "closed_not_a_request")
    assert closed.actor == "user:oper" and closed.detail["reason"] == "a vendor newsletter"


def test_release_from_quarantine_is_for_security_only(client, operator, security, seeded):
    quarantined = seeded[1]
    client.force_login(operator)
    page = client.get(f"{QUEUE_URL}{quarantined}/change/").content.decode()
    assert 'id="form-release"' not in page
    assert act(client, quarantined, "release").status_code == 403
    for action, data in (("replay", {}), ("confirm", {"ticket_id": "1"})):
        act(client, quarantined, action, **data)
        assert InboxEvent.objects.get(pk=quarantined).state == "quarantined"  # replay is not a way out

    client.force_login(security)
    assert 'id="form-release"' in client.get(f"{QUEUE_URL}{quarantined}/change/").content.decode()
    assert act(client, quarantined, "release", note="false positive: a signed installer").status_code == 302
    event = InboxEvent.objects.get(pk=quarantined)
    assert event.state == "ready" and event.reason_code == ""
    assert event.details["quarantine_release"]["by"] == "user:sec"
    assert OutboxMessage.objects.filter(payload={"inbox_event_id": quarantined}, published_at__isnull=True).exists()
    [released] = audit(quarantined, "quarantine_released")
    assert released.actor == "user:sec" and released.detail["previous_reason"] == "attachment_type"


def test_bodies_need_the_permission_and_every_view_is_audited(client, operator, security, mailbox):
    event_id = new_event(mailbox, subject="Password reset", body="my secret is hunter2\n")
    transition_event(event_id, InboxEvent.OPEN_STATES, "awaiting_review", actor="t", kind="r", reason_code="empty")
    client.force_login(operator)
    page = client.get(f"{QUEUE_URL}{event_id}/change/").content.decode()
    assert "hunter2" not in page and 'id="view-body"' not in page
    assert client.get(f"{QUEUE_URL}{event_id}/body/").status_code == 403
    assert audit(event_id, "body_viewed") == []

    client.force_login(security)
    for _ in range(2):
        response = client.get(f"{QUEUE_URL}{event_id}/body/")
        assert response.status_code == 200 and "hunter2" in response.content.decode()
        assert "no-store" in response["Cache-Control"]
    assert [a.actor for a in audit(event_id, "body_viewed")] == ["user:sec", "user:sec"]
    assert "hunter2" not in client.get(f"{QUEUE_URL}{event_id}/change/").content.decode()


def test_attachments_are_downloaded_only_with_the_permission_and_audited(client, operator, security, mailbox):
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = "a@customer.test", "support@acme.test", "Logs"
    message["Message-ID"] = "<logs-1@customer.test>"
    message.set_content("see attached\n")
    message.add_attachment(b"line one\nline two\n", maintype="text", subtype="plain", filename="app.log")
    raw = message.as_bytes()
    event_id = ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id
    quarantine(event_id)
    url = f"{QUEUE_URL}{event_id}/attachment/0/"
    client.force_login(operator)
    assert client.get(url).status_code == 403
    client.force_login(security)
    assert "app.log" in client.get(f"{QUEUE_URL}{event_id}/body/").content.decode()
    response = client.get(url)
    assert response.status_code == 200 and response.content == b"line one\nline two\n"
    assert response["Content-Type"] == "application/octet-stream"
    assert response["Content-Disposition"] == 'attachment; filename="app.log"'
    assert client.get(f"{QUEUE_URL}{event_id}/attachment/5/").status_code == 404
    [download] = audit(event_id, "attachment_downloaded")
    assert download.actor == "user:sec" and download.detail["index"] == 0


def test_a_held_acknowledgment_is_resent_or_marked_handled(operator_client, mailbox, tenant):
    from tests.senderauth import stamped, trust_our_mta

    builtin = Destination.objects.get(tenant=tenant, slug="builtin")
    trust_our_mta(mailbox)  # acknowledgments go to authenticated senders only
    ids = []
    for _ in range(2):
        raw = stamped(make_message())
        event_id = ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id
        assert process_inbox_event(event_id) == "created"
        ack = Intent.objects.get(inbox_event_id=event_id, action="notify_requester")
        Intent.objects.filter(pk=ack.pk).update(state="held")  # the SMTP answer was lost: unknown, then held
        ids.append(event_id)
    response = operator_client.get(QUEUE_URL)
    assert queue_ids(response) == ids and "acknowledgment_held" in response.content.decode()
    assert 'id="form-ack-replay"' in operator_client.get(f"{QUEUE_URL}{ids[0]}/change/").content.decode()

    act(operator_client, ids[0], "replay")
    ack = Intent.objects.get(inbox_event_id=ids[0], action="notify_requester")
    assert ack.state == "pending"
    assert OutboxMessage.objects.filter(topic=intents.NOTIFY_TOPIC, payload={"intent_id": ack.pk}).exists()
    act(operator_client, ids[1], "ack_handled", note="the customer confirmed they got it")
    assert Intent.objects.get(inbox_event_id=ids[1], action="notify_requester").state == "succeeded"
    assert [a.actor for a in audit(ids[1], "acknowledgment_handled")] == ["user:oper"]
    assert queue_ids(operator_client.get(QUEUE_URL)) == []
    assert TicketMapping.objects.filter(inbox_event_id__in=ids).count() == 2 and builtin.tickets.count() == 2


# --- no deletion ------------------------------------------------------------------------------


def test_nobody_can_delete_events_intents_mappings_or_audit_rows(client, seeded, destinations):
    root = get_user_model().objects.create_superuser("root", "root@staff.test", PASSWORD)
    client.force_login(root)
    failed = seeded[0]
    intent = intent_of(failed)
    audit_row = AuditEvent.objects.filter(inbox_event_id=failed).first()
    services.do_confirm_existing_ticket(root, seeded[2], ticket_id="1")
    mapping = TicketMapping.objects.get(inbox_event_id=seeded[2])
    for url in (
        f"/admin/intake/inboxevent/{failed}/delete/",
        f"/admin/ticketing/intent/{intent.pk}/delete/",
        f"/admin/ticketing/ticketmapping/{mapping.pk}/delete/",
        f"/admin/intake/auditevent/{audit_row.pk}/delete/",
        f"{QUEUE_URL}{failed}/delete/",
    ):
        assert client.post(url, {"post": "yes"}).status_code == 403, url
    for url in (
        "/admin/intake/inboxevent/",
        "/admin/ticketing/intent/",
        "/admin/ticketing/ticketmapping/",
        "/admin/intake/auditevent/",
        QUEUE_URL,
    ):
        assert 'value="delete_selected"' not in client.get(url).content.decode(), url
    assert InboxEvent.objects.filter(pk=failed).exists() and Intent.objects.filter(pk=intent.pk).exists()


# --- tenant isolation ----------------------------------------------------------------------------


def test_a_user_never_sees_another_tenants_items(operator_client, operator, seeded, other_tenant):
    _, b_mailbox, b_event = other_tenant
    b_intent = intents.ensure_intent(
        InboxEvent.objects.get(pk=b_event), "create_ticket", Destination.objects.get(tenant=other_tenant[0])
    )
    operator.user_permissions.add(
        *Permission.objects.filter(
            codename__in=[
                "view_message_body",
                "release_quarantine",
                "replay_new_action",
                "view_inboxevent",
                "view_intent",
                "view_auditevent",
                "view_ticketmapping",
                "view_mailbox",
                "view_destination",
            ]
        )
    )

    # Lists, counts, filters and search.
    response = operator_client.get(QUEUE_URL)
    html = response.content.decode()
    assert queue_ids(response) == list(seeded)
    assert re.search(r'id="open-count">3<', html)
    assert "globex" not in html.lower()
    assert queue_ids(operator_client.get(QUEUE_URL, {"q": "Globex secret"})) == []
    assert queue_ids(operator_client.get(QUEUE_URL, {"q": str(b_event)})) == []
    assert queue_ids(operator_client.get(QUEUE_URL, {"mailbox": b_mailbox.pk})) == []
    assert queue_ids(operator_client.get(QUEUE_URL, {"tenant": other_tenant[0].pk})) == []

    # Detail pages, bodies and every action: 404, nothing written.
    audit_rows = AuditEvent.objects.filter(inbox_event_id=b_event).count()
    for url in (
        f"{QUEUE_URL}{b_event}/change/",
        f"{QUEUE_URL}{b_event}/body/",
        f"{QUEUE_URL}{b_event}/attachment/0/",
        f"/admin/intake/inboxevent/{b_event}/change/",
        f"/admin/ticketing/intent/{b_intent.pk}/change/",
    ):
        assert operator_client.get(url).status_code == 404, url
    for action, data in (
        ("assign_me", {}),
        ("replay", {}),
        ("close", {"reason": "x"}),
        ("release", {}),
        ("confirm", {"ticket_id": "1"}),
        ("escalate", {"escalate_at": ""}),
        ("replay_new", {"reason": "x"}),
    ):
        assert act(operator_client, b_event, action, **data).status_code == 404, action
    assert AuditEvent.objects.filter(inbox_event_id=b_event).count() == audit_rows
    with pytest.raises(InboxEvent.DoesNotExist):
        services.do_assign_to_me(operator, b_event)

    # The other admins are scoped too.
    for url in (
        "/admin/intake/inboxevent/",
        "/admin/ticketing/intent/",
        "/admin/intake/auditevent/",
        "/admin/intake/mailbox/",
        "/admin/ticketing/destination/",
    ):
        page = operator_client.get(url)
        assert page.status_code == 200, url
        assert "globex" not in page.content.decode().lower(), url
    found = operator_client.get("/admin/intake/inboxevent/", {"q": "Globex"}).content.decode()
    assert "Globex secret outage" not in found and "0 results" in found


def test_bulk_actions_cannot_reach_another_tenant(operator_client, seeded, other_tenant):
    b_event = other_tenant[2]
    response = operator_client.post(QUEUE_URL, {"action": "assign_to_me", "_selected_action": [b_event, seeded[0]]})
    assert response.status_code == 302
    assert InboxEvent.objects.get(pk=b_event).owner is None
    assert InboxEvent.objects.get(pk=seeded[0]).owner.username == "oper"


# --- bulk replay -----------------------------------------------------------------------------------


def test_bulk_replay_looks_each_item_up_first_and_shows_what_it_found(
    operator_client, seeded, destinations, desk, settings
):
    failed, quarantined, unknown = seeded
    [orphan] = desk.tickets()
    selection = {"action": "bulk_replay", "_selected_action": [failed, quarantined, unknown]}
    settings.MAILROOM_BULK_REPLAY_CAP = 2
    capped = operator_client.post(QUEUE_URL, selection, follow=True)
    assert "select at most 2 items for a bulk replay (3 selected)" in capped.content.decode().lower()
    settings.MAILROOM_BULK_REPLAY_CAP = 3

    preview = operator_client.post(QUEUE_URL, selection)
    assert preview.status_code == 200
    html = preview.content.decode()
    plans = dict(
        re.findall(r'<tr class="bulk-item"><td>#(\d+)</td>.*?<td class="bulk-plan"><strong>(\w+)</strong>', html, re.S)
    )
    assert plans == {str(failed): "replay", str(quarantined): "skip", str(unknown): "confirm"}
    assert f"ticket #{orphan['id']}" in html
    assert intent_of(failed).state == "failed" and intent_of(unknown).state == "unknown"  # a preview writes nothing

    done = operator_client.post(QUEUE_URL, {**selection, "confirmed": "yes"})
    assert done.status_code == 302
    assert intent_of(unknown).state == "succeeded" and intent_of(unknown).result_ref == str(orphan["id"])
    assert intent_of(failed).state == "pending"  # same key, same (revoked) destination: the operator's call
    assert InboxEvent.objects.get(pk=quarantined).state == "quarantined"
    assert len(desk.tickets()) == 1
    assert [a.detail["plan"] for a in audit(failed, "bulk_lookup")] == ["replay"]


def test_the_body_page_shows_every_alternative_as_sent(client, security, mailbox):
    # A newsletter-style message: the plain alternative is a stub, so the ticket got the HTML text;
    # the person reviewing it still sees what the plain part said.
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = "news@vendor.test", "support@acme.test", "Maintenance"
    message["Message-ID"] = "<news-1@vendor.test>"
    message.set_content("View this email in your browser: https://vendor.test/v/1\n")
    message.add_alternative(
        "<html><body><p>" + "Scheduled maintenance of the EU storage cluster. " * 12 + "</p></body></html>",
        subtype="html",
    )
    raw = message.as_bytes()
    event_id = ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id
    transition_event(event_id, InboxEvent.OPEN_STATES, "awaiting_review", actor="t", kind="r", reason_code="empty")
    client.force_login(security)
    page = client.get(f"{QUEUE_URL}{event_id}/body/").content.decode()
    body = page.split('id="message-body"', 1)[1].split("</pre>", 1)[0]
    assert "Scheduled maintenance of the EU storage cluster." in body and "View this email" not in body
    alternatives = page.split("Alternatives as sent", 1)[1]
    assert "View this email in your browser" in alternatives and "<h3>text/plain</h3>" in alternatives
    assert "<h3>text/html</h3>" in alternatives

"""The REST API (/api/v1/, reconciliation.api): tokens, reads, bodies, queue actions, configuration, isolation.

Destinations are the built-in ticket store; the worker is `process_inbox_event` called in process (what
a Celery worker runs for the outbox row an action writes).
"""

import hashlib
import io
import re
from datetime import timedelta
from email.message import EmailMessage

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from intake.models import AuditEvent, InboxEvent, Mailbox
from reconciliation.models import ApiToken
from tests.factories import make_destination, make_mailbox, make_tenant
from tests.support.api import API, api, assert_problem, failed_item, review_item
from tests.support.queue import new_event
from tests.support.users import make_user, token_for
from ticketing.intents.creation import intent_key
from ticketing.models import Destination, Intent, RoutingRule, Ticket, TicketMapping
from ticketing.services import process_inbox_event

# --- helpers ------------------------------------------------------------------------------------------


def audit_rows(event_id, since_pk=0):
    return list(
        AuditEvent.objects.filter(inbox_event_id=event_id, pk__gt=since_pk)
        .order_by("at", "pk")
        .values_list("kind", "actor")
    )


@pytest.fixture
def operator(tenant):
    return make_user("olivia", groups=["operator"], tenants=[tenant])


# --- tokens ---------------------------------------------------------------------------------------------


def test_token_is_printed_once_stored_hashed_and_a_wrong_one_is_a_401(mailbox, operator):
    token = token_for(operator)
    row = ApiToken.objects.get(user=operator)
    assert row.key_hash == hashlib.sha256(token.encode()).hexdigest() and token.startswith(row.prefix)
    assert token not in {row.key_hash, row.prefix}
    assert token_for(operator) != token  # a new one each time; the first is not shown again

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get(f"{API}/events/").status_code == 200
    assert ApiToken.objects.get(pk=row.pk).last_used_at is not None

    client.credentials(HTTP_AUTHORIZATION=f"Token {token}x")
    body = assert_problem(client.get(f"{API}/events/"), 401)
    assert body["detail"] == "Invalid token."
    assert_problem(APIClient().get(f"{API}/events/"), 401)

    operator.is_active = False
    operator.save()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert_problem(client.get(f"{API}/events/"), 401)
    with pytest.raises(CommandError):
        call_command("api_token", "nobody", stdout=io.StringIO())


# --- reads ------------------------------------------------------------------------------------------------


def test_events_list_filters_detail_intents_and_mappings(mailbox, operator, scanner_off):
    done = new_event(mailbox, subject="Works fine")
    assert process_inbox_event(done) == "created"
    review = review_item(mailbox, subject="Nowhere to go", sender="alice@customer.test")
    InboxEvent.objects.filter(pk=done).update(received_at=timezone.now() - timedelta(days=3))
    client = api(operator)

    listed = client.get(f"{API}/events/").json()
    assert [e["id"] for e in listed["results"]] == [review, done]  # newest first
    assert listed["results"][0]["sender"] != "alice@customer.test"  # masked in lists, as in the console
    assert [e["id"] for e in client.get(f"{API}/events/?state=awaiting_review").json()["results"]] == [review]
    assert [e["id"] for e in client.get(f"{API}/events/?reason=no_destination").json()["results"]] == [review]
    assert len(client.get(f"{API}/events/?mailbox=support").json()["results"]) == 2
    assert client.get(f"{API}/events/?mailbox=other").json()["results"] == []
    since = (timezone.now() - timedelta(days=1)).isoformat()
    assert [e["id"] for e in client.get(f"{API}/events/", {"received_after": since}).json()["results"]] == [review]
    assert [e["id"] for e in client.get(f"{API}/events/", {"received_before": since}).json()["results"]] == [done]
    assert_problem(client.get(f"{API}/events/?received_after=yesterday"), 400)
    page = client.get(f"{API}/events/?page_size=1").json()
    assert len(page["results"]) == 1 and "cursor=" in page["next"]
    assert [e["id"] for e in client.get(page["next"]).json()["results"]] == [done]

    detail = client.get(f"{API}/events/{review}/").json()
    assert detail["sender"] == "alice@customer.test" and detail["reason_code"] == "no_destination"
    assert [row["kind"] for row in detail["audit"]][0] == "received"
    completed = client.get(f"{API}/events/{done}/").json()
    assert completed["mappings"][0]["ticket_id"] and completed["intents"][0]["state"] == "succeeded"
    intents_ = client.get(f"{API}/intents/?event={done}").json()["results"]
    assert [i["action"] for i in intents_ if i["action"] == "create_ticket"] == ["create_ticket"]
    assert client.get(f"{API}/intents/{intents_[0]['id']}/").status_code == 200
    mappings = client.get(f"{API}/mappings/?event={done}").json()["results"]
    assert mappings[0]["ticket_id"] == str(Ticket.objects.get().pk)
    assert_problem(client.get(f"{API}/events/999999/"), 404)
    assert_problem(client.get(f"{API}/events/abc/"), 404)


def test_body_and_attachment_need_the_body_permission_and_are_audited(mailbox, operator, scanner_off):
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = "bob@customer.test", "support@acme.test", "See log"
    message["Message-ID"] = "<body-test@test.mailroom>"
    message.set_content("The log is attached.\n")
    message.add_attachment(b"line 1\nline 2\n", maintype="text", subtype="plain", filename="app.log")
    event_id = new_event(mailbox, raw=message.as_bytes())
    security = make_user("sam", groups=["security"], tenants=[mailbox.tenant])

    assert_problem(api(operator).get(f"{API}/events/{event_id}/body/"), 403)
    assert_problem(api(operator).get(f"{API}/events/{event_id}/attachments/0/"), 403)
    assert not AuditEvent.objects.filter(inbox_event_id=event_id, kind="body_viewed").exists()

    client = api(security)
    body = client.get(f"{API}/events/{event_id}/body/")
    assert body.status_code == 200 and body["Cache-Control"] == "no-store"
    data = body.json()
    assert data["available"] and "The log is attached." in data["text"]
    assert [a["filename"] for a in data["attachments"]] == ["app.log"]
    download = client.get(f"{API}/events/{event_id}/attachments/0/")
    assert download.status_code == 200 and download.content == b"line 1\nline 2\n"
    assert download["Content-Type"] == "application/octet-stream"
    assert_problem(client.get(f"{API}/events/{event_id}/attachments/5/"), 404)
    rows = audit_rows(event_id)
    assert ("body_viewed", "user:sam") in rows and ("attachment_downloaded", "user:sam") in rows


# --- the queue and its actions ------------------------------------------------------------------------------


def test_queue_lists_oldest_first_and_triage_actions(mailbox, operator, scanner_off):
    newer = review_item(mailbox, subject="newer")
    older = review_item(mailbox, subject="older")
    InboxEvent.objects.filter(pk=older).update(received_at=timezone.now() - timedelta(hours=5))
    client = api(operator)
    queue = client.get(f"{API}/queue/").json()["results"]
    assert [i["id"] for i in queue] == [older, newer]
    assert queue[0]["reason_code"] == "no_destination" and queue[0]["reason_text"]

    response = client.post(f"{API}/queue/{older}/assign/", {"assignee": "olivia"}, format="json")
    assert response.status_code == 200 and response.json()["event"]["owner"] == "olivia"
    # Another tenant's operator, a member without the queue, and nobody at all: one answer, so the action
    # tells no one which usernames exist.
    make_user("otto", groups=["operator"], tenants=[make_tenant()])
    make_user("mia", groups=["mailroom-admin"], tenants=[mailbox.tenant])
    answers = []
    for name in ("otto", "mia", "ghost"):
        response = client.post(f"{API}/queue/{older}/assign/", {"assignee": name}, format="json")
        assert_problem(response, 400)
        answers.append(response.json()["detail"].replace(repr(name), "<name>"))
    assert len(set(answers)) == 1 and "no assignable user <name>" in answers[0]
    assert InboxEvent.objects.get(pk=older).owner.username == "olivia"
    when = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    response = client.post(f"{API}/queue/{older}/escalation/", {"escalate_at": when.isoformat()}, format="json")
    assert response.status_code == 200
    assert InboxEvent.objects.get(pk=older).escalate_at == when
    rows = audit_rows(older)
    assert ("assigned", "user:olivia") in rows and ("escalation_set", "user:olivia") in rows

    response = client.post(f"{API}/queue/{newer}/close/", {"reason": ""}, format="json")
    assert_problem(response, 400)
    response = client.post(f"{API}/queue/{newer}/close/", {"reason": "newsletter"}, format="json")
    assert response.status_code == 200 and response.json()["event"]["state"] == "suppressed"
    assert ("closed_not_a_request", "user:olivia") in audit_rows(newer)


def test_replay_and_correct_and_replay_make_the_ticket(mailbox, operator, scanner_off):
    builtin = Destination.objects.get(tenant=mailbox.tenant, slug="builtin")
    other = make_destination(mailbox.tenant, slug="second", is_default=False)
    rerouted = review_item(mailbox, subject="Replay me")
    failed = failed_item(mailbox, builtin, subject="Correct me")
    client = api(operator)

    response = client.post(f"{API}/queue/{rerouted}/replay/", format="json")
    assert response.status_code == 200 and response.json()["outcome"] == "rerouted"
    assert process_inbox_event(rerouted) == "created"
    assert TicketMapping.objects.filter(inbox_event_id=rerouted).count() == 1
    assert_problem(client.post(f"{API}/queue/{rerouted}/replay/", format="json"), 409)  # completed now

    original = Intent.objects.get(inbox_event_id=failed)
    response = client.post(
        f"{API}/queue/{failed}/correct-and-replay/", {"destination": other.pk, "priority": "high"}, format="json"
    )
    assert response.status_code == 200 and response.json()["outcome"] == "reopened"
    assert process_inbox_event(failed) == "created"
    intent = Intent.objects.get(inbox_event_id=failed, action="create_ticket")
    assert (intent.idempotency_key, intent.destination_id, intent.state) == (
        original.idempotency_key,
        other.pk,
        "succeeded",
    )
    mapping = TicketMapping.objects.get(inbox_event_id=failed, action="create_ticket")
    assert mapping.destination_id == other.pk
    assert Ticket.objects.filter(destination=other).count() == 1
    # Another tenant's destination is not a choice.
    foreign = make_destination(make_tenant(), slug="theirs")
    third = review_item(mailbox, subject="Not there")
    assert_problem(
        client.post(f"{API}/queue/{third}/correct-and-replay/", {"destination": foreign.pk}, format="json"), 400
    )


def test_replay_as_new_needs_its_own_permission(mailbox, operator, scanner_off):
    builtin = Destination.objects.get(tenant=mailbox.tenant, slug="builtin")
    failed = failed_item(mailbox, builtin)
    assert_problem(
        api(operator).post(f"{API}/queue/{failed}/replay-as-new/", {"reason": "body changed"}, format="json"), 403
    )
    approver = make_user(
        "ada", groups=["operator"], tenants=[mailbox.tenant], perms=["reconciliation.replay_new_action"]
    )
    client = api(approver)
    assert_problem(client.post(f"{API}/queue/{failed}/replay-as-new/", {"reason": ""}, format="json"), 400)
    response = client.post(f"{API}/queue/{failed}/replay-as-new/", {"reason": "body changed"}, format="json")
    assert response.status_code == 200 and response.json()["outcome"] == "new action version 2"
    assert process_inbox_event(failed) == "created"
    v2 = Intent.objects.get(inbox_event_id=failed, action="create_ticket", action_version=2)
    assert v2.state == "succeeded" and v2.idempotency_key == intent_key(v2.inbox_event, "create_ticket", 2)
    assert ("replayed_as_new_action", "user:ada") in audit_rows(failed)


def test_confirm_existing_ticket_and_bulk_replay_within_the_cap(mailbox, operator, scanner_off, settings):
    builtin = Destination.objects.get(tenant=mailbox.tenant, slug="builtin")
    first = failed_item(mailbox, builtin, subject="one")
    second = failed_item(mailbox, builtin, subject="two")
    third = review_item(mailbox, subject="three")
    client = api(operator)

    existing = new_event(mailbox, subject="already ticketed")
    assert process_inbox_event(existing) == "created"
    ticket = Ticket.objects.with_numbers().get()
    body = assert_problem(client.post(f"{API}/queue/{first}/confirm/", {"ticket_id": "EXT-42"}, format="json"), 409)
    assert "number" in body["detail"]  # the console's refusal, nothing written
    # Named as the ticket list shows it (MR-n): its bare id would be refused once ids and numbers differ.
    response = client.post(f"{API}/queue/{first}/confirm/", {"ticket_id": str(ticket)}, format="json")
    assert response.status_code == 200 and response.json()["event"]["state"] == "completed"
    assert TicketMapping.objects.get(inbox_event_id=first).ticket_id == str(ticket.pk)
    assert Ticket.objects.count() == 1  # no destination call
    assert ("ticket_confirmed", "user:olivia") in audit_rows(first)

    settings.MAILROOM_BULK_REPLAY_CAP = 1
    body = assert_problem(client.post(f"{API}/queue/bulk-replay/", {"event_ids": [second, third]}, format="json"), 409)
    assert "at most 1" in body["detail"]
    settings.MAILROOM_BULK_REPLAY_CAP = 20
    preview = client.post(f"{API}/queue/bulk-replay/", {"event_ids": [second, third], "preview": True}, format="json")
    assert preview.status_code == 200 and {i["plan"] for i in preview.json()} == {"replay", "reroute"}
    assert InboxEvent.objects.get(pk=second).state == "failed"  # a preview writes nothing
    done = client.post(f"{API}/queue/bulk-replay/", {"event_ids": [second, third]}, format="json").json()
    assert {i["event_id"]: i["outcome"] for i in done} == {second: "reopened", third: "rerouted"}
    for event_id in (second, third):
        assert process_inbox_event(event_id) == "created"
    assert Ticket.objects.count() == 3


def test_api_replay_and_console_replay_write_the_same_rows(mailbox, operator, scanner_off):
    """The same item replayed through the API and through the admin: same intent version, key rule, audit."""
    builtin = Destination.objects.get(tenant=mailbox.tenant, slug="builtin")
    results = {}
    for via in ("api", "console"):
        event_id = failed_item(mailbox, builtin, subject=f"Replay via {via}")
        before = AuditEvent.objects.filter(inbox_event_id=event_id).order_by("-pk").values_list("pk", flat=True)[0]
        key_before = Intent.objects.get(inbox_event_id=event_id).idempotency_key
        if via == "api":
            assert api(operator).post(f"{API}/queue/{event_id}/replay/").status_code == 200
        else:
            console = Client()
            console.force_login(operator)
            response = console.post(f"/admin/reconciliation/recoveryitem/{event_id}/act/replay/")
            assert response.status_code == 302
        assert process_inbox_event(event_id) == "created"
        event = InboxEvent.objects.get(pk=event_id)
        intent = Intent.objects.get(inbox_event_id=event_id, action="create_ticket")
        assert intent.idempotency_key == key_before == intent_key(event, intent.action, intent.action_version)
        results[via] = {
            "versions": list(
                Intent.objects.filter(inbox_event_id=event_id)
                .order_by("action", "action_version")
                .values_list("action", "action_version", "state")
            ),
            "audit": audit_rows(event_id, since_pk=before),
            "state": event.state,
            "mappings": TicketMapping.objects.filter(inbox_event_id=event_id).count(),
        }
    assert results["api"] == results["console"]
    assert ("replayed", "user:olivia") in results["api"]["audit"]


# --- configuration ------------------------------------------------------------------------------------------


def test_configuration_crud_is_validated_by_full_clean(mailbox, operator):
    admin_user = make_user("ann", groups=["mailroom-admin"], tenants=[mailbox.tenant])
    client = api(admin_user)
    assert_problem(api(operator).get(f"{API}/mailboxes/"), 403)

    for ref in ("hunter2-plaintext", "env:MAILROOM_T_GLOBEX_SECRET"):  # not a reference; another tenant's
        refused = client.post(
            f"{API}/mailboxes/",
            {"tenant": "acme", "slug": "sales", "address": "sales@acme.test", "webhook_secret_ref": ref},
            format="json",
        )
        body = assert_problem(refused, 400)
        assert list(body["errors"]) == ["webhook_secret_ref"] and body["detail"].startswith("webhook_secret_ref: ")
    assert not Mailbox.objects.filter(slug="sales").exists()
    created = client.post(
        f"{API}/mailboxes/",
        {
            "tenant": "acme",
            "slug": "sales",
            "address": "sales@acme.test",
            "webhook_secret_ref": "env:MAILROOM_T_ACME_SALES",
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    mailbox_id = created.json()["id"]
    assert_problem(client.patch(f"{API}/mailboxes/{mailbox_id}/", {"paused": True}, format="json"), 400)  # why?
    assert (
        client.patch(
            f"{API}/mailboxes/{mailbox_id}/", {"paused": True, "pause_reason": "moving desks"}, format="json"
        ).json()["paused"]
        is True
    )
    # The connection's state is shown and never written through the API (its door is intake.mailbox_health).
    forced = client.patch(
        f"{API}/mailboxes/{mailbox_id}/",
        {"link_state": "up", "poll_errors_total": 0, "archive_done_at": "2026-01-01T00:00:00Z"},
        format="json",
    )
    assert forced.status_code == 200 and forced.json()["archive_done_at"] is None
    Mailbox.objects.filter(pk=mailbox_id).update(link_state="down", poll_errors_total=4)
    shown = client.get(f"{API}/mailboxes/{mailbox_id}/").json()
    assert (shown["link_state"], shown["poll_errors_total"]) == ("down", 4)
    assert (
        client.patch(f"{API}/mailboxes/{mailbox_id}/", {"link_state": "up"}, format="json").json()["link_state"]
        == "down"
    )
    assert client.delete(f"{API}/mailboxes/{mailbox_id}/").status_code == 405

    destination = client.post(
        f"{API}/destinations/",
        {"tenant": "acme", "slug": "desk2", "kind": "builtin", "credentials_ref": "plain-token"},
        format="json",
    )
    assert_problem(destination, 400)
    destination = client.post(
        f"{API}/destinations/", {"tenant": "acme", "slug": "desk2", "kind": "builtin"}, format="json"
    )
    assert destination.status_code == 201, destination.content

    rule = client.post(
        f"{API}/routing-rules/",
        {
            "tenant": "acme",
            "name": "urgent",
            "priority": "high",
            "conditions": {"subject_regex": "^urgent"},
            "destination": destination.json()["id"],
        },
        format="json",
    )
    assert rule.status_code == 201, rule.content
    bad = client.post(
        f"{API}/routing-rules/", {"tenant": "acme", "name": "bad", "conditions": {"nope": 1}}, format="json"
    )
    assert_problem(bad, 400)
    rule_id = rule.json()["id"]
    assert client.patch(f"{API}/routing-rules/{rule_id}/", {"enabled": False}, format="json").status_code == 200
    assert client.delete(f"{API}/routing-rules/{rule_id}/").status_code == 204
    assert not RoutingRule.objects.filter(pk=rule_id).exists()


def test_tenant_isolation(mailbox, operator, scanner_off, monkeypatch):
    other_tenant = make_tenant(slug="globex")
    make_destination(other_tenant)
    other_mailbox = make_mailbox(other_tenant, slug="globex-support")
    theirs = review_item(other_mailbox, subject="Globex only")
    ours = review_item(mailbox, subject="Acme only")
    client = api(operator)

    assert [e["id"] for e in client.get(f"{API}/events/").json()["results"]] == [ours]
    assert [e["id"] for e in client.get(f"{API}/queue/").json()["results"]] == [ours]
    assert_problem(client.get(f"{API}/events/{theirs}/"), 404)
    for action, data in (("replay", {}), ("close", {"reason": "x"}), ("assign", {"assignee": None})):
        assert_problem(client.post(f"{API}/queue/{theirs}/{action}/", data, format="json"), 404)
    assert_problem(client.post(f"{API}/queue/bulk-replay/", {"event_ids": [ours, theirs]}, format="json"), 404)
    assert InboxEvent.objects.get(pk=theirs).state == "awaiting_review"
    security = make_user("sam", groups=["security"], tenants=[mailbox.tenant])
    assert_problem(api(security).get(f"{API}/events/{theirs}/body/"), 404)
    assert not AuditEvent.objects.filter(inbox_event_id=theirs, kind="body_viewed").exists()

    admin_user = make_user("ann", groups=["mailroom-admin"], tenants=[mailbox.tenant])
    admin_client = api(admin_user)
    assert [m["slug"] for m in admin_client.get(f"{API}/mailboxes/").json()["results"]] == ["support"]
    assert_problem(admin_client.get(f"{API}/mailboxes/{other_mailbox.pk}/"), 404)
    assert_problem(admin_client.patch(f"{API}/mailboxes/{other_mailbox.pk}/", {"paused": True}, format="json"), 404)
    assert_problem(
        admin_client.post(f"{API}/mailboxes/", {"tenant": "globex", "slug": "x", "address": "x@g.test"}, format="json"),
        400,
    )
    foreign_destination = Destination.objects.get(tenant=other_tenant)
    assert_problem(
        admin_client.post(
            f"{API}/routing-rules/",
            {"tenant": "acme", "name": "r", "destination": foreign_destination.pk},
            format="json",
        ),
        400,
    )
    assert not Mailbox.objects.get(pk=other_mailbox.pk).paused


def test_a_tenant_slug_with_a_nul_byte_is_a_400_not_a_500(mailbox):
    """PostgreSQL refuses NUL in a text query: the slug names no tenant, said as for any unknown one."""
    client = api(make_user("ann", groups=["mailroom-admin"], tenants=[mailbox.tenant]))
    for path, body in (
        ("destinations", {"tenant": "ac\x00me", "slug": "desk", "kind": "builtin"}),
        ("mailboxes", {"tenant": "\x00", "slug": "x", "address": "x@acme.test"}),
    ):
        refused = client.post(f"{API}/{path}/", body, format="json")
        assert_problem(refused, 400)
        assert "tenant" in refused.json()["errors"]


# --- schema and docs ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_schema_and_docs_render_with_local_assets():
    client = Client()
    schema = client.get("/api/schema/?format=json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/v1/events/{id}/" in paths and "/api/v1/queue/{id}/replay/" in paths
    assert "tokenAuth" in schema.json()["components"]["securitySchemes"]
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets and all(a.startswith("/static/") or a.startswith("/api/") for a in assets), assets
    assert "cdn" not in html.lower() and "https://" not in html
    for asset in assets:
        if asset.startswith("/static/"):
            assert client.get(asset).status_code == 200, asset


def test_reconciliation_runs_and_findings_are_read_only_and_scoped(mailbox, operator):
    from reconciliation.models import Finding, ReconciliationRun

    now = timezone.now()
    other = make_tenant(slug="globex")
    ours = ReconciliationRun.objects.create(kind="provider", scope="support", started_at=now)
    theirs = ReconciliationRun.objects.create(kind="provider", scope="globex-support", started_at=now)
    Finding.objects.create(
        run=ours, kind="outbox_stuck", object="outbox:1", tenant=mailbox.tenant, first_seen=now, last_seen=now
    )
    Finding.objects.create(
        run=theirs, kind="outbox_stuck", object="outbox:2", tenant=other, first_seen=now, last_seen=now
    )
    assert_problem(api(operator).get(f"{API}/reconciliation-runs/"), 403)  # not an operator's page
    auditor = make_user(
        "rita", tenants=[mailbox.tenant], perms=["reconciliation.view_reconciliationrun", "reconciliation.view_finding"]
    )
    client = api(auditor)
    assert [r["id"] for r in client.get(f"{API}/reconciliation-runs/").json()["results"]] == [ours.pk]
    assert_problem(client.get(f"{API}/reconciliation-runs/{theirs.pk}/"), 404)
    assert [f["object"] for f in client.get(f"{API}/findings/?open=true").json()["results"]] == ["outbox:1"]
    assert client.post(f"{API}/findings/", {}, format="json").status_code == 405

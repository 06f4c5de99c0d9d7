"""The routing console in the admin: the policy, the rule list and form, enable/disable, order, the
dry run (which writes nothing) and tenant isolation. Django's test client, real PostgreSQL."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from intake.models import InboxEvent
from reconciliation.services import ensure_role_groups
from tests.factories import make_destination, make_event, make_mailbox, make_tenant
from tests.support.users import make_user
from ticketing.models import RoutingPolicy, RoutingRule

RULES = "/admin/ticketing/routingrule/"
POLICIES = "/admin/ticketing/routingpolicy/"


@pytest.fixture
def policy(tenant):
    policy = tenant.routing_policy
    policy.queues, policy.request_types = ["billing", "it"], ["refund", "outage"]
    policy.save()
    return policy


@pytest.fixture
def admin_user(client, tenant, policy):
    user = make_user("ada", groups=["mailroom-admin"], tenants=[tenant])
    client.force_login(user)
    return user


def rule_form(tenant, **fields):
    data = {
        "tenant": tenant.pk,
        "mailbox": "",
        "name": "Urgent billing",
        "position": 10,
        "enabled": "",
        "conditions": '{"recipient": "support@acme.test", "subject_regex": "^urgent"}',
        "destination": "",
        "queue": "billing",
        "priority": "high",
        "request_type": "",
        "assignee": "",
        "sensitive": "",
        "stop_processing": "on",
    }
    data.update(fields)
    return {k: v for k, v in data.items() if v != ""}


def make_rule(tenant, **fields):
    values = {
        "name": "Urgent billing",
        "position": 10,
        "enabled": False,
        "queue": "billing",
        "priority": "high",
        "conditions": {"recipient": "support@acme.test", "subject_regex": "^urgent"},
    }
    values.update(fields)
    return RoutingRule.objects.create(tenant=tenant, **values)


def test_mailroom_admin_role_manages_rules_and_policies(db):
    ensure_role_groups()
    codenames = set(Group.objects.get(name="mailroom-admin").permissions.values_list("codename", flat=True))
    assert {
        "view_routingrule",
        "add_routingrule",
        "change_routingrule",
        "delete_routingrule",
        "view_routingpolicy",
        "change_routingpolicy",
    } <= codenames
    assert "add_routingpolicy" not in codenames and "delete_routingpolicy" not in codenames


def test_the_form_refuses_an_invalid_regex_naming_the_key_and_the_error(client, tenant, admin_user):
    response = client.post(f"{RULES}add/", rule_form(tenant, conditions='{"subject_regex": "(unclosed"}'))
    assert response.status_code == 200
    text = response.content.decode()
    assert "subject_regex: invalid regular expression" in text and "missing )" in text
    assert not RoutingRule.objects.exists()


def test_the_form_checks_keys_and_the_policy_vocabulary(client, tenant, admin_user):
    response = client.post(
        f"{RULES}add/",
        rule_form(tenant, conditions='{"colour": "red"}', queue="sales", request_type="nope", priority="asap"),
    )
    text = response.content.decode()
    assert "unknown condition &#x27;colour&#x27;" in text
    assert "&#x27;sales&#x27; is not a queue of acme" in text
    assert "&#x27;nope&#x27; is not a request type of acme" in text
    assert "Select a valid choice. asap" in text
    assert not RoutingRule.objects.exists()

    response = client.post(f"{RULES}add/", rule_form(tenant))
    assert response.status_code == 302
    rule = RoutingRule.objects.get()
    assert (rule.queue, rule.priority, rule.enabled) == ("billing", "high", False)
    assert rule.conditions == {"recipient": "support@acme.test", "subject_regex": "^urgent"}


def test_the_list_shows_readable_conditions_hits_and_order(client, tenant, admin_user):
    make_rule(tenant, hits=3, last_hit_at=timezone.now())
    make_rule(
        tenant,
        name="Refunds",
        position=20,
        conditions={"sender": ["@bank.test", "a@b.test"], "keywords": ["refund"], "is_reply": False},
    )
    text = client.get(RULES).content.decode()
    assert "recipient is support@acme.test AND subject matches /^urgent/" in text
    assert (
        "sender is one of domain bank.test, a@b.test AND subject or body contains “refund” AND is not a reply"
    ) in text
    assert text.index("Urgent billing") < text.index("Refunds")
    assert 'name="form-0-position"' in text  # position is editable in the list


def test_enable_disable_and_move(client, tenant, admin_user):
    first, second = make_rule(tenant), make_rule(tenant, name="Second", position=20)
    response = client.post(RULES, {"action": "enable", "_selected_action": [first.pk, second.pk]})
    assert response.status_code == 302
    assert set(RoutingRule.objects.values_list("enabled", flat=True)) == {True}
    client.post(RULES, {"action": "disable", "_selected_action": [second.pk]})
    assert RoutingRule.objects.get(pk=second.pk).enabled is False
    assert RoutingRule.objects.get(pk=first.pk).enabled is True
    client.post(RULES, {"action": "move_up", "_selected_action": [second.pk]})
    assert list(RoutingRule.objects.filter(tenant=tenant).values_list("name", flat=True)) == [
        "Second",
        "Urgent billing",
    ]


def test_a_dry_run_lists_what_would_match_and_change_and_writes_nothing(
    client, tenant, mailbox, admin_user, count_rows
):
    hit = make_event(mailbox, subject="Urgent: invoice wrong")
    make_event(mailbox, subject="Hello there")  # no match
    old = make_event(mailbox, subject="Urgent: from last month")
    InboxEvent.objects.filter(pk=old.pk).update(received_at=timezone.now() - timedelta(days=30))
    purged = make_event(mailbox, subject="Urgent: purged")
    InboxEvent.objects.filter(pk=purged.pk).update(raw=None)
    globex = make_tenant(slug="globex")
    make_destination(globex)
    # Another tenant's message that the rule's conditions would match (addresses are unique across tenants).
    make_event(make_mailbox(globex, address="support@globex.test"), subject="Urgent: globex", to="support@acme.test")
    rule = make_rule(tenant)  # disabled: test before enabling
    before = count_rows()

    response = client.get(f"{RULES}{rule.pk}/dry-run/")
    assert response.status_code == 200
    result = response.context["result"]
    assert [m.event.pk for m in result.matches] == [hit.pk]
    assert (result.scanned, result.skipped_purged, result.days) == (3, 1, 7)
    text = response.content.decode()
    assert f"#{hit.pk}" in text and "queue: — → billing" in text and "priority: — → high" in text

    response = client.get(f"{RULES}{rule.pk}/dry-run/?days=400")  # at most 90 days
    assert response.context["result"].days == 90
    assert [m.event.pk for m in response.context["result"].matches] == [hit.pk, old.pk]

    assert count_rows() == before
    rule.refresh_from_db()
    assert (rule.hits, rule.last_hit_at, rule.enabled) == (0, None, False)

    # The list action leads to the same page.
    response = client.post(RULES, {"action": "dry_run", "_selected_action": [rule.pk]})
    assert response.status_code == 302 and response["Location"].endswith(f"{RULES}{rule.pk}/dry-run/")


def test_a_dry_run_keeps_to_the_rules_mailbox(client, tenant, mailbox, admin_user):
    other = make_mailbox(tenant, slug="sales", address="sales@acme.test")
    make_event(other, subject="Urgent: sales", to="support@acme.test")
    mine = make_event(mailbox, subject="Urgent: support")
    rule = make_rule(tenant, mailbox=mailbox)
    response = client.get(f"{RULES}{rule.pk}/dry-run/")
    assert [m.event.pk for m in response.context["result"].matches] == [mine.pk]


def test_tenant_isolation(client, tenant, mailbox, admin_user):
    globex = make_tenant(slug="globex")
    theirs = make_rule(globex, name="Globex secret rule", queue="")
    their_mailbox = make_mailbox(globex, slug="globex-support")
    mine = make_rule(tenant)

    text = client.get(RULES).content.decode()
    assert "Urgent billing" in text and "Globex secret rule" not in text
    assert client.get(f"{RULES}{theirs.pk}/change/").status_code == 404
    assert client.get(f"{RULES}{theirs.pk}/dry-run/").status_code == 404
    assert client.post(RULES, {"action": "enable", "_selected_action": [theirs.pk]}).status_code == 302
    assert RoutingRule.objects.get(pk=theirs.pk).enabled is False

    response = client.post(f"{RULES}add/", rule_form(globex))
    assert "Select a valid choice" in response.content.decode()
    response = client.post(f"{RULES}{mine.pk}/change/", rule_form(tenant, mailbox=their_mailbox.pk))
    assert "Select a valid choice" in response.content.decode()
    assert RoutingRule.objects.get(pk=mine.pk).mailbox_id is None

    text = client.get(POLICIES).content.decode()
    assert "globex" not in text
    assert client.get(f"{POLICIES}{globex.routing_policy.pk}/change/").status_code == 404


def test_the_policy_is_edited_never_added_or_deleted(client, tenant, policy, admin_user):
    assert client.get(f"{POLICIES}add/").status_code == 403
    assert client.get(f"{POLICIES}{policy.pk}/delete/").status_code == 403
    url = f"{POLICIES}{policy.pk}/change/"
    data = {
        "queues": "billing, it, sales",
        "request_types": "refund",
        "sensitive_request_types": "refund",
        "default_queue": "support",
        "default_priority": "normal",
        "default_request_type": "",
        "ai_min_confidence": "0.8",
        "one_ticket_per_message": "on",
    }
    assert "&#x27;support&#x27; is not one of the queues." in client.post(url, data).content.decode()
    response = client.post(url, {**data, "default_queue": "sales", "ai_enabled": "on"})
    assert response.status_code == 302
    policy = RoutingPolicy.objects.get(pk=policy.pk)
    assert (policy.queues, policy.request_types, policy.default_queue) == (
        ["billing", "it", "sales"],
        ["refund"],
        "sales",
    )
    assert (policy.ai_enabled, policy.ai_min_confidence, policy.sensitive_request_types) == (True, 0.8, ["refund"])

"""Routing rules in a real browser: Debian's Chromium, headless, driven by Playwright, against
pytest-django's live server (set-up as in test_recovery_browser.py).

A mailroom-admin creates a rule (disabled), runs its dry run and sees a stored event it would
match, enables it; the next matching mail is routed by it: the built-in ticket carries the rule's
queue and priority. Screenshots go to $MAILROOM_SCREENSHOT_DIR or test-artifacts/screenshots/<time>/.
"""

import pytest

from tests.browser import browser, chromium_path, page, screenshot_dir  # noqa: F401  (fixtures)
from tests.factories import make_event
from tests.support.users import PASSWORD, make_user
from ticketing.models import RoutingRule, Ticket, TicketMapping
from ticketing.services import process_inbox_event

RULES = "/admin/ticketing/routingrule/"

pytestmark = pytest.mark.live


def messages_text(page) -> str:
    return " ".join(page.locator("ul.messagelist li").all_inner_texts())


def test_an_admin_tests_a_rule_then_enables_it_and_the_next_mail_is_routed(
    live_server, page, screenshot_dir, tenant, mailbox, scanner_off
):
    policy = tenant.routing_policy
    policy.queues, policy.request_types = ["billing", "it"], ["invoice"]
    policy.save()
    stored = make_event(mailbox, subject="URGENT: invoice is wrong")
    assert process_inbox_event(stored.pk) == "created"  # routed before the rule existed
    make_event(mailbox, subject="A question")  # does not match
    make_user("ada", groups=["mailroom-admin"], tenants=[tenant])
    base = live_server.url

    page.goto(f"{base}/admin/login/?next={RULES}add/")
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{RULES}add/")

    # A new rule, disabled: first an invalid regex is refused with a clear message.
    page.select_option("#id_tenant", label="acme")
    page.fill("#id_name", "Urgent billing")
    page.fill("#id_position", "10")
    page.uncheck("#id_enabled")
    page.fill("#id_conditions", '{"recipient": "support@acme.test", "subject_regex": "^urgent("}')
    page.fill("#id_queue", "billing")
    page.select_option("#id_priority", "high")
    page.click("input[name=_save]")
    assert "subject_regex: invalid regular expression" in page.inner_text(".errorlist")
    page.fill("#id_conditions", '{"recipient": "support@acme.test", "subject_regex": "^urgent"}')
    page.click("input[name=_save]")
    page.wait_for_url(f"**{RULES}")
    rule = RoutingRule.objects.get(name="Urgent billing")
    assert rule.enabled is False
    row = page.locator("#result_list tbody tr", has_text="Urgent billing")
    assert "recipient is support@acme.test AND subject matches /^urgent/" in row.inner_text()
    page.screenshot(path=screenshot_dir / "routing-01-rules.png", full_page=True)

    # The dry run: the stored event is listed with what would change; nothing is written.
    row.locator("a.dry-run-link").click()
    page.wait_for_url(f"**{RULES}{rule.pk}/dry-run/**")
    matched = page.locator("tr.dry-run-match")
    assert matched.count() == 1
    assert matched.get_attribute("data-event") == str(stored.pk)
    changes = matched.locator("td.changes").inner_text()
    assert "queue:" in changes and "→ billing" in changes and "→ high" in changes
    page.fill("#id_days", "30")
    page.click("#run-dry-run")
    page.wait_for_url("**days=30")
    assert page.locator("tr.dry-run-match").count() == 1
    page.screenshot(path=screenshot_dir / "routing-02-dry-run.png", full_page=True)
    rule.refresh_from_db()
    assert (rule.hits, rule.enabled) == (0, False)

    # Enable it from the list.
    page.goto(f"{base}{RULES}")
    page.locator("#result_list tbody tr", has_text="Urgent billing").locator("input.action-select").check()
    page.select_option("select[name=action]", "enable")
    with page.expect_navigation():
        page.click("button[name=index]")
    assert "Enabled 1 rule(s)." in messages_text(page)
    rule.refresh_from_db()
    assert rule.enabled is True
    page.screenshot(path=screenshot_dir / "routing-03-enabled.png", full_page=True)

    # The next matching mail is routed by it.
    event = make_event(mailbox, subject="Urgent: charged twice")
    assert process_inbox_event(event.pk) == "created"
    mapping = TicketMapping.objects.get(inbox_event=event)
    ticket = Ticket.objects.get(pk=mapping.ticket_id)
    assert (ticket.queue, ticket.priority) == (rule.queue, rule.priority) == ("billing", "high")
    rule.refresh_from_db()
    assert rule.hits == 1 and rule.last_hit_at is not None

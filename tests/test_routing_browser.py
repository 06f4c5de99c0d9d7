"""Routing rules in a real browser: Debian's Chromium, headless, driven by Playwright, against
pytest-django's live server (set-up as in test_recovery_browser.py).

A mailroom-admin creates a rule (disabled), runs its dry run and sees a stored event it would
match, enables it; the next matching mail is routed by it: the built-in ticket carries the rule's
queue and priority. Screenshots go to $MAILROOM_SCREENSHOT_DIR or test-artifacts/screenshots/<time>/.
"""
import contextlib
import os
import time
from pathlib import Path

import pytest
from playwright import sync_api  # noqa: E402  (the test extra installs it)

from tests.factories import make_event
from tests.test_routing_admin import PASSWORD, make_user
from ticketing.models import RoutingRule, Ticket, TicketMapping
from ticketing.services import process_inbox_event

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
REPO_ROOT = Path(__file__).resolve().parents[1]
RULES = "/admin/ticketing/routingrule/"

pytestmark = pytest.mark.live


def _install_chromium() -> str:
    import subprocess

    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:  # a fresh machine may have no package lists yet
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True, timeout=900)
        result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
    return (result.stdout + result.stderr)[-2000:]


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Debian's Chromium (Playwright's own download cannot work here); installed on first use."""
    if not CHROMIUM.exists():
        output = _install_chromium()
        if not CHROMIUM.exists():
            pytest.fail(f"apt-get could not install chromium:\n{output}")
    return str(CHROMIUM)


@pytest.fixture(scope="session")
def screenshot_dir(request) -> Path:
    folder = Path(os.environ.get("MAILROOM_SCREENSHOT_DIR")
                  or REPO_ROOT / "test-artifacts" / "screenshots" / time.strftime("%Y%m%d-%H%M%S"))
    folder.mkdir(parents=True, exist_ok=True)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")

    def say():
        if reporter is None:
            return
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            reporter.write_line("")
            reporter.write_sep("-", f"routing screenshots: {folder}")

    say()
    request.addfinalizer(say)
    return folder


@pytest.fixture(scope="module")
def browser(chromium_path):
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are plain sync code.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_api.sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
            try:
                yield launched
            finally:
                launched.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1920, "height": 1080})
    context.set_default_timeout(15_000)
    try:
        yield context.new_page()
    finally:
        context.close()


def messages_text(page) -> str:
    return " ".join(page.locator("ul.messagelist li").all_inner_texts())


def test_an_admin_tests_a_rule_then_enables_it_and_the_next_mail_is_routed(live_server, page, screenshot_dir,
                                                                          tenant, mailbox, scanner_off):
    policy = tenant.routing_policy
    policy.queues, policy.request_types = ["billing", "it"], ["invoice"]
    policy.save()
    stored = make_event(mailbox, subject="URGENT: invoice is wrong")
    assert process_inbox_event(stored.pk) == "created"  # routed before the rule existed
    make_event(mailbox, subject="A question")  # does not match
    make_user("ada", tenants=[tenant])
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

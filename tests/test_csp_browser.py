"""The Content-Security-Policy in a real browser (Debian's Chromium, headless, Playwright) against the live server.

The console's pages (the queue, an item, its body, the dashboard) and the API docs load with the strict policy
and Chromium reports no violation, at 1400 and at 800 px wide; the pages still work (styles applied, the
Swagger UI rendered by its external script). A page given an inline script on purpose is caught, so the
check itself can fail.
"""

import pytest
from django.urls import reverse

from tests.browser import browser, chromium_path, screenshot_dir  # noqa: F401  (fixtures)
from tests.support.queue import QUEUE_URL, new_event, quarantine
from tests.support.users import PASSWORD, make_user
from ticketing.models import RoutingRule

pytestmark = pytest.mark.live

WATCH_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation',
    (e) => window.__cspViolations.push(e.violatedDirective + ' ' + (e.blockedURI || 'inline')));
"""


def new_page(browser, width):
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(15_000)
    context.add_init_script(WATCH_VIOLATIONS)
    page = context.new_page()
    console = []
    page.on("console", lambda message: console.append(message.text))
    return context, page, console


def violations(page, console) -> list[str]:
    reported = page.evaluate("window.__cspViolations")
    return reported + [text for text in console if "Content Security Policy" in text]


@pytest.mark.parametrize("width", [1400, 800])
def test_the_console_loads_under_the_policy_without_a_violation(
    live_server, browser, screenshot_dir, tenant, mailbox, width
):
    event_id = new_event(mailbox, subject="Printer on fire <script>alert(1)</script>", sender="eve@customer.test")
    quarantine(event_id)
    make_user("sec", groups=["security", "operator", "mailroom-admin"], tenants=[tenant])
    rule = RoutingRule.objects.create(
        tenant=tenant, name="printers", conditions={"body_regex": "printer"}, queue="hardware"
    )
    context, page, console = new_page(browser, width)
    try:
        page.goto(f"{live_server.url}/admin/login/?next={QUEUE_URL}")
        page.fill("#id_username", "sec")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_url(f"**{QUEUE_URL}")
        assert page.inner_text("#open-count") == "1"
        # The console's own stylesheet applies (it used to be an inline <style>): the head is a flex row.
        assert page.eval_on_selector("#queue-summary", "e => getComputedStyle(e).display") == "flex"
        page.screenshot(path=screenshot_dir / f"csp-queue-{width}.png", full_page=True)
        for url in (f"{QUEUE_URL}{event_id}/change/", f"{QUEUE_URL}{event_id}/body/", f"{QUEUE_URL}dashboard/"):
            response = page.goto(f"{live_server.url}{url}")
            assert response.status == 200 and response.headers["content-security-policy"], url
            page.wait_for_load_state("load")
            assert violations(page, console) == [], url
        page.goto(f"{live_server.url}{QUEUE_URL}{event_id}/change/")
        assert page.eval_on_selector("#item-facts", "e => getComputedStyle(e).display") == "grid"
        page.screenshot(path=screenshot_dir / f"csp-item-{width}.png", full_page=True)
        # The pages the tenant boundary changed: the pauses (a tenant's own pause) and a body rule's dry run.
        for name, url in (
            ("pauses", "/admin/reconciliation/pauseswitch/"),
            ("dry-run", reverse("admin:ticketing_routingrule_dry_run", args=[rule.pk])),
        ):
            response = page.goto(f"{live_server.url}{url}")
            assert response.status == 200, url
            page.wait_for_load_state("load")
            assert violations(page, console) == [], url
            page.screenshot(path=screenshot_dir / f"csp-{name}-{width}.png", full_page=True)
        page.goto(f"{live_server.url}/api/docs/")
        page.wait_for_selector("#swagger-ui .info", timeout=20_000)  # rendered by the external script
        assert violations(page, console) == []
    finally:
        context.close()


def test_the_check_sees_a_violation_when_there_is_one(live_server, browser):
    context, page, console = new_page(browser, 800)
    try:
        page.goto(f"{live_server.url}/admin/login/")
        page.evaluate("""() => { const s = document.createElement('script'); s.textContent = 'window.ran = 1';
                                 document.body.appendChild(s); }""")
        page.wait_for_timeout(200)
        assert page.evaluate("window.ran === undefined")  # blocked
        assert any("script-src" in v for v in violations(page, console))
    finally:
        context.close()

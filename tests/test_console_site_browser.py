"""The console's frame in Chromium at 1400 and 800 px: the landing page, the login page, an admin's grouped index,
an operator's index and the 404 inside the console. Each fits the window (no sideways scroll), shows Mailroom's
colours and no Django branding, raises no console error, and leaves a screenshot."""

import pytest

from tests.browser import browser, chromium_path, screenshot_dir  # noqa: F401  (fixtures)
from tests.support.pages import new_page
from tests.support.users import log_in, make_user

pytestmark = pytest.mark.live

HEADER_BG = "rgb(31, 58, 95)"  # --secondary of console.css (#1f3a5f), the header of every console page


def check(page, shot, screenshot_dir, width, errors, expected_errors=0):
    page.screenshot(path=screenshot_dir / f"console-site-{shot}-{width}.png", full_page=True)
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"{shot}: {overflow}px wider than {width}px"
    text = page.inner_text("body")
    assert "Django" not in text and "{'" not in text and "None" not in text, shot
    assert len(errors) == expected_errors, (shot, errors)  # a 404 logs its own status line, nothing else


@pytest.mark.parametrize("width", [1400, 800])
def test_landing_login_index_and_404_fit_the_window_in_mailrooms_colours(
    live_server, browser, screenshot_dir, tenant, width
):
    make_user("root", tenants=[tenant], is_superuser=True)
    make_user("oper", groups=["operator"], tenants=[tenant])
    base = live_server.url
    context, page, errors = new_page(browser, width)
    try:
        assert page.goto(f"{base}/").status == 200
        assert page.locator("h1").inner_text() == "Mailroom"
        check(page, "landing", screenshot_dir, width, errors)
        page.click("#open-console")
        page.wait_for_url("**/admin/login/**")
        assert page.eval_on_selector("#header", "e => getComputedStyle(e).backgroundColor") == HEADER_BG
        check(page, "login", screenshot_dir, width, errors)

        log_in(page, base, "root")
        titles = page.locator(".console-section h2").all_inner_texts()
        assert [t.lower() for t in titles] == ["recovery queue", "configuration", "evidence", "platform internals"]
        assert page.locator("#dashboard-link a").is_visible()
        check(page, "index-admin", screenshot_dir, width, errors)

        response = page.goto(f"{base}/admin/no-such-page/")
        assert response.status == 404 and page.locator("#back-to-console").is_visible()
        check(page, "404", screenshot_dir, width, errors, expected_errors=1)
        page.click("#back-to-console")
        page.wait_for_url("**/admin/")

        assert page.goto(f"{base}/").status == 200
        assert "signed in as root" in page.inner_text("#signed-in")
        check(page, "landing-signed-in", screenshot_dir, width, errors, expected_errors=1)
    finally:
        context.close()

    context, page, errors = new_page(browser, width)
    try:
        log_in(page, base, "oper")
        assert [t.lower() for t in page.locator(".console-section h2").all_inner_texts()] == [
            "recovery queue",
            "configuration",
        ]
        check(page, "index-operator", screenshot_dir, width, errors)
        response = page.goto(f"{base}/admin/axes/accessattempt/")
        assert response.status == 403 and page.locator("#error-403").is_visible()
        check(page, "403", screenshot_dir, width, errors, expected_errors=1)
    finally:
        context.close()


def test_in_dark_mode_the_console_and_the_landing_page_keep_mailrooms_dark_palette(
    live_server, browser, screenshot_dir, tenant
):
    make_user("root", tenants=[tenant], is_superuser=True)
    context = browser.new_context(viewport={"width": 1400, "height": 900}, color_scheme="dark")
    context.set_default_timeout(15_000)
    page = context.new_page()
    try:
        page.goto(f"{live_server.url}/")
        assert page.eval_on_selector("body", "e => getComputedStyle(e).backgroundColor") == "rgb(17, 22, 29)"
        page.screenshot(path=screenshot_dir / "console-site-landing-dark-1400.png", full_page=True)
        log_in(page, live_server.url, "root")
        assert page.eval_on_selector("#header", "e => getComputedStyle(e).backgroundColor") == "rgb(20, 41, 67)"
        assert page.eval_on_selector("body", "e => getComputedStyle(e).backgroundColor") == "rgb(17, 22, 29)"
        page.screenshot(path=screenshot_dir / "console-site-index-dark-1400.png", full_page=True)
    finally:
        context.close()

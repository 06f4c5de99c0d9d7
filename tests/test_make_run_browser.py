"""The first hour in a browser: `make run` on the embedded default, then what the banner says, in Chromium.

A fresh copy of the repository (`copy_project` of tests/support/make_run.py, as tests/test_make_run_smoke.py)
runs `make run`; the test waits for the banner's "ready", takes the URL, user and password from it, and
does what a newcomer does: opens `/` (it leads to the console's login), logs in with the printed
credentials, opens the dashboard and the recovery queue (both render on SQLite), at 1400 and 800 px.
"""

import re

import pytest

from tests.browser import browser, chromium_path, screenshot_dir  # noqa: F401  (fixtures)
from tests.support.make_run import banner_value, running_stack  # noqa: F401  (fixture)

pytestmark = pytest.mark.live


def test_the_banners_url_and_credentials_open_the_console_and_its_dashboard(running_stack, browser, screenshot_dir):
    port, output = running_stack
    console_url = banner_value(output, "admin")
    assert console_url == f"http://127.0.0.1:{port}/admin/", output.tail()
    user, password = banner_value(output, "user"), banner_value(output, "password")
    base = console_url.removesuffix("/admin/")
    for width in (1400, 800):
        context = browser.new_context(viewport={"width": width, "height": 900})
        context.set_default_timeout(20_000)
        page = context.new_page()
        try:
            page.goto(f"{base}/")  # `/` is the landing page; its button leads to the console, which asks for the
            page.click("#open-console")  # banner's credentials
            page.wait_for_url(re.compile(r"/admin/login/"))
            page.fill("#id_username", user)
            page.fill("#id_password", password)
            page.click("input[type=submit]")
            page.wait_for_url(re.compile(r"/admin/$"))
            assert page.locator("#site-name").is_visible()

            response = page.goto(f"{base}/admin/reconciliation/recoveryitem/dashboard/")
            assert response.status == 200
            assert page.locator("#dash-summary").is_visible() and page.locator("#plot-backlog svg").count() == 1
            page.screenshot(path=str(screenshot_dir / f"embedded-dashboard-{width}.png"), full_page=True)
            # Nothing wider than the window: the page reads at this width without scrolling sideways.
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 1, f"{overflow}px wider than {width}px"

            response = page.goto(f"{base}/admin/reconciliation/recoveryitem/")
            assert response.status == 200 and page.locator("#result_list, .paginator").count() >= 1
            page.screenshot(path=str(screenshot_dir / f"embedded-queue-{width}.png"), full_page=True)
        finally:
            context.close()
    assert "exited with" not in output.text() and "Traceback" not in output.text(), output.tail()

"""The first hour in a browser: `make run` on the embedded default, then what the banner says, in Chromium.

A fresh copy of the repository (as tests/test_make_run_smoke.py makes it) runs `make run`; the test
waits for the banner's "ready", takes the URL, user and password from it, and does what a newcomer
does: opens `/` (it leads to the console's login), logs in with the printed credentials, opens the
dashboard and the recovery queue (both render on SQLite), at 1400 and 800 px.
"""
import re

import pytest

from tests.browser import browser, chromium_path, screenshot_dir  # noqa: F401  (fixtures)
from tests.live import free_port, kill_group
from tests.test_make_run_smoke import Output, TreeWatcher, clean_env, copy_project, wait_until

pytestmark = pytest.mark.live


@pytest.fixture
def running_stack(tmp_path):
    import subprocess

    workdir = tmp_path / "mailroom"
    copy_project(workdir)
    port = free_port()
    process = subprocess.Popen(["make", "run", f"PORT={port}", "-o", ".venv/.installed"], cwd=workdir,
                               env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    output = Output(process.stdout)
    watcher = TreeWatcher(process.pid)
    try:
        wait_until(lambda: "Mailroom is ready" in output.text(), timeout=120, what="the ready banner", output=output)
        yield port, output
    finally:
        watcher.kill_all()
        if process.poll() is None:
            kill_group(process.pid)
            process.wait(timeout=10)


def banner_value(output: Output, label: str) -> str:
    banner = output.text().split("Mailroom is ready", 1)[1]
    return re.search(rf"{label}:\s+(\S+)", banner).group(1)


def test_the_banners_url_and_credentials_open_the_console_and_its_dashboard(running_stack, browser,
                                                                             screenshot_dir):
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

"""Playwright with Debian's Chromium, shared by the browser tests (import the fixtures you use)."""

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest
from playwright import sync_api

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
REPO_ROOT = Path(__file__).resolve().parents[1]


def _install_chromium() -> str:
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
    folder = Path(
        os.environ.get("MAILROOM_SCREENSHOT_DIR")
        or REPO_ROOT / "test-artifacts" / "screenshots" / time.strftime("%Y%m%d-%H%M%S")
    )
    folder.mkdir(parents=True, exist_ok=True)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")

    def say():
        if reporter is None:
            return
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            reporter.write_line("")
            reporter.write_sep("-", f"browser screenshots: {folder}")

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

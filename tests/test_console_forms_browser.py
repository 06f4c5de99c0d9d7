"""The mailbox form refusing bad IMAP settings, the pause page asking a reason and the API token pages, in
Chromium at 1400 and 800 px: the errors are on the page, nothing overflows sideways, no dict or None as text.
Screenshots go to $MAILROOM_SCREENSHOT_DIR or test-artifacts/screenshots/<time>/."""

import json

import pytest

from intake.models import Mailbox
from reconciliation.models import ApiToken
from tests.browser import browser, chromium_path, page, screenshot_dir  # noqa: F401  (fixtures)
from tests.support.users import PASSWORD, make_user

pytestmark = pytest.mark.live

WIDTHS = (1400, 800)


def log_in(page, base_url, username, next_url):
    page.goto(f"{base_url}/admin/login/?next={next_url}")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{next_url}")


def assert_readable(page, width):
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    text = page.inner_text("#content")
    assert "{'" not in text and "None" not in text


def test_the_mailbox_form_names_each_bad_imap_setting_at_both_widths(live_server, page, screenshot_dir, mailbox):
    make_user("olga", groups=["mailroom-admin"], tenants=[mailbox.tenant])
    log_in(page, live_server.url, "olga", "/admin/intake/mailbox/add/")
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{live_server.url}/admin/intake/mailbox/add/")
        page.select_option("#id_tenant", str(mailbox.tenant.pk))
        page.fill("#id_slug", "imap-desk")
        page.fill("#id_address", "imap-desk@acme.test")
        page.select_option("#id_provider", "imap")
        page.fill("#id_settings", json.dumps({"host": "imap.example.com", "port": "abc", "colour": "blue"}))
        page.fill("#id_allowed_recipients", "help@acme.test\nnot an address")
        with page.expect_navigation():  # read the answer once loaded, not a prefix of it still streaming in
            page.click("input[name=_save]")
        errors = page.inner_text("#content")
        assert "port: must be a whole number from 1 to 65535" in errors
        assert "colour: is not a setting of imap" in errors
        assert "line 2 (not an address): not an email address" in errors
        assert "env:MAILROOM_T_<TENANT>_<NAME>" in errors  # the placeholder as text
        assert_readable(page, width)
        page.screenshot(path=screenshot_dir / f"forms-mailbox-invalid-{width}.png", full_page=True)
    assert not Mailbox.objects.filter(slug="imap-desk").exists()


def test_the_token_pages_and_the_pause_reason_at_both_widths(live_server, page, screenshot_dir, mailbox):
    make_user("olga", groups=["mailroom-admin"], tenants=[mailbox.tenant])
    log_in(page, live_server.url, "olga", "/admin/reconciliation/apitoken/add/")
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{live_server.url}/admin/reconciliation/apitoken/add/")
        assert_readable(page, width)
        page.screenshot(path=screenshot_dir / f"forms-token-add-{width}.png", full_page=True)
        page.fill("#id_name", f"export at {width}")
        page.select_option("#id_expires", "90")
        page.click("#create-token")
        token = page.inner_text("#new-token")
        assert token.startswith("mr_") and "shown only this once" in page.inner_text("#content")
        assert_readable(page, width)
        page.screenshot(path=screenshot_dir / f"forms-token-created-{width}.png", full_page=True)
        page.goto(f"{live_server.url}/admin/reconciliation/apitoken/")
        assert token not in page.content()
        assert_readable(page, width)
        page.screenshot(path=screenshot_dir / f"forms-token-list-{width}.png", full_page=True)
    assert ApiToken.objects.count() == 2

    page.goto(f"{live_server.url}/admin/reconciliation/pauseswitch/")
    row = page.locator("#mailboxes tbody tr", has_text="support")
    row.locator("input[name=reason]").fill("desk migration")
    row.locator("input[type=submit]").click()
    page.wait_for_load_state()
    assert "paused by olga" in page.inner_text("#mailboxes") and "desk migration" in page.inner_text("#mailboxes")
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        assert_readable(page, width)
        page.screenshot(path=screenshot_dir / f"forms-pauses-{width}.png", full_page=True)

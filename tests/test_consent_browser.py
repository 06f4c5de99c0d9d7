"""The consent flow in Chromium at 1400 and 800 px against the stub authorization server: a tenant admin presses
Connect on the mailbox page, goes through the stub's sign-in page and lands back on the mailbox with the granted
scopes and expiry shown and the tokens in the file: reference; a tampered state is refused with nothing written;
the credentials banner shows on the mailbox list, the dashboard and the queue. Every page fits the window and
leaves a screenshot."""

from datetime import timedelta

import pytest
from django.utils import timezone

from intake.models import Mailbox
from tests.browser import browser, chromium_path, screenshot_dir  # noqa: F401  (fixtures)
from tests.fake_authorization_server import FakeAuthorizationServer
from tests.support.consent import CALLBACK, CLIENT_SECRET, credentials_of, oauth_mailbox
from tests.support.pages import new_page
from tests.support.users import log_in, make_user

pytestmark = pytest.mark.live


@pytest.fixture
def stub():
    server = FakeAuthorizationServer(
        client_id="consent-app", client_secret=CLIENT_SECRET, refresh_lifetime=90 * 86400
    ).start()
    yield server
    server.stop()


def fits(page, shot, screenshot_dir, width):
    page.screenshot(path=screenshot_dir / f"consent-{shot}-{width}.png", full_page=True)
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"{shot}: {overflow}px wider than {width}px"
    assert "Django" not in page.inner_text("body"), shot


@pytest.mark.parametrize("width", [1400, 800])
def test_an_admin_connects_a_mailbox_through_the_sign_in_page_and_sees_scopes_and_expiry(
    live_server, browser, screenshot_dir, tenant, tmp_path, settings, stub, width
):
    settings.MAILROOM_SECRETS_DIR = str(tmp_path / "secrets")
    mailbox = oauth_mailbox(tenant, tmp_path / "secrets", stub)
    make_user("alice", groups=["mailroom-admin", "operator"], tenants=[tenant])
    base = live_server.url
    context, page, errors = new_page(browser, width)
    try:
        log_in(page, base, "alice")
        page.goto(f"{base}/admin/intake/mailbox/{mailbox.pk}/change/")
        assert page.locator("#oauth-not-connected").is_visible()
        fits(page, "mailbox-before", screenshot_dir, width)
        page.click("#oauth-connect")
        page.wait_for_url("**/connect/")
        assert "offline_access" in page.inner_text("#consent-scope")
        fits(page, "connect", screenshot_dir, width)

        page.click("#consent-continue")
        page.wait_for_url(f"{stub.url}/authorize?**")
        assert "Mail.Read" in page.inner_text("#scope")
        page.click("#approve")
        page.wait_for_url(f"**/admin/intake/mailbox/{mailbox.pk}/change/")
        assert "is connected" in page.inner_text(".messagelist")
        assert "https://graph.microsoft.com/Mail.Read" in page.inner_text("#oauth-scopes")
        expires = Mailbox.objects.get(pk=mailbox.pk).oauth_expires_at
        assert f"{expires:%Y-%m-%d}" in page.inner_text("#oauth-expires")
        assert "alice" in page.inner_text("#oauth-connected")
        fits(page, "mailbox-connected", screenshot_dir, width)
        assert credentials_of(mailbox)["refresh_token"] == stub.issued[0]["refresh_token"]

        written = (tmp_path / "secrets" / tenant.slug / "graph.json").read_text()
        response = page.goto(f"{base}{CALLBACK}?code=forged&state=not-the-state")
        assert response.status == 400 and page.locator("#consent-error").is_visible()
        fits(page, "refused", screenshot_dir, width)
        assert (tmp_path / "secrets" / tenant.slug / "graph.json").read_text() == written
        assert len(stub.exchanges) == 1

        Mailbox.objects.filter(pk=mailbox.pk).update(oauth_expires_at=timezone.now() + timedelta(days=3))
        for shot, url in (
            ("mailbox-list", "/admin/intake/mailbox/"),
            ("dashboard", "/admin/reconciliation/recoveryitem/dashboard/"),
            ("queue", "/admin/reconciliation/recoveryitem/"),
        ):
            page.goto(base + url)
            assert page.locator("#credentials-warning").is_visible(), shot
            assert mailbox.slug in page.inner_text("#credentials-warning")
            fits(page, shot, screenshot_dir, width)
        page.goto(f"{base}/admin/intake/mailbox/{mailbox.pk}/change/")
        assert page.locator("#oauth-state").is_visible()
        assert "expire within a week" in page.inner_text(".messagelist .warning")  # said on top of the long form
        fits(page, "mailbox-expiring", screenshot_dir, width)
        # The one console error is the refused callback's own 400 status line.
        assert len(errors) == 1 and "400" in errors[0], errors
    finally:
        context.close()

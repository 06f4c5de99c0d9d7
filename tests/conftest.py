import pytest
from django.conf import settings

# Shared fixtures, available in every test module:
#   fakedesk.pytest_plugin  `desk` / `desk_factory`, the `fakedesk` marker and request hook (a FakeDesk per test)
#   tests.factories         `tenant`, `mailbox` (+ built-in default destination), `scanner_off`, `count_rows`
#   tests.clamd             `clamd`, a real clamd for the session (started on first use)
pytest_plugins = ["fakedesk.pytest_plugin", "tests.factories", "tests.clamd"]

# Fixtures that start a real service or process. A test that uses one, directly or through another
# fixture, gets the `services` marker, so `make test-fast` (-m "not live and not services") never runs it.
SERVICE_FIXTURES = {
    "clamd",  # tests/clamd.py
    "dovecot",
    "private_dovecot",  # tests/dovecot.py
    "oauth_dovecot",  # tests/test_imap_oauth.py: Dovecot with an oauth2 passdb
    "chromium_path",
    "browser",  # test_recovery_browser.py (Playwright + Chromium)
    "live_processes",
    "live_broker",
    "live_mailbox",  # tests/live.py: worker, relay, web processes
    "live_server",  # pytest-django's live server
    "openbao",  # tests/openbao.py: an OpenBao dev server
    "sns_server",  # tests/sns.py: an HTTPS stand-in for SNS
    "moto_server",  # tests/test_ses.py: moto's S3-compatible server
    "lmtp_listener",
    "start_listener",  # tests/postfix.py: manage.py run_lmtp processes
    "unix_listener",  # tests/support/lmtp.py: run_lmtp on a unix socket
    "private_postfix",  # tests/postfix.py: a private Postfix instance
}


WEBHOOK_SECRET = "test-webhook-secret"  # the `mailbox` fixture's secret (tests/factories.py)


@pytest.fixture(autouse=True)
def _fresh_secret_caches():
    """intake.secrets keeps per-process caches (vault values, resolution records, tenant prefixes): none
    may carry one test's rows or values into the next."""
    from intake import secrets

    secrets.clear_cache()
    yield
    secrets.clear_cache()


def pytest_configure(config):
    # The promise is made on PostgreSQL; a suite that quietly ran on SQLite would prove less.
    assert settings.USING_POSTGRES, "the test suite runs on PostgreSQL (see config/test_settings.py)"


def pytest_collection_modifyitems(config, items):
    for item in items:
        fakedesk = item.get_closest_marker("fakedesk")
        desk_process = fakedesk is not None and fakedesk.kwargs.get("process")
        if SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())) or desk_process:
            item.add_marker(pytest.mark.services)

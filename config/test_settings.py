"""Settings for the test suite: the production settings, on PostgreSQL and Redis by default.

The variables are set before the settings module reads them, so a bare
`pytest` runs on PostgreSQL exactly as `make test` does.
"""

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/mailroom")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
# The suite's fixtures name fixed variables for every tenant: platform references, listed here (and in the
# environment, so that the processes tests start see the same list). "=*" binds one to every row, which only
# a test rig does (intake.secrets; tests/test_secret_boundary.py binds its own to single rows). The AI keys
# resolve only for the platform when named by MAILROOM_AI_API_KEY_REF. Tenant-scoped references need no listing.
TEST_SECRET_REFS = [
    f"env:{name}=*"
    for name in (
        "MAILROOM_TEST_WEBHOOK_SECRET",
        "MAILROOM_LIVE_TEST_WEBHOOK_SECRET",
        "MAILROOM_TEST_MAILGUN_KEY",
        "MAILROOM_TEST_BASIC",
        "FAKEDESK_CREDENTIALS",
        "FAKEDESK_BAD_CREDENTIALS",
        "DESK_CREDENTIALS",
        "ZD_CREDENTIALS",
        "ZD_TOKEN_ONLY",
        "SOME_OTHER_PASSWORD",
        "GMAIL_TEST_CREDENTIALS",
        "GMAIL_TEST_URL_TOKEN",
        "GRAPH_TEST_CREDENTIALS",
        "GRAPH_TEST_CLIENT_STATE",
    )
] + ["env:TEST_AI_KEY", "env:MAILROOM_TEST_NO_SUCH_KEY"]
os.environ.setdefault("MAILROOM_PLATFORM_SECRET_REFS", ",".join(TEST_SECRET_REFS))
# The suite is a development environment: the built-in SECRET_KEY, plain HTTP. Set in the environment, so
# the processes the tests start (worker, relay, gunicorn) inherit it; tests of production strip it.
os.environ.setdefault("MAILROOM_ENV", "development")
# The suite's servers (FakeDesk, the provider fakes, Dovecot, the SNS stand-in) listen on 127.0.0.1: the egress
# guard lets loopback through, as development does by default (tests/test_egress.py shows it refuses it without).
os.environ.setdefault("MAILROOM_EGRESS_ALLOWED_NETWORKS", "127.0.0.0/8,::1")

from .settings import *  # noqa: E402,F401,F403

# Static files come from the apps' folders in tests (no collectstatic run needed).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True

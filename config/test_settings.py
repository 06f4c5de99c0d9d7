"""Settings for the test suite: the production settings, on PostgreSQL and Redis by default.

The variables are set before the settings module reads them, so a bare
`pytest` runs on PostgreSQL exactly as `make test` does.
"""

import os

# The Redis databases the suite owns, by use: the in-process broker, the live pipeline's broker (tests/live.py),
# the pause tests' and the worker-logging probe's. A serial run uses these numbers. Under pytest-xdist each
# worker (PYTEST_XDIST_WORKER = gw0, gw1, ...) takes a block of its own, so no worker's broker carries another's
# tasks, and no worker flushes a database another is using. Redis has 16 databases: 4 workers at most.
REDIS_DATABASES = {"probe": 5, "pause": 11, "pipeline": 13, "broker": 15}
XDIST_MAX_WORKERS = 16 // len(REDIS_DATABASES)


def redis_database(use: str) -> int:
    """The Redis database this test process owns for `use` (a key of REDIS_DATABASES)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return REDIS_DATABASES[use]
    index = int(worker.removeprefix("gw"))
    if index >= XDIST_MAX_WORKERS:
        raise RuntimeError(f"the suite owns Redis databases for {XDIST_MAX_WORKERS} xdist workers, not {index + 1}")
    return index * len(REDIS_DATABASES) + list(REDIS_DATABASES).index(use)


os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/mailroom")
# Only a default: a CELERY_BROKER_URL in the environment is used as given (by every xdist worker alike). The
# processes a test starts inherit the variable, so they never pick a database of their own here.
os.environ.setdefault("CELERY_BROKER_URL", f"redis://127.0.0.1:6379/{redis_database('broker')}")
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

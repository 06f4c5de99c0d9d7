"""Settings for the test suite: the production settings, on PostgreSQL and Redis by default.

The variables are set before the settings module reads them, so a bare
`pytest` runs on PostgreSQL exactly as `make test` does.
"""
import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/mailroom")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")

from .settings import *  # noqa: E402,F401,F403

# Static files come from the apps' folders in tests (no collectstatic run needed).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True

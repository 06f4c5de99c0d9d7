import os

import pytest

# The suite runs on PostgreSQL, as production does (`make test` sets these too).
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/mailroom")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture
def tenant(db):
    from intake.models import Tenant

    return Tenant.objects.create(slug="acme", name="Acme")

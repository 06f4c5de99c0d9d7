import pytest
from django.conf import settings

# FakeDesk's `desk` / `desk_factory` fixtures, its `fakedesk` marker and request hook (fakedesk/pytest_plugin.py).
pytest_plugins = ["fakedesk.pytest_plugin"]


def pytest_configure(config):
    # The promise is made on PostgreSQL; a suite that quietly ran on SQLite would prove less.
    assert settings.USING_POSTGRES, "the test suite runs on PostgreSQL (see config/test_settings.py)"


@pytest.fixture
def tenant(db):
    from intake.models import Tenant

    return Tenant.objects.create(slug="acme", name="Acme")


WEBHOOK_SECRET = "test-webhook-secret"


@pytest.fixture
def mailbox(tenant, monkeypatch):
    """A raw mailbox whose secret is referenced from the environment, and a built-in default destination."""
    from intake.models import Mailbox
    from ticketing.models import Destination

    monkeypatch.setenv("MAILROOM_TEST_WEBHOOK_SECRET", WEBHOOK_SECRET)
    Destination.objects.create(tenant=tenant, slug="builtin", kind="builtin", is_default=True)
    return Mailbox.objects.create(
        tenant=tenant, slug="support", address="support@acme.test", provider="raw",
        webhook_secret_ref="env:MAILROOM_TEST_WEBHOOK_SECRET",
    )


@pytest.fixture
def count_rows():
    """Row counts of every table the pipeline writes, for 'nothing was stored' assertions."""
    def count():
        from intake.models import AuditEvent, InboxEvent, OutboxMessage
        from ticketing.models import Intent, Ticket, TicketMapping

        return {m.__name__: m.objects.count()
                for m in (InboxEvent, OutboxMessage, AuditEvent, Intent, Ticket, TicketMapping)}
    return count


# Session-scoped real clamd (started once, on first use).
from tests.clamd import clamd  # noqa: E402,F401

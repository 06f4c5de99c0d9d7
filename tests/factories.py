"""Test data in one call: tenants, mailboxes, destinations, messages and inbox events.

    from tests.factories import make_tenant, make_mailbox, make_destination, email_message, make_event

Plain functions over the ORM (no factory library): each takes the fields a test cares about as
keyword arguments and fills the rest with values that pass the model's checks. Events are made the
way mail really arrives, through `intake.services.ingest` (event + `received` audit + outbox row, one
transaction), with the provider message id and thread key the raw webhook would compute.

This module is also a pytest plugin (registered in tests/conftest.py with `pytest_plugins`): the
fixtures at the bottom, `tenant`, `mailbox`, `scanner_off`, `count_rows`, are available in every test.
"""

import itertools
import uuid
from email.message import EmailMessage

import pytest

WEBHOOK_SECRET_VAR = "MAILROOM_TEST_WEBHOOK_SECRET"
# A fixed date: the Date header is part of the content fingerprint, so the same fields give the same bytes.
MESSAGE_DATE = "Mon, 04 Mar 2024 10:15:00 +0000"

_sequence = itertools.count(1)


def _next(prefix: str) -> str:
    return f"{prefix}-{next(_sequence)}"


# --- rows -----------------------------------------------------------------------------------------


def make_tenant(slug: str | None = None, name: str | None = None, domains: tuple[str, ...] = (), **fields):
    """A tenant; `domains` are verified for it (a mailbox made by `make_mailbox` verifies its own)."""
    from intake.models import Tenant

    slug = slug or _next("tenant")
    tenant = Tenant.objects.create(slug=slug, name=name if name is not None else slug.title(), **fields)
    for domain in domains:
        verify_test_domain(tenant, domain)
    return tenant


def verify_test_domain(tenant, domain: str):
    """Verify `domain` for `tenant`, as a superuser would, unless another tenant holds it already (then that
    tenant keeps it: tests of the boundary rely on it)."""
    from intake.domains import normalize_domain
    from intake.models import VerifiedDomain

    return VerifiedDomain.objects.get_or_create(
        domain=normalize_domain(domain), defaults={"tenant": tenant, "verified_by": "tests"}
    )[0]


def make_mailbox(
    tenant=None,
    slug: str | None = None,
    address: str | None = None,
    provider: str = "raw",
    webhook_secret_ref: str = f"env:{WEBHOOK_SECRET_VAR}",
    **fields,
):
    """A mailbox (raw webhook by default) whose secret is referenced from the environment.

    The reference only resolves once the variable is set: use the `mailbox` fixture, or
    `monkeypatch.setenv(WEBHOOK_SECRET_VAR, tests.conftest.WEBHOOK_SECRET)`. The address's domain is
    verified for the tenant (`verify_test_domain`), so the tenant's admin can make more mailboxes in it
    through the admin or the API.
    """
    from intake.models import Mailbox

    tenant = tenant or make_tenant()
    slug = slug or _next("mailbox")
    address = address or f"{slug}@{tenant.slug}.test"
    verify_test_domain(tenant, address.rpartition("@")[2])
    return Mailbox.objects.create(
        tenant=tenant,
        slug=slug,
        address=address,
        provider=provider,
        webhook_secret_ref=webhook_secret_ref,
        **fields,
    )


def make_destination(tenant, slug: str = "builtin", kind: str = "builtin", is_default: bool = True, **fields):
    """A destination; by default the built-in ticket store as the tenant's default."""
    from ticketing.models import Destination

    if is_default:  # one default per tenant (a partial unique constraint): the new one takes over
        Destination.objects.filter(tenant=tenant, is_default=True).update(is_default=False)
    return Destination.objects.create(tenant=tenant, slug=slug, kind=kind, is_default=is_default, **fields)


def make_desk_destination(tenant, desk, monkeypatch, slug: str = "desk", is_default: bool = True, **settings):
    """FakeDesk (speaking Zendesk; `desk` is the fakedesk plugin's fixture) as a zendesk destination.

    Its credentials are put in the environment (`env:FAKEDESK_CREDENTIALS`); `settings` override short
    timeouts and retry delays fit for tests.
    """
    monkeypatch.setenv("FAKEDESK_CREDENTIALS", f"agent@{tenant.slug}.test/token:{desk.token}")
    return make_destination(
        tenant,
        slug=slug,
        kind="zendesk",
        is_default=is_default,
        base_url=desk.url,
        credentials_ref="env:FAKEDESK_CREDENTIALS",
        settings={"read_timeout": 1.0, "retry_base_seconds": 0.01, "retry_cap_seconds": 0.05, **settings},
    )


# --- messages and events --------------------------------------------------------------------------


def email_message(
    subject: str = "Printer on fire",
    sender: str = "customer@example.com",
    to: str = "support@acme.test",
    body: str = "Please help.\n",
    message_id: str | None = None,
    extra_headers: dict | None = None,
    html: str | None = None,
    date: str | None = MESSAGE_DATE,
    attachments: list[tuple[str, str, bytes]] = (),
) -> bytes:
    """An RFC 5322 message as a mail client writes it: From, To, Subject, Date, Message-ID, a text body.

    `sender` may carry a display name ("Jane Doe <jane@example.com>"); `message_id` defaults to a new
    unique one; `html` adds a text/html alternative; `attachments` are (filename, "type/subtype", bytes);
    `date=None` leaves the Date header out.
    """
    message = EmailMessage()
    message["From"] = sender
    message["To"] = to
    message["Subject"] = subject
    if date:
        message["Date"] = date
    message["Message-ID"] = message_id or f"<{uuid.uuid4()}@test.mailroom>"
    for name, value in (extra_headers or {}).items():
        message[name] = value
    message.set_content(body)
    if html is not None:
        message.add_alternative(html, subtype="html")
    for filename, content_type, data in attachments:
        maintype, subtype = content_type.split("/", 1)
        message.add_attachment(data, maintype=maintype, subtype=subtype, filename=filename)
    return message.as_bytes()


def ingest_message(mailbox, raw: bytes | None = None, source: str = "raw", **message_fields):
    """Store a message as the raw webhook does (`intake.services.ingest`); returns the IngestResult.

    `raw` defaults to `email_message(**message_fields)`; a delivery of the same bytes again is a
    duplicate (`result.duplicate`), as it is for a provider retrying.
    """
    from intake.keys import raw_message_keys
    from intake.services import ingest

    if raw is None:
        raw = email_message(**message_fields)
    elif message_fields:
        raise TypeError("pass either raw bytes or message fields, not both")
    provider_message_id, thread_key = raw_message_keys(raw)
    return ingest(mailbox, provider_message_id, raw, source=source, thread_key=thread_key)


def make_event(mailbox, raw: bytes | None = None, source: str = "raw", **message_fields):
    """A `received` InboxEvent (with its audit and outbox rows) made through `ingest`; see `ingest_message`."""
    from intake.models import InboxEvent

    return InboxEvent.objects.get(pk=ingest_message(mailbox, raw, source, **message_fields).inbox_event_id)


# --- fixtures (this module is a pytest plugin: tests/conftest.py) ----------------------------------


@pytest.fixture
def tenant(db):
    return make_tenant(slug="acme", name="Acme", domains=("acme.test",))


@pytest.fixture
def mailbox(tenant, monkeypatch):
    """A raw mailbox whose secret is referenced from the environment, and a built-in default destination."""
    from tests.conftest import WEBHOOK_SECRET

    monkeypatch.setenv(WEBHOOK_SECRET_VAR, WEBHOOK_SECRET)
    make_destination(tenant)
    return make_mailbox(tenant, slug="support", address="support@acme.test")


@pytest.fixture
def scanner_off(settings):
    """No virus scan: for pipeline tests that are not about scanning (the default setting asks clamd)."""
    settings.MAILROOM_CLAMD = "off"


@pytest.fixture
def count_rows():
    """Row counts of every table the pipeline writes, for 'nothing was stored' assertions."""

    def count():
        from intake.models import AuditEvent, InboxEvent, OutboxMessage
        from ticketing.models import Intent, Ticket, TicketMapping

        return {
            m.__name__: m.objects.count()
            for m in (InboxEvent, OutboxMessage, AuditEvent, Intent, Ticket, TicketMapping)
        }

    return count

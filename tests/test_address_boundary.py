"""Issue 20, finding 1: a tenant admin must not take over another tenant's mail by reusing its address.

The attack: tenant B's `mailroom-admin` (not a superuser) makes a mailbox with tenant A's address (as written,
in other case, with a `+tag`), through the Django admin and through the REST API. Both refuse it with a clear
error on `address`; the database refuses a forced insert (the unique `Mailbox.address_key`); a mailbox or an
allowed recipient outside the tenant's verified domains is refused, and only a superuser verifies domains.
Over LMTP (a real listener process, a real LMTP client), mail for A's address ends in A only; a recipient that
matches mailboxes of two tenants anyway (a row whose key was written past `save()`) is a 451 and an alert,
delivered to neither. The data migration (0013) stops on colliding rows, naming them.
"""

import json
from io import StringIO

import pytest
from django.contrib.auth.models import Permission
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from intake.domains import ADDRESS_IN_USE, address_key, mailbox_address_errors, verify_domain
from intake.models import AuditEvent, InboxEvent, Mailbox, Tenant, VerifiedDomain
from reconciliation.services.setup import do_bootstrap_demo
from tests.conftest import WEBHOOK_SECRET
from tests.factories import WEBHOOK_SECRET_VAR, email_message, make_mailbox, make_tenant
from tests.postfix import lmtp_listener  # noqa: F401  (fixture)
from tests.support.api import API, api, assert_problem
from tests.support.lmtp import lmtp, send
from tests.support.users import make_user

VICTIM = "support@acme.test"
VARIANTS = ["support@acme.test", "SUPPORT@Acme.TEST", "support+intercept@acme.test", "Support+X@ACME.test"]
TEMPORARY = (451, b"4.3.0 Temporary failure, please try again later")


@pytest.fixture
def globex(db):
    return make_tenant(slug="globex", domains=("globex.test",))


@pytest.fixture
def intruder(globex):
    """Tenant B's admin: the `mailroom-admin` role, a member of globex only, not a superuser."""
    return make_user("bob", groups=["mailroom-admin"], tenants=[globex])


def admin_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def add_form(tenant, address: str, slug: str = "intercept", **fields) -> dict:
    return {
        "tenant": tenant.pk,
        "slug": slug,
        "address": address,
        "provider": "raw",
        "webhook_secret_ref": "",
        "credentials_ref": "",
        "settings": "{}",
        "allowed_recipients": "[]",
        **fields,
    }


def admin_errors(response) -> str:
    """The add form came back (no redirect) with its errors: their text."""
    assert response.status_code == 200, response.status_code
    form = response.context["adminform"].form
    assert form.errors, "the form was accepted"
    return json.dumps(form.errors)


def untouched(victim) -> None:
    assert list(Mailbox.objects.filter(address_key=address_key(VICTIM)).values_list("pk", flat=True)) == [victim.pk]
    assert not Mailbox.objects.filter(slug="intercept").exists()


# --- the attack, through the admin and through the API -------------------------------------------------------


@pytest.mark.parametrize("address", VARIANTS)
def test_tenant_admin_cannot_take_another_tenants_address_in_the_admin(mailbox, globex, intruder, address):
    response = admin_client(intruder).post("/admin/intake/mailbox/add/", add_form(globex, address))
    errors = admin_errors(response)
    assert "acme.test is not a verified domain of this tenant" in errors
    assert "Tenant globex may only use its verified domains (globex.test)" in errors
    untouched(mailbox)


@pytest.mark.parametrize("address", VARIANTS)
def test_tenant_admin_cannot_take_another_tenants_address_through_the_api(mailbox, globex, intruder, address):
    response = api(intruder).post(
        f"{API}/mailboxes/", {"tenant": "globex", "slug": "intercept", "address": address}, format="json"
    )
    body = assert_problem(response, 400)
    assert list(body["errors"]) == ["address"]
    assert "acme.test is not a verified domain of this tenant" in body["errors"]["address"][0]
    untouched(mailbox)


def test_an_existing_mailbox_cannot_be_moved_onto_another_tenants_address(mailbox, globex, intruder):
    """Not only new mailboxes: changing the address of B's own mailbox is refused the same way."""
    own = make_mailbox(globex, slug="globex-help", address="help@globex.test")
    client = api(intruder)
    for address in ("support@acme.test", "support+x@ACME.test"):
        response = client.patch(f"{API}/mailboxes/{own.pk}/", {"address": address}, format="json")
        assert "acme.test is not a verified domain" in assert_problem(response, 400)["errors"]["address"][0]
    response = admin_client(intruder).post(
        f"/admin/intake/mailbox/{own.pk}/change/", add_form(globex, "Support@acme.test", slug="globex-help")
    )
    assert "acme.test is not a verified domain" in admin_errors(response)
    own.refresh_from_db()
    assert own.address == "help@globex.test"
    untouched(mailbox)


def test_an_address_in_use_is_refused_even_in_a_domain_the_tenant_holds(mailbox, globex, intruder, superuser):
    """A mailbox older than the rule holds help@shared.test in acme; shared.test is then given to globex: globex
    still cannot take the address (unique across the platform, ignoring case and +tags), in admin and API."""
    legacy = make_mailbox(mailbox.tenant, slug="legacy", address="help@shared.test")
    VerifiedDomain.objects.filter(domain="shared.test").delete()
    admin_client(superuser).post(f"/admin/intake/tenant/{globex.pk}/change/", tenant_form(globex, ["shared.test"]))
    assert VerifiedDomain.objects.get(domain="shared.test").tenant == globex
    expected = ADDRESS_IN_USE.format(key="help@shared.test")
    for address in ("help@shared.test", "HELP@Shared.test", "help+sales@shared.test"):
        errors = admin_errors(admin_client(intruder).post("/admin/intake/mailbox/add/", add_form(globex, address)))
        assert expected in json.loads(errors)["address"]
        body = assert_problem(
            api(intruder).post(
                f"{API}/mailboxes/", {"tenant": "globex", "slug": "intercept", "address": address}, format="json"
            ),
            400,
        )
        assert body["errors"] == {"address": [expected]}
    assert list(Mailbox.objects.filter(address_key="help@shared.test").values_list("pk", flat=True)) == [legacy.pk]
    # Another address of that domain is globex's to use.
    created = api(intruder).post(
        f"{API}/mailboxes/", {"tenant": "globex", "slug": "globex-sales", "address": "sales@shared.test"}, format="json"
    )
    assert created.status_code == 201, created.content


def test_one_tenant_cannot_make_two_mailboxes_of_one_address_either(mailbox):
    owner = make_user("ann", groups=["mailroom-admin"], tenants=[mailbox.tenant])
    for address in ("SUPPORT@acme.test", "support+sales@acme.test"):
        response = api(owner).post(
            f"{API}/mailboxes/", {"tenant": "acme", "slug": "sales", "address": address}, format="json"
        )
        assert assert_problem(response, 400)["errors"] == {"address": [ADDRESS_IN_USE.format(key=VICTIM)]}
    # The mailbox keeps its own address through an edit (it does not collide with itself).
    assert (
        api(owner)
        .patch(f"{API}/mailboxes/{mailbox.pk}/", {"address": "Support+desk@acme.test"}, format="json")
        .status_code
        == 200
    )
    mailbox.refresh_from_db()
    assert (mailbox.address, mailbox.address_key) == ("Support+desk@acme.test", VICTIM)


# --- the database itself ---------------------------------------------------------------------------------------


def test_the_database_refuses_a_forced_duplicate(mailbox, globex):
    for address in VARIANTS:
        with pytest.raises(IntegrityError, match="mailbox_address_unique"), transaction.atomic():
            Mailbox.objects.create(tenant=globex, slug="forced", address=address)  # past clean(): save() keys it
    table = Mailbox._meta.db_table
    columns = (
        "tenant_id, slug, address, address_key, provider, webhook_secret_ref, credentials_ref, settings, "
        "allowed_recipients, poll_enabled, paused, created_at, health, health_detail"
    )
    values = "%s, %s, %s, %s, 'raw', '', '', '{}', '[]', false, false, now(), 'ok', ''"
    for key, constraint in ((VICTIM, "mailbox_address_unique"), ("", "mailbox_address_key_set")):
        with pytest.raises(IntegrityError, match=constraint), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES ({values})", [globex.pk, "forced-sql", "x@globex.test", key]
            )
    assert Mailbox.objects.filter(address_key=VICTIM).count() == 1


# --- verified domains ------------------------------------------------------------------------------------------


def test_a_mailbox_outside_the_verified_domains_is_refused(globex, intruder):
    client, console = api(intruder), admin_client(intruder)
    for address in ("help@unverified.test", "help@sub.globex.test"):
        body = assert_problem(
            client.post(f"{API}/mailboxes/", {"tenant": "globex", "slug": "x", "address": address}, format="json"), 400
        )
        assert body["errors"]["address"] == [
            f"{address.split('@')[1]} is not a verified domain of this tenant. Tenant globex may only use its "
            "verified domains (globex.test); a superuser verifies a domain on the tenant's page."
        ]
        assert "is not a verified domain" in admin_errors(
            console.post("/admin/intake/mailbox/add/", add_form(globex, address, slug="x"))
        )
    # allowed_recipients: every entry in a verified domain, an address or "@domain".
    for entries in (["support@acme.test"], ["@acme.test"], ["help@globex.test", "Billing@Other.test"]):
        body = assert_problem(
            client.post(
                f"{API}/mailboxes/",
                {"tenant": "globex", "slug": "x", "address": "help@globex.test", "allowed_recipients": entries},
                format="json",
            ),
            400,
        )
        assert list(body["errors"]) == ["allowed_recipients"]
        assert body["errors"]["allowed_recipients"][0].startswith("Outside this tenant's verified domains: ")
        assert "globex.test" in body["errors"]["allowed_recipients"][0]
    assert not Mailbox.objects.filter(slug="x").exists()
    created = client.post(
        f"{API}/mailboxes/",
        {
            "tenant": "globex",
            "slug": "x",
            "address": "Help@GLOBEX.test",
            "allowed_recipients": ["@globex.test", "help@globex.test"],
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    assert Mailbox.objects.get(slug="x").address_key == "help@globex.test"


def test_a_mailbox_from_before_the_rule_keeps_what_it_has_and_gains_nothing(globex, intruder):
    """A row stored before domains were verified (its domain given to nobody): it can still be paused or
    edited, but a new address or a new allowed recipient outside the verified domains is refused."""
    legacy = make_mailbox(globex, slug="legacy", address="ceo@victim.test", allowed_recipients=["@victim.test"])
    VerifiedDomain.objects.filter(domain="victim.test").delete()
    client = api(intruder)
    assert (
        client.patch(
            f"{API}/mailboxes/{legacy.pk}/", {"paused": True, "pause_reason": "legacy row"}, format="json"
        ).status_code
        == 200
    )
    assert (
        client.patch(f"{API}/mailboxes/{legacy.pk}/", {"address": "CEO@Victim.test"}, format="json").status_code == 200
    )  # the same address (key): kept
    body = assert_problem(
        client.patch(f"{API}/mailboxes/{legacy.pk}/", {"address": "cfo@victim.test"}, format="json"), 400
    )
    assert "victim.test is not a verified domain" in body["errors"]["address"][0]
    body = assert_problem(
        client.patch(
            f"{API}/mailboxes/{legacy.pk}/", {"allowed_recipients": ["@victim.test", "cfo@other.test"]}, format="json"
        ),
        400,
    )
    assert "Outside this tenant's verified domains: cfo@other.test." in body["errors"]["allowed_recipients"][0]
    legacy.refresh_from_db()
    assert (legacy.address, legacy.allowed_recipients, legacy.paused) == ("CEO@Victim.test", ["@victim.test"], True)


def test_a_tenant_without_verified_domains_is_told_so(db):
    lonely = make_tenant(slug="lonely")
    user = make_user("lou", groups=["mailroom-admin"], tenants=[lonely])
    body = assert_problem(
        api(user).post(
            f"{API}/mailboxes/", {"tenant": "lonely", "slug": "x", "address": "help@lonely.test"}, format="json"
        ),
        400,
    )
    assert "(none yet)" in body["errors"]["address"][0]
    page = admin_client(user).get("/admin/intake/mailbox/add/").content.decode()
    assert "none yet: a superuser verifies them" in page


@pytest.fixture
def superuser(db):
    return make_user("root", is_superuser=True)


def tenant_form(tenant, domains: list[str]) -> dict:
    """The tenant change form with its verified-domains inline holding `domains` (new rows)."""
    prefix = "verified_domains"
    existing = list(VerifiedDomain.objects.filter(tenant=tenant).order_by("pk"))
    form = {
        "slug": tenant.slug,
        "name": tenant.name,
        "settings": json.dumps(tenant.settings or {}),
        "members": [str(pk) for pk in tenant.members.values_list("pk", flat=True)],
        f"{prefix}-TOTAL_FORMS": str(len(existing) + len(domains)),
        f"{prefix}-INITIAL_FORMS": str(len(existing)),
        f"{prefix}-MIN_NUM_FORMS": "0",
        f"{prefix}-MAX_NUM_FORMS": "1000",
    }
    for n, row in enumerate(existing):
        form.update(
            {
                f"{prefix}-{n}-id": str(row.pk),
                f"{prefix}-{n}-tenant": str(tenant.pk),
                f"{prefix}-{n}-domain": row.domain,
            }
        )
    for n, domain in enumerate(domains, start=len(existing)):
        form.update({f"{prefix}-{n}-tenant": str(tenant.pk), f"{prefix}-{n}-domain": domain})
    return form


def test_only_a_superuser_verifies_domains(mailbox, globex, intruder, superuser):
    console = admin_client(intruder)
    # The tenant admin sees their own tenant's domains, not acme's, and can change none of them.
    listing = console.get("/admin/intake/verifieddomain/")
    assert listing.status_code == 200
    assert "globex.test" in listing.content.decode() and "acme.test" not in listing.content.decode()
    own = VerifiedDomain.objects.get(domain="globex.test")
    theirs = VerifiedDomain.objects.get(domain="acme.test")
    assert console.get("/admin/intake/verifieddomain/add/").status_code == 403
    assert (
        console.post("/admin/intake/verifieddomain/add/", {"tenant": globex.pk, "domain": "acme.test"}).status_code
        == 403
    )
    assert console.post(
        f"/admin/intake/verifieddomain/{own.pk}/change/", {"tenant": globex.pk, "domain": "x.test"}
    ).status_code in (403, 200)  # a view-only page at most
    assert console.post(f"/admin/intake/verifieddomain/{own.pk}/delete/", {"post": "yes"}).status_code == 403
    assert console.get(f"/admin/intake/verifieddomain/{theirs.pk}/change/").status_code == 404
    assert (
        console.post(f"/admin/intake/tenant/{globex.pk}/change/", tenant_form(globex, ["acme.test"])).status_code == 403
    )
    assert sorted(VerifiedDomain.objects.values_list("domain", "tenant__slug")) == [
        ("acme.test", "acme"),
        ("globex.test", "globex"),
    ]
    # No role can be granted the right: the model has a view permission only.
    assert list(Permission.objects.filter(content_type__model="verifieddomain").values_list("codename", flat=True)) == [
        "view_verifieddomain"
    ]

    # A superuser gives domains on the tenant's page: normalised, one tenant per domain (case-insensitively).
    root = admin_client(superuser)
    response = root.post(f"/admin/intake/tenant/{globex.pk}/change/", tenant_form(globex, ["Globex.EXAMPLE."]))
    assert response.status_code == 302, response.content.decode()[-3000:]
    added = VerifiedDomain.objects.get(domain="globex.example")
    assert (added.tenant, added.verified_by) == (globex, "root")
    response = root.post(f"/admin/intake/tenant/{globex.pk}/change/", tenant_form(globex, ["ACME.test"]))
    assert response.status_code == 200 and "already exists" in response.content.decode()
    assert VerifiedDomain.objects.get(domain="acme.test").tenant.slug == "acme"


def test_the_database_keeps_one_tenant_per_domain_case_insensitively(tenant, globex):
    with pytest.raises(IntegrityError), transaction.atomic():
        VerifiedDomain.objects.create(tenant=globex, domain="ACME.Test")  # save() normalises: acme.test, taken
    with (
        pytest.raises(IntegrityError, match="verified_domain_is_normalised"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            f"INSERT INTO {VerifiedDomain._meta.db_table} (tenant_id, domain, verified_by, created_at) "
            "VALUES (%s, 'ACME.test', '', now())",
            [globex.pk],
        )
    with pytest.raises(ValueError, match="acme.test is a verified domain of another tenant"):
        verify_domain(tenant=globex, domain="Acme.test", verified_by="script")


def test_the_demo_set_up_verifies_its_domain(db, tmp_path, monkeypatch):
    for name in ("SECRET_KEY", "MAILROOM_DEMO_WEBHOOK_SECRET", "MAILROOM_DEMO_ADMIN_PASSWORD"):
        monkeypatch.setenv(name, "x" * 50)  # nothing generated into this process's environment
    do_bootstrap_demo(tmp_path / ".env")
    do_bootstrap_demo(tmp_path / ".env")  # again: changes nothing
    demo = Tenant.objects.get(slug="demo")
    assert list(demo.verified_domains.values_list("domain", flat=True)) == ["demo.mailroom.test"]
    mailbox = Mailbox.objects.get(slug="demo")
    assert mailbox_address_errors(mailbox) == {}  # its address and allowed recipients are in its domain
    assert mailbox.address_key == "support@demo.mailroom.test"


# --- LMTP: one recipient, one tenant ---------------------------------------------------------------------------


@pytest.fixture
def victim_and_intruder(transactional_db, monkeypatch):
    """Committed (the listener is another process): acme's support@ and globex's own mailbox."""
    monkeypatch.setenv(WEBHOOK_SECRET_VAR, WEBHOOK_SECRET)
    acme = make_tenant(slug="acme", domains=("acme.test",))
    globex = make_tenant(slug="globex", domains=("globex.test",))
    return make_mailbox(acme, slug="support", address=VICTIM), make_mailbox(
        globex, slug="intercept", address="help@globex.test"
    )


def test_lmtp_delivers_the_victims_address_to_the_victims_tenant_only(victim_and_intruder, lmtp_listener):
    victim, intruder_box = victim_and_intruder
    intruder = make_user("bob", groups=["mailroom-admin"], tenants=[intruder_box.tenant])
    for address in VARIANTS:  # the attack, refused; then the mail arrives
        assert (
            api(intruder)
            .post(f"{API}/mailboxes/", {"tenant": "globex", "slug": "x", "address": address}, format="json")
            .status_code
            == 400
        )
    client = lmtp(lmtp_listener)
    recipients = ["support@acme.test", "SUPPORT+intercept@acme.test"]
    replies = send(client, recipients, email_message(to=VICTIM))[2]
    client.quit()
    assert replies == [(250, b"2.0.0 Delivered")] * 2
    assert [(e.tenant.slug, e.mailbox.slug) for e in InboxEvent.objects.select_related("tenant", "mailbox")] == [
        ("acme", "support")
    ]


def test_lmtp_refuses_to_deliver_a_recipient_matching_two_tenants(victim_and_intruder, lmtp_listener, count_rows):
    """A row forced past save() (an UPDATE leaves its key stale) gives globex's mailbox acme's address: the
    listener finds mailboxes of two tenants for the recipient, answers 451 4.3.0 and alerts; neither stores it."""
    victim, intruder_box = victim_and_intruder
    Mailbox.objects.filter(pk=intruder_box.pk).update(address="Support@acme.test")  # key still help@globex.test
    before = count_rows()
    client = lmtp(lmtp_listener)
    mail, rcpts, replies = send(client, ["support@acme.test", "support+x@acme.test"], email_message(to=VICTIM))
    client.quit()
    assert rcpts == [TEMPORARY, TEMPORARY] and replies == []
    assert count_rows() == before
    assert not InboxEvent.objects.exists() and not AuditEvent.objects.exists()
    log = lmtp_listener.log()
    assert "mailroom.security" in log and "matches mailboxes support (tenant acme), intercept (tenant globex)" in log
    assert "deferred (451), delivered to none" in log
    assert VICTIM not in log and "s***@a***.test" in log

    # Once the operator fixes the row, the mail server's retry is delivered, to acme only.
    intruder_box.refresh_from_db()
    intruder_box.address = "help@globex.test"
    intruder_box.save()
    client = lmtp(lmtp_listener)
    assert send(client, ["support@acme.test"], email_message(to=VICTIM))[2] == [(250, b"2.0.0 Delivered")]
    client.quit()
    assert [e.mailbox_id for e in InboxEvent.objects.all()] == [victim.pk]


# --- the data migration ------------------------------------------------------------------------------------------


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)


def test_the_migration_stops_on_colliding_addresses_and_names_them(transactional_db, capsys):
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    migrate([("intake", "0012_mailbox_known_provider")])
    try:
        with connection.cursor() as cursor:
            for slug in ("acme", "globex", "initech"):
                cursor.execute(
                    "INSERT INTO intake_tenant (slug, name, settings) VALUES (%s, %s, '{}') RETURNING id", [slug, slug]
                )
            cursor.execute("SELECT slug, id FROM intake_tenant")
            ids = dict(cursor.fetchall())
            for tenant, slug, address in (
                ("acme", "support", "support@acme.test"),
                ("globex", "intercept", "SUPPORT+x@acme.test"),
                ("acme", "sales", "sales@shared.test"),
                ("initech", "help", "help@shared.test"),
                ("initech", "desk", "desk@initech.test"),
            ):
                cursor.execute(
                    "INSERT INTO intake_mailbox (tenant_id, slug, address, provider, webhook_secret_ref, "
                    "credentials_ref, settings, allowed_recipients, poll_enabled, paused, created_at, health, "
                    "health_detail) VALUES (%s, %s, %s, 'raw', '', '', '{}', '[]', false, false, now(), 'ok', '')",
                    [ids[tenant], slug, address],
                )
        with pytest.raises(Exception, match="unique across the platform") as stopped:
            migrate(leaves)
        message = str(stopped.value)
        assert "'support' (tenant acme)" in message and "'intercept' (tenant globex)" in message
        assert "Nothing was changed" in message and "support@acme.test" not in message  # masked: s***@a***.test
        # Nothing was changed: still at 0012, every row as it was.
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM intake_mailbox")
            assert cursor.fetchone()[0] == 5
        assert ("intake", "0013_verified_domains_and_address_keys") not in MigrationExecutor(
            connection
        ).loader.applied_migrations

        # The operator decides: globex's mailbox gets an address of its own; then the migration runs.
        with connection.cursor() as cursor:
            cursor.execute("UPDATE intake_mailbox SET address = 'help@globex.test' WHERE slug = 'intercept'")
        capsys.readouterr()
        migrate(leaves)
        printed = capsys.readouterr().out
    finally:
        migrate(leaves)
    assert dict(Mailbox.objects.values_list("slug", "address_key")) == {
        "support": "support@acme.test",
        "intercept": "help@globex.test",
        "sales": "sales@shared.test",
        "help": "help@shared.test",
        "desk": "desk@initech.test",
    }
    assert sorted(VerifiedDomain.objects.values_list("domain", "tenant__slug")) == [
        ("acme.test", "acme"),
        ("globex.test", "globex"),
        ("initech.test", "initech"),
    ]
    assert "NOT verified: shared.test is used by mailboxes of tenants acme, initech" in printed


@pytest.mark.django_db(transaction=True)
def test_two_creates_of_one_address_at_the_same_moment_keep_one_and_answer_the_other_400(globex, intruder, monkeypatch):
    """The loser of a race past `clean()` meets the unique constraint: a 400 naming the address, not a 500. The
    winner commits from another connection between our checks and our INSERT, as a second web worker would."""
    import threading

    from django.db import connections

    original_clean = Mailbox.clean

    def clean_then_lose_the_race(self):
        original_clean(self)
        if self.slug != "second":
            return

        def winner():
            try:
                Mailbox.objects.create(tenant=globex, slug="first", address="help@globex.test")
            finally:
                connections.close_all()

        thread = threading.Thread(target=winner)
        thread.start()
        thread.join()

    monkeypatch.setattr(Mailbox, "clean", clean_then_lose_the_race)
    response = api(intruder).post(
        f"{API}/mailboxes/", {"tenant": "globex", "slug": "second", "address": "Help@globex.test"}, format="json"
    )
    body = assert_problem(response, 400)
    assert "already used by another mailbox" in body["errors"]["address"][0]
    assert list(Mailbox.objects.filter(address_key="help@globex.test").values_list("slug", flat=True)) == ["first"]


def test_the_platform_verifies_domains_from_the_shell_and_a_domain_stays_with_one_tenant(mailbox, globex):
    from django.core.management import CommandError, call_command

    out = StringIO()
    call_command("verify_domain", "globex", "Globex-EU.Test", "help.globex.test", stdout=out)
    assert "globex-eu.test: verified for globex" in out.getvalue()
    assert set(VerifiedDomain.objects.filter(tenant=globex).values_list("domain", flat=True)) >= {
        "globex-eu.test",
        "help.globex.test",
    }
    with pytest.raises(CommandError, match="acme.test is a verified domain of another tenant"):
        call_command("verify_domain", "globex", "ACME.test", stdout=StringIO())
    assert VerifiedDomain.objects.get(domain="acme.test").tenant.slug == "acme"
    with pytest.raises(CommandError, match="no tenant 'nobody'"):
        call_command("verify_domain", "nobody", stdout=StringIO())

"""Secret references are scoped to their tenant (intake.secrets): refused at save with the allowed forms
named, refused again at resolve time for a row forced past the save, and platform references only from
MAILROOM_PLATFORM_SECRET_REFS, for the rows they are bound to (the attacks of issue 20 finding 2:
tests/test_secret_boundary.py)."""

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core import checks
from django.core.exceptions import ValidationError
from django.test import Client

from intake.models import InboxEvent, Mailbox, SecretResolution
from intake.secrets import SecretRefused, SecretUnavailable, resolve_secret
from tests.factories import make_destination, make_mailbox, make_tenant
from tests.mail import make_message, webhook_headers
from ticketing.destinations import adapter_for
from ticketing.destinations.base import PermanentError, TicketRequest
from ticketing.models import Destination


@pytest.fixture
def secrets_dir(tmp_path, settings):
    settings.MAILROOM_SECRETS_DIR = str(tmp_path / "secrets")
    for slug in ("acme", "globex"):
        (tmp_path / "secrets" / slug).mkdir(parents=True)
    return tmp_path / "secrets"


@pytest.fixture
def globex(db):
    return make_tenant(slug="globex")


def refused_refs(secrets_dir):
    (secrets_dir / "globex" / "desk").write_text("globex-token")
    (secrets_dir / "acme" / "escape").symlink_to(secrets_dir / "globex" / "desk")
    return {
        "platform variable": "env:SECRET_KEY",
        "another tenant's variable": "env:MAILROOM_T_GLOBEX_DESK",
        "another tenant's vault path": "vault:secret/mailroom/globex/desk#token",
        "a file of another tenant": f"file:{secrets_dir / 'globex' / 'desk'}",
        "a file reached through ..": f"file:{secrets_dir / 'acme' / '..' / 'globex' / 'desk'}",
        "a symlink out of the folder": f"file:{secrets_dir / 'acme' / 'escape'}",
        "a file outside every folder": "file:/etc/passwd",
        "no scheme": "hunter2",
    }


def test_refused_at_save_with_the_allowed_forms_named(tenant, globex, secrets_dir):
    mailbox = make_mailbox(tenant, webhook_secret_ref="env:MAILROOM_T_ACME_WEBHOOK")
    destination = make_destination(
        tenant, slug="desk", kind="zendesk", is_default=False, base_url="https://acme.zendesk.example"
    )
    for what, ref in refused_refs(secrets_dir).items():
        for row, field in (
            (mailbox, "webhook_secret_ref"),
            (mailbox, "credentials_ref"),
            (destination, "credentials_ref"),
        ):
            setattr(row, field, ref)
            with pytest.raises(ValidationError) as refused:
                row.full_clean()
            [message] = refused.value.message_dict[field]
            assert "Allowed: env:MAILROOM_T_ACME_<NAME>" in message, what
            assert f"{secrets_dir}/acme/<file>" in message and "vault:<mount>/mailroom/acme/" in message, what
            setattr(row, field, "")


def test_allowed_references_save_and_resolve(tenant, secrets_dir, monkeypatch):
    monkeypatch.setenv("MAILROOM_T_ACME_WEBHOOK", "from-env")
    (secrets_dir / "acme" / "nested").mkdir()
    (secrets_dir / "acme" / "nested" / "desk").write_text("from-file\n")
    mailbox = make_mailbox(
        tenant,
        webhook_secret_ref="env:MAILROOM_T_ACME_WEBHOOK",
        credentials_ref=f"file:{secrets_dir / 'acme' / 'nested' / 'desk'}",
    )
    destination = make_destination(
        tenant, slug="desk", kind="zendesk", is_default=False, credentials_ref="vault:secret/mailroom/acme/desk#token"
    )
    mailbox.full_clean()
    destination.full_clean()
    assert resolve_secret(mailbox.webhook_secret_ref, tenant=tenant, owner=mailbox) == "from-env"
    assert resolve_secret(mailbox.credentials_ref, tenant=tenant, owner=mailbox) == "from-file"


def test_a_variable_in_a_longer_tenant_namespace_is_not_the_shorter_tenants(tenant, monkeypatch):
    acme_eu = make_tenant(slug="acme-eu")
    monkeypatch.setenv("MAILROOM_T_ACME_EU_TOKEN", "acme-eu's")
    with pytest.raises(SecretRefused):
        resolve_secret("env:MAILROOM_T_ACME_EU_TOKEN", tenant=tenant)
    assert resolve_secret("env:MAILROOM_T_ACME_EU_TOKEN", tenant=acme_eu) == "acme-eu's"


def test_platform_references_only_from_the_allow_list_and_for_the_rows_they_are_bound_to(tenant, settings, monkeypatch):
    monkeypatch.setenv("MAILROOM_DEMO_WEBHOOK_SECRET", "demo")
    demo = make_mailbox(tenant, slug="demo", webhook_secret_ref="env:MAILROOM_T_ACME_WEBHOOK")
    other = make_mailbox(tenant, slug="other", webhook_secret_ref="env:MAILROOM_T_ACME_WEBHOOK")
    settings.MAILROOM_PLATFORM_SECRET_REFS = []
    with pytest.raises(SecretRefused):
        resolve_secret("env:MAILROOM_DEMO_WEBHOOK_SECRET", tenant=None)
    with pytest.raises(SecretRefused):
        resolve_secret("env:MAILROOM_DEMO_WEBHOOK_SECRET", tenant=tenant, owner=demo)
    settings.MAILROOM_PLATFORM_SECRET_REFS = ["env:MAILROOM_DEMO_WEBHOOK_SECRET"]  # unbound: the contract's list
    assert resolve_secret("env:MAILROOM_DEMO_WEBHOOK_SECRET", tenant=None) == "demo"
    for row in (demo, other):  # any row a superuser points at it
        assert resolve_secret("env:MAILROOM_DEMO_WEBHOOK_SECRET", tenant=tenant, owner=row) == "demo"
    settings.MAILROOM_PLATFORM_SECRET_REFS = ["env:MAILROOM_DEMO_WEBHOOK_SECRET=mailbox:demo"]
    assert resolve_secret("env:MAILROOM_DEMO_WEBHOOK_SECRET", tenant=tenant, owner=demo) == "demo"
    with pytest.raises(SecretRefused, match="not bound to mailbox:other"):
        resolve_secret("env:MAILROOM_DEMO_WEBHOOK_SECRET", tenant=tenant, owner=other)
    with pytest.raises(SecretRefused):
        resolve_secret("env:MAILROOM_DEMO_WEBHOOK_SECRET", tenant=tenant)  # no row: nothing it is bound to
    with pytest.raises(TypeError):
        resolve_secret("env:MAILROOM_DEMO_WEBHOOK_SECRET")  # the tenant is required


def test_a_destination_forced_to_another_tenants_secret_sends_nothing(tenant, globex, desk, monkeypatch):
    monkeypatch.setenv("MAILROOM_T_GLOBEX_DESK", desk.credentials)
    monkeypatch.setenv("SECRET_KEY", "the-django-secret-key")
    destination = make_destination(
        tenant,
        slug="desk",
        kind="zendesk",
        is_default=False,
        base_url=desk.url,
        credentials_ref="env:MAILROOM_T_ACME_DESK",
    )
    for forced in ("env:MAILROOM_T_GLOBEX_DESK", "env:SECRET_KEY", "vault:secret/mailroom/globex/desk#token"):
        Destination.objects.filter(pk=destination.pk).update(credentials_ref=forced)  # past clean()
        adapter = adapter_for(Destination.objects.get(pk=destination.pk))
        with pytest.raises(PermanentError) as failed:
            adapter.create_ticket(TicketRequest("Hello", "Body", "a@example.com"), "key-1", "ref-1")
        assert failed.value.reason == "credentials" and "refused" in str(failed.value)
    assert desk.requests_log() == []
    refused = SecretResolution.objects.filter(owner=f"destination:{destination.pk}", outcome="refused")
    assert {r.ref for r in refused} == {
        "env:MAILROOM_T_GLOBEX_DESK",
        "env:SECRET_KEY",
        "vault:secret/mailroom/globex/desk#token",
    }


def test_a_mailbox_forced_to_another_tenants_secret_stores_nothing(tenant, globex, monkeypatch):
    monkeypatch.setenv("MAILROOM_T_GLOBEX_WEBHOOK", "globex-secret")
    mailbox = make_mailbox(tenant, slug="forced", webhook_secret_ref="env:MAILROOM_T_ACME_WEBHOOK")
    Mailbox.objects.filter(pk=mailbox.pk).update(webhook_secret_ref="env:MAILROOM_T_GLOBEX_WEBHOOK")
    raw = make_message()
    response = Client().post(
        f"/webhooks/raw/{mailbox.slug}/", raw, content_type="message/rfc822", **webhook_headers("globex-secret", raw)
    )
    assert response.status_code == 401
    assert not InboxEvent.objects.filter(mailbox=mailbox).exists()


def test_manage_py_check_lists_rows_outside_their_scope(tenant):
    mailbox = make_mailbox(tenant, slug="legacy", webhook_secret_ref="env:MAILROOM_T_ACME_WEBHOOK")
    Mailbox.objects.filter(pk=mailbox.pk).update(webhook_secret_ref="env:OLD_SHARED_SECRET")
    destination = make_destination(tenant, slug="old-desk", kind="zendesk", is_default=False)
    Destination.objects.filter(pk=destination.pk).update(credentials_ref="file:/etc/mailroom/desk")
    found = {(w.id, str(w.obj)) for w in checks.run_checks() if w.id in ("intake.W001", "ticketing.W001")}
    assert found == {("intake.W001", "legacy"), ("ticketing.W001", "acme/old-desk")}


def test_resolutions_are_recorded_once_per_ttl(tenant, monkeypatch):
    monkeypatch.setenv("MAILROOM_T_ACME_WEBHOOK", "s3cret")
    mailbox = make_mailbox(tenant, webhook_secret_ref="env:MAILROOM_T_ACME_WEBHOOK")
    for _ in range(5):
        resolve_secret(mailbox.webhook_secret_ref, tenant=tenant, owner=mailbox)
    with pytest.raises(SecretUnavailable):
        resolve_secret("env:MAILROOM_T_ACME_UNSET", tenant=tenant, owner=mailbox)
    rows = list(SecretResolution.objects.values_list("ref", "owner", "outcome", "tenant_id"))
    assert rows == [
        ("env:MAILROOM_T_ACME_WEBHOOK", f"mailbox:{mailbox.pk}", "ok", tenant.pk),
        ("env:MAILROOM_T_ACME_UNSET", f"mailbox:{mailbox.pk}", "unavailable", tenant.pk),
    ]
    assert "s3cret" not in str(list(SecretResolution.objects.values()))


def _staff(tenant):
    user = get_user_model().objects.create_user("alice", "alice@acme.test", "pw-for-tests-only", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["change_destination", "view_destination"]))
    tenant.members.add(user)
    return user


def _destination_form(destination, **changes):
    data = {
        "tenant": destination.tenant_id,
        "slug": destination.slug,
        "kind": destination.kind,
        "base_url": destination.base_url,
        "credentials_ref": destination.credentials_ref,
        "settings": "{}",
        "paused_reason": "",
        **changes,
    }
    return data


def test_the_admin_form_names_the_allowed_forms_and_keeps_platform_refs_for_superusers(tenant, settings):
    settings.MAILROOM_PLATFORM_SECRET_REFS = ["env:MAILROOM_DEMO_WEBHOOK_SECRET=destination:acme/desk"]
    destination = make_destination(
        tenant,
        slug="desk",
        kind="zendesk",
        is_default=False,
        base_url="https://acme.zendesk.example",
        credentials_ref="env:MAILROOM_T_ACME_DESK",
    )
    url = f"/admin/ticketing/destination/{destination.pk}/change/"
    client = Client()
    client.force_login(_staff(tenant))
    response = client.post(url, _destination_form(destination, credentials_ref="env:SECRET_KEY"))
    assert response.status_code == 200  # the form again, with the error
    assert "Allowed: env:MAILROOM_T_ACME_&lt;NAME&gt;" in response.content.decode()
    response = client.post(url, _destination_form(destination, credentials_ref="env:MAILROOM_DEMO_WEBHOOK_SECRET"))
    assert response.status_code == 200
    page = response.content.decode()
    assert "only a platform operator (superuser) may use a platform secret reference" in page
    assert "Use one of the tenant&#x27;s own: env:MAILROOM_T_ACME_&lt;NAME&gt;" in page
    assert Destination.objects.get(pk=destination.pk).credentials_ref == "env:MAILROOM_T_ACME_DESK"

    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests-only")
    client.force_login(root)
    response = client.post(url, _destination_form(destination, credentials_ref="env:MAILROOM_DEMO_WEBHOOK_SECRET"))
    assert response.status_code == 302
    assert Destination.objects.get(pk=destination.pk).credentials_ref == "env:MAILROOM_DEMO_WEBHOOK_SECRET"


def test_a_base_url_change_by_a_non_superuser_needs_the_credentials_again_and_is_audited(tenant, caplog):
    destination = make_destination(
        tenant,
        slug="desk",
        kind="zendesk",
        is_default=False,
        base_url="https://acme.zendesk.example",
        credentials_ref="env:MAILROOM_T_ACME_DESK",
    )
    client = Client()
    user = _staff(tenant)
    client.force_login(user)
    url = f"/admin/ticketing/destination/{destination.pk}/change/"
    for confirmation in ("", "env:MAILROOM_T_ACME_OTHER"):  # not entered again; entered wrong
        response = client.post(
            url,
            _destination_form(destination, base_url="https://collector.example/", confirm_credentials_ref=confirmation),
        )
        assert response.status_code == 200, confirmation
    assert "base_url moves to another host (acme.zendesk.example -&gt; collector.example)" in response.content.decode()
    assert Destination.objects.get(pk=destination.pk).base_url == "https://acme.zendesk.example"
    assert not LogEntry.objects.filter(object_id=str(destination.pk)).exists()

    response = client.post(
        url,
        _destination_form(
            destination, base_url="https://collector.example/", confirm_credentials_ref="env:MAILROOM_T_ACME_DESK"
        ),
    )
    assert response.status_code == 302
    [entry] = LogEntry.objects.filter(object_id=str(destination.pk), change_message__startswith="base_url")
    assert entry.user == user
    assert entry.change_message.startswith(
        "base_url changed by non-superuser alice: host acme.zendesk.example -> collector.example"
    )
    assert "collector.example" in caplog.text and "mailroom.audit" in [r.name for r in caplog.records]

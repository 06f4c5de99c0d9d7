"""`vault:` references against a real OpenBao dev server (tests/openbao.py): KV v2 reads, token and AppRole
auth, the per-process cache, the tenant scope, and a rotated desk token re-read once after a 401."""

import pytest

from intake.models import SecretResolution
from intake.secrets import SecretRefused, SecretUnavailable, forget, resolve_secret
from tests.factories import make_desk_destination, make_event, make_tenant
from tests.openbao import openbao  # noqa: F401  (fixture)
from ticketing.models import Destination, Intent
from ticketing.services import process_inbox_event

REF = "vault:secret/mailroom/acme/desk#credentials"


@pytest.fixture
def vault_env(openbao, monkeypatch):
    for name in ("VAULT_TOKEN", "BAO_TOKEN", "BAO_ADDR", "VAULT_ROLE_ID", "VAULT_SECRET_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VAULT_ADDR", openbao.addr)
    monkeypatch.setenv("VAULT_TOKEN", openbao.token)
    return openbao


def test_a_vault_reference_resolves_and_is_cached_for_the_ttl(tenant, vault_env, settings):
    vault_env.write("mailroom/acme/desk", credentials="first", other="x")
    assert resolve_secret(REF, tenant=tenant, owner="test") == "first"
    vault_env.write("mailroom/acme/desk", credentials="second")
    assert resolve_secret(REF, tenant=tenant, owner="test") == "first"  # cached
    forget(REF)
    settings.MAILROOM_SECRET_CACHE_SECONDS = 0  # what is read from now on expires at once
    assert resolve_secret(REF, tenant=tenant, owner="test") == "second"
    vault_env.write("mailroom/acme/desk", credentials="third")
    assert resolve_secret(REF, tenant=tenant, owner="test") == "third"
    with pytest.raises(SecretUnavailable, match="has no key"):
        resolve_secret("vault:secret/mailroom/acme/desk#nope", tenant=tenant)
    with pytest.raises(SecretUnavailable, match="no secret"):
        resolve_secret("vault:secret/mailroom/acme/missing#credentials", tenant=tenant)


def test_another_tenants_vault_path_is_refused_without_a_read(tenant, vault_env):
    make_tenant(slug="globex")
    vault_env.write("mailroom/globex/desk", credentials="globex's")
    for ref in (
        "vault:secret/mailroom/globex/desk#credentials",
        "vault:secret/mailroom/acme/../globex/desk#credentials",
        "vault:secret/other/acme/desk#credentials",
    ):
        with pytest.raises(SecretRefused):
            resolve_secret(ref, tenant=tenant)


def test_approle_login(tenant, vault_env, monkeypatch):
    client = vault_env.client()
    if "approle/" not in client.sys.list_auth_methods()["data"]:
        client.sys.enable_auth_method("approle")
    client.sys.create_or_update_policy("mailroom-acme", 'path "secret/data/mailroom/acme/*" {capabilities = ["read"]}')
    client.auth.approle.create_or_update_approle("mailroom", token_policies=["mailroom-acme"])
    role_id = client.auth.approle.read_role_id("mailroom")["data"]["role_id"]
    secret_id = client.auth.approle.generate_secret_id("mailroom")["data"]["secret_id"]
    vault_env.write("mailroom/acme/desk", credentials="via-approle")
    monkeypatch.delenv("VAULT_TOKEN")
    monkeypatch.setenv("VAULT_ROLE_ID", role_id)
    monkeypatch.setenv("VAULT_SECRET_ID", secret_id)
    assert resolve_secret(REF, tenant=tenant) == "via-approle"
    vault_env.write("mailroom/globex/desk", credentials="not-acme's")
    globex = make_tenant(slug="globex")
    with pytest.raises(SecretUnavailable, match="permission denied"):  # the policy, not only our check
        resolve_secret("vault:secret/mailroom/globex/desk#credentials", tenant=globex)


def test_a_rotated_desk_token_is_re_read_once_after_a_401(tenant, mailbox, desk, vault_env, monkeypatch, settings):
    settings.MAILROOM_CLAMD = "off"
    vault_env.write("mailroom/acme/desk", credentials=desk.credentials)
    destination = make_desk_destination(tenant, desk, monkeypatch)
    Destination.objects.filter(pk=destination.pk).update(credentials_ref=REF)

    assert process_inbox_event(make_event(mailbox, subject="Before the rotation").pk) == "created"

    # The desk's token is rotated and the new one stored in OpenBao; this process still caches the old one.
    desk._server.token = "rotated-token"
    desk.token = "rotated-token"
    vault_env.write("mailroom/acme/desk", credentials=desk.credentials)
    assert process_inbox_event(make_event(mailbox, subject="After the rotation").pk) == "created"

    statuses = [entry["status"] for entry in desk.requests_log()]
    assert statuses == [201, 401, 201]
    assert Intent.objects.filter(state="succeeded", destination=destination).count() == 2
    records = list(SecretResolution.objects.filter(ref=REF).order_by("pk").values_list("owner", "outcome", "fresh"))
    assert records == [(f"destination:{destination.pk}", "ok", False), (f"destination:{destination.pk}", "ok", True)]


def test_a_401_with_an_unchanged_secret_fails_after_one_re_read(
    tenant, mailbox, desk, vault_env, monkeypatch, settings
):
    settings.MAILROOM_CLAMD = "off"
    vault_env.write("mailroom/acme/desk", credentials="agent@acme.test/token:wrong")
    destination = make_desk_destination(tenant, desk, monkeypatch)
    Destination.objects.filter(pk=destination.pk).update(credentials_ref=REF)
    assert process_inbox_event(make_event(mailbox).pk) == "failed"
    assert [entry["status"] for entry in desk.requests_log()] == [401]  # the same secret is not sent twice
    assert SecretResolution.objects.filter(ref=REF, fresh=True).count() == 1

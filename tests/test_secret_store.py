"""Secrets written back where a reference points (intake.secret_store): a `file:` replaced atomically and kept
0600, a `vault:` KV v2 key set beside the others (a real OpenBao dev server, tests/openbao.py), an `env:` refused,
another tenant's reference refused without a write; the consent flow's `store_oauth_tokens`; the system check
that warns about OAuth mailboxes whose credentials are an environment variable."""

import json
import os
import stat

import pytest
from django.core import checks
from django.utils import timezone

from intake.models import Mailbox, MailboxAudit
from intake.secret_store import (
    SecretNotWritable,
    SecretRefused,
    keep_rotated_refresh_token,
    store_oauth_tokens,
    store_secret,
)
from intake.secrets import resolve_secret
from tests.factories import make_mailbox, make_tenant
from tests.openbao import openbao  # noqa: F401  (fixture)


@pytest.fixture
def secrets_dir(tmp_path, settings):
    settings.MAILROOM_SECRETS_DIR = str(tmp_path / "secrets")
    for slug in ("acme", "globex"):
        (tmp_path / "secrets" / slug).mkdir(parents=True)
    return tmp_path / "secrets"


@pytest.fixture
def vault_env(openbao, monkeypatch):  # noqa: F811
    for name in ("VAULT_TOKEN", "BAO_TOKEN", "BAO_ADDR", "VAULT_ROLE_ID", "VAULT_SECRET_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VAULT_ADDR", openbao.addr)
    monkeypatch.setenv("VAULT_TOKEN", openbao.token)
    return openbao


@pytest.fixture
def graph_box(tenant, secrets_dir):
    path = secrets_dir / "acme" / "graph.json"
    path.write_text(json.dumps({"client_id": "c", "client_secret": "s", "refresh_token": "old"}))
    path.chmod(0o600)
    return make_mailbox(
        tenant, slug="graph-box", provider="graph", credentials_ref=f"file:{path}", settings={"client_id": "c"}
    )


def test_a_file_secret_is_replaced_atomically_and_stays_0600_with_no_temporary_file_left(tenant, secrets_dir):
    path = secrets_dir / "acme" / "imap.json"
    path.write_text("old value")
    path.chmod(0o600)
    ref = f"file:{path}"
    assert resolve_secret(ref, tenant=tenant) == "old value"
    inode = os.stat(path).st_ino

    store_secret(ref, '{"refresh_token": "new"}', tenant=tenant, owner=None, actor="test")

    assert resolve_secret(ref, tenant=tenant) == '{"refresh_token": "new"}'
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.stat(path).st_ino != inode, "a new file renamed over the old one, not the old one rewritten"
    assert sorted(p.name for p in path.parent.iterdir()) == ["imap.json"]


def test_a_file_secret_reached_through_a_symlink_replaces_the_target_and_keeps_the_link(tenant, secrets_dir):
    target = secrets_dir / "acme" / "real.json"
    target.write_text("v1")
    link = secrets_dir / "acme" / "current.json"
    link.symlink_to(target)

    store_secret(f"file:{link}", "v2", tenant=tenant, owner=None, actor="test")

    assert link.is_symlink() and target.read_text() == "v2"


def test_a_file_secret_can_be_created_in_the_tenants_folder(tenant, secrets_dir):
    path = secrets_dir / "acme" / "new" / "mailbox.json"
    store_secret(f"file:{path}", "first", tenant=tenant, owner=None, actor="test")
    assert path.read_text() == "first" and stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_an_environment_variable_is_refused_as_not_writable(tenant, monkeypatch):
    monkeypatch.setenv("MAILROOM_T_ACME_TOKENS", "old")
    with pytest.raises(SecretNotWritable, match="cannot be rotated; use file: or vault:"):
        store_secret("env:MAILROOM_T_ACME_TOKENS", "new", tenant=tenant, owner=None, actor="test")
    assert os.environ["MAILROOM_T_ACME_TOKENS"] == "old"


def test_another_tenants_references_are_refused_and_nothing_is_written(tenant, secrets_dir):
    make_tenant(slug="globex")
    theirs = secrets_dir / "globex" / "desk"
    theirs.write_text("globex-token")
    (secrets_dir / "acme" / "escape").symlink_to(theirs)
    for ref in (
        f"file:{theirs}",
        f"file:{secrets_dir / 'acme' / 'escape'}",
        f"file:{secrets_dir / 'acme' / '..' / 'globex' / 'desk'}",
        "file:/tmp/anywhere",
        "vault:secret/mailroom/globex/desk#token",
        "env:MAILROOM_T_GLOBEX_DESK",
    ):
        with pytest.raises(SecretRefused):
            store_secret(ref, "stolen", tenant=tenant, owner=None, actor="test")
    assert theirs.read_text() == "globex-token"


def test_a_row_of_another_tenant_is_refused_even_with_a_ref_in_scope(tenant, secrets_dir):
    globex_box = make_mailbox(make_tenant(slug="globex"), slug="globex-box")
    path = secrets_dir / "acme" / "x"
    with pytest.raises(SecretRefused, match="another tenant"):
        store_secret(f"file:{path}", "v", tenant=tenant, owner=globex_box, actor="test")
    assert not path.exists()


def test_a_vault_key_is_written_beside_the_others_and_the_cache_is_dropped(tenant, vault_env):
    vault_env.write("mailroom/acme/imap", credentials="old", other="kept")
    ref = "vault:secret/mailroom/acme/imap#credentials"
    assert resolve_secret(ref, tenant=tenant) == "old"  # now cached for the TTL

    store_secret(ref, "new", tenant=tenant, owner=None, actor="test")

    assert resolve_secret(ref, tenant=tenant) == "new"
    data = vault_env.client().secrets.kv.v2.read_secret_version(
        path="mailroom/acme/imap", mount_point="secret", raise_on_deleted_version=True
    )["data"]
    assert data["data"] == {"credentials": "new", "other": "kept"}
    assert data["metadata"]["version"] == 2


def test_a_vault_path_that_does_not_exist_yet_is_created(tenant, vault_env):
    ref = "vault:secret/mailroom/acme/fresh-mailbox#credentials"
    store_secret(ref, '{"refresh_token": "r"}', tenant=tenant, owner=None, actor="test")
    assert resolve_secret(ref, tenant=tenant) == '{"refresh_token": "r"}'


def test_store_oauth_tokens_writes_the_blob_records_the_grant_audits_it_and_lets_polling_resume(graph_box):
    Mailbox.objects.filter(pk=graph_box.pk).update(health="credentials_invalid", health_detail="invalid_grant")
    graph_box.refresh_from_db()
    expires = timezone.now() + timezone.timedelta(days=90)

    store_oauth_tokens(
        graph_box,
        blob={"client_id": "c", "client_secret": "s", "refresh_token": "connected"},
        actor="ann",
        scopes="Mail.Read offline_access",
        expires_at=expires,
    )

    assert (
        json.loads(resolve_secret(graph_box.credentials_ref, tenant=graph_box.tenant))["refresh_token"] == "connected"
    )
    row = Mailbox.objects.get(pk=graph_box.pk)
    assert (row.oauth_scopes, row.oauth_expires_at, row.oauth_connected_by) == (
        "Mail.Read offline_access",
        expires,
        "ann",
    )
    assert row.oauth_connected_at is not None and row.health == "ok"
    [audit] = MailboxAudit.objects.filter(mailbox=graph_box)
    assert (audit.kind, audit.actor, audit.detail["refresh_token"]) == ("tokens_connected", "ann", True)
    assert "connected" not in json.dumps(audit.detail)


def test_a_kept_rotation_moves_the_expiry_on_by_the_grants_lifetime(graph_box):
    connected = timezone.now() - timezone.timedelta(days=80)
    Mailbox.objects.filter(pk=graph_box.pk).update(
        oauth_connected_at=connected,
        oauth_warned_at=timezone.now(),
        oauth_expires_at=connected + timezone.timedelta(days=90),
    )
    graph_box.refresh_from_db()

    assert keep_rotated_refresh_token(
        mailbox=graph_box,
        blob={"client_id": "c", "client_secret": "s", "refresh_token": "old"},
        new_refresh_token="rotated",
        actor="system:poll",
        provider="graph",
    )

    row = Mailbox.objects.get(pk=graph_box.pk)
    left = row.oauth_expires_at - timezone.now()
    assert timezone.timedelta(days=89) < left <= timezone.timedelta(days=90), "90 days from now, not 10"
    assert row.oauth_warned_at is None, "the next expiry is warned about again"


def test_store_oauth_tokens_to_an_env_reference_changes_nothing(tenant, monkeypatch):
    monkeypatch.setenv("MAILROOM_T_ACME_GRAPH", "{}")
    box = make_mailbox(tenant, slug="graph-env", provider="graph", credentials_ref="env:MAILROOM_T_ACME_GRAPH")
    with pytest.raises(SecretNotWritable):
        store_oauth_tokens(box, blob={"refresh_token": "x"}, actor="ann", scopes="", expires_at=None)
    assert not MailboxAudit.objects.filter(mailbox=box).exists()
    assert Mailbox.objects.get(pk=box.pk).oauth_connected_at is None


def test_the_system_check_warns_about_every_oauth_mailbox_whose_credentials_are_an_env_reference(tenant):
    make_mailbox(tenant, slug="graph-env", provider="graph", credentials_ref="env:MAILROOM_T_ACME_GRAPH")
    make_mailbox(tenant, slug="gmail-env", provider="gmail", credentials_ref="env:MAILROOM_T_ACME_GMAIL")
    make_mailbox(
        tenant,
        slug="imap-oauth-env",
        provider="imap",
        credentials_ref="env:MAILROOM_T_ACME_IMAP",
        settings={"host": "127.0.0.1", "auth": "xoauth2", "token_url": "http://127.0.0.1/token"},
    )
    make_mailbox(
        tenant,
        slug="imap-password-env",
        provider="imap",
        credentials_ref="env:MAILROOM_T_ACME_PW",
        settings={"host": "127.0.0.1"},
    )
    make_mailbox(tenant, slug="graph-file", provider="graph", credentials_ref="file:/srv/secrets/acme/graph")

    warnings = [w for w in checks.run_checks(tags=[checks.Tags.security]) if w.id == "intake.W006"]

    assert sorted(w.obj.slug for w in warnings) == ["gmail-env", "graph-env", "imap-oauth-env"]
    assert all("env references are unsuitable for rotating refresh tokens" in w.msg for w in warnings)

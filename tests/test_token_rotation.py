"""Rotated refresh tokens are kept for the API providers too (issue 25): against the Graph and Gmail fakes, which
answer every refresh with a new refresh token and void the old one, the new token is written back to the
mailbox's `file:` reference (or its Vault key) before it is used, audited without the value, and the old one is
never sent again."""

import json
import os
import stat

import pytest

from intake.channels import polling
from intake.models import InboxEvent, Mailbox, MailboxAudit
from intake.providers.oauth import clear_token_cache
from tests.fake_google import FakeGoogle
from tests.fake_graph import FakeGraph
from tests.openbao import openbao  # noqa: F401  (fixture)


def make_raw(n: int) -> bytes:
    return (
        f"From: Customer {n} <customer{n}@example.com>\r\nTo: support@acme.test\r\n"
        f"Subject: Request {n}\r\nMessage-ID: <rotation-{n}@example.com>\r\n"
        f"Date: Sun, 29 Nov 2026 10:00:{n:02d} +0000\r\nMIME-Version: 1.0\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\n\r\nPlease help with {n}.\r\n"
    ).encode()


@pytest.fixture(autouse=True)
def fresh_tokens():
    clear_token_cache()
    yield
    clear_token_cache()


@pytest.fixture
def secrets_dir(tmp_path, settings):
    settings.MAILROOM_SECRETS_DIR = str(tmp_path / "secrets")
    (tmp_path / "secrets" / "acme").mkdir(parents=True)
    return tmp_path / "secrets"


@pytest.fixture
def graph():
    server = FakeGraph(refresh_token="graph-refresh-1").start()
    server.rotate_refresh_tokens = True
    yield server
    server.stop()


@pytest.fixture
def google():
    server = FakeGoogle().start()
    server.rotate_refresh_tokens = True
    yield server
    server.stop()


def credentials_file(secrets_dir, name: str, blob: dict):
    path = secrets_dir / "acme" / name
    path.write_text(json.dumps(blob))
    path.chmod(0o600)
    return path


def graph_mailbox(tenant, graph, ref: str) -> Mailbox:
    return Mailbox.objects.create(
        tenant=tenant,
        slug="support-graph",
        address="support@acme.test",
        provider="graph",
        poll_enabled=True,
        credentials_ref=ref,
        webhook_secret_ref="env:GRAPH_TEST_CLIENT_STATE",
        settings={
            "api_base": graph.api_base,
            "token_url": graph.token_url,
            "client_id": graph.client_id,
            "tenant_id": graph.tenant,
            "user": graph.user,
            "folder": "inbox",
        },
    )


def gmail_mailbox(tenant, google, ref: str) -> Mailbox:
    return Mailbox.objects.create(
        tenant=tenant,
        slug="support-gmail",
        address="support@acme.test",
        provider="gmail",
        poll_enabled=True,
        credentials_ref=ref,
        webhook_secret_ref="env:GMAIL_TEST_URL_TOKEN",
        settings={
            "api_base": google.url,
            "token_url": f"{google.url}/token",
            "client_id": google.client_id,
            "resync_days": 7,
        },
    )


def rotations(mailbox) -> list[MailboxAudit]:
    return list(MailboxAudit.objects.filter(mailbox=mailbox, kind="refresh_token_rotated").order_by("pk"))


def test_graph_a_rotated_refresh_token_is_written_back_and_the_old_one_never_sent_again(tenant, graph, secrets_dir):
    path = credentials_file(
        secrets_dir, "graph.json", {"refresh_token": "graph-refresh-1", "client_secret": graph.client_secret}
    )
    mailbox = graph_mailbox(tenant, graph, f"file:{path}")
    graph.add_message(make_raw(1))

    assert polling.poll_mailbox(mailbox.pk).status == "ok"
    stored = json.loads(path.read_text())
    assert stored == {"refresh_token": graph.refresh_token, "client_secret": graph.client_secret}
    assert stored["refresh_token"] != "graph-refresh-1"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

    graph.revoke_tokens()  # the access token is refused: one refresh, with the stored (new) refresh token
    graph.add_message(make_raw(2))
    report = polling.poll_mailbox(mailbox.pk)

    assert (report.status, report.new) == ("ok", 1), report.detail
    assert graph.reused_refresh_tokens == [] and graph.token_requests == 2
    assert json.loads(path.read_text())["refresh_token"] == graph.refresh_token
    audits = rotations(mailbox)
    assert [(a.actor, a.detail["provider"], a.detail["kept"]) for a in audits] == [
        ("provider:graph", "graph", True)
    ] * 2
    assert not any(token in json.dumps(a.detail) for a in audits for token in graph.rotated_refresh_tokens)
    assert InboxEvent.objects.filter(mailbox=mailbox).count() == 2


def test_gmail_a_rotated_refresh_token_is_written_back_and_the_old_one_never_sent_again(tenant, google, secrets_dir):
    path = credentials_file(
        secrets_dir, "gmail.json", {"refresh_token": google.refresh_token, "client_secret": google.client_secret}
    )
    mailbox = gmail_mailbox(tenant, google, f"file:{path}")
    google.add_message(make_raw(1))

    assert polling.poll_mailbox(mailbox.pk).status == "ok"
    google.revoke_tokens()
    google.add_message(make_raw(2))
    report = polling.poll_mailbox(mailbox.pk)

    assert report.status == "ok", report.detail
    assert json.loads(path.read_text())["refresh_token"] == google.refresh_token
    assert google.reused_refresh_tokens == [] and len(google.rotated_refresh_tokens) == 2
    assert [a.detail["kept"] for a in rotations(mailbox)] == [True, True]


def test_gmail_a_rotated_refresh_token_is_written_to_the_same_vault_key(tenant, google, openbao, monkeypatch):  # noqa: F811
    for name in ("VAULT_TOKEN", "BAO_TOKEN", "BAO_ADDR", "VAULT_ROLE_ID", "VAULT_SECRET_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VAULT_ADDR", openbao.addr)
    monkeypatch.setenv("VAULT_TOKEN", openbao.token)
    first = google.refresh_token
    openbao.write(
        "mailroom/acme/gmail",
        credentials=json.dumps({"refresh_token": first, "client_secret": google.client_secret}),
        note="kept",
    )
    mailbox = gmail_mailbox(tenant, google, "vault:secret/mailroom/acme/gmail#credentials")
    google.add_message(make_raw(1))

    assert polling.poll_mailbox(mailbox.pk).status == "ok"

    data = openbao.client().secrets.kv.v2.read_secret_version(
        path="mailroom/acme/gmail", mount_point="secret", raise_on_deleted_version=True
    )["data"]["data"]
    assert json.loads(data["credentials"])["refresh_token"] == google.refresh_token != first
    assert data["note"] == "kept"
    google.revoke_tokens()
    assert polling.poll_mailbox(mailbox.pk).status == "ok"
    assert google.reused_refresh_tokens == []


def test_graph_with_an_env_reference_the_rotation_lives_in_memory_and_is_audited_as_not_kept(
    tenant, graph, monkeypatch, caplog
):
    monkeypatch.setenv(
        "MAILROOM_T_ACME_GRAPH", json.dumps({"refresh_token": "graph-refresh-1", "client_secret": graph.client_secret})
    )
    mailbox = graph_mailbox(tenant, graph, "env:MAILROOM_T_ACME_GRAPH")
    graph.add_message(make_raw(1))

    assert polling.poll_mailbox(mailbox.pk).status == "ok"
    graph.revoke_tokens()
    assert polling.poll_mailbox(mailbox.pk).status == "ok"

    assert graph.reused_refresh_tokens == []
    assert [a.detail["kept"] for a in rotations(mailbox)] == [False, False]
    assert "cannot be written" in caplog.text and graph.refresh_token not in caplog.text


def test_a_rotation_that_cannot_be_written_fails_the_poll_as_transient_and_keeps_the_new_token_in_memory(
    tenant, google, openbao, monkeypatch
):  # noqa: F811
    """A Vault token that may read but not write: the poll backs off (the admin sees why), the new refresh token
    is sent next time (never the voided one), and once writing works again it is stored."""
    root = openbao.client()
    root.sys.create_or_update_policy(
        name="mailroom-read-only", policy='path "secret/data/mailroom/*" { capabilities = ["read"] }'
    )
    read_only = root.auth.token.create(policies=["mailroom-read-only"])["auth"]["client_token"]
    for name in ("VAULT_TOKEN", "BAO_TOKEN", "BAO_ADDR", "VAULT_ROLE_ID", "VAULT_SECRET_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VAULT_ADDR", openbao.addr)
    monkeypatch.setenv("VAULT_TOKEN", read_only)
    openbao.write(
        "mailroom/acme/gmail-ro",
        credentials=json.dumps({"refresh_token": google.refresh_token, "client_secret": google.client_secret}),
    )
    mailbox = gmail_mailbox(tenant, google, "vault:secret/mailroom/acme/gmail-ro#credentials")

    for _attempt in range(2):
        report = polling.poll_mailbox(mailbox.pk, trigger="manual")
        assert report.status == "backoff" and "secret_store" in report.detail, report.detail
    assert google.reused_refresh_tokens == [] and len(google.rotated_refresh_tokens) == 2
    assert rotations(mailbox) == []

    monkeypatch.setenv("VAULT_TOKEN", openbao.token)  # writing works again
    report = polling.poll_mailbox(mailbox.pk, trigger="manual")

    assert report.status == "ok", report.detail
    stored = openbao.client().secrets.kv.v2.read_secret_version(
        path="mailroom/acme/gmail-ro", mount_point="secret", raise_on_deleted_version=True
    )["data"]["data"]
    assert json.loads(stored["credentials"])["refresh_token"] == google.refresh_token
    assert google.reused_refresh_tokens == [] and [a.detail["kept"] for a in rotations(mailbox)] == [True]

"""IMAP with OAuth 2.0 against a real Dovecot whose `passdb { driver = oauth2 }` introspects every bearer token at
a real token server on 127.0.0.1 (tests/fake_oauth_server.py) that issues short-lived access tokens, rotates the
refresh token on every refresh (the old one is then void) and can revoke: the acceptance of issue 25, part 1/2."""

import json
import os
import ssl
import stat
import time
from urllib.parse import parse_qs

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.core import mail

from intake.channels.polling import poll_mailbox
from intake.egress import guarded_session
from intake.failures import PermanentError
from intake.models import Mailbox, MailboxAudit
from intake.providers import imap_oauth, oauth
from intake.providers.settings_schema import settings_errors
from intake.secret_store import store_oauth_tokens
from tests.dovecot import start_dovecot
from tests.fake_oauth_server import FakeOAuth
from tests.mail import make_message
from tests.sns import sns_keys
from tests.strict_imap import StrictIMAP
from tests.support.users import make_user
from ticketing import mailbox_alerts

pytestmark = pytest.mark.django_db(transaction=True)
FOLDER = "Support"


@pytest.fixture(scope="module")
def oauth_server():
    server = FakeOAuth().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oauth_dovecot(oauth_server):
    server = start_dovecot(oauth_introspection_url=oauth_server.introspection_url)
    yield server
    server.cleanup()


@pytest.fixture(autouse=True)
def _fresh_tokens(oauth_server):
    oauth.clear_token_cache()
    imap_oauth.clear_cache()
    oauth_server.token_lifetime = 3600
    with oauth_server.lock:
        oauth_server.issued.clear()
        oauth_server.reused_refresh_tokens.clear()
    yield
    oauth.clear_token_cache()
    imap_oauth.clear_cache()


@pytest.fixture
def secrets_dir(tmp_path, settings):
    settings.MAILROOM_SECRETS_DIR = str(tmp_path / "secrets")
    (tmp_path / "secrets" / "acme").mkdir(parents=True)
    return tmp_path / "secrets"


class OAuthBox:
    def __init__(self, server, oauth_server, mailbox, username, password, credentials_file):
        self.server, self.oauth, self.mailbox = server, oauth_server, mailbox
        self.username, self.password, self.credentials_file = username, password, credentials_file

    def append(self, *subjects):
        with self.server.client(self.username, self.password) as client:
            if not client.folder_exists(FOLDER):
                client.create_folder(FOLDER)
            for subject in subjects:
                client.append(FOLDER, make_message(subject=subject))

    def poll(self):
        return poll_mailbox(self.mailbox.pk, trigger="manual")

    def stored(self) -> dict:
        return json.loads(self.credentials_file.read_text())

    def refreshed(self) -> list[dict]:
        with self.oauth.lock:
            return [entry for entry in self.oauth.issued if entry["user"] == self.username]

    def reload(self) -> Mailbox:
        return Mailbox.objects.get(pk=self.mailbox.pk)


def make_oauth_box(server, oauth_server, tenant, secrets_dir, slug="imap-oauth", **settings) -> OAuthBox:
    username, password = server.add_user()
    credentials = secrets_dir / tenant.slug / f"{slug}.json"
    credentials.write_text(
        json.dumps(
            {
                "client_id": oauth_server.client_id,
                "client_secret": oauth_server.client_secret,
                "refresh_token": oauth_server.grant(username),
            }
        )
    )
    credentials.chmod(0o600)
    mailbox = Mailbox.objects.create(
        tenant=tenant,
        slug=slug,
        address=username,
        provider="imap",
        poll_enabled=True,
        credentials_ref=f"file:{credentials}",
        settings={
            "host": "127.0.0.1",
            "port": server.port,
            "ssl": False,
            "username": username,
            "folder": FOLDER,
            "auth": "xoauth2",
            "token_url": oauth_server.token_url,
            **settings,
        },
    )
    return OAuthBox(server, oauth_server, mailbox, username, password, credentials)


@pytest.fixture
def box(oauth_dovecot, oauth_server, tenant, secrets_dir):
    return make_oauth_box(oauth_dovecot, oauth_server, tenant, secrets_dir)


def logins(server, username: str, method: str) -> int:
    return sum(
        1
        for line in server.log().splitlines()
        if "Login:" in line and f"user=<{username}>" in line and f"method={method}" in line
    )


def test_a_mailbox_with_auth_xoauth2_polls_its_mail_through_dovecots_oauth_passdb(box, oauth_dovecot):
    box.append("Printer on fire", "Invoice 2291 overdue", "VPN drops every hour")

    report = box.poll()

    assert (report.status, report.new) == ("ok", 3), report.detail
    assert box.reload().health == "ok"
    assert logins(oauth_dovecot, box.username, "XOAUTH2") == 1
    assert [entry["grant"] for entry in box.refreshed()] == ["refresh_token"]


def test_a_rotated_refresh_token_is_written_back_and_the_old_one_is_never_sent_again(box, oauth_server):
    first = box.stored()["refresh_token"]
    box.append("Laptop will not boot")
    assert box.poll().new == 1

    second = box.stored()["refresh_token"]
    assert second != first and second == oauth_server.current_refresh_token(box.username)
    assert box.stored()["client_secret"] == oauth_server.client_secret, "the rest of the blob is kept"
    assert stat.S_IMODE(os.stat(box.credentials_file).st_mode) == 0o600
    [rotation] = MailboxAudit.objects.filter(mailbox=box.mailbox, kind="refresh_token_rotated")
    assert rotation.detail["kept"] is True and rotation.detail["ref_kind"] == "file"
    assert first not in json.dumps(rotation.detail) and second not in json.dumps(rotation.detail)

    # Next refreshes (the access token expired): each sends the token stored last, never a rotated-away one.
    for subject in ("Second request", "Third request"):
        oauth_server.expire_access_tokens()
        box.append(subject)
        assert box.poll().new == 1
    sent = [entry["refresh_sent"] for entry in box.refreshed()]
    issued = [entry["refresh_issued"] for entry in box.refreshed()]
    assert sent == [first, *issued[:-1]] and box.stored()["refresh_token"] == issued[-1]
    assert oauth_server.reused_refresh_tokens == []
    assert MailboxAudit.objects.filter(mailbox=box.mailbox, kind="refresh_token_rotated").count() == 3


def test_an_access_token_the_server_no_longer_accepts_is_refreshed_once_and_the_poll_goes_on(box, oauth_server):
    box.append("Before the token expired")
    assert box.poll().new == 1
    assert box.poll().new == 0
    assert len(box.refreshed()) == 1, "a valid cached token is reused"

    oauth_server.expire_access_tokens()  # Dovecot's introspection now says inactive for the cached token
    box.append("After the token expired")
    before = oauth_server.introspections
    report = box.poll()

    assert (report.status, report.new) == ("ok", 1), report.detail
    assert len(box.refreshed()) == 2 and box.reload().health == "ok"
    assert oauth_server.introspections - before == 2, "the refused cached token, then the fresh one"


def test_a_token_about_to_expire_is_refreshed_before_the_login(box, oauth_server, oauth_dovecot):
    oauth_server.token_lifetime = 30  # inside the refresh skew: never worth reusing
    box.append("Short-lived tokens")
    before = oauth_server.introspections
    assert box.poll().new == 1
    assert box.poll().new == 0
    assert len(box.refreshed()) == 2
    assert oauth_server.introspections - before == 2, "one AUTHENTICATE per poll: none with an expired token"
    assert logins(oauth_dovecot, box.username, "XOAUTH2") == 2


def test_oauthbearer_logs_in_too(oauth_dovecot, oauth_server, tenant, secrets_dir):
    box = make_oauth_box(oauth_dovecot, oauth_server, tenant, secrets_dir, slug="imap-bearer", sasl="oauthbearer")
    box.append("Sent over OAUTHBEARER")

    report = box.poll()

    assert (report.status, report.new) == ("ok", 1), report.detail
    assert logins(oauth_dovecot, box.username, "OAUTHBEARER") == 1
    assert logins(oauth_dovecot, box.username, "XOAUTH2") == 0


def test_a_fresh_token_the_server_refuses_is_refused_credentials_without_a_second_refresh(
    oauth_dovecot, oauth_server, tenant, secrets_dir
):
    box = make_oauth_box(oauth_dovecot, oauth_server, tenant, secrets_dir, slug="imap-app-only")
    # App-only (client credentials) whose token the server issues for ANOTHER user: Dovecot refuses it.
    oauth_server.client_users["app-only-client"] = "someone-else@example.test"
    box.credentials_file.write_text(
        json.dumps({"client_id": "app-only-client", "client_secret": oauth_server.client_secret})
    )
    oauth_server.client_id = "app-only-client"
    try:
        report = box.poll()
    finally:
        oauth_server.client_id = "imap-client"

    assert report.status == "credentials_invalid", report.detail
    assert "AUTHENTICATIONFAILED" in report.detail
    with oauth_server.lock:
        assert [entry["grant"] for entry in oauth_server.issued] == ["client_credentials"]


def test_a_revoked_token_marks_the_mailbox_down_emails_the_admins_once_and_recovers_once_new_tokens_are_connected(
    box, oauth_server, tenant, settings
):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    make_user("ann", groups=["mailroom-admin"], tenants=[tenant])
    box.append("Before the revocation")
    assert box.poll().new == 1

    oauth_server.revoke(box.username)
    box.append("While revoked")
    report = box.poll()

    assert report.status == "credentials_invalid", report.detail
    assert "invalid_grant" in report.detail
    mailbox = box.reload()
    assert (mailbox.health, mailbox.link_state) == ("credentials_invalid", "down")
    assert box.poll().status == "credentials_invalid", "not polled again until fixed"
    mailbox_alerts.send_pending()
    mailbox_alerts.send_pending()
    assert [m.subject for m in mail.outbox] == [f"[Mailroom] mailbox acme/{box.mailbox.slug} is down"]
    assert all(box.stored()["refresh_token"] not in m.body for m in mail.outbox)

    # The admin connects the mailbox again (the consent flow's store): new tokens, polled again.
    store_oauth_tokens(
        mailbox,
        blob={
            "client_id": oauth_server.client_id,
            "client_secret": oauth_server.client_secret,
            "refresh_token": oauth_server.grant(box.username),
        },
        actor="ann",
        scopes=oauth_server.scope,
        expires_at=None,
    )
    report = box.poll()

    assert (report.status, report.new) == ("ok", 1), report.detail
    mailbox = box.reload()
    assert (mailbox.health, mailbox.link_state) == ("ok", "recovered")
    assert (mailbox.oauth_connected_by, mailbox.oauth_scopes) == ("ann", oauth_server.scope)
    assert list(
        MailboxAudit.objects.filter(mailbox=mailbox, kind__in=("tokens_connected", "link_down", "link_recovered"))
        .order_by("pk")
        .values_list("kind", flat=True)
    ) == ["link_down", "tokens_connected", "link_recovered"]
    mailbox_alerts.send_pending()
    assert [m.subject for m in mail.outbox][-1] == f"[Mailroom] mailbox acme/{box.mailbox.slug} recovered"
    assert oauth_server.reused_refresh_tokens == []


def test_an_env_reference_cannot_keep_a_rotation_this_process_still_uses_the_new_token_and_says_so(
    oauth_dovecot, oauth_server, tenant, secrets_dir, monkeypatch, caplog
):
    box = make_oauth_box(oauth_dovecot, oauth_server, tenant, secrets_dir, slug="imap-env")
    monkeypatch.setenv("MAILROOM_T_ACME_IMAP_OAUTH", box.credentials_file.read_text())
    Mailbox.objects.filter(pk=box.mailbox.pk).update(credentials_ref="env:MAILROOM_T_ACME_IMAP_OAUTH")
    box.append("From an env reference")

    assert box.poll().new == 1
    oauth_server.expire_access_tokens()
    box.append("Second one")
    assert box.poll().new == 1

    assert oauth_server.reused_refresh_tokens == [], "the rotated token is kept in memory at least"
    rotations = MailboxAudit.objects.filter(mailbox=box.mailbox, kind="refresh_token_rotated")
    assert [r.detail["kept"] for r in rotations] == [False, False]
    assert "cannot be written" in caplog.text


def service_account_key(oauth_server, email: str) -> dict:
    """A Google service account key file (as the console downloads it), its public half known to the server."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    oauth_server.service_accounts[email] = key.public_key()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return {
        "type": "service_account",
        "project_id": "acme-mail",
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": email,
        "client_id": "1234567890",
        "token_uri": "https://oauth2.googleapis.com/token",
    }


def test_google_a_service_account_with_domain_wide_delegation_gets_a_token_for_the_mailbox_user(
    oauth_dovecot, oauth_server, tenant, secrets_dir
):
    box = make_oauth_box(
        oauth_dovecot,
        oauth_server,
        tenant,
        secrets_dir,
        slug="imap-google-sa",
        oauth_flavor="google",
        sasl="oauthbearer",
    )
    box.credentials_file.write_text(json.dumps(service_account_key(oauth_server, "mailroom@acme-mail.iam.test")))
    box.append("Over a service account")

    report = box.poll()

    assert (report.status, report.new) == ("ok", 1), report.detail
    [grant] = box.refreshed()
    assert (grant["iss"], grant["scope"]) == ("mailroom@acme-mail.iam.test", "https://mail.google.com/")
    assert logins(oauth_dovecot, box.username, "OAUTHBEARER") == 1


def test_google_a_delegated_refresh_token_is_refreshed_with_google_auth_and_its_rotation_kept(
    oauth_dovecot, oauth_server, tenant, secrets_dir
):
    box = make_oauth_box(
        oauth_dovecot, oauth_server, tenant, secrets_dir, slug="imap-google-user", oauth_flavor="google"
    )
    first = box.stored()["refresh_token"]
    box.append("Over a Google refresh token")

    assert box.poll().new == 1
    oauth_server.expire_access_tokens()
    box.append("And another")
    assert box.poll().new == 1

    sent = [entry["refresh_sent"] for entry in box.refreshed()]
    assert sent[0] == first and sent[1] == box.refreshed()[0]["refresh_issued"]
    assert box.stored()["refresh_token"] == oauth_server.current_refresh_token(box.username)
    assert oauth_server.reused_refresh_tokens == []
    assert [
        a.detail["kept"] for a in MailboxAudit.objects.filter(mailbox=box.mailbox, kind="refresh_token_rotated")
    ] == [True, True]


def test_google_a_service_account_key_the_server_does_not_know_is_refused_credentials(
    oauth_dovecot, oauth_server, tenant, secrets_dir
):
    box = make_oauth_box(
        oauth_dovecot, oauth_server, tenant, secrets_dir, slug="imap-google-bad", oauth_flavor="google"
    )
    key = service_account_key(oauth_server, "stale@acme-mail.iam.test")
    del oauth_server.service_accounts["stale@acme-mail.iam.test"]  # the key was deleted in the console
    box.credentials_file.write_text(json.dumps(key))

    report = box.poll()

    assert report.status == "credentials_invalid" and "invalid_grant" in report.detail, report.detail


@pytest.fixture(scope="module")
def entra(tmp_path_factory):
    """The token server over HTTPS (msal speaks nothing else), with a private CA the test's session trusts."""
    keys, folder = sns_keys(), tmp_path_factory.mktemp("entra-tls")
    (folder / "tls.pem").write_bytes(keys.tls_cert_pem)
    (folder / "tls.key").write_bytes(keys.tls_key_pem)
    (folder / "ca.pem").write_bytes(keys.ca_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "tls.pem", folder / "tls.key")
    server = FakeOAuth(client_id="entra-app", client_secret="entra-secret").start(ssl_context=context)
    server.ca_file = str(folder / "ca.pem")
    yield server
    server.stop()


def microsoft_tokens(entra, mailbox) -> imap_oauth.MicrosoftTokens:
    tokens = imap_oauth.token_source(mailbox)
    tokens.session = guarded_session(purpose="token_url")
    tokens.session.verify = entra.ca_file  # the private CA; everything else as in production
    return tokens


def introspect(entra, token: str) -> dict:
    return requests.post(entra.introspection_url, data={"token": token}, verify=entra.ca_file, timeout=5).json()


def test_microsoft_app_only_client_credentials_through_msal_for_a_shared_mailbox(entra, tenant, secrets_dir):
    path = secrets_dir / "acme" / "m365.json"
    path.write_text(json.dumps({"client_id": "entra-app", "client_secret": "entra-secret"}))
    entra.client_users["entra-app"] = "shared@acme.test"
    mailbox = Mailbox.objects.create(
        tenant=tenant,
        slug="m365-shared",
        address="shared@acme.test",
        provider="imap",
        credentials_ref=f"file:{path}",
        settings={
            "host": "127.0.0.1",
            "auth": "xoauth2",
            "oauth_flavor": "microsoft",
            "authority": f"{entra.url}/acme-tenant-id",
        },
    )
    tokens = microsoft_tokens(entra, mailbox)

    token = tokens.token()

    assert introspect(entra, token) == {
        "active": True,
        "username": "shared@acme.test",
        "scope": entra.scope,
        "exp": pytest.approx(time.time() + 3600, abs=5),
    }
    assert tokens.last_fresh and tokens.token() == token and not tokens.last_fresh, "cached, not asked again"
    with entra.lock:
        [request] = [r for r in entra.requests if r["path"] == "/token"]
    form = {k: v[0] for k, v in parse_qs(request["body"].decode()).items()}
    assert (form["grant_type"], form["scope"]) == ("client_credentials", "https://outlook.office365.com/.default")


def test_microsoft_a_delegated_refresh_token_rotated_by_msal_is_stored_before_the_token_is_used(
    entra, tenant, secrets_dir
):
    first = entra.grant("agent@acme.test")
    path = secrets_dir / "acme" / "m365-user.json"
    path.write_text(json.dumps({"client_id": "entra-app", "client_secret": "entra-secret", "refresh_token": first}))
    mailbox = Mailbox.objects.create(
        tenant=tenant,
        slug="m365-user",
        address="agent@acme.test",
        provider="imap",
        credentials_ref=f"file:{path}",
        settings={
            "host": "127.0.0.1",
            "auth": "xoauth2",
            "oauth_flavor": "microsoft",
            "authority": f"{entra.url}/acme-tenant-id",
        },
    )
    tokens = microsoft_tokens(entra, mailbox)

    token = tokens.token()

    assert introspect(entra, token)["username"] == "agent@acme.test"
    stored = json.loads(path.read_text())["refresh_token"]
    assert stored != first and stored == entra.current_refresh_token("agent@acme.test")
    entra.expire_access_tokens()
    tokens.invalidate()
    assert introspect(entra, tokens.token())["active"] is True
    assert entra.reused_refresh_tokens == []
    assert MailboxAudit.objects.filter(mailbox=mailbox, kind="refresh_token_rotated").count() == 2

    entra.revoke("agent@acme.test")
    tokens.invalidate()
    with pytest.raises(PermanentError, match="invalid_grant"):
        tokens.token()


def test_the_imap_oauth_settings_are_checked_when_typed():
    base = {"host": "imap.example.test", "auth": "xoauth2"}
    assert settings_errors("imap", {**base, "token_url": "https://login.example.test/token"}) == {}
    assert (
        settings_errors(
            "imap", {**base, "oauth_flavor": "microsoft", "authority": "https://login.microsoftonline.com/acme"}
        )
        == {}
    )
    assert settings_errors("imap", {**base, "oauth_flavor": "google", "sasl": "oauthbearer"}) == {}
    assert list(settings_errors("imap", base)) == ["token_url"]
    assert list(settings_errors("imap", {**base, "oauth_flavor": "microsoft"})) == ["authority"]
    assert list(settings_errors("imap", {**base, "oauth_flavor": "yahoo", "token_url": "https://x.test/t"})) == [
        "oauth_flavor"
    ]
    assert list(settings_errors("imap", {**base, "token_url": "https://x.test/t", "sasl": "plain"})) == ["sasl"]


def test_a_platform_client_secret_is_used_for_the_refresh_and_never_copied_into_the_tenants_blob(
    oauth_dovecot, oauth_server, tenant, secrets_dir, settings, monkeypatch
):
    # The consent flow stores {"client_id", "refresh_token"} when the app's secret is the platform's.
    ref = "env:MAILROOM_PLATFORM_IMAP_APP_SECRET"
    monkeypatch.setenv("MAILROOM_PLATFORM_IMAP_APP_SECRET", oauth_server.client_secret)
    settings.MAILROOM_PLATFORM_SECRET_REFS = [f"{ref}=mailbox:imap-platform-app"]
    box = make_oauth_box(
        oauth_dovecot, oauth_server, tenant, secrets_dir, slug="imap-platform-app", client_secret_ref=ref
    )
    blob = box.stored()
    del blob["client_secret"]
    box.credentials_file.write_text(json.dumps(blob))
    box.append("Scanner jams on every page")

    report = box.poll()

    assert (report.status, report.new) == ("ok", 1), report.detail
    assert [entry["grant"] for entry in box.refreshed()] == ["refresh_token"]
    stored = box.stored()
    assert stored["refresh_token"] == oauth_server.current_refresh_token(box.username), "the rotation is kept"
    assert "client_secret" not in stored and oauth_server.client_secret not in box.credentials_file.read_text()


@pytest.fixture
def strict_imap(oauth_server):
    def active(user: str, token: str) -> bool:
        with oauth_server.lock:
            entry = oauth_server.access_tokens.get(token)
        return entry is not None and entry["user"] == user and entry["expires"] > time.time()

    server = StrictIMAP(check=active).start()
    yield server
    server.stop()


def make_strict_box(strict_imap, oauth_server, tenant, secrets_dir, slug, **settings) -> OAuthBox:
    username = f"{slug}@acme.test"
    credentials = secrets_dir / tenant.slug / f"{slug}.json"
    credentials.write_text(
        json.dumps(
            {
                "client_id": oauth_server.client_id,
                "client_secret": oauth_server.client_secret,
                "refresh_token": oauth_server.grant(username),
            }
        )
    )
    mailbox = Mailbox.objects.create(
        tenant=tenant,
        slug=slug,
        address=username,
        provider="imap",
        poll_enabled=True,
        credentials_ref=f"file:{credentials}",
        settings={
            "host": "127.0.0.1",
            "port": strict_imap.port,
            "ssl": False,
            "username": username,
            "folder": FOLDER,
            "auth": "xoauth2",
            "token_url": oauth_server.token_url,
            **settings,
        },
    )
    return OAuthBox(strict_imap, oauth_server, mailbox, username, None, credentials)


@pytest.mark.parametrize(
    ("sasl", "mechanism", "after_error"), [("xoauth2", "XOAUTH2", b""), ("oauthbearer", "OAUTHBEARER", b"AQ==")]
)
def test_a_refused_cached_token_gets_the_answer_the_sasl_mechanism_wants_then_one_refresh_on_a_new_connection(
    strict_imap, oauth_server, tenant, secrets_dir, sasl, mechanism, after_error
):
    box = make_strict_box(strict_imap, oauth_server, tenant, secrets_dir, slug=f"strict-{sasl}", sasl=sasl)
    assert box.poll().status == "ok"
    oauth_server.expire_access_tokens()  # the cached token is now refused; the server closes after the NO
    del strict_imap.sessions[:]

    report = box.poll()

    assert report.status == "ok", report.detail
    refused, accepted = strict_imap.sessions
    assert (refused["mechanism"], refused["after_error"], refused["outcome"]) == (mechanism, after_error, "refused")
    assert (accepted["outcome"], accepted["after_error"], accepted["commands"][-1]) == ("ok", None, "LOGOUT")
    assert len(box.refreshed()) == 2, "exactly one refresh for the refused token"
    assert box.reload().health == "ok"
    if sasl == "oauthbearer":  # RFC 7628 §3.1: the gs2 header names the user, host and port ride along
        assert (accepted["fields"]["host"], accepted["fields"]["port"]) == ("127.0.0.1", str(strict_imap.port))


def test_a_refused_fresh_token_is_a_credentials_refusal_after_the_proper_error_answer_without_a_second_refresh(
    strict_imap, oauth_server, tenant, secrets_dir
):
    box = make_strict_box(strict_imap, oauth_server, tenant, secrets_dir, slug="strict-fresh")
    strict_imap.check = lambda user, token: False

    report = box.poll()

    assert report.status == "credentials_invalid" and "AUTHENTICATIONFAILED" in report.detail, report.detail
    # The fresh token refused: final. The poll's one re-read of the secret after a refusal (intake.channels.polling)
    # finds only our own rotation, which is no new secret: no second login, no second refresh.
    [only] = strict_imap.sessions
    assert (only["after_error"], only["outcome"]) == (b"", "refused")
    assert len(box.refreshed()) == 1


def test_an_unavailable_refusal_is_a_backoff_and_spends_no_refresh(strict_imap, oauth_server, tenant, secrets_dir):
    box = make_strict_box(strict_imap, oauth_server, tenant, secrets_dir, slug="strict-unavailable")
    assert box.poll().status == "ok"
    strict_imap.unavailable = True  # Dovecot's answer when its introspection server fails

    report = box.poll()

    assert report.status == "backoff" and "UNAVAILABLE" in report.detail, report.detail
    assert box.reload().health == "backoff"
    assert len(box.refreshed()) == 1, "no refresh: the cached token was never said to be bad"
    assert [s["outcome"] for s in strict_imap.sessions] == ["ok", "unavailable"]

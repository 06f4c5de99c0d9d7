"""The admin consent flow (intake.oauth_consent) against a real authorization server on 127.0.0.1
(tests/fake_authorization_server.py): PKCE S256 and a session-bound, single-use state; the tokens written to the
mailbox's file: reference through intake.secret_store; tenant scoping at both ends; the expiry emails and the
banners (ticketing.credential_warnings, the credentials_banner tag)."""

import json
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from intake.models import Mailbox, MailboxAudit
from intake.oauth_consent import services
from intake.oauth_consent.services import SESSION_KEY, ConsentRefused
from tests.factories import make_tenant
from tests.fake_authorization_server import FakeAuthorizationServer, s256
from tests.smtp import smtp_server  # noqa: F401  (fixture)
from tests.support.consent import CALLBACK, CLIENT_SECRET, credentials_of, oauth_mailbox
from tests.support.users import make_user
from ticketing import credential_warnings
from ticketing.models import Notification


@pytest.fixture
def stub():
    server = FakeAuthorizationServer(
        client_id="consent-app", client_secret=CLIENT_SECRET, auto_approve=True, refresh_lifetime=90 * 86400
    ).start()
    yield server
    server.stop()


@pytest.fixture
def secrets_dir(tmp_path, settings):
    settings.MAILROOM_SECRETS_DIR = str(tmp_path / "secrets")
    return tmp_path / "secrets"


def admin_client(username, tenant, **flags) -> Client:
    client = Client()
    client.force_login(make_user(username, groups=["mailroom-admin"], tenants=[tenant] if tenant else [], **flags))
    return client


def start(client, mailbox) -> dict:
    """Open the connect page; the authorization request's parameters (the page's Continue link)."""
    response = client.get(reverse("admin:intake_mailbox_connect", args=[mailbox.pk]))
    assert response.status_code == 200, response.content[:500]
    assert not response.context["problem"], response.context["problem"]
    link = response.context["authorize_url"]
    return {k: v[0] for k, v in parse_qs(urlsplit(link).query).items()} | {"_url": link}


def sign_in(params) -> dict:
    """The browser's visit to the stub: it answers with a redirect back carrying code and state."""
    answer = requests.get(params["_url"], allow_redirects=False, timeout=5)
    assert answer.status_code == 302, answer.text
    location = urlsplit(answer.headers["Location"])
    assert location.path == CALLBACK
    return {k: v[0] for k, v in parse_qs(location.query).items()}


def test_an_admin_connects_a_graph_mailbox_with_pkce_and_the_tokens_land_in_its_file(tenant, secrets_dir, stub):
    mailbox = oauth_mailbox(tenant, secrets_dir, stub)
    client = admin_client("alice", tenant)
    params = start(client, mailbox)
    assert params["code_challenge_method"] == "S256" and len(params["code_challenge"]) == 43
    assert params["response_type"] == "code" and params["client_id"] == "consent-app"
    assert params["scope"] == "offline_access https://graph.microsoft.com/Mail.Read"
    assert params["redirect_uri"] == f"http://testserver{CALLBACK}" and len(params["state"]) >= 40

    answer = sign_in(params)
    response = client.get(CALLBACK, answer)
    assert response.status_code == 302 and response["Location"] == reverse(
        "admin:intake_mailbox_change", args=[mailbox.pk]
    )
    [exchange] = stub.exchanges
    assert s256(exchange["code_verifier"]) == params["code_challenge"]  # the verifier we sent matches
    assert exchange["client_secret"] == CLIENT_SECRET and exchange["redirect_uri"] == params["redirect_uri"]
    stored = credentials_of(mailbox)
    assert stored == {
        "client_id": "consent-app",
        "client_secret": CLIENT_SECRET,
        "refresh_token": stub.issued[0]["refresh_token"],
    }
    mailbox.refresh_from_db()
    assert mailbox.oauth_scopes == "offline_access https://graph.microsoft.com/Mail.Read"
    assert mailbox.oauth_connected_by == "alice"
    assert abs((mailbox.oauth_expires_at - timezone.now()) - timedelta(days=90)) < timedelta(minutes=1)
    audit = MailboxAudit.objects.get(mailbox=mailbox, kind=MailboxAudit.Kind.TOKENS_CONNECTED)
    assert stub.issued[0]["refresh_token"] not in json.dumps(audit.detail)

    page = client.get(reverse("admin:intake_mailbox_change", args=[mailbox.pk])).content.decode()
    assert "https://graph.microsoft.com/Mail.Read" in page and 'id="oauth-expires"' in page
    assert stub.issued[0]["refresh_token"] not in page and CLIENT_SECRET not in page

    # The state was spent: the same answer again is refused, and no second exchange is made.
    again = client.get(CALLBACK, answer)
    assert again.status_code == 400 and "already used" in again.content.decode()
    assert len(stub.exchanges) == 1


def test_a_tampered_state_is_refused_and_nothing_is_written(tenant, secrets_dir, stub):
    mailbox = oauth_mailbox(tenant, secrets_dir, stub)
    client = admin_client("alice", tenant)
    answer = sign_in(start(client, mailbox))
    tampered = client.get(CALLBACK, {**answer, "state": answer["state"][:-2] + "xx"})
    assert tampered.status_code == 400 and 'id="consent-error"' in tampered.content.decode()
    missing = client.get(CALLBACK, {"code": answer["code"]})
    assert missing.status_code == 400 and "Nothing was stored" in missing.content.decode()
    assert stub.exchanges == [] and credentials_of(mailbox) is None
    mailbox.refresh_from_db()
    assert mailbox.oauth_connected_at is None and not MailboxAudit.objects.filter(mailbox=mailbox).exists()


def test_an_expired_state_is_refused(tenant, secrets_dir, stub):
    mailbox = oauth_mailbox(tenant, secrets_dir, stub)
    client = admin_client("alice", tenant)
    answer = sign_in(start(client, mailbox))
    session = client.session
    session[SESSION_KEY][answer["state"]]["expires"] -= services.STATE_SECONDS + 1
    session.save()
    response = client.get(CALLBACK, answer)
    assert response.status_code == 400 and "expired" in response.content.decode()
    assert stub.exchanges == [] and credentials_of(mailbox) is None


def test_the_stub_refuses_a_wrong_code_verifier_and_then_nothing_is_stored(tenant, secrets_dir, stub):
    mailbox = oauth_mailbox(tenant, secrets_dir, stub)
    client = admin_client("alice", tenant)
    params = start(client, mailbox)
    answer = sign_in(params)
    # The stub checks PKCE: a verifier that does not hash to the challenge is refused.
    direct = requests.post(
        f"{stub.url}/token",
        timeout=5,
        data={
            "grant_type": "authorization_code",
            "code": answer["code"],
            "redirect_uri": params["redirect_uri"],
            "client_id": "consent-app",
            "client_secret": CLIENT_SECRET,
            "code_verifier": "x" * 64,
        },
    )
    assert direct.status_code == 400 and direct.json() == {"error": "invalid_grant"}

    second = start(client, mailbox)
    answer = sign_in(second)
    session = client.session
    session[SESSION_KEY][answer["state"]]["verifier"] = "y" * 64  # what a client with a wrong verifier would send
    session.save()
    response = client.get(CALLBACK, answer)
    assert response.status_code == 400 and "refused the authorization code" in response.content.decode()
    assert stub.exchanges[-1]["code_verifier"] == "y" * 64
    assert credentials_of(mailbox) is None and Mailbox.objects.get(pk=mailbox.pk).oauth_connected_at is None


def test_a_tenant_admin_of_another_tenant_can_neither_start_nor_complete_the_flow(tenant, secrets_dir, stub):
    mailbox = oauth_mailbox(tenant, secrets_dir, stub)
    other = make_tenant("tenant-b")
    intruder = admin_client("bob", other)
    assert intruder.get(reverse("admin:intake_mailbox_connect", args=[mailbox.pk])).status_code == 404

    owner = admin_client("alice", tenant)
    answer = sign_in(start(owner, mailbox))
    # Bob replays Alice's answer (code and state) in his own session: the state is not his.
    replay = intruder.get(CALLBACK, answer)
    assert replay.status_code == 400
    # Even holding Alice's pending entry (a stolen session), the service refuses Bob.
    stolen = dict(owner.session[SESSION_KEY])
    bob = get_user("bob")
    with pytest.raises(ConsentRefused) as refused:
        services.complete_consent(user=bob, session={SESSION_KEY: stolen}, state=answer["state"], code=answer["code"])
    assert refused.value.status == 403
    assert stub.exchanges == [] and credentials_of(mailbox) is None


def test_only_who_may_change_the_mailbox_starts_the_flow_and_a_superuser_may(tenant, secrets_dir, stub):
    mailbox = oauth_mailbox(tenant, secrets_dir, stub)
    operator = make_user("oper", groups=["operator"], tenants=[tenant])
    with pytest.raises(ConsentRefused) as refused:
        services.start_consent(user=operator, mailbox_id=mailbox.pk, session={}, redirect_uri="http://x/cb")
    assert refused.value.status == 403
    root = Client()
    root.force_login(make_user("root", is_superuser=True))
    sign_in(start(root, mailbox))


def test_an_env_credentials_reference_is_refused_with_a_clear_message(tenant, secrets_dir, stub):
    mailbox = oauth_mailbox(tenant, secrets_dir, stub)
    Mailbox.objects.filter(pk=mailbox.pk).update(credentials_ref=f"env:MAILROOM_T_{tenant.slug.upper()}_GRAPH")
    response = admin_client("alice", tenant).get(reverse("admin:intake_mailbox_connect", args=[mailbox.pk]))
    text = response.content.decode()
    assert 'id="consent-problem"' in text and "environment variable cannot take tokens that rotate" in text
    assert 'id="consent-continue"' not in text


def test_google_over_imap_asks_for_offline_access_and_a_denial_stores_nothing(tenant, secrets_dir, stub):
    mailbox = oauth_mailbox(
        tenant, secrets_dir, stub, provider="imap", ref_name="imap.json", host="imap.gmail.com", auth="xoauth2"
    )
    client = admin_client("alice", tenant)
    params = start(client, mailbox)
    assert (params["access_type"], params["prompt"], params["scope"]) == (
        "offline",
        "consent",
        "https://mail.google.com/",
    )
    denied = client.get(
        CALLBACK, {"error": "access_denied", "error_description": "The user said no", "state": params["state"]}
    )
    assert denied.status_code == 400 and "Google did not grant access (access_denied" in denied.content.decode()
    assert credentials_of(mailbox) is None and stub.exchanges == []


def test_admins_are_emailed_once_a_week_before_the_credentials_expire(tenant, secrets_dir, stub, smtp_server):
    mailbox = oauth_mailbox(tenant, secrets_dir, stub)
    expires = timezone.now() + timedelta(days=5)
    Mailbox.objects.filter(pk=mailbox.pk).update(oauth_expires_at=expires, oauth_connected_at=timezone.now())
    make_user("alice", groups=["mailroom-admin"], tenants=[tenant])
    make_user("carol", groups=["mailroom-admin"], tenants=[tenant])
    make_user("oper", groups=["operator"], tenants=[tenant])
    make_user("bob", groups=["mailroom-admin"], tenants=[make_tenant("tenant-b")])
    later = oauth_mailbox(tenant, secrets_dir, stub, ref_name="later.json")
    Mailbox.objects.filter(pk=later.pk).update(oauth_expires_at=timezone.now() + timedelta(days=30))

    assert credential_warnings.warn_expiring_credentials() == 1
    assert credential_warnings.warn_expiring_credentials() == 0
    [email] = smtp_server.messages
    assert sorted(email["To"].split(", ")) == ["alice@staff.test", "carol@staff.test"]
    assert mailbox.slug in email["Subject"] and f"/admin/intake/mailbox/{mailbox.pk}/change/" in email.get_content()
    note = Notification.objects.get(kind=Notification.Kind.CREDENTIALS)
    assert note.mailbox_id == mailbox.pk
    mailbox.refresh_from_db()
    assert mailbox.oauth_warned_at is not None
    assert MailboxAudit.objects.filter(mailbox=mailbox, kind=MailboxAudit.Kind.CREDENTIALS_EXPIRING).count() == 1

    # A new consent (a new expiry, warning cleared) is warned about again when it nears.
    Mailbox.objects.filter(pk=mailbox.pk).update(oauth_expires_at=expires + timedelta(days=1), oauth_warned_at=None)
    assert credential_warnings.warn_expiring_credentials() == 1 and len(smtp_server.messages) == 2


def test_expiring_and_refused_credentials_show_on_the_mailbox_the_dashboard_and_the_queue(tenant, secrets_dir, stub):
    expiring = oauth_mailbox(tenant, secrets_dir, stub)
    Mailbox.objects.filter(pk=expiring.pk).update(
        oauth_expires_at=timezone.now() + timedelta(days=3), oauth_connected_at=timezone.now(), oauth_scopes="Mail.Read"
    )
    refused = oauth_mailbox(tenant, secrets_dir, stub, ref_name="other.json")
    Mailbox.objects.filter(pk=refused.pk).update(health=Mailbox.Health.CREDENTIALS_INVALID)
    operator = Client()
    operator.force_login(make_user("oper", groups=["operator"], tenants=[tenant]))
    client = admin_client("alice", tenant)
    for viewer, url in (
        (operator, reverse("admin:reconciliation_dashboard")),
        (operator, reverse("admin:reconciliation_recoveryitem_changelist")),
        (client, reverse("admin:intake_mailbox_changelist")),
    ):
        text = viewer.get(url).content.decode()
        assert 'id="credentials-warning"' in text, url
        assert f">{expiring.slug}</a>" in text and "credentials expire soon" in text
        assert f">{refused.slug}</a>" in text and "credentials refused by the provider" in text
    page = client.get(reverse("admin:intake_mailbox_change", args=[expiring.pk])).content.decode()
    assert 'class="oauth-state oauth-state-expiring"' in page
    page = client.get(reverse("admin:intake_mailbox_change", args=[refused.pk])).content.decode()
    assert 'class="oauth-state oauth-state-refused"' in page

    stranger = Client()
    stranger.force_login(make_user("bob", groups=["operator", "mailroom-admin"], tenants=[make_tenant("tenant-b")]))
    text = stranger.get(reverse("admin:reconciliation_dashboard")).content.decode()
    assert 'id="dash-summary"' in text
    assert 'id="credentials-warning"' not in text and expiring.slug not in text


def get_user(username):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(username=username)


def test_the_token_exchange_goes_through_the_egress_guard(tenant, secrets_dir, stub, settings):
    mailbox = oauth_mailbox(tenant, secrets_dir, stub)
    client = admin_client("alice", tenant)
    answer = sign_in(start(client, mailbox))
    settings.MAILROOM_EGRESS_ALLOWED_NETWORKS = ""  # loopback is no longer reachable for tenant URLs
    response = client.get(CALLBACK, answer)
    assert response.status_code == 400
    assert "The token endpoint may not be reached: token_url: refused" in response.content.decode()
    assert stub.exchanges == [] and credentials_of(mailbox) is None


def test_an_unbound_platform_reference_is_no_client_secret_and_a_grant_without_refresh_token_stores_nothing(
    tenant, secrets_dir, stub, settings
):
    settings.MAILROOM_PLATFORM_SECRET_REFS = [*settings.MAILROOM_PLATFORM_SECRET_REFS, "env:MAILROOM_APP_SECRET"]
    mailbox = oauth_mailbox(tenant, secrets_dir, stub, client_secret_ref="env:MAILROOM_APP_SECRET")
    text = (
        admin_client("root", None, is_superuser=True)
        .get(reverse("admin:intake_mailbox_connect", args=[mailbox.pk]))
        .content.decode()
    )
    assert "bound to no row" in text and 'id="consent-continue"' not in text

    Mailbox.objects.filter(pk=mailbox.pk).update(settings={**mailbox.settings, "client_secret_ref": ""})
    stub.client_secret, stub.issue_refresh_token = "", False
    client = admin_client("alice", tenant)
    response = client.get(CALLBACK, sign_in(start(client, mailbox)))
    assert response.status_code == 400 and "granted no refresh token" in response.content.decode()
    assert "client_secret" not in stub.exchanges[0] and credentials_of(mailbox) is None


def test_reconnecting_a_mailbox_whose_blob_holds_the_app_secret_sends_and_keeps_it(tenant, secrets_dir, stub):
    mailbox = oauth_mailbox(tenant, secrets_dir, stub)
    mailbox.settings = {k: v for k, v in mailbox.settings.items() if k != "client_secret_ref"}
    mailbox.save(update_fields=["settings"])
    path = mailbox.credentials_ref.removeprefix("file:")
    with open(path, "w") as handle:  # what a tenant wrote by hand before the console could connect
        json.dump(
            {"client_id": "consent-app", "client_secret": CLIENT_SECRET, "refresh_token": "revoked-long-ago"}, handle
        )
    client = admin_client("alice", tenant)

    response = client.get(CALLBACK, sign_in(start(client, mailbox)))

    assert response.status_code == 302
    [exchange] = stub.exchanges
    assert exchange["client_secret"] == CLIENT_SECRET, "a confidential client's exchange carries its secret"
    assert credentials_of(mailbox) == {
        "client_id": "consent-app",
        "client_secret": CLIENT_SECRET,
        "refresh_token": stub.issued[0]["refresh_token"],
    }

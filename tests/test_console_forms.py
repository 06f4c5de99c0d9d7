"""Forms that refuse nonsense: mailbox settings per provider, allowed recipients as lines, literal help texts,
https for external desks, a warning for a secret that does not resolve, a reason for every pause, API tokens in
the console, tags as words. Each refusal is checked through the admin and through the service or the API."""

import io
import json
from datetime import timedelta

import pytest
import requests
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from intake.models import Mailbox
from intake.providers.settings_schema import settings_errors
from intake.secrets import env_prefix
from reconciliation import services
from reconciliation.models import ApiToken
from tests.factories import make_destination
from tests.support.api import API, api, assert_problem
from tests.support.users import make_user
from ticketing.destinations import configuration_errors
from ticketing.models import Destination, Ticket

MAILBOX_ADD = "/admin/intake/mailbox/add/"
PAUSES_URL = "/admin/reconciliation/pauseswitch/"
TOKENS_URL = "/admin/reconciliation/apitoken/"
BAD_IMAP = {"port": "abc", "colour": "blue", "host": "imap.example.com"}


@pytest.fixture
def tenant_admin(tenant):
    return make_user("olga", groups=["mailroom-admin", "operator"], tenants=[tenant])


def console(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def mailbox_form(tenant, **changes) -> dict:
    data = {
        "tenant": tenant.pk,
        "slug": "imap-desk",
        "address": "imap-desk@acme.test",
        "provider": "imap",
        "webhook_secret_ref": "",
        "credentials_ref": "",
        "settings": json.dumps({"host": "imap.example.com"}),
        "allowed_recipients": "",
    }
    data.update(changes)
    return data


def page_errors(response) -> str:
    assert response.status_code == 200, response.status_code  # the form again, nothing saved
    return response.content.decode()


# --- 1. settings schemas ------------------------------------------------------------------------------------


def test_imap_settings_of_the_wrong_type_or_unknown_name_are_refused_key_by_key():
    errors = settings_errors("imap", BAD_IMAP)
    assert errors["port"] == ["must be a whole number from 1 to 65535"]
    assert errors["colour"][0].startswith("is not a setting of imap (known: ") and "folder" in errors["colour"][0]
    assert settings_errors("imap", {"host": "imap.example.com", "port": 993, "ssl": True, "folder": "INBOX"}) == {}
    assert settings_errors("imap", {"host": "h.example.com", "port": 70000})["port"]
    assert "needs ssl: false" in settings_errors("imap", {"host": "h.example.com", "starttls": True})["starttls"][0]
    assert settings_errors("gmail", {"push_auth": "magic"})["push_auth"] == ["must be one of oidc, url_token"]
    assert settings_errors("raw", {"attachment_policy": {"max_bytes": "big"}})["attachment_policy"]


def test_the_admin_shows_each_bad_imap_setting_and_saves_nothing(tenant, tenant_admin):
    page = page_errors(console(tenant_admin).post(MAILBOX_ADD, mailbox_form(tenant, settings=json.dumps(BAD_IMAP))))
    assert "port: must be a whole number from 1 to 65535" in page
    assert "colour: is not a setting of imap (known: " in page
    assert not Mailbox.objects.filter(slug="imap-desk").exists()


def test_the_api_refuses_bad_mailbox_settings_as_problem_json(tenant, tenant_admin):
    body = assert_problem(
        api(tenant_admin).post(
            f"{API}/mailboxes/",
            {
                "tenant": "acme",
                "slug": "imap-desk",
                "address": "imap-desk@acme.test",
                "provider": "imap",
                "settings": BAD_IMAP,
            },
            format="json",
        ),
        400,
    )
    messages = body["errors"]["settings"]
    assert "port: must be a whole number from 1 to 65535" in messages
    assert any(m.startswith("colour: is not a setting of imap") for m in messages)
    assert not Mailbox.objects.filter(slug="imap-desk").exists()
    created = api(tenant_admin).post(
        f"{API}/mailboxes/",
        {
            "tenant": "acme",
            "slug": "imap-desk",
            "address": "imap-desk@acme.test",
            "provider": "imap",
            "settings": {"host": "imap.example.com", "port": 993},
        },
        format="json",
    )
    assert created.status_code == 201, created.content


def test_a_stored_mailbox_with_settings_now_refused_still_loads_and_can_be_paused(mailbox, tenant_admin):
    Mailbox.objects.filter(pk=mailbox.pk).update(settings={"colour": "blue"})  # saved before the schema
    admin = console(tenant_admin)
    assert admin.get(f"/admin/intake/mailbox/{mailbox.pk}/change/").status_code == 200
    assert admin.get("/admin/intake/mailbox/").status_code == 200
    assert api(tenant_admin).get(f"{API}/mailboxes/{mailbox.pk}/").json()["settings"] == {"colour": "blue"}
    assert services.do_set_mailbox_pause(tenant_admin, mailbox.pk, True, reason="legacy row") == 0


# --- 2. allowed recipients as lines ---------------------------------------------------------------------------


def test_allowed_recipients_are_typed_one_per_line_and_each_is_checked(tenant, tenant_admin):
    admin = console(tenant_admin)
    bad_lines = "help@acme.test\nnot an address"
    refused = page_errors(admin.post(MAILBOX_ADD, mailbox_form(tenant, allowed_recipients=bad_lines)))
    assert "line 2 (not an address): not an email address" in refused
    response = admin.post(MAILBOX_ADD, mailbox_form(tenant, allowed_recipients="help@acme.test\r\n\r\n@acme.test\n"))
    assert response.status_code == 302, response.content.decode()[:3000]
    box = Mailbox.objects.get(slug="imap-desk")
    assert box.allowed_recipients == ["help@acme.test", "@acme.test"]
    page = admin.get(f"/admin/intake/mailbox/{box.pk}/change/").content.decode()
    assert "help@acme.test\n@acme.test</textarea>" in page and "[&quot;help@acme.test" not in page


# --- 3. help texts render literally -------------------------------------------------------------------------


def test_placeholders_in_help_texts_render_as_text_not_as_tags(tenant, tenant_admin):
    admin = console(tenant_admin)
    destination_page = admin.get("/admin/ticketing/destination/add/").content.decode()
    assert "env:MAILROOM_T_&lt;TENANT&gt;_&lt;NAME&gt;" in destination_page
    assert "env:MAILROOM_T_<TENANT>" not in destination_page
    mailbox_page = admin.get(MAILBOX_ADD).content.decode()
    assert "env:MAILROOM_T_&lt;TENANT&gt;_&lt;NAME&gt;" in mailbox_page and "&amp;lt;" not in mailbox_page


# --- 4. https for external desks -----------------------------------------------------------------------------


def test_an_external_desk_needs_https_unless_its_host_is_allow_listed(settings):
    settings.MAILROOM_EGRESS_ALLOWED_NETWORKS = ["10.20.0.0/16"]
    refused = configuration_errors("zendesk", "http://acme.zendesk.com", "env:X", {})
    assert refused["base_url"][0].startswith("The base URL must start with https://")
    assert "base_url" not in configuration_errors("zendesk", "https://acme.zendesk.com", "env:X", {})
    assert "base_url" not in configuration_errors("zendesk", "http://10.20.1.2", "env:X", {})  # allow-listed
    assert "base_url" not in configuration_errors("builtin", "", "", {})


def test_the_admin_and_the_api_refuse_a_plain_http_zendesk(tenant, tenant_admin, settings):
    settings.MAILROOM_EGRESS_ALLOWED_NETWORKS = []
    ref = f"env:{env_prefix('acme')}ZENDESK"
    page = page_errors(
        console(tenant_admin).post(
            "/admin/ticketing/destination/add/",
            {
                "tenant": tenant.pk,
                "slug": "zd",
                "kind": "zendesk",
                "base_url": "http://acme.zendesk.com",
                "credentials_ref": ref,
                "settings": "{}",
            },
        )
    )
    assert "The base URL must start with https://" in page
    body = assert_problem(
        api(tenant_admin).post(
            f"{API}/destinations/",
            {
                "tenant": "acme",
                "slug": "zd",
                "kind": "zendesk",
                "base_url": "http://acme.zendesk.com",
                "credentials_ref": ref,
                "settings": {},
            },
            format="json",
        ),
        400,
    )
    assert body["errors"]["base_url"][0].startswith("The base URL must start with https://")
    assert not Destination.objects.filter(slug="zd").exists()


# --- 5. a secret that does not resolve now ---------------------------------------------------------------------


def test_a_missing_secret_is_saved_with_a_warning_that_names_the_reference_not_the_value(
    tenant, tenant_admin, monkeypatch
):
    ref = f"env:{env_prefix('acme')}IMAP_PASSWORD"
    admin = console(tenant_admin)
    response = admin.post(MAILBOX_ADD, mailbox_form(tenant, credentials_ref=ref), follow=True)
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert Mailbox.objects.filter(slug="imap-desk", credentials_ref=ref).exists()
    assert any(ref in m and "does not resolve now" in m for m in said), said

    monkeypatch.setenv(ref.removeprefix("env:"), "s3cret-value-42")
    box = Mailbox.objects.get(slug="imap-desk")
    response = admin.post(
        f"/admin/intake/mailbox/{box.pk}/change/", mailbox_form(tenant, credentials_ref=ref), follow=True
    )
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert not any("does not resolve" in m for m in said), said
    assert "s3cret-value-42" not in response.content.decode()


# --- 6. a reason for every pause ---------------------------------------------------------------------------------


def test_a_pause_without_a_reason_is_refused_by_the_service_and_the_page(mailbox, tenant_admin):
    with pytest.raises(ValidationError):
        services.do_set_mailbox_pause(tenant_admin, mailbox.pk, True, reason="  ")
    with pytest.raises(TypeError):
        services.do_set_mailbox_pause(tenant_admin, mailbox.pk, True, "positional")  # keyword-only
    assert not Mailbox.objects.get(pk=mailbox.pk).paused
    admin = console(tenant_admin)
    response = admin.post(PAUSES_URL, {"target": "mailbox", "id": mailbox.pk, "paused": "1", "reason": ""}, follow=True)
    assert "Nothing paused." in response.content.decode()
    assert not Mailbox.objects.get(pk=mailbox.pk).paused
    assert services.do_set_mailbox_pause(tenant_admin, mailbox.pk, False) == 0  # a resume needs none


def test_the_reason_is_audited_and_shown_next_to_each_paused_thing(mailbox, tenant, tenant_admin):
    admin = console(tenant_admin)
    destination = Destination.objects.get(tenant=tenant, slug="builtin")
    for target, pk, why in (
        ("mailbox", mailbox.pk, "desk migration"),
        ("tenant", tenant.pk, "audit week"),
        ("destination", destination.pk, "token rotation"),
    ):
        assert admin.post(PAUSES_URL, {"target": target, "id": pk, "paused": "1", "reason": why}).status_code == 302
    entry = LogEntry.objects.filter(user=tenant_admin, object_id=str(mailbox.pk), content_type__model="mailbox").latest(
        "pk"
    )
    assert entry.change_message == "mailbox paused; reason: desk migration"
    assert Destination.objects.get(pk=destination.pk).paused_reason == "token rotation"
    page = admin.get(PAUSES_URL).content.decode()
    for why in ("desk migration", "audit week", "token rotation"):
        assert f": {why}" in page
    assert "paused by olga" in page and "ago" in page


def test_the_global_pause_needs_a_reason_too(db):
    root = make_user("root", is_superuser=True)
    with pytest.raises(ValidationError):
        services.do_set_global_pause(root, True)
    services.do_set_global_pause(root, True, reason="platform upgrade")
    page = console(root).get(PAUSES_URL).content.decode()
    assert "paused by root" in page and "platform upgrade" in page
    services.do_set_global_pause(root, False)


# --- 7. API tokens in the console ---------------------------------------------------------------------------------


def create_token(client, **fields) -> tuple[str, object]:
    response = client.post(f"{TOKENS_URL}add/", {"name": "nightly export", "expires": "30", **fields})
    assert response.status_code == 200, response.status_code
    page = response.content.decode()
    start = page.index('id="new-token">') + len('id="new-token">')
    return page[start : page.index("</code>", start)], response


def test_a_token_made_in_the_console_is_shown_once_works_and_is_revoked_by_its_owner(mailbox, tenant_admin):
    admin = console(tenant_admin)
    token, response = create_token(admin)
    assert token.startswith("mr_") and "no-store" in response["Cache-Control"]
    row = ApiToken.objects.get(user=tenant_admin)
    assert row.name == "nightly export" and row.key_hash != token and token not in str(row.__dict__)
    assert timedelta(days=29) < row.expires_at - timezone.now() <= timedelta(days=30)
    listing = admin.get(TOKENS_URL).content.decode()
    assert token not in listing and f"{row.prefix}…" in listing and "nightly export" in listing
    assert token not in admin.get(f"{TOKENS_URL}{row.pk}/change/").content.decode()

    reader = Client(HTTP_AUTHORIZATION=f"Token {token}")
    assert reader.get(f"{API}/mailboxes/").status_code == 200
    assert admin.post(f"{TOKENS_URL}{row.pk}/revoke/").status_code == 302
    assert_problem(reader.get(f"{API}/mailboxes/"), 401)
    assert LogEntry.objects.filter(object_id=str(row.pk), change_message__contains="revoked").exists()


def test_only_the_owner_or_a_superuser_revokes_and_only_a_superuser_issues_for_others(tenant, tenant_admin):
    other = make_user("oscar", groups=["operator"], tenants=[tenant])
    theirs = services.do_issue_api_token(other, name="theirs")
    row = ApiToken.objects.get(user=other)
    admin = console(tenant_admin)
    assert admin.post(f"{TOKENS_URL}{row.pk}/revoke/").status_code == 404  # not theirs to see
    assert f"{row.prefix}" not in admin.get(TOKENS_URL).content.decode()
    with pytest.raises(ApiToken.DoesNotExist):
        services.do_revoke_api_token(tenant_admin, token_id=row.pk)
    with pytest.raises(PermissionDenied):
        services.do_issue_api_token(tenant_admin, owner=other, name="for oscar")
    assert ApiToken.objects.filter(user=other).count() == 1 and theirs

    root = make_user("root", is_superuser=True)
    token, _ = create_token(console(root), owner=other.pk, expires="never")
    assert ApiToken.objects.get(key_hash=services.api_tokens.hash_token(token)).user == other
    services.do_revoke_api_token(root, token_id=row.pk)
    assert not ApiToken.objects.filter(pk=row.pk).exists()


def test_an_expired_token_is_refused_by_the_running_api(live_server, mailbox, tenant_admin):
    token = services.do_issue_api_token(tenant_admin, name="short", expires_in_days=1)
    url = f"{live_server.url}{API}/mailboxes/"
    assert requests.get(url, headers={"Authorization": f"Token {token}"}, timeout=10).status_code == 200
    ApiToken.objects.filter(user=tenant_admin).update(expires_at=timezone.now() - timedelta(seconds=1))
    refused = requests.get(url, headers={"Authorization": f"Token {token}"}, timeout=10)
    assert refused.status_code == 401 and refused.json()["detail"] == "Invalid token."


def test_the_command_names_a_token_and_sets_its_expiry(tenant_admin):
    out = io.StringIO()
    call_command("api_token", "olga", "--name", "ci", "--expires-in-days", "7", stdout=out)
    row = ApiToken.objects.get(user=tenant_admin)
    assert out.getvalue().strip().startswith(row.prefix) and row.name == "ci"
    assert timedelta(days=6) < row.expires_at - timezone.now() <= timedelta(days=7)


# --- 8. tags as words ------------------------------------------------------------------------------------------


def test_the_ticket_list_shows_tags_as_chips_not_json(tenant):
    destination = make_destination(tenant)
    Ticket.objects.create(
        destination=destination,
        subject="Refund",
        idempotency_key="k" * 64,
        external_ref="r1",
        tags=["billing", "needs-approval"],
        created_at=timezone.now(),
    )
    page = console(make_user("root", is_superuser=True)).get("/admin/ticketing/ticket/").content.decode()
    assert '<span class="tag-chip">billing</span><span class="tag-chip">needs-approval</span>' in page
    assert '["billing"' not in page and "[&quot;billing" not in page


def test_the_api_pauses_through_the_service_with_a_reason(mailbox, tenant_admin):
    client = api(tenant_admin)
    body = assert_problem(client.patch(f"{API}/mailboxes/{mailbox.pk}/", {"paused": True}, format="json"), 400)
    assert body["errors"]["pause_reason"] == [services.REASON_NEEDED]
    assert not Mailbox.objects.get(pk=mailbox.pk).paused
    answer = client.patch(
        f"{API}/mailboxes/{mailbox.pk}/", {"paused": True, "pause_reason": "desk migration"}, format="json"
    )
    assert answer.status_code == 200 and answer.json()["paused"] is True and "pause_reason" not in answer.json()
    entry = LogEntry.objects.filter(user=tenant_admin, object_id=str(mailbox.pk)).latest("pk")
    assert entry.change_message == "mailbox paused; reason: desk migration"
    assert client.patch(f"{API}/mailboxes/{mailbox.pk}/", {"paused": False}, format="json").json()["paused"] is False
    operator = make_user(
        "oscar", groups=["operator"], perms=["intake.change_mailbox", "intake.view_mailbox"], tenants=[mailbox.tenant]
    )
    assert_problem(
        api(operator).patch(f"{API}/mailboxes/{mailbox.pk}/", {"paused": True, "pause_reason": "x"}, format="json"), 403
    )
    assert not Mailbox.objects.get(pk=mailbox.pk).paused

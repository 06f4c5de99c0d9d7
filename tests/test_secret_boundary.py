"""Issue 20, finding 2: a tenant admin must never make a row of theirs use a platform secret (the AI key, another
tenant's webhook secret listed as platform), through the REST API, the admin or "Test connection", nor redirect a
row that holds one (intake.secret_policy); and a platform reference resolves only for the rows it is bound to
(intake.secrets, `MAILROOM_PLATFORM_SECRET_REFS` entries `<ref>=<owner>|...`).

The platform list here binds each reference to single rows (no `*`); a real HTTP server on 127.0.0.1 counts
every request it gets, so "sends nothing" is counted, and one control shows it does receive what is bound.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.core import checks
from django.test import Client

from intake.domains import verify_domain
from intake.models import Mailbox, SecretResolution
from intake.secret_policy import PLATFORM, SecretChangeRefused, check_secret_change, origin, stored_values
from intake.secrets import SecretRefused, parse_platform_refs, resolve_secret
from reconciliation.services.setup import PLATFORM_REFS_VAR, ensure_platform_ref
from tests.factories import make_destination, make_mailbox, make_tenant
from tests.support.api import API, api, assert_problem
from tests.support.users import make_user
from ticketing.models import Destination

AI_KEY_REF = "env:MAILROOM_BOUNDARY_AI_KEY"
GLOBEX_HOOK_REF = "env:MAILROOM_BOUNDARY_GLOBEX_HOOK"  # globex's webhook secret, listed as a platform reference
ACME_DESK_REF = "env:MAILROOM_BOUNDARY_ACME_DESK"  # a platform credential lent to acme's desk only
OWN_DESK_REF = "env:MAILROOM_T_ACME_DESK"  # in acme's own scope
SECRETS = {
    AI_KEY_REF: "sk-the-ai-key",
    GLOBEX_HOOK_REF: "globex-webhook-secret",
    ACME_DESK_REF: "agent@acme.test/token:platform-desk-token",
    OWN_DESK_REF: "agent@acme.test/token:own",
}
PLATFORM_ONLY = "only a platform operator (superuser) may use a platform secret reference"
ATTACKER_URL = "https://collector.attacker.example"  # where the attacker wants the secret sent


class CountingServer:
    """A real HTTP server on 127.0.0.1 that answers every request as Zendesk's /users/me does, and keeps what
    it was sent (method, path, Authorization)."""

    def __init__(self):
        self.requests: list[tuple[str, str, str]] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                received.append((self.command, self.path, self.headers.get("Authorization", "")))
                body = json.dumps({"user": {"id": 7, "role": "admin"}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = _answer

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self):
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def collector():
    server = CountingServer()
    yield server
    server.close()


@pytest.fixture
def rig(tenant, settings, monkeypatch):
    """acme and globex with a mailbox each, acme's desk holding its bound platform credential, the tenant admin
    ann (mailroom-admin of acme) and the platform list binding each reference to single rows."""
    settings.MAILROOM_AI_API_KEY_REF = AI_KEY_REF
    settings.MAILROOM_PLATFORM_SECRET_REFS = [
        AI_KEY_REF,
        f"{GLOBEX_HOOK_REF}=mailbox:globex-support",
        f"{ACME_DESK_REF}=destination:acme/desk",
    ]
    for ref, value in SECRETS.items():
        monkeypatch.setenv(ref.removeprefix("env:"), value)
    globex = make_tenant(slug="globex")
    for owner, domain in ((tenant, "acme.test"), (globex, "globex.test")):
        verify_domain(tenant=owner, domain=domain, verified_by="tests")
    rows = {
        "globex": globex,
        "globex_mailbox": make_mailbox(
            globex, slug="globex-support", address="support@globex.test", webhook_secret_ref=GLOBEX_HOOK_REF
        ),
        "mailbox": make_mailbox(
            tenant, slug="acme-support", address="support@acme.test", webhook_secret_ref="env:MAILROOM_T_ACME_HOOK"
        ),
        "desk": make_destination(
            tenant,
            slug="desk",
            kind="zendesk",
            is_default=False,
            base_url="https://acme.zendesk.example",
            credentials_ref=ACME_DESK_REF,
        ),
        "own_desk": make_destination(
            tenant,
            slug="own-desk",
            kind="zendesk",
            is_default=False,
            base_url="https://acme.zendesk.example",
            credentials_ref=OWN_DESK_REF,
        ),
        "ann": make_user("ann", groups=["mailroom-admin"], tenants=[tenant]),
        "root": get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests-only"),
    }
    return type("Rig", (), rows)


def snapshot(row) -> dict:
    return type(row).objects.filter(pk=row.pk).values().get()


# --- the REST API ------------------------------------------------------------------------------------------


def test_api_a_tenant_admin_cannot_point_a_destination_at_a_platform_secret(rig):
    client = api(rig.ann)
    before = snapshot(rig.own_desk)
    for ref in (AI_KEY_REF, GLOBEX_HOOK_REF, ACME_DESK_REF):
        created = client.post(
            f"{API}/destinations/",
            {"tenant": "acme", "slug": "exfil", "kind": "zendesk", "base_url": ATTACKER_URL, "credentials_ref": ref},
            format="json",
        )
        body = assert_problem(created, 400)
        assert body["detail"].startswith(f"credentials_ref: {PLATFORM_ONLY}"), (ref, body)
        for change in ({"credentials_ref": ref}, {"credentials_ref": ref, "base_url": ATTACKER_URL}):
            body = assert_problem(client.patch(f"{API}/destinations/{rig.own_desk.pk}/", change, format="json"), 400)
            assert PLATFORM_ONLY in body["errors"]["credentials_ref"][0], (ref, change)
    assert not Destination.objects.filter(slug="exfil").exists()
    assert snapshot(rig.own_desk) == before


def test_api_a_tenant_admin_cannot_point_a_mailbox_at_a_platform_secret(rig):
    client = api(rig.ann)
    before = snapshot(rig.mailbox)
    for field in ("webhook_secret_ref", "credentials_ref"):
        for ref in (AI_KEY_REF, GLOBEX_HOOK_REF):
            created = client.post(
                f"{API}/mailboxes/",
                {"tenant": "acme", "slug": "sales", "address": "sales@acme.test", field: ref},
                format="json",
            )
            body = assert_problem(created, 400)
            assert body["detail"].startswith(f"{field}: {PLATFORM_ONLY}"), (field, ref, body)
            body = assert_problem(client.patch(f"{API}/mailboxes/{rig.mailbox.pk}/", {field: ref}, format="json"), 400)
            assert PLATFORM_ONLY in body["errors"][field][0]
    assert not Mailbox.objects.filter(slug="sales").exists()
    assert snapshot(rig.mailbox) == before


def test_api_a_row_holding_a_platform_secret_cannot_be_redirected_by_a_tenant_admin(rig):
    client = api(rig.ann)
    before = snapshot(rig.desk)
    url = f"{API}/destinations/{rig.desk.pk}/"
    for change in (
        {"base_url": ATTACKER_URL},
        {"base_url": ATTACKER_URL, "credentials_ref": ACME_DESK_REF},
        {"kind": "rest"},
        {"settings": {"agent_email": "x@attacker.example"}},
        {"slug": "renamed"},
    ):
        body = assert_problem(client.patch(url, change, format="json"), 400)
        field = next(iter(set(change) - {"credentials_ref"}))
        assert body["errors"][field] == [
            f"only a platform operator (superuser) may change {field} of a destination that uses a platform secret "
            "reference (credentials_ref). Replace that reference with one of the tenant's own first."
        ], change
    assert snapshot(rig.desk) == before
    # What does not decide where the secret goes stays the tenant admin's; so does replacing the reference.
    assert client.patch(url, {"paused": True, "pause_reason": "rotation"}, format="json").status_code == 200
    moved = client.patch(url, {"credentials_ref": OWN_DESK_REF, "base_url": "https://desk.acme.example"}, format="json")
    assert moved.status_code == 200, moved.content
    assert Destination.objects.get(pk=rig.desk.pk).credentials_ref == OWN_DESK_REF

    # A mailbox holding a platform webhook secret (globex's own admin, on globex's mailbox).
    globex_admin = make_user("gus", groups=["mailroom-admin"], tenants=[rig.globex])
    mailbox_url = f"{API}/mailboxes/{rig.globex_mailbox.pk}/"
    held = snapshot(rig.globex_mailbox)
    for change in ({"provider": "imap"}, {"settings": {"host": "imap.attacker.example"}}):
        body = assert_problem(api(globex_admin).patch(mailbox_url, change, format="json"), 400)
        assert "uses a platform secret reference (webhook_secret_ref)" in body["errors"][next(iter(change))][0]
    assert snapshot(rig.globex_mailbox) == held


def test_api_a_tenant_admin_cannot_name_a_platform_secret_as_an_oauth_client_secret(rig, settings):
    # settings.client_secret_ref is sent to the token URL the settings name: a reference like the fields.
    bound = "env:MAILROOM_PLATFORM_OAUTH_APP"
    settings.MAILROOM_PLATFORM_SECRET_REFS = [*settings.MAILROOM_PLATFORM_SECRET_REFS, f"{bound}=mailbox:acme-support"]
    client, url = api(rig.ann), f"{API}/mailboxes/{rig.mailbox.pk}/"
    before = snapshot(rig.mailbox)
    for ref in (AI_KEY_REF, GLOBEX_HOOK_REF, bound):
        body = assert_problem(
            client.patch(
                url,
                {
                    "provider": "graph",
                    "settings": {"client_id": "app", "token_url": ATTACKER_URL, "client_secret_ref": ref},
                },
                format="json",
            ),
            400,
        )
        assert body["errors"]["settings"][0].startswith(f"client_secret_ref: {PLATFORM_ONLY}"), (ref, body)
    assert snapshot(rig.mailbox) == before

    # Set by a platform operator, it locks the settings (the token URL) against the tenant admin.
    root = api(rig.root)
    assert (
        root.patch(
            url, {"provider": "graph", "settings": {"client_id": "app", "client_secret_ref": bound}}, format="json"
        ).status_code
        == 200
    )
    body = assert_problem(
        client.patch(
            url,
            {"settings": {"client_id": "app", "client_secret_ref": bound, "token_url": ATTACKER_URL}},
            format="json",
        ),
        400,
    )
    assert "uses a platform secret reference (settings.client_secret_ref)" in body["errors"]["settings"][0]
    replaced = client.patch(
        url, {"settings": {"client_id": "app", "token_url": "https://login.acme.example/t"}}, format="json"
    )
    assert replaced.status_code == 200, replaced.content  # dropping the platform secret frees the settings


def test_api_moving_base_url_to_another_host_needs_credentials_ref_in_the_same_request(rig):
    client = api(rig.ann)
    url = f"{API}/destinations/{rig.own_desk.pk}/"
    body = assert_problem(client.patch(url, {"base_url": "https://collector.example"}, format="json"), 400)
    assert body["errors"]["credentials_ref"][0].startswith(
        "base_url moves to another host (acme.zendesk.example -> collector.example): enter credentials_ref again"
    )
    assert Destination.objects.get(pk=rig.own_desk.pk).base_url == "https://acme.zendesk.example"
    # The same host, another path: the credentials go where they went.
    assert client.patch(url, {"base_url": "https://acme.zendesk.example/v2"}, format="json").status_code == 200
    moved = client.patch(url, {"base_url": "https://collector.example", "credentials_ref": OWN_DESK_REF}, format="json")
    assert moved.status_code == 200, moved.content
    [entry] = LogEntry.objects.filter(object_id=str(rig.own_desk.pk), change_message__contains="collector.example")
    assert entry.user == rig.ann  # audited as the admin's change is
    # What the standard library and requests read differently is another host to both.
    assert origin("https://evil.example\\@acme.zendesk.example/") != origin("https://acme.zendesk.example/")
    assert origin("https://user@acme.zendesk.example/") != origin("https://acme.zendesk.example/")
    assert origin("HTTPS://ACME.zendesk.example/x") == origin("https://acme.zendesk.example/y")


def test_api_a_superuser_may_do_all_but_only_for_rows_a_reference_is_bound_to(rig, settings):
    client = api(rig.root)
    url = f"{API}/destinations/{rig.desk.pk}/"
    assert client.patch(url, {"base_url": "https://desk2.acme.example"}, format="json").status_code == 200
    settings.MAILROOM_PLATFORM_SECRET_REFS = [
        *settings.MAILROOM_PLATFORM_SECRET_REFS,
        f"{ACME_DESK_REF}=destination:acme/second",
    ]
    created = client.post(
        f"{API}/destinations/",
        {
            "tenant": "acme",
            "slug": "second",
            "kind": "zendesk",
            "base_url": "https://acme.zendesk.example",
            "credentials_ref": ACME_DESK_REF,
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    # Not bound to the row: refused even for a superuser (it would never resolve), the binding named.
    for ref, problem in (
        (AI_KEY_REF, "the AI key (MAILROOM_AI_API_KEY_REF) resolves only for the platform"),
        (GLOBEX_HOOK_REF, "this platform secret reference is not bound to destination:acme/own-desk"),
    ):
        body = assert_problem(
            client.patch(f"{API}/destinations/{rig.own_desk.pk}/", {"credentials_ref": ref}, format="json"), 400
        )
        assert body["errors"]["credentials_ref"][0].startswith(problem), body
        assert f"({ref}=destination:acme/own-desk), set by a platform operator" in body["errors"]["credentials_ref"][0]


# --- "Test connection" ---------------------------------------------------------------------------------------


def test_test_connection_on_a_row_forced_to_a_platform_secret_sends_nothing(rig, collector):
    forced = []
    for slug, ref in (("forced-ai", AI_KEY_REF), ("forced-hook", GLOBEX_HOOK_REF), ("forced-desk", ACME_DESK_REF)):
        row = make_destination(
            rig.desk.tenant,
            slug=slug,
            kind="zendesk",
            is_default=False,
            base_url=collector.url,
            credentials_ref=OWN_DESK_REF,
        )
        Destination.objects.filter(pk=row.pk).update(credentials_ref=ref)  # past clean() and the rule
        forced.append(row.pk)
    changelist = "/admin/ticketing/destination/"
    for user in (rig.ann, rig.root):  # the binding holds whoever asks
        client = Client()
        client.force_login(user)
        response = client.post(changelist, {"action": "test_connection", "_selected_action": forced}, follow=True)
        assert response.status_code == 200
        page = response.content.decode()
        assert page.count("secret reference refused") == 3, user
        assert not any(value in page for value in SECRETS.values())
    assert collector.requests == []
    refused = SecretResolution.objects.filter(outcome="refused", owner__in=[f"destination:{pk}" for pk in forced])
    assert {row.ref for row in refused} == {AI_KEY_REF, GLOBEX_HOOK_REF, ACME_DESK_REF}
    assert not SecretResolution.objects.filter(outcome="ok").exists()

    # The control: the row the platform credential is bound to does reach the server, with it.
    Destination.objects.filter(pk=rig.desk.pk).update(base_url=collector.url)
    client = Client()
    client.force_login(rig.ann)
    response = client.post(changelist, {"action": "test_connection", "_selected_action": [rig.desk.pk]}, follow=True)
    assert "OK, signed in as Zendesk user 7" in response.content.decode()
    assert [(method, path) for method, path, _ in collector.requests] == [("GET", "/api/v2/users/me.json")]
    assert collector.requests[0][2].startswith("Basic ")


# --- the admin ----------------------------------------------------------------------------------------------


def destination_form(destination, **changes) -> dict:
    return {
        "tenant": destination.tenant_id,
        "slug": destination.slug,
        "kind": destination.kind,
        "base_url": destination.base_url,
        "credentials_ref": destination.credentials_ref,
        "settings": json.dumps(destination.settings),
        "paused_reason": "",
        **changes,
    }


def mailbox_form(mailbox, **changes) -> dict:
    return {
        "tenant": mailbox.tenant_id,
        "slug": mailbox.slug,
        "address": mailbox.address,
        "provider": mailbox.provider,
        "webhook_secret_ref": mailbox.webhook_secret_ref,
        "credentials_ref": mailbox.credentials_ref,
        "settings": json.dumps(mailbox.settings),
        "allowed_recipients": json.dumps(mailbox.allowed_recipients),
        **changes,
    }


def test_admin_a_tenant_admin_who_keeps_a_platform_reference_cannot_change_base_url(rig):
    client = Client()
    client.force_login(rig.ann)
    url = f"/admin/ticketing/destination/{rig.desk.pk}/change/"
    before = snapshot(rig.desk)
    for confirmation in ("", ACME_DESK_REF):  # confirming the reference does not make it the tenant's
        response = client.post(
            url, destination_form(rig.desk, base_url=ATTACKER_URL, confirm_credentials_ref=confirmation)
        )
        assert response.status_code == 200, confirmation  # the form again, with the error
        assert (
            "only a platform operator (superuser) may change base_url of a destination that uses a platform "
            "secret reference (credentials_ref)"
        ) in response.content.decode()
    assert snapshot(rig.desk) == before

    client.force_login(rig.root)
    assert client.post(url, destination_form(rig.desk, base_url=ATTACKER_URL)).status_code == 302
    assert Destination.objects.get(pk=rig.desk.pk).base_url == ATTACKER_URL


def test_admin_a_tenant_admin_cannot_set_a_platform_reference(rig):
    client = Client()
    client.force_login(rig.ann)
    before = snapshot(rig.own_desk)
    for ref in (AI_KEY_REF, GLOBEX_HOOK_REF, ACME_DESK_REF):
        response = client.post(
            f"/admin/ticketing/destination/{rig.own_desk.pk}/change/",
            destination_form(rig.own_desk, credentials_ref=ref),
        )
        assert response.status_code == 200 and PLATFORM_ONLY in response.content.decode(), ref
    assert snapshot(rig.own_desk) == before
    mailbox_before = snapshot(rig.mailbox)
    for field in ("webhook_secret_ref", "credentials_ref"):
        response = client.post(
            f"/admin/intake/mailbox/{rig.mailbox.pk}/change/", mailbox_form(rig.mailbox, **{field: GLOBEX_HOOK_REF})
        )
        assert response.status_code == 200 and PLATFORM_ONLY in response.content.decode(), field
    assert snapshot(rig.mailbox) == mailbox_before
    response = client.post(
        "/admin/intake/mailbox/add/",
        mailbox_form(
            Mailbox(
                tenant=rig.mailbox.tenant,
                slug="sales",
                address="sales@acme.test",
                provider="raw",
                webhook_secret_ref=AI_KEY_REF,
            )
        ),
    )
    assert response.status_code == 200 and PLATFORM_ONLY in response.content.decode()
    assert not Mailbox.objects.filter(slug="sales").exists()


# --- the binding, at resolve time ------------------------------------------------------------------------------


def test_a_reference_bound_to_one_mailbox_is_refused_for_any_other(rig, settings, monkeypatch):
    acme = rig.mailbox.tenant
    other_acme = make_mailbox(acme, slug="acme-sales", address="sales@acme.test")
    globex_other = make_mailbox(rig.globex, slug="globex-sales", address="sales@globex.test")
    assert resolve_secret(GLOBEX_HOOK_REF, tenant=rig.globex, owner=rig.globex_mailbox) == SECRETS[GLOBEX_HOOK_REF]
    for tenant, owner in (
        (rig.globex, globex_other),
        (acme, rig.mailbox),
        (acme, other_acme),
        (acme, rig.globex_mailbox),
    ):  # the last: a row passed with a tenant not its own
        with pytest.raises(SecretRefused):
            resolve_secret(GLOBEX_HOOK_REF, tenant=tenant, owner=owner)
    refused = set(
        SecretResolution.objects.filter(ref=GLOBEX_HOOK_REF, outcome="refused").values_list("owner", flat=True)
    )
    assert refused == {f"mailbox:{row.pk}" for row in (globex_other, rig.mailbox, other_acme, rig.globex_mailbox)}

    # A destination binding names the tenant: the same slug in another tenant is another row.
    globex_desk = make_destination(rig.globex, slug="desk", kind="zendesk", is_default=False)
    assert resolve_secret(ACME_DESK_REF, tenant=acme, owner=rig.desk) == SECRETS[ACME_DESK_REF]
    with pytest.raises(SecretRefused, match="not bound to destination:globex/desk"):
        resolve_secret(ACME_DESK_REF, tenant=rig.globex, owner=globex_desk)
    # tenant:<slug> binds every row of that tenant, and only those.
    settings.MAILROOM_PLATFORM_SECRET_REFS = [f"{ACME_DESK_REF}=tenant:acme"]
    assert resolve_secret(ACME_DESK_REF, tenant=acme, owner=other_acme) == SECRETS[ACME_DESK_REF]
    with pytest.raises(SecretRefused):
        resolve_secret(ACME_DESK_REF, tenant=rig.globex, owner=globex_desk)


def test_the_ai_key_resolves_only_for_the_platform(rig, settings):
    assert resolve_secret(AI_KEY_REF, tenant=None, owner="platform:ai") == SECRETS[AI_KEY_REF]
    settings.MAILROOM_PLATFORM_SECRET_REFS = [f"{AI_KEY_REF}=*"]  # even bound to every row
    for tenant, owner in ((rig.desk.tenant, rig.desk), (rig.desk.tenant, None), (None, rig.desk)):
        with pytest.raises(SecretRefused, match="resolves only for the platform"):
            resolve_secret(AI_KEY_REF, tenant=tenant, owner=owner)
    assert "intake.W005" in {w.id for w in checks.run_checks()}


def test_platform_entries_parse_unambiguously_and_bad_ones_bind_nothing(db, settings):
    parsed = parse_platform_refs(
        [
            " vault:secret/platform/hooks#globex=mailbox:globex-support|tenant:acme ",
            "file:/run/secrets/a=b=",  # a reference with "=": its entry ends with "=" (here: unbound)
            "file:/run/secrets/c=d",  # ... else what follows its last "=" must be owners: "d" is not
            "env:UNBOUND",
            "env:EVERY_ROW=*",
            "vault:secret/x#key|part=destination:acme/desk",
            "vault:secret/x#k=v",  # "v" is not an owner
            "env:NO_OWNER=mailbox:",
            "plain=*",  # not a reference
            "",
        ]
    )
    assert parsed.bindings == {
        "vault:secret/platform/hooks#globex": frozenset({"mailbox:globex-support", "tenant:acme"}),
        "file:/run/secrets/a=b": frozenset({"*"}),
        "env:UNBOUND": frozenset({"*"}),
        "env:EVERY_ROW": frozenset({"*"}),
        "vault:secret/x#key|part": frozenset({"destination:acme/desk"}),
    }
    assert parsed.malformed == ("file:/run/secrets/c=d", "vault:secret/x#k=v", "env:NO_OWNER=mailbox:", "plain=*")

    assert parsed.unbound == frozenset({"file:/run/secrets/a=b", "env:UNBOUND"})

    settings.MAILROOM_PLATFORM_SECRET_REFS = [
        "env:EVERY_ROW=*",
        "env:UNBOUND",
        "env:ONE=mailbox:one",
        "vault:secret/x#k=v",
    ]
    settings.MAILROOM_ENV = "production"
    found = {(w.id, w.msg) for w in checks.run_checks() if w.id in ("intake.W003", "intake.W004")}
    assert found == {
        (
            "intake.W003",
            "MAILROOM_PLATFORM_SECRET_REFS lets 'env:EVERY_ROW' serve every row (unbound or '*') in production",
        ),
        (
            "intake.W003",
            "MAILROOM_PLATFORM_SECRET_REFS lets 'env:UNBOUND' serve every row (unbound or '*') in production",
        ),
        (
            "intake.W004",
            "MAILROOM_PLATFORM_SECRET_REFS entry 'vault:secret/x#k=v' does not parse: it binds nothing "
            "and resolves for nobody",
        ),
    }
    settings.MAILROOM_ENV = "development"
    assert not {w.id for w in checks.run_checks()} & {"intake.W003"}


def test_the_rule_itself_for_commands_and_new_rows(rig):
    desk = Destination.objects.get(pk=rig.desk.pk)
    with pytest.raises(SecretChangeRefused) as refused:
        check_secret_change(
            actor=rig.ann, row=desk, before=stored_values(desk), changes={"base_url": "https://x.example"}
        )
    assert set(refused.value.message_dict) == {"base_url", "credentials_ref"}  # held; and not entered again
    with pytest.raises(SecretChangeRefused):
        check_secret_change(actor=None, row=desk, before=stored_values(desk), changes={"kind": "rest"})  # no actor
    # A management command run by the platform operator, and a superuser, may.
    check_secret_change(actor=PLATFORM, row=desk, before=stored_values(desk), changes={"base_url": "https://x.example"})
    check_secret_change(actor=rig.root, row=Destination(), before=None, changes={"credentials_ref": AI_KEY_REF})


def test_bootstrap_demo_binds_its_webhook_secret_to_the_demo_mailbox(tmp_path, settings, monkeypatch):
    settings.MAILROOM_PLATFORM_SECRET_REFS = []
    env_file = tmp_path / ".env"
    monkeypatch.delenv(PLATFORM_REFS_VAR, raising=False)
    assert ensure_platform_ref(env_file, "env:MAILROOM_DEMO_WEBHOOK_SECRET", "mailbox:demo")
    assert env_file.read_text() == f"{PLATFORM_REFS_VAR}=env:MAILROOM_DEMO_WEBHOOK_SECRET=mailbox:demo\n"
    # The unbound entry an older bootstrap_demo wrote is bound in place.
    env_file.write_text(f"SECRET_KEY=x\n{PLATFORM_REFS_VAR}=env:MAILROOM_DEMO_WEBHOOK_SECRET\n")
    monkeypatch.setenv(PLATFORM_REFS_VAR, "env:MAILROOM_DEMO_WEBHOOK_SECRET")
    assert ensure_platform_ref(env_file, "env:MAILROOM_DEMO_WEBHOOK_SECRET", "mailbox:demo")
    assert env_file.read_text() == f"SECRET_KEY=x\n{PLATFORM_REFS_VAR}=env:MAILROOM_DEMO_WEBHOOK_SECRET=mailbox:demo\n"
    # A list the operator chose otherwise is left alone.
    monkeypatch.setenv(PLATFORM_REFS_VAR, "env:SOMETHING_ELSE")
    assert not ensure_platform_ref(env_file, "env:MAILROOM_DEMO_WEBHOOK_SECRET", "mailbox:demo")

"""The egress guard (intake.egress, issue 20 finding 4): no tenant-configured URL or host reaches loopback,
link-local (cloud metadata), private, CGNAT, unique-local or metadata-named addresses, nor a URL that hides
its host behind user information or a backslash, unless the platform lists the network in
MAILROOM_EGRESS_ALLOWED_NETWORKS.

The suite runs with that list set to loopback (config/test_settings.py), which is how every other test's
server on 127.0.0.1 is reached. Here the list is emptied (`no_allow_list`), as in production, and:
- saving refuses each bad address with a clear message, through the admin (a tenant's `mailroom-admin`)
  and through the REST API with a token, for destinations (Zendesk and generic REST, its URL templates and
  lookups), provider endpoints (Graph's token_url and api_base), IMAP hosts; SNS refuses them per message;
- a row stored before (or behind the admin's back) is refused at connect time, with real servers listening
  on 127.0.0.1 that see zero connections;
- a name that resolves to a public address when checked and to 127.0.0.1 when connected (DNS rebinding,
  played with an in-process resolver) is still refused: the check is made on the socket's address.
"""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from django.core.exceptions import ValidationError
from django.test import Client

from intake.egress import EgressRefused, check_host, check_url, guarded_session, parse_networks
from intake.failures import PermanentError
from intake.models import Mailbox
from intake.providers import provider_for, sns
from intake.providers.base import WebhookRejected
from intake.providers.oauth import clear_token_cache
from intake.secrets import env_prefix
from tests.factories import email_message, make_destination
from tests.fake_graph import FakeGraph
from tests.sns import CERT_PATH, SNS_TOPIC_ARN, ses_notification, signed_sns_message, sns_server  # noqa: F401
from tests.support.api import API, api
from tests.support.production import clean_env, manage
from tests.support.servers import CountingServer
from tests.support.users import make_user
from ticketing.destinations import adapter_for
from ticketing.destinations.base import TicketRequest
from ticketing.models import Destination

REFUSED_HINT = "the platform allows only public addresses and MAILROOM_EGRESS_ALLOWED_NETWORKS"
# (how the host is written, what the refusal says about it)
BAD_HOSTS = [
    ("127.0.0.1", "127.0.0.1 is a loopback address"),
    ("169.254.169.254", "169.254.169.254 is a link-local address"),
    ("10.0.0.1", "10.0.0.1 is a private address"),
    ("[::1]", "::1 is a loopback address"),
    ("localhost", "localhost resolves to 127.0.0.1, a loopback address"),
]
BAD_URLS = [
    *[(f"https://{host}/api", said) for host, said in BAD_HOSTS],
    ("https://desk.example@127.0.0.1/api", "the URL carries user information"),
    ("https://user:secret@desk.example/api", "the URL carries user information"),
    ("https://desk.example\\@127.0.0.1/api", "the URL contains a backslash"),
    ("https://desk.example%5C@127.0.0.1/api", "the URL carries user information"),
    ("https://metadata.google.internal/computeMetadata/v1/", "metadata.google.internal is a cloud metadata"),
]
REQUEST = TicketRequest(subject="Printer on fire", description="It is on fire.", requester="jane@example.com")


@pytest.fixture
def no_allow_list(settings):
    """Production's default: public addresses only."""
    settings.MAILROOM_EGRESS_ALLOWED_NETWORKS = []


@pytest.fixture
def listening():
    server = CountingServer()
    yield server
    server.stop()


@pytest.fixture
def tenant_admin(tenant):
    return make_user("acme-admin", groups=["mailroom-admin"], tenants=[tenant])


@pytest.fixture
def admin_browser(tenant_admin):
    client = Client()
    client.force_login(tenant_admin)
    return client


# --- the rule itself ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "said"), BAD_URLS)
def test_each_bad_url_is_refused_with_a_clear_message(no_allow_list, url, said):
    for resolve in (False, True):  # at save time (no DNS) and before a connection (resolved)
        with pytest.raises(EgressRefused) as caught:
            check_url(url, purpose="base_url", resolve=resolve)
        assert str(caught.value).startswith("base_url: refused: ") and said in str(caught.value)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("https://100.64.0.1/", "a shared (CGNAT) address"),
        ("https://[fd00:ec2::254]/", "a unique-local address"),
        ("https://[::ffff:127.0.0.1]/", "an IPv6 form of 127.0.0.1, a loopback address"),
        ("https://[64:ff9b::a9fe:a9fe]/", "an IPv6 form of 169.254.169.254"),
        ("https://0.0.0.0/", "the unspecified address"),
        ("https://224.0.0.1/", "a multicast address"),
        ("https://0x7f.1/", "0x7f.1 (that is 127.0.0.1) is a loopback address"),
        ("https://2130706433/", "(that is 127.0.0.1) is a loopback address"),
        ("https://192.168.1.10/", "a private address"),
        ("https://desk.example:22/", "port 22 on desk.example"),
        ("https://desk.example/#@127.0.0.1", "the URL has a fragment"),
        ("https://desk.example/ x", "whitespace or a control character"),
        ("ftp://desk.example/", "the URL must start with https:// or http://"),
        ("https://instance-data/latest/meta-data/", "a cloud metadata service name"),
    ],
)
def test_the_other_non_public_forms_are_refused_too(no_allow_list, url, said):
    with pytest.raises(EgressRefused) as caught:
        check_url(url, purpose="base_url", resolve=False)
    assert said in str(caught.value)


def test_a_public_address_passes_and_the_message_names_the_setting(no_allow_list):
    assert check_url("https://93.184.216.34/api", purpose="base_url", resolve=False).host == "93.184.216.34"
    with pytest.raises(EgressRefused) as caught:
        check_url("https://10.0.0.1/", purpose="base_url", resolve=False)
    assert str(caught.value) == f"base_url: refused: 10.0.0.1 is a private address; {REFUSED_HINT}"


def test_an_allow_listed_network_is_reached_on_any_port(settings):
    settings.MAILROOM_EGRESS_ALLOWED_NETWORKS = ["10.20.0.0/16"]
    assert check_url("http://10.20.3.4:8080/", purpose="base_url", resolve=False).port == 8080
    with pytest.raises(EgressRefused):
        check_url("http://10.21.0.1/", purpose="base_url", resolve=False)
    with pytest.raises(EgressRefused):
        check_url("http://127.0.0.1/", purpose="base_url", resolve=False)


def test_the_setting_unset_empty_and_set_as_the_contract_says():
    show = "from django.conf import settings; print(settings.MAILROOM_EGRESS_ALLOWED_NETWORKS)"
    key = {"SECRET_KEY": "q7Vd2-cJx9LwZr4Tn8YbHs1Pk6Gm3Fa0Ue5Oi_Ql2Ws7Ej4Rt9Yu6Ip3As8Df1Gh"}
    cases = [
        ({**key}, "[]"),  # production, unset
        ({"MAILROOM_ENV": "development"}, "['127.0.0.0/8', '::1']"),  # development, unset
        ({"MAILROOM_ENV": "development", "MAILROOM_EGRESS_ALLOWED_NETWORKS": ""}, "[]"),  # set, empty
        ({**key, "MAILROOM_EGRESS_ALLOWED_NETWORKS": "10.20.0.0/16, fd00::/8"}, "['10.20.0.0/16', 'fd00::/8']"),
    ]
    for env, shown in cases:
        result = manage(clean_env(**env), "shell", "-c", show)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip().splitlines()[-1] == shown
    broken = manage(clean_env(**key, MAILROOM_EGRESS_ALLOWED_NETWORKS="10.0.0.0/33"), "check")
    assert broken.returncode != 0
    assert "MAILROOM_EGRESS_ALLOWED_NETWORKS: '10.0.0.0/33' is not a network" in broken.stderr
    with pytest.raises(ValueError):
        parse_networks("intranet")


# --- the real server gets nothing ---------------------------------------------------------------------------


def test_with_the_allow_list_empty_a_listening_loopback_server_gets_zero_connections(no_allow_list, listening):
    session = guarded_session(purpose="base_url")
    with pytest.raises(EgressRefused) as caught:
        session.get(listening.url + "/api", timeout=3)
    assert "127.0.0.1 is a loopback address" in str(caught.value)
    assert listening.connections == 0
    # The same server, the same session, once the platform lists loopback: reached.
    from django.conf import settings

    settings.MAILROOM_EGRESS_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    assert session.get(listening.url + "/api", timeout=3).status_code == 200
    assert listening.connections == 1


def test_a_redirect_to_a_private_address_is_refused(settings, listening):
    settings.MAILROOM_EGRESS_ALLOWED_NETWORKS = ["127.0.0.0/8"]

    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(EgressRefused) as caught:
            guarded_session(purpose="base_url").get(f"http://127.0.0.1:{server.server_address[1]}/", timeout=3)
    finally:
        server.shutdown()
        server.server_close()
    assert "169.254.169.254 is a link-local address" in str(caught.value)


def test_no_proxy_is_used(settings, listening, monkeypatch):
    """A proxy would connect on our behalf, unchecked: none from the environment, an explicit one refused."""
    settings.MAILROOM_EGRESS_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    monkeypatch.setenv("HTTP_PROXY", listening.url)
    monkeypatch.setenv("HTTPS_PROXY", listening.url)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(requests.ConnectionError):  # straight to the (closed) port, not through the proxy
        guarded_session(purpose="base_url").get(f"http://127.0.0.1:{port}/", timeout=2)
    with pytest.raises(EgressRefused, match="requests through a proxy are not checked"):
        guarded_session(purpose="base_url").get(f"http://127.0.0.1:{port}/", proxies={"http": listening.url}, timeout=2)
    assert listening.connections == 0


# --- DNS rebinding: the check is made on the address the socket connects to ---------------------------


@pytest.fixture
def rebinding(monkeypatch, listening):
    """`desk.rebind.test` resolves to a public address on the first lookup and to the listening loopback
    server afterwards (an attacker's DNS with a TTL of 0). Other names resolve as usual."""
    real = socket.getaddrinfo
    lookups = []

    def getaddrinfo(host, port, *args, **kwargs):
        if host in ("desk.rebind.test", "imap.rebind.test"):
            lookups.append(host)
            address = "93.184.216.34" if len(lookups) == 1 else "127.0.0.1"
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, listening.port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return lookups


def test_a_name_that_rebinds_to_loopback_after_the_check_is_refused_at_connect(no_allow_list, listening, rebinding):
    url = "http://desk.rebind.test/api/v2/users/me.json"
    assert check_url(url, purpose="base_url").host == "desk.rebind.test"  # the check sees 93.184.216.34
    with pytest.raises(EgressRefused) as caught:
        guarded_session(purpose="base_url").get(url, timeout=3)
    assert "desk.rebind.test resolves to 127.0.0.1, a loopback address" in str(caught.value)
    assert listening.connections == 0 and rebinding == ["desk.rebind.test", "desk.rebind.test"]


def test_a_destination_whose_name_rebinds_is_refused_and_the_server_gets_nothing(
    tenant, no_allow_list, listening, rebinding, monkeypatch
):
    monkeypatch.setenv(f"{env_prefix(tenant.slug)}ZD", "agent@acme.test/token:t")
    destination = Destination(
        tenant=tenant,
        slug="rebind",
        kind="zendesk",
        base_url="http://desk.rebind.test",
        credentials_ref=f"env:{env_prefix(tenant.slug)}ZD",
    )
    destination.full_clean()  # saving does not resolve: nothing to refuse yet
    destination.save()
    check_url(destination.base_url, purpose="base_url")  # resolves to the public address
    with pytest.raises(PermanentError) as caught:
        adapter_for(destination).create_ticket(REQUEST, "key-1", "evt-1")
    assert caught.value.reason == "configuration" and "resolves to 127.0.0.1" in caught.value.detail
    assert listening.connections == 0


def test_an_imap_host_that_rebinds_is_refused(tenant, no_allow_list, listening, rebinding, monkeypatch):
    box = imap_mailbox(tenant, monkeypatch, host="imap.rebind.test", port=143)
    with pytest.raises(PermanentError) as caught:
        provider_for(box).poll({})
    assert caught.value.reason == "settings" and "imap.rebind.test resolves to 127.0.0.1" in caught.value.detail
    assert rebinding == ["imap.rebind.test", "imap.rebind.test"] and listening.connections == 0


# --- destinations: saved through the admin and the API, or called at connect time ---------------------------


def zendesk_form(tenant, base_url: str) -> dict:
    return {
        "tenant": tenant.pk,
        "slug": "intruder",
        "kind": "zendesk",
        "base_url": base_url,
        "credentials_ref": f"env:{env_prefix(tenant.slug)}ZD",
        "settings": "{}",
    }


@pytest.mark.parametrize(("host", "said"), BAD_HOSTS)
def test_a_zendesk_base_url_on_a_non_public_host_is_refused_in_the_admin_and_the_api(
    no_allow_list, tenant, tenant_admin, admin_browser, host, said
):
    base_url = f"https://{host}"
    page = admin_browser.post("/admin/ticketing/destination/add/", zendesk_form(tenant, base_url))
    assert page.status_code == 200 and f"base_url: refused: {said}" in page.content.decode()
    answer = api(tenant_admin).post(
        f"{API}/destinations/",
        {
            "tenant": tenant.slug,
            "slug": "intruder",
            "kind": "zendesk",
            "base_url": base_url,
            "credentials_ref": f"env:{env_prefix(tenant.slug)}ZD",
        },
        format="json",
    )
    assert answer.status_code == 400, answer.content
    [message] = answer.json()["errors"]["base_url"]
    assert message.startswith(f"base_url: refused: {said}") and message.endswith(REFUSED_HINT)
    assert not Destination.objects.filter(slug="intruder").exists()


def test_a_zendesk_base_url_with_user_information_is_refused_in_the_admin_and_the_api(
    no_allow_list, tenant, tenant_admin, admin_browser
):
    base_url = "https://desk.example@10.0.0.1"
    page = admin_browser.post("/admin/ticketing/destination/add/", zendesk_form(tenant, base_url))
    assert "base_url: refused: the URL carries user information" in page.content.decode()
    answer = api(tenant_admin).post(
        f"{API}/destinations/",
        {
            "tenant": tenant.slug,
            "slug": "intruder",
            "kind": "zendesk",
            "base_url": base_url,
            "credentials_ref": f"env:{env_prefix(tenant.slug)}ZD",
        },
        format="json",
    )
    assert answer.status_code == 400 and "the URL carries user information" in answer.json()["errors"]["base_url"][0]
    assert not Destination.objects.filter(slug="intruder").exists()


REST_PLAIN = {"create_url": "/records", "body_template": '{"subject": "{{ subject }}"}', "id_path": "data.id"}


@pytest.mark.parametrize(("url", "said"), BAD_URLS)
@pytest.mark.parametrize("setting", ["create_url", "lookup_url_template", "check_url"])
def test_rest_url_templates_and_lookups_on_non_public_hosts_are_refused_through_the_api(
    no_allow_list, tenant, tenant_admin, setting, url, said
):
    url = url + ("/{external_ref}" if setting == "lookup_url_template" else "")
    settings = {**REST_PLAIN, setting: url, "lookup_id_path": "data.id"}
    answer = api(tenant_admin).post(
        f"{API}/destinations/",
        {
            "tenant": tenant.slug,
            "slug": "intruder",
            "kind": "rest",
            "base_url": "https://desk.example",
            "settings": settings,
        },
        format="json",
    )
    assert answer.status_code == 400, answer.content
    [message] = answer.json()["errors"]["settings"]
    assert message.startswith(f"{setting}: refused: ") and said in message
    assert not Destination.objects.filter(slug="intruder").exists()


def test_a_rest_lookup_on_a_metadata_address_is_refused_in_the_admin(no_allow_list, tenant, admin_browser):
    settings = {
        **REST_PLAIN,
        "lookup_url_template": "http://169.254.169.254/latest/meta-data/{external_ref}",
        "lookup_id_path": "data.id",
    }
    page = admin_browser.post(
        "/admin/ticketing/destination/add/",
        {
            "tenant": tenant.pk,
            "slug": "intruder",
            "kind": "rest",
            "base_url": "https://desk.example",
            "settings": json.dumps(settings),
        },
    )
    assert page.status_code == 200
    assert "lookup_url_template: refused: 169.254.169.254 is a link-local address" in page.content.decode()
    assert not Destination.objects.filter(slug="intruder").exists()


def test_stored_destinations_are_refused_at_connect_time_and_the_server_gets_nothing(
    tenant, no_allow_list, listening, monkeypatch
):
    """Rows stored before the rule (or by the ORM, skipping clean()): each call is checked as it connects."""
    monkeypatch.setenv(f"{env_prefix(tenant.slug)}ZD", "agent@acme.test/token:t")
    zendesk = make_destination(
        tenant, slug="zd", kind="zendesk", base_url=listening.url, credentials_ref=f"env:{env_prefix(tenant.slug)}ZD"
    )
    rest = make_destination(
        tenant,
        slug="rest",
        kind="rest",
        is_default=False,
        base_url="https://93.184.216.34",
        settings={
            **REST_PLAIN,
            "lookup_url_template": listening.url + "/find/{external_ref}",
            "lookup_id_path": "data.id",
            "check_url": listening.url + "/health",
        },
    )
    calls = [
        lambda: adapter_for(zendesk).create_ticket(REQUEST, "key-1", "evt-1"),
        lambda: adapter_for(zendesk).check_connection(),
        lambda: adapter_for(rest).find_by_external_ref("evt-1"),
        lambda: adapter_for(rest).check_connection(),
    ]
    for call in calls:
        with pytest.raises(PermanentError) as caught:
            call()
        assert caught.value.reason == "configuration"
        assert "refused: 127.0.0.1 is a loopback address" in caught.value.detail
    assert listening.connections == 0


def test_test_connection_in_the_admin_names_the_refusal(tenant, no_allow_list, listening, admin_browser, monkeypatch):
    monkeypatch.setenv(f"{env_prefix(tenant.slug)}ZD", "agent@acme.test/token:t")
    destination = make_destination(
        tenant,
        slug="zd",
        kind="zendesk",
        base_url="http://169.254.169.254",
        credentials_ref=f"env:{env_prefix(tenant.slug)}ZD",
    )
    page = admin_browser.post(
        "/admin/ticketing/destination/",
        {"action": "test_connection", "_selected_action": [destination.pk]},
        follow=True,
    )
    said = [str(m) for m in page.context["messages"]]
    assert said == [
        f"{destination}: failed (permanent: configuration) destination zd: refused: 169.254.169.254 is "
        f"a link-local address (cloud metadata lives there); {REFUSED_HINT}"
    ]


def test_the_allow_list_lets_a_real_loopback_server_through(tenant, listening, monkeypatch):
    """The suite's own setting (loopback listed): what every FakeDesk test relies on, shown once here."""
    monkeypatch.setenv(f"{env_prefix(tenant.slug)}ZD", "agent@acme.test/token:t")
    destination = Destination(
        tenant=tenant,
        slug="zd",
        kind="zendesk",
        base_url=listening.url,
        credentials_ref=f"env:{env_prefix(tenant.slug)}ZD",
    )
    destination.full_clean()
    destination.save()
    assert adapter_for(destination).check_connection().startswith("signed in as Zendesk user 1")
    assert listening.connections == 1


# --- provider endpoints (OAuth token_url and api_base) ------------------------------------------------------


@pytest.fixture
def graph():
    clear_token_cache()
    server = FakeGraph().start()
    yield server
    server.stop()
    clear_token_cache()


def graph_settings(graph, **changes) -> dict:
    return {
        "api_base": graph.api_base,
        "token_url": graph.token_url,
        "client_id": graph.client_id,
        "tenant_id": graph.tenant,
        "user": graph.user,
        **changes,
    }


PUBLIC_GRAPH = {
    "api_base": "https://graph.microsoft.com/v1.0",
    "token_url": "https://login.microsoftonline.com/tenant-1/oauth2/v2.0/token",
}


@pytest.mark.parametrize(("host", "said"), BAD_HOSTS)
@pytest.mark.parametrize("setting", ["token_url", "api_base"])
def test_graph_endpoints_on_non_public_hosts_are_refused_in_the_admin_and_the_api(
    no_allow_list, tenant, tenant_admin, admin_browser, graph, setting, host, said
):
    settings = graph_settings(graph, **{**PUBLIC_GRAPH, setting: f"https://{host}/oauth2/v2.0/token"})
    page = admin_browser.post(
        "/admin/intake/mailbox/add/",
        {
            "tenant": tenant.pk,
            "slug": "intruder",
            "address": "intruder@acme.test",
            "provider": "graph",
            "credentials_ref": f"env:{env_prefix(tenant.slug)}GRAPH",
            "settings": json.dumps(settings),
            "allowed_recipients": "[]",
        },
    )
    assert page.status_code == 200 and f"{setting}: refused: {said}" in page.content.decode()
    answer = api(tenant_admin).post(
        f"{API}/mailboxes/",
        {
            "tenant": tenant.slug,
            "slug": "intruder",
            "address": "intruder@acme.test",
            "provider": "graph",
            "credentials_ref": f"env:{env_prefix(tenant.slug)}GRAPH",
            "settings": settings,
        },
        format="json",
    )
    assert answer.status_code == 400, answer.content
    [message] = answer.json()["errors"]["settings"]
    assert message.startswith(f"{setting}: refused: {said}") and message.endswith(REFUSED_HINT)
    assert not Mailbox.objects.filter(slug="intruder").exists()


def test_a_stored_graph_mailbox_is_refused_at_connect_time_and_the_fake_gets_nothing(
    tenant, no_allow_list, graph, monkeypatch
):
    monkeypatch.setenv("GRAPH_TEST_CREDENTIALS", json.dumps({"client_secret": graph.client_secret}))
    box = Mailbox.objects.create(
        tenant=tenant,
        slug="graph-box",
        address="graph-box@acme.test",
        provider="graph",
        credentials_ref="env:GRAPH_TEST_CREDENTIALS",
        settings=graph_settings(graph),
    )
    with pytest.raises(PermanentError) as caught:
        provider_for(box).poll({})
    assert caught.value.reason == "configuration"
    assert caught.value.detail.startswith("token_url: refused: 127.0.0.1 is a loopback address")
    assert graph.requests == []


# --- IMAP hosts -----------------------------------------------------------------------------------------------


def imap_mailbox(tenant, monkeypatch, **settings):
    monkeypatch.setenv(f"{env_prefix(tenant.slug)}IMAP_PASSWORD", "pw")
    return Mailbox.objects.create(
        tenant=tenant,
        slug="imap-box",
        address="imap-box@acme.test",
        provider="imap",
        credentials_ref=f"env:{env_prefix(tenant.slug)}IMAP_PASSWORD",
        settings={"ssl": False, "username": "u", "timeout": 3, **settings},
    )


@pytest.mark.parametrize(("host", "said"), BAD_HOSTS)
def test_an_imap_host_that_is_not_public_is_refused_in_the_admin_and_the_api(
    no_allow_list, tenant, tenant_admin, admin_browser, host, said
):
    settings = {"host": host.strip("[]"), "ssl": True, "username": "support"}
    page = admin_browser.post(
        "/admin/intake/mailbox/add/",
        {
            "tenant": tenant.pk,
            "slug": "intruder",
            "address": "intruder@acme.test",
            "provider": "imap",
            "credentials_ref": f"env:{env_prefix(tenant.slug)}IMAP",
            "settings": json.dumps(settings),
            "allowed_recipients": "[]",
        },
    )
    assert page.status_code == 200 and "host: refused: " in page.content.decode()
    answer = api(tenant_admin).post(
        f"{API}/mailboxes/",
        {
            "tenant": tenant.slug,
            "slug": "intruder",
            "address": "intruder@acme.test",
            "provider": "imap",
            "credentials_ref": f"env:{env_prefix(tenant.slug)}IMAP",
            "settings": settings,
        },
        format="json",
    )
    assert answer.status_code == 400, answer.content
    [message] = answer.json()["errors"]["settings"]
    assert message.startswith("host: refused: ") and said.replace("[::1]", "::1") in message
    assert not Mailbox.objects.filter(slug="intruder").exists()


def test_an_imap_host_on_another_port_is_refused_when_saved(no_allow_list, tenant):
    box = Mailbox(
        tenant=tenant,
        slug="imap-box",
        address="imap-box@acme.test",
        provider="imap",
        settings={"host": "imap.example.com", "port": 22},
    )
    with pytest.raises(ValidationError) as caught:
        box.full_clean()
    assert "host: refused: port 22 on imap.example.com; the platform allows only port 993 or 143" in str(caught.value)


@pytest.mark.parametrize(("host", "said"), BAD_HOSTS)
def test_a_stored_imap_mailbox_is_refused_at_connect_time_and_the_server_gets_nothing(
    tenant, no_allow_list, listening, monkeypatch, host, said
):
    box = imap_mailbox(tenant, monkeypatch, host=host.strip("[]"), port=listening.port)
    with pytest.raises(PermanentError) as caught:
        provider_for(box).poll({})
    assert caught.value.reason == "settings" and caught.value.detail.startswith("IMAP host: refused: ")
    assert listening.connections == 0


def test_check_host_refuses_the_metadata_name_and_allows_a_listed_network(settings):
    settings.MAILROOM_EGRESS_ALLOWED_NETWORKS = []
    with pytest.raises(EgressRefused, match="metadata.google.internal is a cloud metadata service name"):
        check_host("metadata.google.internal", 993, purpose="IMAP host", resolve=False)
    settings.MAILROOM_EGRESS_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    assert check_host("10.1.2.3", 1143, purpose="IMAP host", resolve=False)


# --- SNS ----------------------------------------------------------------------------------------------------


def test_sns_certificate_on_loopback_is_refused_without_the_allow_list(tenant, sns_server, no_allow_list, count_rows):
    Mailbox.objects.create(
        tenant=tenant,
        slug="ses-box",
        address="ses-box@acme.test",
        provider="ses",
        settings={"topic_arn": SNS_TOPIC_ARN},
    )
    before = count_rows()
    message = signed_sns_message(sns_server.cert_url, ses_notification(email_message()))
    response = Client().post("/webhooks/ses/ses-box/", data=json.dumps(message), content_type="text/plain")
    assert response.status_code == 401
    assert sum(sns_server.requests.values()) == 0 and count_rows() == before


@pytest.mark.parametrize(("host", "said"), [*BAD_HOSTS, ("metadata.google.internal", "a cloud metadata")])
def test_sns_urls_on_non_public_hosts_are_refused_whatever_the_host_pattern(settings, no_allow_list, host, said):
    settings.MAILROOM_SNS_CERT_HOST_PATTERN = r".*"  # the egress guard alone decides here
    with pytest.raises(WebhookRejected) as caught:
        sns.check_certificate_url(f"https://{host}{CERT_PATH}")
    assert said in str(caught.value)
    subscribe = {
        "TopicArn": SNS_TOPIC_ARN,
        "Token": "t",
        "SubscribeURL": f"https://{host}/?Action=ConfirmSubscription&TopicArn={SNS_TOPIC_ARN}&Token=t",
    }
    with pytest.raises(WebhookRejected) as caught:
        sns.check_subscribe_url(subscribe)
    assert said in str(caught.value)


@pytest.mark.parametrize(
    ("provider", "options", "setting"),
    [
        ("gmail", {"jwks_url": "https://169.254.169.254/certs"}, "jwks_url"),
        ("gmail", {"api_base": "https://localhost"}, "api_base"),
        ("mailgun", {"api_base": "https://10.0.0.1"}, "api_base"),
        ("ses", {"topic_arn": SNS_TOPIC_ARN, "s3_endpoint_url": "http://[::1]:9000"}, "s3_endpoint_url"),
        ("imap", {"host": "metadata.google.internal"}, "host"),
    ],
)
def test_every_provider_endpoint_setting_is_checked_when_saved(no_allow_list, tenant, provider, options, setting):
    box = Mailbox(tenant=tenant, slug="box", address="box@acme.test", provider=provider, settings=options)
    with pytest.raises(ValidationError) as caught:
        box.full_clean()
    [message] = caught.value.message_dict["settings"]
    assert message.startswith(f"{setting}: refused: ")


def test_a_jwks_url_on_a_metadata_address_is_refused_when_fetched(no_allow_list):
    from intake.providers.oidc import TokenInvalid, clear_jwks_cache, verify_id_token

    clear_jwks_cache()
    token = "eyJhbGciOiJSUzI1NiIsImtpZCI6ImsxIn0.eyJzdWIiOiJ4In0.c2ln"  # header {"alg": "RS256", "kid": "k1"}
    with pytest.raises(TokenInvalid) as caught:
        verify_id_token(token, jwks_url="http://169.254.169.254/certs", audience="a", issuers=["i"])
    assert "jwks_url: refused: 169.254.169.254 is a link-local address" in str(caught.value)

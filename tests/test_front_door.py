"""The front door: `/` is a landing page leading to the console, /api/v1/ is the API's index, /favicon.ico exists,
the console's "Start page" link leads back to `/`. A newcomer's first three URLs answer something useful, and none
of them shows a row."""

import json

import pytest
from django.test import Client
from rest_framework.test import APIClient

from reconciliation.api.urls import router
from tests.factories import make_mailbox, make_tenant
from tests.support.users import make_user, token_for

ICON = "/static/reconciliation/favicon.ico"
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"  # what Chromium sends


@pytest.fixture
def two_tenants(db):
    """acme and globex, each with a mailbox whose slug must never appear at the door."""
    acme, globex = make_tenant("acme-door"), make_tenant("globex-door")
    make_mailbox(acme, slug="acme-door-secret-box", address="help@acme-door.test")
    make_mailbox(globex, slug="globex-door-secret-box", address="help@globex-door.test")
    return acme, globex


def test_root_is_a_landing_page_whose_console_link_takes_an_anonymous_visitor_to_the_login_page(db, two_tenants):
    response = Client().get("/")
    page = response.content.decode()
    assert response.status_code == 200 and "<h1>Mailroom</h1>" in page
    assert '<a class="button-primary" id="open-console" href="/admin/">Open the console</a>' in page
    assert 'href="/api/docs/"' in page and 'href="/healthz"' in page
    for secret in ("acme-door", "globex-door", "help@"):
        assert secret not in page
    followed = Client().get("/admin/", follow=True)
    assert followed.status_code == 200
    assert followed.redirect_chain[-1][0].startswith("/admin/login/")


def test_favicon_is_served_and_linked_from_every_console_page(db):
    client = Client()
    response = client.get("/favicon.ico")
    assert response.status_code == 302 and response["Location"] == ICON
    icon = client.get(ICON)
    assert icon.status_code == 200
    assert b"".join(icon.streaming_content)[:4] == b"\x00\x00\x01\x00"  # an ICO file's header
    login = client.get("/admin/login/")
    assert f'<link rel="icon" href="{ICON}"'.encode() in login.content
    client.force_login(make_user("doorman", is_superuser=True))
    assert f'<link rel="icon" href="{ICON}"'.encode() in client.get("/admin/").content


def test_the_console_links_its_start_page_and_the_api_docs_which_a_console_session_may_read_in_production(db, settings):
    settings.MAILROOM_PUBLIC_API_SCHEMA = False  # production: the docs need a signed-in user
    client = Client()
    client.force_login(make_user("viewer", groups=["operator"]))
    page = client.get("/admin/").content.decode()
    assert '<a href="/" id="start-page-link">Start page</a>' in page and '<a href="/api/docs/">API docs</a>' in page
    assert "You are signed in as <strong>viewer</strong>." in client.get("/").content.decode()
    assert client.get("/api/docs/").status_code == 200
    assert Client().get("/api/docs/").status_code in (401, 403)  # and not for a stranger


def test_the_api_index_lists_every_resource_the_schema_and_the_docs_as_json(db, two_tenants):
    response = Client().get("/api/v1/", HTTP_ACCEPT=BROWSER_ACCEPT)  # a browser gets JSON too
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    index = response.json()
    assert set(index["resources"]) == {prefix for prefix, _, _ in router.registry}
    assert index["resources"]["events"] == "http://testserver/api/v1/events/"
    assert index["schema"] == "http://testserver/api/schema/" and index["docs"] == "http://testserver/api/docs/"
    assert "Token" in index["authentication"]


def test_every_url_the_index_lists_is_a_real_endpoint_behind_a_token(db, two_tenants):
    index = Client().get("/api/v1/").json()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(make_user('lister', is_superuser=True))}")
    for name, url in index["resources"].items():
        assert APIClient().get(url).status_code == 401, name  # the index is public, the resources are not
        assert client.get(url).status_code == 200, name


def test_the_index_is_the_same_for_everyone_and_names_no_row(db, two_tenants):
    acme, globex = two_tenants
    anonymous = Client().get("/api/v1/").content
    for user in (
        make_user("acme-reader", groups=["operator"], tenants=[acme]),
        make_user("globex-reader", groups=["operator"], tenants=[globex]),
        make_user("root-reader", is_superuser=True),
    ):
        assert Client().get("/api/v1/", HTTP_AUTHORIZATION=f"Token {token_for(user)}").content == anonymous
    text = anonymous.decode()
    for secret in ("acme-door", "globex-door", "help@"):
        assert secret not in text
    assert set(json.loads(text)) == {"name", "version", "authentication", "resources", "schema", "docs"}


def test_a_bad_token_at_the_index_is_the_401_every_endpoint_gives(db):
    index = Client().get("/api/v1/", HTTP_AUTHORIZATION="Token not-a-token")
    events = Client().get("/api/v1/events/", HTTP_AUTHORIZATION="Token not-a-token")
    assert index.status_code == events.status_code == 401
    assert index["Content-Type"] == events["Content-Type"] == "application/problem+json"
    assert index.json()["detail"] == events.json()["detail"]


def test_the_index_is_in_the_openapi_schema(db):
    schema = Client().get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/v1/" in paths and "get" in paths["/api/v1/"]

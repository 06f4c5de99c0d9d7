"""Issue 20, the lower findings at the browser-facing edge.

- A strict Content-Security-Policy on every console page (the admin, the recovery queue, the dashboard) and the
  API docs; the pages themselves hold no inline script, style or event handler that the policy would block.
  (tests/test_csp_browser.py loads them in Chromium and counts violations.)
- `/api/schema/` and `/api/docs/` behind authentication in production (a token or a console session).
- Attachment downloads name non-Latin-1 files with RFC 6266's `filename*`, with an ASCII `filename` for every
  client, through the admin and the REST API.
"""

import re
from email.message import EmailMessage
from html.parser import HTMLParser
from urllib.parse import unquote

import pytest
from django.conf import settings
from django.test import Client

from intake.keys import provider_message_id_for_raw
from intake.services import ingest
from reconciliation.services import attachment_content_disposition
from tests.support.api import API, api
from tests.support.production import PRODUCTION_ENV, clean_env, manage
from tests.support.queue import QUEUE_URL, quarantine
from tests.support.users import make_user

pytestmark = pytest.mark.usefixtures("scanner_off")


class InlineFinder(HTMLParser):
    """What a strict policy (no 'unsafe-inline') would block: inline scripts, <style>, style= and on*= attributes."""

    def __init__(self):
        super().__init__()
        self.found = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if (
            tag == "script"
            and not attrs.get("src")
            and attrs.get("type", "text/javascript") in ("text/javascript", "module", "")
        ):
            self.found.append("<script> without src")
        if tag == "style":
            self.found.append("<style>")
        for name in attrs:
            if name == "style" or name.startswith("on"):
                self.found.append(f"<{tag} {name}=>")
        if attrs.get("href", "").lower().startswith("javascript:"):
            self.found.append(f"<{tag} href=javascript:>")


def inline_code(html: str) -> list[str]:
    finder = InlineFinder()
    finder.feed(html)
    return finder.found


def quarantined_event_with_attachments(mailbox, names) -> int:
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = "a@customer.test", "support@acme.test", "Reports"
    message["Message-ID"] = "<reports-1@customer.test>"
    message.set_content("see attached\n")
    for n, name in enumerate(names):
        message.add_attachment(f"file {n}\n".encode(), maintype="text", subtype="plain", filename=name)
    raw = message.as_bytes()
    event_id = ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id
    quarantine(event_id)
    return event_id


# --- the Content-Security-Policy ----------------------------------------------------------------------------


def test_console_pages_carry_a_strict_policy_and_hold_nothing_it_would_block(client, tenant, mailbox):
    policy = settings.MAILROOM_CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in policy and "style-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe" not in policy
    event_id = quarantined_event_with_attachments(mailbox, ["app.log"])
    root = make_user("root", is_superuser=True)
    client.force_login(root)
    pages = [
        "/admin/",
        QUEUE_URL,
        f"{QUEUE_URL}{event_id}/change/",
        f"{QUEUE_URL}{event_id}/body/",
        f"{QUEUE_URL}dashboard/",
        "/admin/reconciliation/pauseswitch/",
        "/admin/intake/mailbox/",
        f"/admin/intake/mailbox/{mailbox.pk}/change/",
        "/admin/intake/inboxevent/",
        f"/admin/intake/inboxevent/{event_id}/change/",
        "/admin/ticketing/routingrule/add/",
    ]
    for url in pages:
        response = client.get(url, follow=True)
        assert response.status_code == 200, url
        assert response["Content-Security-Policy"] == policy, url
        assert inline_code(response.content.decode()) == [], url
    anonymous = Client().get("/admin/login/")
    assert anonymous["Content-Security-Policy"] == policy and inline_code(anonymous.content.decode()) == []


def test_the_api_docs_page_loads_its_script_and_styles_from_files(client):
    page = client.get("/api/docs/")
    assert page.status_code == 200 and page["Content-Security-Policy"] == settings.MAILROOM_CONTENT_SECURITY_POLICY
    assert inline_code(page.content.decode()) == []
    [script] = re.findall(r'<script src="([^"]*\?script=[^"]*)"', page.content.decode())
    code = client.get(script.replace("&amp;", "&"))
    assert code.status_code == 200 and code["Content-Type"].startswith("application/javascript")
    assert b"SwaggerUIBundle" in code.content


def test_an_empty_setting_turns_the_header_off(client, settings):
    settings.MAILROOM_CONTENT_SECURITY_POLICY = ""
    assert "Content-Security-Policy" not in client.get("/admin/login/")


# --- the schema in production ------------------------------------------------------------------------------


def test_in_production_the_schema_and_docs_need_a_token_or_a_console_session(settings, tenant):
    settings.MAILROOM_PUBLIC_API_SCHEMA = False  # production's default (next test)
    anonymous = Client()
    for url in ("/api/schema/", "/api/schema/?format=json", "/api/docs/", "/api/docs/?script="):
        assert anonymous.get(url).status_code == 401, url
    user = make_user("reader", groups=["operator"], tenants=[tenant])
    schema = api(user).get("/api/schema/?format=json")
    assert schema.status_code == 200 and "/api/v1/events/" in schema.json()["paths"]
    browser = Client()
    browser.force_login(user)
    assert browser.get("/api/docs/").status_code == 200
    assert browser.get("/api/schema/").status_code == 200  # what the docs page fetches, with the session
    assert anonymous.get(f"{API}/events/", HTTP_AUTHORIZATION="Token not-a-token").status_code == 401


def test_production_keeps_the_schema_private_by_default():
    code = (
        "from django.conf import settings; from django.test import Client; "
        "c = Client(HTTP_HOST='mailroom.example.com'); "
        "print(settings.MAILROOM_PUBLIC_API_SCHEMA, c.get('/api/schema/', secure=True).status_code, "
        "c.get('/api/docs/', secure=True).status_code)"
    )
    result = manage(clean_env(**PRODUCTION_ENV), "shell", "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False 401 401"
    development = manage(
        clean_env(SECRET_KEY=PRODUCTION_ENV["SECRET_KEY"], MAILROOM_ENV="development"),
        "shell",
        "-c",
        "from django.conf import settings; print(settings.MAILROOM_PUBLIC_API_SCHEMA)",
    )
    assert development.stdout.strip().splitlines()[-1] == "True", development.stderr


# --- attachment names (RFC 6266 / RFC 8187) -----------------------------------------------------------------

NAMES = {
    "Отчёт 2026.pdf": "attachment; filename=\"_ 2026.pdf\"; filename*=UTF-8''%D0%9E%D1%82%D1%87%D1%91%D1%82%202026.pdf",
    "報告.xlsx": "attachment; filename=\"attachment-1.xlsx\"; filename*=UTF-8''%E5%A0%B1%E5%91%8A.xlsx",
    'say "hi"\r\nSet-Cookie: x=1.txt': 'attachment; filename="say _hi_Set-Cookie: x=1.txt"; '
    "filename*=UTF-8''say%20%22hi%22Set-Cookie%3A%20x%3D1.txt",
    "Café.txt": "attachment; filename=\"Cafe.txt\"; filename*=UTF-8''Caf%C3%A9.txt",
    "plain.log": 'attachment; filename="plain.log"',
}


@pytest.mark.parametrize("name", list(NAMES))
def test_the_disposition_of_a_name(name):
    index = list(NAMES).index(name)
    assert attachment_content_disposition(name, index=index) == NAMES[name]


def test_attachment_names_survive_the_download_through_the_admin_and_the_api(client, tenant, mailbox):
    names = ["Отчёт 2026.pdf", "報告.xlsx", "Café.txt"]
    event_id = quarantined_event_with_attachments(mailbox, names)
    security = make_user("sec", groups=["security"], tenants=[tenant])
    client.force_login(security)
    token_client = api(security)
    for index, name in enumerate(names):
        for response in (
            client.get(f"{QUEUE_URL}{event_id}/attachment/{index}/"),
            token_client.get(f"{API}/events/{event_id}/attachments/{index}/"),
        ):
            assert response.status_code == 200 and response.content == f"file {index}\n".encode()
            disposition = response["Content-Disposition"]
            assert disposition == NAMES[name].replace("attachment-1", f"attachment-{index}"), disposition
            assert disposition.encode("latin-1")  # a header any client reads
            assert unquote(disposition.split("filename*=UTF-8''", 1)[1]) == name  # what the browser saves

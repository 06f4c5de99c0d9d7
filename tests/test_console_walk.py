"""The console walked in Chromium as an operator and as an admin, at 1400 and 800 px, page by page.

Every page is loaded at both widths by one helper, `walk(page, url, name)` (tests/support/pages.py), which
collects what is wrong with it and never stops at the first problem:

- (a) the document is wider than the window (`scrollWidth > innerWidth + 1`), with the element that sticks
  out furthest (outside any box that scrolls on its own);
- (b) any response with status >= 400 (the page, its CSS, scripts, images, favicon). An invalid form submit
  is expected to answer 200 (or 400) *with its errors shown*; a 4xx/5xx of anything else, or an invalid
  submit that shows no error, is a problem;
- (c) a console error, an uncaught page error, or a Content-Security-Policy violation;
- (d) a Python repr rendered as text: `{'`, `[{` or the word `None` in `inner_text("body")`.

Screenshots go to var/screenshots/<name>-<width>.png (var/ is git-ignored; CI keeps the folder as an
artifact; $MAILROOM_WALK_SCREENSHOTS moves it). Each test asserts once, with one line per problem.

The same walk runs on PostgreSQL (pytest-django's live server, items seeded as tests/test_recovery_queue.py
does: a failed, a quarantined and an unknown item through FakeDesk, one awaiting review, one completed into
the built-in store) and on the embedded default (`test_the_admins_walk_on_the_embedded_sqlite_default`: a
real gunicorn on a SQLite file, as tests/test_sqlite_parity.py builds it, seeded by `manage.py shell`).
"""

import json
import re

import pytest

from intake.models import InboxEvent, Mailbox
from intake.services import transition_event
from tests.browser import REPO_ROOT, browser, chromium_path  # noqa: F401  (fixtures)
from tests.support.pages import SCREENSHOTS, WIDTHS, new_context_page, walk
from tests.support.queue import QUEUE_URL, age, new_event, normalize, seed_three, set_default, zendesk_destinations
from tests.support.users import PASSWORD, make_user
from ticketing.models import Destination, RoutingRule
from ticketing.services import process_inbox_event

pytestmark = [pytest.mark.live, pytest.mark.timeout(900)]

STATES = ("awaiting_review", "quarantined", "failed", "unknown", "completed")


def report(problems: list[str]) -> str:
    return f"{len(problems)} problem(s) on the walk:\n" + "\n".join(problems)


# --- the paths ---------------------------------------------------------------------------------


def save(page, width):
    page.click("input[name=_save]")


def fill_then_save(selector, value):
    def submit(page, width):
        page.fill(selector, value)
        page.click("input[name=_save]")

    return submit


def log_in(page, base, username, password) -> list[str]:
    """Walk the login page logged out, then log in through it."""
    problems = walk(page, f"{base}/admin/login/", "login")
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/$"))
    return problems


def operator_paths(items: dict) -> list[tuple]:
    """(name, path) of the operator's pages: index, queue, each state's item page, dashboard."""
    return [
        ("operator-index", "/admin/"),
        ("operator-queue", QUEUE_URL),
        *[(f"operator-item-{state}", f"{QUEUE_URL}{items[state]}/change/") for state in STATES],
        ("operator-dashboard", f"{QUEUE_URL}dashboard/"),
    ]


def admin_paths(items: dict, ids: dict) -> list[tuple]:
    """(name, path, options) of the admin's pages, forms with a valid and an invalid submit."""
    mailbox = f"/admin/intake/mailbox/{ids['mailbox']}/change/"
    destination = f"/admin/ticketing/destination/{ids['destination']}/change/"
    rule = f"/admin/ticketing/routingrule/{ids['rule']}/change/"
    return [
        ("admin-index", "/admin/", {}),
        ("admin-queue", QUEUE_URL, {}),
        *[(f"admin-item-{state}", f"{QUEUE_URL}{items[state]}/change/", {}) for state in STATES],
        *[(f"admin-body-{state}", f"{QUEUE_URL}{items[state]}/body/", {}) for state in STATES],
        ("admin-dashboard", f"{QUEUE_URL}dashboard/", {}),
        ("admin-pauses", "/admin/reconciliation/pauseswitch/", {}),
        ("admin-mailbox", mailbox, {}),
        ("admin-mailbox-invalid", mailbox, {"submit": fill_then_save("#id_slug", ""), "invalid": True}),
        # The example: a setting no provider knows must be refused with a message, not saved.
        (
            "admin-mailbox-invalid-settings",
            mailbox,
            {"submit": fill_then_save("#id_settings", '{"colour": "blue"}'), "invalid": True},
        ),
        ("admin-mailbox-saved", mailbox, {"submit": save}),
        ("admin-destination", destination, {}),
        ("admin-destination-invalid", destination, {"submit": fill_then_save("#id_slug", ""), "invalid": True}),
        ("admin-destination-saved", destination, {"submit": save}),
        ("admin-rule", rule, {}),
        (
            "admin-rule-invalid",
            rule,
            {"submit": fill_then_save("#id_conditions", '{"subject_regex": "^urgent("}'), "invalid": True},
        ),
        ("admin-rule-saved", rule, {"submit": save}),
        ("admin-tickets", "/admin/ticketing/ticket/", {}),
        ("admin-inbox-events", "/admin/intake/inboxevent/", {}),
        ("admin-audit", "/admin/intake/auditevent/", {}),
    ]


# --- seeding on PostgreSQL -------------------------------------------------------------------------


@pytest.fixture
def console_data(tenant, mailbox, desk, monkeypatch, scanner_off):
    """An item in each queue state and one completed, a rule, and the ids the walk needs."""
    builtin = Destination.objects.get(tenant=tenant, kind="builtin")
    good, bad = zendesk_destinations(tenant, desk, monkeypatch)
    failed, quarantined, unknown = seed_three(mailbox, good, bad, desk)
    set_default(tenant, builtin)
    review = new_event(mailbox, subject="Not for us", sender="dan@customer.test", to="someone@elsewhere.test")
    normalize(review)
    assert transition_event(
        review,
        InboxEvent.OPEN_STATES,
        InboxEvent.State.AWAITING_REVIEW,
        actor="system:test",
        kind="awaiting_review",
        reason_code="recipient_not_allowed",
        reason_detail="recipients (someone@elsewhere.test) are not among this mailbox's",
    )
    completed = new_event(
        mailbox,
        subject="VPN drops every 20 minutes",
        sender="lukas@customer.test",
        body="Since Monday the VPN drops every 20 minutes.\n" * 40,
    )
    assert process_inbox_event(completed) == "created"
    age(review, 4)
    policy = tenant.routing_policy
    policy.queues = ["hardware", "billing"]
    policy.save()
    rule = RoutingRule.objects.create(
        tenant=tenant, name="printers", conditions={"subject_regex": "printer"}, queue="hardware"
    )
    items = {
        "awaiting_review": review,
        "quarantined": quarantined,
        "failed": failed,
        "unknown": unknown,
        "completed": completed,
    }
    assert {state: InboxEvent.objects.get(pk=pk).state for state, pk in items.items()} == {
        state: state for state in STATES
    }
    return items, {"mailbox": Mailbox.objects.get(pk=mailbox.pk).pk, "destination": builtin.pk, "rule": rule.pk}


def test_the_operators_walk_finds_no_overflow_error_or_repr(live_server, browser, tenant, console_data):
    items, _ = console_data
    make_user("oper", groups=["operator"], tenants=[tenant])
    context, page = new_context_page(browser)
    try:
        problems = [p.replace("login @", "operator-login @") for p in log_in(page, live_server.url, "oper", PASSWORD)]
        for name, path in operator_paths(items):
            problems += walk(page, f"{live_server.url}{path}", name)
    finally:
        context.close()
    assert not problems, report(problems)


def test_the_admins_walk_finds_no_overflow_error_or_repr(live_server, browser, tenant, console_data):
    items, ids = console_data
    make_user("root", tenants=[tenant], is_superuser=True)
    context, page = new_context_page(browser)
    try:
        problems = [p.replace("login @", "admin-login @") for p in log_in(page, live_server.url, "root", PASSWORD)]
        for name, path, options in admin_paths(items, ids):
            problems += walk(page, f"{live_server.url}{path}", name, **options)
    finally:
        context.close()
    assert not problems, report(problems)


def test_the_walk_reports_overflow_errors_and_reprs_when_a_page_has_them(live_server, browser):
    """The checks themselves can fail: a page made wide, broken and full of reprs on purpose."""
    context, page = new_context_page(browser)
    try:
        page.route(
            "**/walk-check/",
            lambda route: route.fulfill(
                status=200,
                content_type="text/html",
                body=(
                    "<html><body><div id='wide'><table><tr><td><code>" + "x" * 900 + "</code></td></tr></table></div>"
                    "<p>{'fields': None} [{'a': 1}]</p><img src='/static/no-such-file.png'>"
                    "<script>throw new Error('boom')</script></body></html>"
                ),
            ),
        )
        problems = walk(page, f"{live_server.url}/walk-check/", "walk-check")
    finally:
        context.close()
    text = "\n".join(problems)
    for width in WIDTHS:
        assert f"walk-check @{width}px: horizontal overflow" in text, text
        assert re.search(rf"walk-check @{width}px: HTTP 404 for image GET /static/no-such-file.png", text), text
        assert f"walk-check @{width}px: page error: boom" in text, text
        assert "Failed to load resource" not in text, text  # said once, as the response
        assert f"walk-check @{width}px: repr as text" in text, text
    assert "widest: td" in text or "widest: code" in text or "widest: table" in text, text
    assert (SCREENSHOTS / "walk-check-800.png").exists()


# --- the embedded default (SQLite) -----------------------------------------------------------------

# Run in the SQLite instance (`manage.py shell -c`): an item in each state on the demo mailbox, a rule, an
# operator; prints the ids as one JSON line.
SQLITE_SEED = """
import json
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from intake.keys import provider_message_id_for_raw
from intake.models import InboxEvent, Mailbox
from intake.services import ingest, transition_event
from reconciliation.services import ensure_role_groups
from tests.factories import email_message
from ticketing.models import Destination, RoutingRule
from ticketing.services import process_inbox_event

mailbox = Mailbox.objects.get(slug="demo")
def event(**fields):
    raw = email_message(to=mailbox.address, **fields)
    return ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id
items = {}
items["completed"] = event(subject="VPN drops every 20 minutes", sender="lukas@customer.test")
assert process_inbox_event(items["completed"]) == "created"
for state, reason, fields in (
        ("awaiting_review", "recipient_not_allowed", {"subject": "Not for us"}),
        ("quarantined", "attachment_type", {"subject": "Run this", "attachments": [
            ("run.exe", "application/octet-stream", b"MZ" + bytes(200))]}),
        ("failed", "poison", {"subject": "Printer on fire"}),
        ("unknown", "timeout", {"subject": "Cannot log in"})):
    items[state] = event(sender=f"{state}@customer.test", **fields)
    detail = "run.exe: extension .exe is blocked" if state == "quarantined" else "seeded for the console walk"
    assert transition_event(items[state], InboxEvent.OPEN_STATES, state, actor="system:walk", kind=state,
                            reason_code=reason, reason_detail=detail)
ensure_role_groups()
oper = get_user_model().objects.create_user("oper", "oper@staff.test", PASSWORD, is_staff=True)
oper.groups.set(Group.objects.filter(name="operator"))
mailbox.tenant.members.add(oper)
policy = mailbox.tenant.routing_policy
policy.queues = ["hardware", "billing"]
policy.save()
rule = RoutingRule.objects.create(tenant=mailbox.tenant, name="printers", conditions={"subject_regex": "printer"},
                                  queue="hardware")
destination = Destination.objects.get(tenant=mailbox.tenant, is_default=True)
print(json.dumps({"items": items, "ids": {"mailbox": mailbox.pk, "destination": destination.pk, "rule": rule.pk}}))
"""


def start_web(site) -> None:
    """`Instance.start_web`, patient with a busy machine: gunicorn's first answer may take longer than 2 s."""
    import time

    import requests

    from tests.live import LiveProcess, free_port
    from tests.support.instance import GUNICORN

    port = free_port()
    site.url = f"http://127.0.0.1:{port}"
    site.web = LiveProcess(
        "web",
        [
            GUNICORN,
            "config.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--timeout",
            "120",
            "--access-logfile",
            "-",
        ],
        site.env,
        REPO_ROOT,
        site.root / "web.log",
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert site.web.alive(), site.web.tail()
        try:
            if requests.get(f"{site.url}/healthz", timeout=10).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    pytest.fail(f"gunicorn did not answer /healthz within 90 s:\n{site.web.tail()}")


@pytest.fixture(scope="module")
def sqlite_instance(tmp_path_factory):
    from tests.support.instance import PASSWORD as ADMIN_PASSWORD, Instance

    site = Instance(tmp_path_factory.mktemp("walk-sqlite"))
    site.env["MAILROOM_CLAMD"] = "off"
    site.manage_ok("migrate", "--noinput", "-v0")
    site.manage_ok("collectstatic", "--noinput", "-v0")
    site.manage_ok("bootstrap_demo")
    seeded = json.loads(
        site.manage_ok("shell", "-c", f"PASSWORD = {PASSWORD!r}\n{SQLITE_SEED}").strip().splitlines()[-1]
    )
    start_web(site)
    try:
        yield site, ADMIN_PASSWORD, seeded
    finally:
        site.web.stop()


def test_the_admins_and_operators_walk_on_the_embedded_sqlite_default(sqlite_instance, browser):
    site, admin_password, seeded = sqlite_instance
    problems = []
    for username, password, role in (("admin", admin_password, "admin"), ("oper", PASSWORD, "operator")):
        context, page = new_context_page(browser)
        try:
            problems += [
                p.replace("login @", f"sqlite-{role}-login @") for p in log_in(page, site.url, username, password)
            ]
            paths = (
                admin_paths(seeded["items"], seeded["ids"])
                if role == "admin"
                else [(name, path, {}) for name, path in operator_paths(seeded["items"])]
            )
            for name, path, options in paths:
                problems += walk(page, f"{site.url}{path}", f"sqlite-{name}", **options)
        finally:
            context.close()
    assert not problems, report(problems)

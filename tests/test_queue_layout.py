"""The recovery queue's list as an operator reads it: eight columns that fit 1400 px beside the filters, cards at
800 px, an overdue mark and count, and a warning (queue and dashboard) when a tenant's escalations reach nobody.

The browser test drives Debian's Chromium (tests/browser.py) against pytest-django's live server and saves its
screenshots (queue-1400.png, queue-800.png) in the screenshot folder.
"""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from intake.models import InboxEvent, Tenant
from intake.services import transition_event
from reconciliation import selectors
from reconciliation.services import escalation
from tests.browser import browser, chromium_path, page, screenshot_dir  # noqa: F401  (fixtures)
from tests.factories import make_destination, make_event, make_mailbox, make_tenant
from tests.support.queue import QUEUE_URL
from tests.support.users import PASSWORD, make_user

DASHBOARD_URL = f"{QUEUE_URL}dashboard/"
LONG_SUBJECT = (
    "Our whole accounting department cannot open the invoices you sent last week, and the quarter "
    "closes on Friday: please resend them as PDF"
)


def queue_item(
    mailbox,
    state="failed",
    reason="credentials",
    subject="Printer on fire",
    sender="jane.doe@customer.test",
    hours=2,
    **fields,
) -> InboxEvent:
    event = make_event(mailbox, subject=subject)
    assert transition_event(
        event.pk,
        InboxEvent.OPEN_STATES,
        state,
        actor="system:test",
        kind=state,
        reason_code=reason,
        reason_detail="test",
    )
    InboxEvent.objects.filter(pk=event.pk).update(
        sender=sender, subject=subject, received_at=timezone.now() - timedelta(hours=hours), **fields
    )
    return InboxEvent.objects.get(pk=event.pk)


def cell(html: str, event_id: int, field: str) -> str:
    """The HTML of one cell of the item's row."""
    row = re.search(rf"<tr>(?:(?!</tr>).)*?>#{event_id}[ <](?:(?!</tr>).)*</tr>", html, re.S).group(0)
    return re.search(rf'<t[dh] class="field-{field}[^"]*">(.*?)</t[dh]>', row, re.S).group(1)


@pytest.fixture
def operator(tenant):
    return make_user("oper", groups=["operator"], tenants=[tenant])


@pytest.fixture
def operator_client(client, operator):
    client.force_login(operator)
    return client


# --- the columns ---------------------------------------------------------------------------------


def test_the_queue_shows_eight_columns_in_words_and_masks_the_sender(operator_client, operator, mailbox):
    item = queue_item(mailbox, subject=LONG_SUBJECT, hours=3, owner=operator)
    html = operator_client.get(QUEUE_URL).content.decode()

    headers = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', html)
    assert headers == [
        "item",
        "age",
        "state_reason",
        "short_subject",
        "masked_sender",
        "mailbox_slug",
        "owner_name",
        "escalation",
    ]
    listing = html[html.index('id="result_list"') :]
    for gone in ("first seen", "latest attempt", "field-attempts", "field-destination_ref"):
        assert gone not in listing
    assert f">#{item.pk}</a>" in cell(html, item.pk, "item")
    age = cell(html, item.pk, "age")
    assert re.fullmatch(r'<span title="received \d{4}-\d\d-\d\d \d\d:\d\d UTC">3\xa0hours ago</span>', age), age
    state = cell(html, item.pk, "state_reason")
    assert '<span class="state state-failed">failed</span>' in state
    assert re.search(
        r'<span class="reason reason-credentials" title="The destination refused our credentials[^"]*">'
        r"Credentials<",
        state,
    )
    subject = cell(html, item.pk, "short_subject")
    assert subject.count(LONG_SUBJECT.replace("'", "&#x27;")) == 2  # the text (cut by CSS) and its title
    sender = cell(html, item.pk, "masked_sender")
    assert "j***@c***.test" in sender and "jane.doe" not in html
    assert mailbox.slug in cell(html, item.pk, "mailbox_slug")
    assert cell(html, item.pk, "owner_name") == '<span class="cut" title="oper">oper</span>'
    assert re.search(
        r'<span title="in \d+\xa0hours?">\d{4}-\d\d-\d\d \d\d:\d\d UTC</span>', cell(html, item.pk, "escalation")
    )
    assert "None" not in listing and "{'" not in html


def test_the_reason_filter_reads_in_words_and_still_filters_by_code(operator_client, mailbox):
    missing = queue_item(mailbox, state="awaiting_review", reason="missing_sender", sender="")
    queue_item(mailbox, reason="credentials")
    html = operator_client.get(QUEUE_URL).content.decode()
    assert re.search(r'href="\?reason=missing_sender"[^>]*>Missing sender</a>', html)
    filtered = operator_client.get(QUEUE_URL, {"reason": "missing_sender"}).content.decode()
    assert re.findall(r'class="field-item"><a href="[^"]+">#(\d+)', filtered) == [str(missing.pk)]


def test_the_list_makes_the_same_number_of_queries_for_2_or_40_varied_items(operator_client, operator, tenant, mailbox):
    other_box = make_mailbox(tenant, slug="sales")

    def page_queries():
        with CaptureQueriesContext(connection) as ctx:
            assert operator_client.get(QUEUE_URL).status_code == 200
        return len(ctx.captured_queries)

    def add(n, offset):
        for i in range(n):
            queue_item(
                mailbox if i % 2 else other_box,
                reason=("credentials", "poison", "timeout")[i % 3],
                subject=f"item {offset + i}",
                owner=operator if i % 3 == 0 else None,
                escalate_at=timezone.now() - timedelta(minutes=5) if i % 4 == 0 else None,
            )

    add(2, 0)
    few = page_queries()
    add(38, 2)
    assert page_queries() == few


def test_one_grouped_read_gives_the_same_head_and_reason_choices_as_the_separate_reads(operator, mailbox):
    queue_item(mailbox, reason="poison", hours=5, escalate_at=timezone.now() - timedelta(minutes=1))
    queue_item(mailbox, reason="credentials", hours=1)
    queue_item(mailbox, state="quarantined", reason="malware", hours=3)
    overview, summary = selectors.queue_overview(operator), selectors.queue_summary(operator)
    assert {k: overview[k] for k in ("open", "overdue", "oldest_received_at")} == {
        k: summary[k] for k in ("open", "overdue", "oldest_received_at")
    } and summary["open"] == 3
    assert overview["reason_codes"] == selectors.queue_reason_codes(operator) == ["credentials", "poison", "malware"]


def test_pages_and_counts_stay_right_when_the_whole_queue_count_comes_from_the_head(operator_client, mailbox):
    items = [queue_item(mailbox, reason="poison" if i % 5 else "timeout", hours=60 - i) for i in range(55)]
    first = operator_client.get(QUEUE_URL).content.decode()
    second = operator_client.get(QUEUE_URL, {"p": "2"}).content.decode()
    ids = lambda html: re.findall(r'class="field-item"><a href="[^"]+">#(\d+)', html)  # noqa: E731
    assert ids(first) + ids(second) == [str(e.pk) for e in items]
    assert "55 recovery queue" in first and re.search(r'id="open-count">55<', first)
    assert " results (" not in first  # no "(Show all)" beside the search box of the unfiltered queue
    filtered = operator_client.get(QUEUE_URL, {"reason": "timeout"}).content.decode()
    assert len(ids(filtered)) == 11 and "11 recovery queue" in filtered
    assert re.search(r'11 results \(<a href="\?">55 total</a>\)', filtered)


# --- overdue -------------------------------------------------------------------------------------


def test_an_overdue_item_is_marked_in_its_row_and_counted_in_the_header(operator_client, mailbox):
    late = queue_item(mailbox, escalate_at=timezone.now() - timedelta(hours=1))
    on_time = queue_item(mailbox, escalate_at=timezone.now() + timedelta(hours=1))
    html = operator_client.get(QUEUE_URL).content.decode()

    assert re.search(r'id="overdue-count">1<', html) and 'class="queue-overdue"' in html
    assert re.search(
        r'#\d+ <span class="overdue-mark" title="overdue since [^"]+ UTC">overdue</span>', cell(html, late.pk, "item")
    )
    assert 'class="overdue"' in cell(html, late.pk, "escalation")
    assert "overdue" not in cell(html, on_time.pk, "item") + cell(html, on_time.pk, "escalation")
    # Overdue first, whatever the age.
    assert re.findall(r'class="field-item"><a href="[^"]+">#(\d+)', html) == [str(late.pk), str(on_time.pk)]


# --- nobody receives the escalations ---------------------------------------------------------------


def test_the_selector_names_the_tenants_whose_escalations_reach_nobody_as_the_email_code_sees_them(db):
    acme, globex, drill = make_tenant(slug="acme"), make_tenant(slug="globex"), make_tenant(slug="drill")
    Tenant.objects.filter(pk=drill.pk).update(is_drill=True)
    lead = make_user("lead", tenants=[acme, globex, drill])
    lead_tenants = lambda: [t.slug for t in selectors.tenants_without_escalation_recipients(lead)]  # noqa: E731

    def agrees():  # the warning and the email code (escalation.tenant_operators) tell the same story
        for tenant in (acme, globex):
            assert (tenant.slug in lead_tenants()) == (escalation.tenant_operators(tenant.pk) == [])

    assert lead_tenants() == ["acme", "globex"]  # `lead` has an address but is no operator; drills never warn
    silent = make_user("silent", groups=["operator"], tenants=[acme])
    silent.email = ""
    silent.save()
    agrees()
    assert lead_tenants() == ["acme", "globex"]
    gone = make_user("gone", groups=["operator"], tenants=[acme], is_active=False)
    agrees()
    assert lead_tenants() == ["acme", "globex"] and gone.email
    make_user("olga", groups=["operator"], tenants=[acme])
    agrees()
    assert lead_tenants() == ["globex"]
    # Only the user's own tenants.
    assert [
        t.slug for t in selectors.tenants_without_escalation_recipients(make_user("outsider", tenants=[acme]))
    ] == []


def test_the_queue_and_the_dashboard_warn_about_a_tenant_nobody_can_be_escalated_to(client, tenant, mailbox):
    other = make_tenant(slug="globex")
    make_destination(other)
    lead = make_user("lead", groups=["operator"], tenants=[tenant, other])
    lead.email = ""
    lead.save()
    make_user("otto", groups=["operator"], tenants=[other])  # globex can be reached
    queue_item(mailbox, escalate_at=timezone.now() - timedelta(hours=1))
    client.force_login(lead)
    for url in (QUEUE_URL, DASHBOARD_URL):
        html = client.get(url).content.decode()
        warning = re.search(
            r'<div class="escalation-warning" id="escalation-warning"[^>]*>(.*?)</div>', html, re.S
        ).group(1)
        assert '<span class="unreachable-tenant">acme</span>' in warning and "globex" not in warning, url
    assert re.search(r'id="queue-overdue">1<', html)

    olga = make_user("olga", tenants=[tenant])  # first: make_user makes the role groups a flushed database lacks
    Group.objects.get(name="operator").user_set.add(olga)
    for url in (QUEUE_URL, DASHBOARD_URL):
        assert 'id="escalation-warning"' not in client.get(url).content.decode(), url


# --- in a browser ----------------------------------------------------------------------------------


def overflow(page) -> dict:
    return page.evaluate("""() => {
        const results = document.querySelector('#changelist-form .results');
        return {page: document.documentElement.scrollWidth, inner: window.innerWidth,
                results: results.scrollWidth, resultsBox: results.clientWidth};
    }""")


@pytest.mark.live
def test_the_queue_fits_1400_px_beside_the_filters_and_stacks_into_cards_at_800(
    live_server, page, screenshot_dir, tenant, mailbox
):
    operator = make_user("oper", groups=["operator"], tenants=[tenant])
    long_box = make_mailbox(tenant, slug="customer-support-emea-and-apac-escalations")
    items = [
        queue_item(
            long_box if i % 3 == 0 else mailbox,
            subject=LONG_SUBJECT if i % 2 else f"Cannot log in {i}",
            sender=f"firstname.lastname{i}@a-rather-long-customer-domain-name.example",
            hours=i + 1,
            reason=("credentials", "retries_exhausted", "idempotent_request_error")[i % 3],
            owner=operator if i % 2 else None,
            escalate_at=timezone.now() - timedelta(minutes=30) if i == 4 else None,
        )
        for i in range(8)
    ]
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{live_server.url}/admin/login/?next={QUEUE_URL}")
    page.fill("#id_username", "oper")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{QUEUE_URL}")

    sizes = overflow(page)
    assert sizes["page"] <= sizes["inner"] and sizes["results"] <= sizes["resultsBox"], sizes
    assert page.locator("#changelist-filter").is_visible()
    assert page.locator("#changelist-filter").bounding_box()["x"] + 100 < 1400
    headers = page.locator("#result_list thead th")
    assert [t.strip().lower() for t in headers.all_inner_texts()][1:] == [
        "item",
        "age",
        "state and reason",
        "subject",
        "sender",
        "mailbox",
        "owner",
        "escalation",
    ]
    for index in range(headers.count()):
        box = headers.nth(index).bounding_box()
        assert box["width"] > 10 and box["x"] + box["width"] <= 1400, (index, box)
    subject = page.locator("#result_list td.field-short_subject .cut", has_text="accounting department").first
    assert subject.evaluate("e => e.scrollWidth > e.clientWidth")  # cut with an ellipsis, not widening the table
    assert subject.get_attribute("title") == LONG_SUBJECT
    assert page.locator("#result_list th.field-item .overdue-mark").count() == 1
    assert page.inner_text("#overdue-count") == "1"
    assert len(page.locator("#result_list tbody th.field-item a").all()) == len(items)
    page.screenshot(path=screenshot_dir / "queue-1400.png", full_page=True)

    page.set_viewport_size({"width": 800, "height": 900})
    sizes = overflow(page)
    assert sizes["page"] <= 800 and sizes["results"] <= sizes["resultsBox"], sizes
    assert not page.locator("#result_list thead").is_visible()
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == len(items)
    first, second = rows.nth(0).bounding_box(), rows.nth(1).bounding_box()
    assert first["width"] <= 800 and second["y"] >= first["y"] + first["height"]  # cards, one under the other
    card = rows.nth(0)
    for field in ("age", "state_reason", "short_subject", "masked_sender", "mailbox_slug", "owner_name", "escalation"):
        box = card.locator(f"td.field-{field}").bounding_box()
        assert box and box["height"] > 0 and box["x"] + box["width"] <= first["x"] + first["width"] + 1, field
    page.screenshot(path=screenshot_dir / "queue-800.png", full_page=True)


@pytest.mark.live
def test_the_dashboard_warns_about_unreachable_escalations_and_fits_1400_and_800_px(
    live_server, page, screenshot_dir, tenant, mailbox
):
    lead = make_user("lead", groups=["operator"], tenants=[tenant])
    lead.email = ""
    lead.save()
    for i in range(3):
        queue_item(
            mailbox,
            reason=("credentials", "malware", "timeout")[i],
            hours=i + 1,
            escalate_at=timezone.now() - timedelta(minutes=5) if i == 0 else None,
        )
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{live_server.url}/admin/login/?next={DASHBOARD_URL}")
    page.fill("#id_username", "lead")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{DASHBOARD_URL}")
    warning = page.locator("#escalation-warning")
    assert warning.is_visible() and "acme" in warning.inner_text()
    assert page.inner_text("#queue-overdue") == "1"
    for width in (1400, 800):
        page.set_viewport_size({"width": width, "height": 900})
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        page.screenshot(path=screenshot_dir / f"dashboard-{width}.png", full_page=True)
    page.goto(f"{live_server.url}{QUEUE_URL}")
    assert page.locator("#escalation-warning").is_visible()
    page.screenshot(path=screenshot_dir / "queue-warning-800.png", full_page=True)

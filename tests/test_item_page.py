"""The recovery item's page shows the effect of every action: the route the next attempt uses with each
value's origin, a message naming what changed, an overdue mark, a warning when nobody can receive the
escalation, and mail without a usable sender asks for its requester before any replay.

FakeDesk speaks Zendesk over real HTTP; "the ticket has that requester" is read from FakeDesk's own list.
The browser test drives Debian's Chromium (Playwright) against the live server at 1400 and 800 px.
"""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import PermissionDenied
from django.utils import timezone

from intake.models import AuditEvent, InboxEvent
from intake.services import transition_event
from reconciliation import services
from reconciliation.rendering import RouteField, detail_lines, effective_route, route_changes
from tests.browser import browser, chromium_path, screenshot_dir  # noqa: F401  (fixtures)
from tests.support.queue import (  # noqa: F401  (fixtures and helpers)
    QUEUE_URL,
    act,
    audit,
    destinations,
    intent_of,
    new_event,
    seeded,
    set_default,
    tickets_for,
)
from tests.support.users import PASSWORD, make_user, operator, operator_client  # noqa: F401  (fixtures and helpers)
from ticketing.models import Intent
from ticketing.services import process_inbox_event

NOBODY = "Just A Name"  # a From without an address: validation says missing_sender
REPR = re.compile(r"\{'|\['|\bNone\b")


def item_url(event_id) -> str:
    return f"{QUEUE_URL}{event_id}/change/"


def followed(client, response) -> str:
    assert response.status_code == 302, response.status_code
    return client.get(response["Location"]).content.decode()


def element(html: str, element_id: str) -> str:
    start = html.index(f'id="{element_id}"')
    return html[start : html.index("</form>" if element_id.startswith("form-") else "</dd>", start)]


@pytest.fixture
def nameless(mailbox, destinations):
    """An item without a usable sender (missing_sender), with FakeDesk (`desk`) as the tenant default."""
    good, _ = destinations
    set_default(mailbox.tenant, good)
    event_id = new_event(mailbox, subject="Who wrote me", sender=NOBODY)
    assert process_inbox_event(event_id) == "awaiting_review"
    event = InboxEvent.objects.get(pk=event_id)
    assert (event.state, event.reason_code) == ("awaiting_review", "missing_sender")
    return event_id


# --- the requester of mail without a usable sender ------------------------------------------------


def test_a_plain_replay_of_mail_without_a_sender_is_refused_until_a_requester_is_entered(operator, nameless, desk):
    with pytest.raises(services.ActionRefused, match="no usable sender address.*enter the requester"):
        services.do_replay(operator, nameless)
    with pytest.raises(services.ActionRefused, match="no usable sender address"):
        services.do_correct_and_replay(operator, nameless, priority="high")
    event = InboxEvent.objects.get(pk=nameless)
    assert event.state == "awaiting_review" and not audit(nameless, "replayed")

    assert (
        services.do_enter_requester(operator, nameless, address="Carol <carol@customer.test>") == "carol@customer.test"
    )
    assert services.do_replay(operator, nameless) == "rerouted"
    assert process_inbox_event(nameless) == "created"
    [ticket] = tickets_for(desk, intent_of(nameless))
    assert ticket["requester"]["email"] == "carol@customer.test"
    assert ticket["people"]["requester"] == "carol@customer.test"


def test_the_entered_requester_is_stored_on_the_event_with_a_masked_audit_row(operator, nameless):
    services.do_enter_requester(operator, nameless, address="carol@customer.test")
    services.do_enter_requester(operator, nameless, address="dave@customer.test")
    entered = InboxEvent.objects.get(pk=nameless).details["requester_entered"]
    assert entered["address"] == "dave@customer.test" and entered["by"] == "user:oper"
    first, second = audit(nameless, "requester_entered")
    assert first.actor == "user:oper" and first.detail == {"requester": "c***@c***.test", "previous": None}
    assert second.detail == {"requester": "d***@c***.test", "previous": "c***@c***.test"}


@pytest.mark.parametrize(
    ("typed", "why"),
    [
        ("", "enter the requester's email address"),
        ("carol", "not a valid email address"),
        ("carol@", "not a valid email address"),
        ("carol@customer.test, dave@customer.test", "one email address"),
        ("Support <SUPPORT+x@acme.test>", "own mailbox addresses"),
    ],
)
def test_a_requester_address_is_checked_and_bad_input_changes_nothing(operator, nameless, typed, why):
    with pytest.raises(services.ActionRefused, match=why):
        services.do_enter_requester(operator, nameless, address=typed)
    assert "requester_entered" not in (InboxEvent.objects.get(pk=nameless).details or {})
    assert not audit(nameless, "requester_entered")


def test_entering_a_requester_needs_the_replay_permission(tenant, nameless):
    viewer = make_user("viewer", tenants=[tenant])
    viewer.user_permissions.add(Permission.objects.get(codename="view_recoveryitem"))
    with pytest.raises(PermissionDenied):
        services.do_enter_requester(viewer, nameless, address="carol@customer.test")
    assert not audit(nameless, "requester_entered")


def test_the_item_page_asks_for_the_requester_and_saving_it_replays(operator_client, nameless, desk):
    page = operator_client.get(item_url(nameless)).content.decode()
    assert 'id="needs-requester"' in page and 'id="form-requester"' in page
    assert 'id="form-replay"' not in page and 'id="form-correct"' not in page

    bad = act(operator_client, nameless, "enter_requester", address="not an address", then="replay")
    assert bad.status_code == 400
    html = bad.content.decode()
    assert "Not done — Requester: requester&#x27;s email address: that is not a valid email address" in html
    assert "errorlist" in element(html, "form-requester")
    assert InboxEvent.objects.get(pk=nameless).state == "awaiting_review"

    html = followed(
        operator_client, act(operator_client, nameless, "enter_requester", address="carol@customer.test", then="replay")
    )
    assert "Requester set to carol@customer.test (was: none)." in html
    assert "Replayed: back to routing" in html
    assert "carol@customer.test" in element(html, "item-requester") and "oper" in element(html, "item-requester")
    assert process_inbox_event(nameless) == "created"
    assert tickets_for(desk, intent_of(nameless))[0]["requester"]["email"] == "carol@customer.test"


# --- correct and replay keeps the destination -------------------------------------------------------


def test_correct_and_replay_without_a_destination_keeps_the_intents(operator, seeded, destinations):
    _, bad = destinations
    failed = seeded[0]
    assert intent_of(failed).destination == bad
    assert services.do_correct_and_replay(operator, failed, priority="high") == "reopened"
    intent = intent_of(failed)
    assert (intent.state, intent.destination_id) == ("pending", bad.pk)
    assert InboxEvent.objects.get(pk=failed).route_override == {"priority": "high"}
    [replayed] = audit(failed, "replayed")
    assert replayed.detail["corrected"] == {"priority": {"from": "normal", "to": "high"}}


def test_a_correction_without_a_destination_keeps_the_one_an_earlier_correction_chose(operator, mailbox, destinations):
    good, _ = destinations
    event_id = new_event(mailbox)
    transition_event(
        event_id, InboxEvent.OPEN_STATES, "awaiting_review", actor="t", kind="r", reason_code="low_confidence"
    )
    InboxEvent.objects.filter(pk=event_id).update(route_override={"destination_id": good.pk}, sender="a@b.test")
    services.do_correct_and_replay(operator, event_id, queue="billing")
    assert InboxEvent.objects.get(pk=event_id).route_override == {"destination_id": good.pk, "queue": "billing"}


def test_the_page_says_what_a_correction_changed_and_shows_the_route_the_next_attempt_uses(
    operator_client, seeded, destinations
):
    _, bad = destinations
    failed = seeded[0]
    before = operator_client.get(item_url(failed)).content.decode()
    assert "priority: <strong>normal</strong> <small>(the policy&#x27;s default)</small>" in element(
        before, "item-effective-route"
    )
    assert f"(keep: {bad.slug})" in element(before, "form-correct")

    html = followed(
        operator_client,
        act(operator_client, failed, "correct", destination="", priority="high", queue="", request_type=""),
    )
    assert (
        f"Route corrected: priority normal → high; destination kept ({bad.slug}). Replayed with its "
        "original idempotency key" in html
    )
    route = element(html, "item-effective-route")
    assert "priority: <strong>high</strong> <small>(corrected by oper)</small>" in route
    assert f"destination: <strong>{bad.slug}</strong>" in route
    assert not REPR.search(route)


def test_an_invalid_correction_names_the_field_and_shows_the_error_at_the_form(operator_client, seeded):
    failed = seeded[0]
    response = act(operator_client, failed, "correct", destination="999999", priority="high")
    assert response.status_code == 400
    html = response.content.decode()
    assert "Not done — Correct the route and replay: destination: Select a valid choice." in html
    assert "errorlist" in element(html, "form-correct")
    assert intent_of(failed).state == "failed" and not audit(failed, "replayed")


# --- messages naming the effect; overdue and nobody to escalate to --------------------------------------


def test_assign_and_escalation_messages_name_the_new_and_the_previous_value(operator_client, operator, tenant, seeded):
    failed = seeded[0]
    colleague = make_user("colleague", groups=["operator"], tenants=[tenant])
    html = followed(operator_client, act(operator_client, failed, "assign", assignee=colleague.pk))
    assert "Assigned to colleague (was: nobody)." in html
    html = followed(operator_client, act(operator_client, failed, "assign_me"))
    assert "Assigned to you, oper (was: colleague)." in html
    InboxEvent.objects.filter(pk=failed).update(escalate_at=None)  # the queue set one on entry: start from none
    html = followed(operator_client, act(operator_client, failed, "escalate", escalate_at="2031-01-02T03:04"))
    assert re.search(r"Escalation set to 2031-01-02 03:04 UTC \(in \d+.years?\)\. Was: not set\.", html)
    html = followed(operator_client, act(operator_client, failed, "escalate", escalate_at=""))
    assert "Escalation cleared (was: 2031-01-02 03:04 UTC)." in html


def test_an_overdue_item_is_marked_and_one_nobody_can_be_told_about_is_flagged(operator_client, operator, seeded):
    failed = seeded[0]
    InboxEvent.objects.filter(pk=failed).update(escalate_at=timezone.now() - timedelta(hours=3))
    html = operator_client.get(item_url(failed)).content.decode()
    assert 'id="item-overdue"' in html and re.search(r"Overdue</strong> by 3.hours", html)
    assert 'id="no-escalation-recipient"' not in html  # oper is an operator of the tenant, with an address

    type(operator).objects.filter(pk=operator.pk).update(email="")
    html = operator_client.get(item_url(failed)).content.decode()
    assert "Nobody can receive this item's escalation email</strong>: no active operator of acme" in html

    InboxEvent.objects.filter(pk=failed).update(escalate_at=timezone.now() + timedelta(hours=3))
    assert 'id="item-overdue"' not in operator_client.get(item_url(failed)).content.decode()


# --- the renderer -------------------------------------------------------------------------------------


def test_the_effective_route_names_each_values_origin_in_words():
    route = {
        "fields": {
            "queue": {"value": "billing", "origin": "rule:3"},
            "priority": {"value": "normal", "origin": "default"},
            "request_type": {"value": "", "origin": ""},
            "assignee": {"value": "", "origin": ""},
        },
        "destination_id": 7,
        "destination_origin": "rule:3",
        "sensitive_request_types": ["refund"],
    }
    fields = effective_route(
        route,
        {"priority": "high", "request_type": "refund"},
        intent_destination_id=7,
        default_destination_id=1,
        corrected_by_name="olga",
        rule_names={"3": "refunds"},
        destination_names={7: "zendesk-eu", 1: "builtin"},
    )
    assert [(f.label, f.value, f.origin) for f in fields] == [
        ("destination", "zendesk-eu", "set by rule 3 (refunds)"),
        ("queue", "billing", "set by rule 3 (refunds)"),
        ("priority", "high", "corrected by olga"),
        ("request type", "refund", "corrected by olga"),
        ("needs approval", "yes", "its request type refund is sensitive"),
    ]
    default = effective_route({}, None, default_destination_id=1, destination_names={1: "builtin"})
    assert default[0] == RouteField("destination", "destination", "builtin", "the tenant's default")
    assert all(not REPR.search(f"{f.value} {f.origin}") for f in fields + default)


def test_route_changes_read_as_a_sentence():
    before = [RouteField("destination", "destination", "desk", "x"), RouteField("priority", "priority", "normal", "x")]
    kept = [RouteField("destination", "destination", "desk", "x"), RouteField("priority", "priority", "high", "x")]
    moved = [RouteField("destination", "destination", "eu", "x"), RouteField("priority", "priority", "normal", "x")]
    assert route_changes(before, kept) == "priority normal → high; destination kept (desk)"
    assert route_changes(before, moved) == "no field changed; destination desk → eu"


def test_a_replays_corrections_and_destinations_read_as_names_in_the_timeline():
    detail = {
        "corrected": {"priority": {"from": "normal", "to": "high"}, "destination_id": {"from": 3, "to": 5}},
        "destination": 5,
        "previous_destination": 3,
        "intent": 9,
    }
    assert detail_lines(detail, destination_names={3: "desk-bad", 5: "desk"}) == [
        "corrected: priority normal → high; destination desk-bad → desk",
        "destination: desk",
        "previous destination: desk-bad",
        "intent: 9",
    ]
    assert detail_lines({"corrected": {"queue": {"from": None, "to": "billing"}}}) == ["corrected: queue — → billing"]
    assert detail_lines({"escalate_at": "2031-01-02T03:04:00+00:00", "previous": None}) == [
        "escalate at: 2031-01-02 03:04 UTC",
        "previous: —",
    ]


# --- in the browser, at 1400 and 800 px ---------------------------------------------------------------


def log_in(page, base_url, username, next_url):
    page.goto(f"{base_url}/admin/login/?next={next_url}")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{next_url}")


def no_overflow(page, width):
    page.set_viewport_size({"width": width, "height": 900})
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the page is {scroll} px wide at {width} px"


@pytest.mark.live
def test_an_operator_corrects_and_enters_a_requester_in_a_browser_at_1400_and_800_px(
    live_server, browser, screenshot_dir, tenant, mailbox, destinations, desk
):  # noqa: F811
    good, bad = destinations
    failed = new_event(mailbox, subject="Printer on fire " + "very " * 40 + "long", sender="alice@customer.test")
    set_default(tenant, bad)
    assert process_inbox_event(failed) == "failed"
    long_ref = "r" * 200  # the longest a result reference holds, with no place to break
    Intent.objects.filter(inbox_event_id=failed).update(result_ref=long_ref)
    InboxEvent.objects.filter(pk=failed).update(reason_detail="x" * 1796)
    set_default(tenant, good)
    nameless = new_event(mailbox, subject="Who wrote me", sender=NOBODY)
    assert process_inbox_event(nameless) == "awaiting_review"
    oper = make_user("oper", groups=["operator"], tenants=[tenant])
    base = live_server.url
    context = browser.new_context(
        viewport={"width": 1400, "height": 900}, permissions=["clipboard-read", "clipboard-write"]
    )
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        log_in(page, base, "oper", item_url(failed))
        for width in (1400, 800):
            no_overflow(page, width)
            page.screenshot(path=screenshot_dir / f"item-failed-{width}.png", full_page=True)
        page.set_viewport_size({"width": 1400, "height": 900})
        copy = page.locator("#intents button[data-copy]").last
        assert copy.get_attribute("data-copy") == long_ref
        copy.click()
        page.wait_for_function("b => b.textContent === 'Copied'", arg=copy.element_handle())
        assert page.evaluate("navigator.clipboard.readText()") == long_ref

        # Correct and replay without re-picking the destination: it stays, and the message says so.
        page.select_option("#form-correct select[name=priority]", "high")
        page.click("#correct-replay")
        message = " ".join(page.locator("ul.messagelist li").all_inner_texts())
        assert f"Route corrected: priority normal → high; destination kept ({bad.slug})." in message
        assert "priority: high (corrected by oper)" in page.inner_text("#item-effective-route")
        assert intent_of(failed).destination_id == bad.pk
        for width in (1400, 800):
            no_overflow(page, width)
            page.screenshot(path=screenshot_dir / f"item-corrected-{width}.png", full_page=True)

        # Mail without a sender: the requester first, then the replay; the FakeDesk ticket is for them.
        page.set_viewport_size({"width": 1400, "height": 900})
        InboxEvent.objects.filter(pk=nameless).update(escalate_at=timezone.now() - timedelta(hours=2))
        type(oper).objects.filter(pk=oper.pk).update(email="")  # nobody left to email about it
        page.goto(f"{base}{item_url(nameless)}")
        assert page.locator("#form-replay").count() == 0
        assert page.is_visible("#item-overdue") and page.is_visible("#no-escalation-recipient")
        assert page.is_visible("#needs-requester")
        page.fill("#form-requester input[name=address]", "carol@customer.test")
        for width in (1400, 800):
            no_overflow(page, width)
            page.screenshot(path=screenshot_dir / f"item-requester-{width}.png", full_page=True)
        page.click("#requester-replay")
        message = " ".join(page.locator("ul.messagelist li").all_inner_texts())
        assert "Requester set to carol@customer.test (was: none)." in message
        assert process_inbox_event(nameless) == "created"
        [ticket] = tickets_for(desk, intent_of(nameless))
        assert ticket["requester"]["email"] == "carol@customer.test"
        page.reload()
        body = page.inner_text("#content")
        assert "{'" not in body and "None" not in body
        assert AuditEvent.objects.filter(inbox_event_id=nameless, kind="requester_entered").count() == 1
        assert not errors, errors
    finally:
        context.close()

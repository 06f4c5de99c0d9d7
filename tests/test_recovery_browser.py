"""The recovery queue in a real browser: Debian's Chromium, headless, driven by Playwright, against
pytest-django's live server, with FakeDesk as the destination.

An operator logs in, sees three seeded items oldest first, assigns one to
themself, corrects its route to FakeDesk and replays it: exactly one ticket
there (FakeDesk's own list), the item leaves the queue, the audit names the
operator; replaying it again from a stale page makes no second ticket.
'Confirm existing ticket' completes another item with zero calls to FakeDesk.
The operator sees no body and cannot release the quarantined one.

Screenshots go to $MAILROOM_SCREENSHOT_DIR or test-artifacts/screenshots/<time>/
(git-ignored); the run prints the folder.
"""

import re

import pytest

from intake.models import AuditEvent, InboxEvent, Mailbox, Tenant
from intake.services import transition_event
from tests.browser import browser, chromium_path, page, screenshot_dir  # noqa: F401  (fixtures)
from tests.support.queue import (  # noqa: F401  (fixtures)
    QUEUE_URL,
    desk_calls,
    intent_of,
    new_event,
    seed_three,
    tickets_for,
    zendesk_destinations,
)
from tests.support.users import PASSWORD, make_user
from ticketing.models import Destination
from ticketing.services import process_inbox_event

pytestmark = pytest.mark.live


def log_in(page, base_url, username, next_url=QUEUE_URL):
    page.goto(f"{base_url}/admin/login/?next={next_url}")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{next_url}")


def queue_rows(page) -> list[int]:
    # "#12", or "#12 OVERDUE" when its escalation time has passed
    return [
        int(re.match(r"#(\d+)", text).group(1))
        for text in page.locator("#result_list tbody th.field-item a").all_inner_texts()
    ]


def success_message(page) -> str:
    return " ".join(page.locator("ul.messagelist li").all_inner_texts())


def test_an_operator_works_the_queue_in_a_browser(
    live_server, page, screenshot_dir, tenant, mailbox, desk, desk_calls, monkeypatch
):
    good, bad = zendesk_destinations(tenant, desk, monkeypatch)
    failed, quarantined, unknown = seed_three(mailbox, good, bad, desk)
    # Another tenant's item: never shown, never counted.
    globex = Tenant.objects.create(slug="globex")
    Destination.objects.create(tenant=globex, slug="builtin", kind="builtin", is_default=True)
    hidden = new_event(
        Mailbox.objects.create(tenant=globex, slug="globex-support", address="help@globex.test"),
        subject="Globex outage",
        to="help@globex.test",
    )
    transition_event(hidden, InboxEvent.OPEN_STATES, "failed", actor="system:test", kind="failed", reason_code="poison")
    make_user("oper", groups=["operator"], tenants=[tenant])
    base = live_server.url

    # The queue: three items, oldest first, with the head of the page.
    log_in(page, base, "oper")
    assert queue_rows(page) == [failed, quarantined, unknown]
    assert page.inner_text("#open-count") == "3"
    assert re.fullmatch(r"3\s+hours", page.inner_text("#oldest-age"))
    assert "Globex" not in page.content()
    page.screenshot(path=screenshot_dir / "01-queue.png", full_page=True)

    # The failed item: assign it to me, correct its route to FakeDesk and replay.
    page.click(f"#result_list a:text-is('#{failed}')")
    page.wait_for_url(f"**{QUEUE_URL}{failed}/change/")
    assert "needs the message-body permission" in page.inner_text("#item-body")
    assert page.locator("#view-body").count() == 0
    page.click("#assign-me")
    assert "Assigned to you, oper (was: nobody)." in success_message(page)
    # A whole-minute escalation time, typed as a person picks it, is accepted by the browser and saved.
    page.fill("#form-escalate input[name=escalate_at]", "2031-05-04T09:30")
    page.click("#form-escalate input[type=submit]")
    assert page.inner_text("#item-escalate").startswith("2031-05-04 09:30 UTC (in ")
    assert page.inner_text("#item-owner") == "oper"
    stale = page.context.new_page()  # a second tab, opened before the replay: it will try again later
    stale.goto(f"{base}{QUEUE_URL}{failed}/change/")
    page.select_option("#form-correct select[name=destination]", label=str(good))
    page.select_option("#form-correct select[name=priority]", "high")
    page.click("#correct-replay")
    assert (
        "Route corrected: priority normal → high; destination desk-bad → desk. Replayed with its original "
        "idempotency key" in success_message(page)
    )
    page.screenshot(path=screenshot_dir / "02-detail-after-replay.png", full_page=True)

    # A worker picks up the outbox row the replay wrote.
    assert process_inbox_event(failed) == "created"
    intent = intent_of(failed)
    assert intent.destination == good and len(tickets_for(desk, intent)) == 1

    # Replaying the same item again (the stale tab) is refused and makes no second ticket.
    stale.click("#replay")
    assert "Not done: the event is completed" in success_message(stale)
    assert process_inbox_event(failed) == "done"
    assert len(tickets_for(desk, intent)) == 1
    stale.close()

    page.goto(f"{base}{QUEUE_URL}{failed}/change/")
    assert page.inner_text("#item-state") == "completed"
    assert page.locator("#mappings a.ticket-link").inner_text() == f"desk #{intent.result_ref}"
    timeline = page.inner_text("#timeline")
    assert "assigned" in timeline and "replayed" in timeline
    # Who did it, in words ("oper"), with the stored actor as the cell's tooltip.
    assert page.locator("#timeline td.audit-actor[title='user:oper']").first.inner_text() == "oper"
    # Details in words (reconciliation.rendering): the corrected route names who corrected it, no dict repr.
    assert "{'" not in timeline and "None" not in timeline and "priority: high" in timeline
    assert page.inner_text("#item-route").split("\n") == ["priority: high", f"destination: {good.slug} (corrected)"]
    page.screenshot(path=screenshot_dir / "03-detail-completed.png", full_page=True)
    page.set_viewport_size({"width": 800, "height": 900})
    assert page.evaluate("document.documentElement.scrollWidth") <= 800
    page.screenshot(path=screenshot_dir / "03-detail-completed-800.png", full_page=True)
    page.set_viewport_size({"width": 1400, "height": 900})
    actors = dict(
        AuditEvent.objects.filter(inbox_event_id=failed, kind__in=["assigned", "replayed"]).values_list("kind", "actor")
    )
    assert actors == {"assigned": "user:oper", "replayed": "user:oper"}

    # The item left the queue.
    page.goto(f"{base}{QUEUE_URL}")
    assert queue_rows(page) == [quarantined, unknown]
    assert page.inner_text("#open-count") == "2"

    # 'Confirm existing ticket': the unknown item's ticket exists at FakeDesk; zero calls to link it.
    [orphan] = [t for t in desk.tickets() if t["external_id"] == intent_of(unknown).external_ref]
    page.goto(f"{base}{QUEUE_URL}{unknown}/change/")
    calls = len(desk_calls)
    page.fill("#form-confirm input[name=ticket_id]", str(orphan["id"]))
    page.click("#confirm-ticket")
    assert "confirmed" in success_message(page)
    assert len(desk_calls) == calls
    assert InboxEvent.objects.get(pk=unknown).state == "completed"
    assert len(desk.tickets()) == 2  # the orphan and the replayed item's: nothing new

    # The quarantined item: no body, no release (absent in the page, 403 by URL).
    page.goto(f"{base}{QUEUE_URL}{quarantined}/change/")
    assert page.locator("#form-release").count() == 0 and page.locator("#view-body").count() == 0
    page.screenshot(path=screenshot_dir / "04-quarantined-as-operator.png", full_page=True)
    assert page.goto(f"{base}{QUEUE_URL}{quarantined}/body/").status == 403
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    release = page.request.post(
        f"{base}{QUEUE_URL}{quarantined}/act/release/",
        form={"note": "x"},
        headers={"X-CSRFToken": csrf, "Referer": f"{base}{QUEUE_URL}"},
    )
    assert release.status == 403
    assert InboxEvent.objects.get(pk=quarantined).state == "quarantined"
    assert page.goto(f"{base}{QUEUE_URL}{hidden}/change/").status == 404

    page.goto(f"{base}{QUEUE_URL}")
    assert queue_rows(page) == [quarantined]
    page.screenshot(path=screenshot_dir / "05-queue-after.png", full_page=True)
    assert sorted(p.name for p in screenshot_dir.iterdir()) >= ["01-queue.png", "02-detail-after-replay.png"]

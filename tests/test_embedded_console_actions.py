"""The console's actions in Chromium on the embedded default, against `make run`'s own stack.

A fresh copy of the repository runs `make run` (SQLite and the embedded SQLite broker, with run_stack's real
web, worker, beat and relay), as tests/test_make_run_browser.py starts it. Mail arrives as signed raw webhooks
over HTTP and the worker's pipeline judges it: 200 messages to an address the demo mailbox does not allow
(`recipient_not_allowed`), 5 without any text (`empty`) and one whose From names nobody
(`From: undisclosed-recipients:;`, `missing_sender`). One more item is failed for good (`poison`), stored by
a `manage.py shell` script in the copy. Then the admin of the banner, in Chromium at 1400 px:

- filters the queue by the reason, opens "Act on all 200 matching items…", closes them as not a request
  with a reason, and watches the job page reach 200 done (run_stack's worker runs the job); the 5 others stay;
- on the failed item: saves an escalation time (a whole minute in the datetime-local input), then corrects the
  priority only and replays; the item leaves the queue and its built-in ticket has priority high;
- on the item without a sender: no plain replay is offered (and a posted one is refused); enters a requester
  and replays; the built-in ticket is for that requester.

Every page visited is photographed at 1400 and 800 px. A console error, an uncaught page error, a
Content-Security-Policy violation or any response >= 500 fails the test, as does a traceback on make's console.
"""

import json
import re
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest
import requests
from playwright.sync_api import Error as PlaywrightError

from intake.signing import signed_headers
from tests.browser import browser, chromium_path, screenshot_dir  # noqa: F401  (fixtures)
from tests.factories import email_message
from tests.support.make_run import banner_value, clean_env, running_stack  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.live, pytest.mark.timeout(900)]

QUEUE = "/admin/reconciliation/recoveryitem/"
DEMO = "support@demo.mailroom.test"  # reconciliation.services.setup.DEMO_ADDRESS, the one allowed recipient
FLOOD, OTHER, NOBODY = "recipient_not_allowed", "empty", "missing_sender"
CLOSE_REASON = "misaddressed newsletter wave"
FAILED_SUBJECT = "Printer on fire in room 4"
NAMELESS_SUBJECT = "Who wrote me"
REQUESTER = "carol@customer.test"

# Registered before any page script: a CSP violation is reported here as well as on the console.
WATCH_VIOLATIONS = """
window.__violations = [];
document.addEventListener('securitypolicyviolation',
    (e) => window.__violations.push(e.violatedDirective + ' ' + (e.blockedURI || 'inline')));
"""

# Run in the copy (`manage.py shell -c`): the events' states and reasons, and the ids of a few of them.
STATES_CODE = """
import json
from collections import Counter
from intake.models import InboxEvent
rows = list(InboxEvent.objects.values_list("pk", "state", "reason_code", "subject"))
print(json.dumps({"states": Counter(f"{state}/{reason}" for _, state, reason, _ in rows),
                  "ids": {subject: pk for pk, _, _, subject in rows if subject in SUBJECTS},
                  "empty": sorted(pk for pk, state, reason, _ in rows if reason == "empty")}))
"""

# Run in the copy: an item the workers gave up on (poison), stored and failed in one transaction so that the
# running worker never sees it open (a real poison message takes MAILROOM_MAX_DISPATCHES stale sweeps); sender
# and subject stored as normalization stores them.
FAILED_CODE = """
import json
from django.db import transaction
from intake.keys import provider_message_id_for_raw
from intake.mime import parse_message
from intake.models import InboxEvent, Mailbox
from intake.services import ingest, transition_event
from intake.vocabulary import AuditKind, ReasonCode
from tests.factories import email_message

mailbox = Mailbox.objects.get(slug="demo")
raw = email_message(to=mailbox.address, subject=SUBJECT, sender="Alice Example <alice@customer.test>",
                    body="The printer in room 4 smells of smoke again.\\n")
parsed = parse_message(raw)
with transaction.atomic():
    event_id = ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id
    InboxEvent.objects.filter(pk=event_id).update(sender=parsed.sender, subject=parsed.subject,
                                                  message_id_header=parsed.message_id)
    InboxEvent.objects.filter(pk=event_id).update(dispatch_count=5)
    # What the stale-event sweep writes (intake.services) once an event was dispatched too often.
    assert transition_event(event_id, InboxEvent.OPEN_STATES, InboxEvent.State.FAILED, actor="system:sweep",
                            kind=AuditKind.POISON, reason_code=ReasonCode.POISON,
                            reason_detail="dispatched 5 times without progress", audit_detail={"dispatches": 5})
print(json.dumps({"failed": event_id}))
"""

TICKET_CODE = """
import json
from ticketing.models import Ticket
print(json.dumps([{"destination": t.destination.slug, "kind": t.destination.kind, "priority": t.priority,
                   "requester": t.requester} for t in Ticket.objects.filter(subject=SUBJECT)]))
"""


def shell(workdir, code: str, **names):
    import subprocess

    prefix = "".join(f"{name} = {value!r}\n" for name, value in names.items())
    env = {**clean_env(), "MAILROOM_ENV": "development"}  # what `make run` exports to its processes
    result = subprocess.run(
        [".venv/bin/python", "manage.py", "shell", "-c", prefix + code],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def env_file_value(workdir, name: str) -> str:
    for line in (workdir / ".env").read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"{name} is not in the copy's .env")


def post_mail(session, base: str, secret: str, raw: bytes):
    response = session.post(
        f"{base}/webhooks/raw/demo/",
        data=raw,
        timeout=30,
        headers={**signed_headers(secret, raw), "Content-Type": "message/rfc822"},
    )
    assert response.status_code == 202, (response.status_code, response.text[:300])


def poll(predicate, timeout: float, what: str, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"{what}: not within {timeout:.0f} s")


class Watch:
    """What the browser reported: console errors, uncaught errors, CSP violations, responses >= 500."""

    def __init__(self, page):
        self.problems: list[str] = []
        page.on("console", lambda m: m.type == "error" and self.problems.append(f"console error: {m.text[:300]}"))
        page.on("pageerror", lambda exc: self.problems.append(f"page error: {str(exc)[:300]}"))
        page.on(
            "response",
            lambda r: r.status >= 500 and self.problems.append(f"HTTP {r.status} for {r.request.method} {r.url}"),
        )

    def check(self, page, where: str) -> None:
        try:
            violations = page.evaluate("window.__violations || []")
        except PlaywrightError:  # the page is navigating: the next check reads them
            violations = []
        self.problems += [f"{where}: CSP violation: {v}" for v in violations]


def photograph(page, folder, name: str, watch: Watch) -> None:
    """At 1400 and 800 px: a full-page screenshot; the page no wider than the window, no repr as text."""
    for width in (1400, 800):
        page.set_viewport_size({"width": width, "height": 900})
        page.screenshot(path=str(folder / f"embedded-actions-{name}-{width}.png"), full_page=True)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        if overflow > 1:
            watch.problems.append(f"{name} @{width}px: {overflow}px wider than the window")
        text = page.inner_text("body")
        for match in list(re.finditer(r"\{'|\[\{|\bNone\b", text))[:2]:
            watch.problems.append(f"{name} @{width}px: repr as text near {text[max(0, match.start() - 30) :][:70]!r}")
    page.set_viewport_size({"width": 1400, "height": 900})
    watch.check(page, name)


def messages_text(page) -> str:
    return " ".join(" ".join(page.locator("ul.messagelist li").all_inner_texts()).split())


def wait_out_of_queue(page, item_url: str) -> None:
    def gone():
        page.goto(item_url)
        return page.locator("#not-in-queue").count() == 1

    poll(gone, 90, f"{item_url} leaving the queue (run_stack's worker making its ticket)", interval=1.5)


def test_an_admin_closes_200_in_bulk_corrects_and_replays_and_enters_a_requester_on_the_embedded_default(
    running_stack, browser, screenshot_dir, tmp_path
):  # noqa: F811
    port, output = running_stack
    workdir = tmp_path / "mailroom"  # where the fixture copied the project and runs `make run`
    base = banner_value(output, "admin").removesuffix("/admin/")
    assert base == f"http://127.0.0.1:{port}", output.tail()
    user, password = banner_value(output, "user"), banner_value(output, "password")

    # --- the mail, over the webhook, judged by the worker's pipeline --------------------------------
    secret = env_file_value(workdir, "MAILROOM_DEMO_WEBHOOK_SECRET")
    with requests.Session() as session:
        for n in range(200):
            post_mail(
                session,
                base,
                secret,
                email_message(
                    subject=f"Spring newsletter {n}",
                    sender=f"News {n} <news{n}@lists.example>",
                    to="orders@elsewhere.example",
                    body=f"Issue {n}: our spring offers.\n",
                ),
            )
        for n in range(5):
            post_mail(
                session,
                base,
                secret,
                email_message(subject=f"Blank {n}", sender=f"blank{n}@customer.test", to=DEMO, body=""),
            )
        post_mail(
            session,
            base,
            secret,
            email_message(
                subject=NAMELESS_SUBJECT, sender="undisclosed-recipients:;", to=DEMO, body="My laptop will not start.\n"
            ),
        )
    expected = {f"awaiting_review/{FLOOD}": 200, f"awaiting_review/{OTHER}": 5, f"awaiting_review/{NOBODY}": 1}
    subjects = [NAMELESS_SUBJECT]
    state = poll(
        lambda: (s := shell(workdir, STATES_CODE, SUBJECTS=subjects))["states"] == expected and s,
        240,
        f"the worker judging the 206 messages as {expected}",
        interval=2,
    )
    nameless, empty_ids = state["ids"][NAMELESS_SUBJECT], state["empty"]
    failed = shell(workdir, FAILED_CODE, SUBJECT=FAILED_SUBJECT)["failed"]

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(20_000)
    context.add_init_script(WATCH_VIOLATIONS)
    page = context.new_page()
    watch = Watch(page)
    try:
        # --- logged in with the banner's credentials ---------------------------------------------------
        page.goto(f"{base}/")
        page.click("#open-console")
        page.wait_for_url(re.compile(r"/admin/login/"))
        page.fill("#id_username", user)
        page.fill("#id_password", password)
        page.click("input[type=submit]")
        page.wait_for_url(re.compile(r"/admin/$"))

        # --- the queue, filtered by the reason; the bulk close of its 200 items ------------------------
        page.goto(f"{base}{QUEUE}")
        photograph(page, screenshot_dir, "queue", watch)
        page.click(f"#changelist-filter a[href*='reason={FLOOD}']")
        page.wait_for_url(re.compile(rf"reason={FLOOD}"))
        assert page.inner_text("#bulk-open") == "Act on all 200 matching items…"
        photograph(page, screenshot_dir, "queue-filtered", watch)
        page.click("#bulk-open")
        page.wait_for_url(re.compile(r"/bulk/\?reason="))
        assert page.inner_text("#bulk-count") == "200"
        assert page.locator("#bulk-sample tbody tr").count() == 10
        photograph(page, screenshot_dir, "bulk-preview", watch)
        page.check("input[name=job-action][value=close]")
        page.fill("#id_job-reason", CLOSE_REASON)
        page.click("#bulk-confirm")
        page.wait_for_url(re.compile(r"/bulk/\d+/$"))
        assert page.inner_text("#bulk-total") == "200"
        assert "for 200 item(s)" in messages_text(page)

        seen = set()

        def job_done():
            try:  # bulk.js follows the job, then loads the page once more when it ends
                seen.add(int(page.inner_text("#bulk-done", timeout=2_000)))
                return page.evaluate("(document.getElementById('bulk-job') || {dataset: {}}).dataset.state") == "done"
            except (PlaywrightError, ValueError):
                return False

        poll(job_done, 180, "the bulk job done on the job page (run_stack's worker on the SQLite broker)", 0.3)
        page.wait_for_selector("#bulk-state.bulk-state-done")
        assert (
            page.inner_text("#bulk-done"),
            page.inner_text("#bulk-succeeded"),
            page.inner_text("#bulk-skipped"),
            page.inner_text("#bulk-failed"),
        ) == ("200", "200", "0", "0"), seen
        assert page.locator("#bulk-progress").get_attribute("value") == "200"
        photograph(page, screenshot_dir, "bulk-done", watch)
        states = shell(workdir, STATES_CODE, SUBJECTS=[])["states"]
        assert states == {
            "suppressed/not_a_request": 200,
            f"awaiting_review/{OTHER}": 5,
            f"awaiting_review/{NOBODY}": 1,
            "failed/poison": 1,
        }, states
        page.goto(f"{base}{QUEUE}?reason={FLOOD}")
        assert page.locator("#bulk-open").count() == 0  # nothing left under that reason
        page.goto(f"{base}{QUEUE}?reason={OTHER}")
        assert page.inner_text("#bulk-open") == "Act on all 5 matching items…"
        listed = {
            int(n)
            for n in re.findall(r"#(\d+)", " ".join(page.locator("#result_list th.field-item").all_inner_texts()))
        }
        assert listed == set(empty_ids), (listed, empty_ids)

        # --- the failed item: an escalation time, then correct the priority and replay ----------------
        item_url = f"{base}{QUEUE}{failed}/change/"
        page.goto(item_url)
        assert page.inner_text("#item-state") == "failed"
        photograph(page, screenshot_dir, "item-failed", watch)
        at = (datetime.now(UTC) + timedelta(days=1)).replace(second=0, microsecond=0)
        page.fill("#form-escalate input[name=escalate_at]", at.strftime("%Y-%m-%dT%H:%M"))
        page.click("#form-escalate input[type=submit]")
        page.wait_for_load_state("load")
        shown = at.strftime("%Y-%m-%d %H:%M UTC")
        assert f"Escalation set to {shown} (in " in messages_text(page), messages_text(page)
        assert page.inner_text("#item-escalate").startswith(shown)
        photograph(page, screenshot_dir, "item-escalated", watch)
        assert page.locator("#form-correct select[name=destination]").input_value() == ""  # keep the current one
        page.select_option("#form-correct select[name=priority]", "high")
        page.click("#correct-replay")
        page.wait_for_load_state("load")
        said = messages_text(page)
        # Never classified (it failed first), so its priority was the policy's default or none at all.
        assert re.search(r"Route corrected: priority .+? → high; destination kept \(builtin\)\. Replayed", said), said
        photograph(page, screenshot_dir, "item-corrected", watch)
        wait_out_of_queue(page, item_url)
        assert page.inner_text("#item-state") == "completed"
        assert "priority: high" in page.inner_text("#item-effective-route")
        [ticket] = shell(workdir, TICKET_CODE, SUBJECT=FAILED_SUBJECT)
        assert (ticket["destination"], ticket["kind"], ticket["priority"]) == ("builtin", "builtin", "high"), ticket
        assert "alice@customer.test" in ticket["requester"], ticket
        open_ticket(page, base, FAILED_SUBJECT)
        assert page.locator("#id_priority").input_value() == "high"
        photograph(page, screenshot_dir, "ticket-corrected", watch)

        # --- mail without a sender: no plain replay; the requester, then the replay --------------------
        item_url = f"{base}{QUEUE}{nameless}/change/"
        page.goto(item_url)
        assert page.is_visible("#needs-requester")
        assert page.locator("#form-replay, #replay, #form-correct").count() == 0
        photograph(page, screenshot_dir, "item-nameless", watch)
        token = page.locator("#form-requester input[name=csrfmiddlewaretoken]").input_value()
        refused = page.request.post(f"{base}{QUEUE}{nameless}/act/replay/", form={"csrfmiddlewaretoken": token})
        assert refused.status == 200 and "Not done:" in refused.text() and "no usable sender" in refused.text()
        page.fill("#form-requester input[name=address]", REQUESTER)
        page.click("#requester-replay")
        page.wait_for_load_state("load")
        said = messages_text(page)
        assert f"Requester set to {REQUESTER} (was: none)." in said and "Replayed" in said, said
        assert REQUESTER in page.inner_text("#item-requester")
        photograph(page, screenshot_dir, "item-requester", watch)
        wait_out_of_queue(page, item_url)
        assert page.inner_text("#item-state") == "completed"
        [ticket] = shell(workdir, TICKET_CODE, SUBJECT=NAMELESS_SUBJECT)
        assert (ticket["destination"], ticket["kind"], ticket["requester"]) == ("builtin", "builtin", REQUESTER), ticket
        open_ticket(page, base, NAMELESS_SUBJECT)
        assert page.inner_text(".field-requester .readonly") == REQUESTER
        photograph(page, screenshot_dir, "ticket-requester", watch)
        page.goto(f"{base}{QUEUE}")
        assert page.inner_text("#open-count") == "5"  # the 5 empty ones are all that is left
    finally:
        watch.check(page, "last page")
        context.close()
    assert not watch.problems, "\n".join(watch.problems)
    console = output.text()
    assert "Traceback" not in console and "exited with" not in console, output.tail()


def open_ticket(page, base: str, subject: str) -> None:
    """The built-in ticket, found by its subject in the console's ticket list."""
    page.goto(f"{base}/admin/ticketing/ticket/?q={quote(subject)}")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1, page.inner_text("#result_list")
    rows.first.locator("th a, td a").first.click()
    page.wait_for_url(re.compile(r"/admin/ticketing/ticket/\d+/change/"))

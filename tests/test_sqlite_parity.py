"""The embedded default behaves like production: the same pages, API, set-based path, reconciliation and drill on
a real SQLite file, with nothing logged at ERROR.

What `make run` does, in a temporary directory and without make: `DATABASE_URL=sqlite:///<tmp>/db.sqlite3`,
`MAILROOM_ENV=development`, no broker setting (the embedded one), then `migrate`, `collectstatic`,
`bootstrap_demo` and a real gunicorn on a free 127.0.0.1 port. Mail arrives over HTTP (`send_test_email` and
signed posts); a `manage.py shell` script processes it with the task the worker runs (after comparing every row
the set-based path writes with the per-event path's, on SQLite), and the console is driven over HTTP with a
logged-in session. The demo's secrets come from the environment, so nothing is written outside the directory.

The tests of this module share one instance, built once, and run in file order; the drill goes last because its
scratch tenant is in the queue and the dashboard while it runs.
"""

import json
import re

import pytest
import requests

from tests.factories import email_message
from tests.senderauth import TRUSTED_AUTHSERV_ID, stamped
from tests.support.instance import Instance, assert_no_error_lines

pytestmark = [pytest.mark.live, pytest.mark.timeout(600)]

DEMO = "support@demo.mailroom.test"  # reconciliation.services.setup.DEMO_ADDRESS
QUEUE = "/admin/reconciliation/recoveryitem/"


# Run inside the SQLite instance (`manage.py shell -c`), after EXPECT = {...} is prepended. Every event still in
# `received` is processed three ways from the same start, each in a transaction rolled back afterwards: per event,
# as the task does it (set-based first), and by the set-based path alone (which ids it leaves to the per-event
# path); then for real with the task, and the acknowledgments it planned are sent. Prints one JSON line.
PROCESS_SCRIPT = """
import json
from django.db import transaction
from intake.models import InboxEvent, OutboxMessage
from tests.support.batch import assert_same, snapshot
from ticketing import batch, services, tasks, workers
from ticketing.models import Intent, RoutingRule, TicketMapping


class Undo(Exception):
    pass


def per_event(ids):
    worker, cache, outcomes = workers.worker_identity(), {}, {}
    for event_id in ids:
        outcome = services.process_inbox_event(event_id, worker=worker, group_cache=cache)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes


def set_based_only(ids):
    return batch.process_plain(ids, workers.worker_identity(), {})[1]


ids = list(InboxEvent.objects.filter(state="received").order_by("pk").values_list("pk", flat=True))
assert sorted(EXPECT["all"]) == ids, (EXPECT["all"], ids)
outbox_after = OutboxMessage.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
runs = {}
for name, run in (("per_event", per_event), ("task", tasks.process_inbox_events), ("set_based", set_based_only)):
    try:
        with transaction.atomic():
            result = run(ids)
            runs[name] = (snapshot(ids, outbox_after), result)
            raise Undo
    except Undo:
        pass
assert_same(runs["per_event"][0], runs["task"][0])
outcomes = tasks.process_inbox_events(ids)
acknowledgments = list(Intent.objects.filter(action="notify_requester", state="pending").values_list("pk", flat=True))
print(json.dumps({
    "same_outcomes": runs["per_event"][1] == runs["task"][1], "outcomes": outcomes,
    "left_by_set_based": runs["set_based"][1],
    "states": {pk: [s, r] for pk, s, r in InboxEvent.objects.filter(pk__in=ids).values_list("pk", "state",
                                                                                          "reason_code")},
    "mappings": {pk: a for pk, a in TicketMapping.objects.filter(inbox_event_id__in=ids).values_list("inbox_event_id",
                                                                                                    "action")},
    "acknowledgments": tasks.send_acknowledgments(acknowledgments),
    "rule_hits": list(RoutingRule.objects.values_list("name", "hits")),
}))
"""


def csrf(session: requests.Session) -> str:
    return session.cookies["csrftoken"]


@pytest.fixture(scope="module")
def instance(tmp_path_factory):
    """migrate, collectstatic, bootstrap_demo, gunicorn; a rule and a mailbox setting written through the API;
    mail by `send_test_email` and by signed posts; then the processing script."""
    site = Instance(tmp_path_factory.mktemp("sqlite-instance"))
    site.manage_ok("migrate", "--noinput", "-v0")
    site.manage_ok("collectstatic", "--noinput", "-v0")
    assert "demo ready" in site.manage_ok("bootstrap_demo")
    assert not (site.root / ".env").exists()  # every secret came from the environment
    site.start_web()
    try:
        site.token = site.manage_ok("api_token", "admin").strip()
        api = site.api()
        mailbox = api.get(f"{site.url}/api/v1/mailboxes/", timeout=10).json()["results"][0]
        changed = api.patch(
            f"{site.url}/api/v1/mailboxes/{mailbox['id']}/",
            timeout=10,
            json={"settings": {**mailbox["settings"], "trusted_authserv_id": TRUSTED_AUTHSERV_ID}},
        )
        assert changed.status_code == 200, changed.text
        rule = api.post(
            f"{site.url}/api/v1/routing-rules/",
            timeout=10,
            json={"tenant": "demo", "name": "invoices", "priority": "high", "conditions": {"subject_regex": "invoice"}},
        )
        assert rule.status_code == 201, rule.text
        site.ids["rule"] = rule.json()["id"]

        sent = site.manage_ok("send_test_email", "demo", "--url", site.url, "--count", "2")
        samples = [
            json.loads(line.split(" ", 1)[1])["inbox_event_id"] for line in sent.splitlines() if line.startswith("202 ")
        ]
        assert len(samples) == 2, sent
        first = email_message(subject="Printer on fire", sender="ann@example.com", to=DEMO)
        message_id = first.split(b"Message-ID: <", 1)[1].split(b">", 1)[0].decode()
        mail = {
            "first": stamped(first),
            "second": stamped(email_message(subject="Scanner jammed", sender="ben@example.com", to=DEMO)),
            "invoice": stamped(email_message(subject="Where is my invoice?", sender="cat@example.com", to=DEMO)),
            "reply": stamped(
                email_message(
                    subject="Re: Printer on fire",
                    sender="ann@example.com",
                    to=DEMO,
                    extra_headers={"In-Reply-To": f"<{message_id}>", "References": f"<{message_id}>"},
                )
            ),
            "review": email_message(subject="Not for us", sender="dan@example.com", to="someone@elsewhere.test"),
            "api_review": email_message(subject="Nor this", sender="fay@example.com", to="other@elsewhere.test"),
            "quarantine": email_message(
                subject="Run this",
                sender="eve@example.com",
                to=DEMO,
                attachments=[("run.exe", "application/octet-stream", b"MZ\x90\x00" + b"\x00" * 200)],
            ),
        }
        for name, raw in mail.items():
            response = site.post_mail(raw)
            assert response.status_code == 202, (name, response.status_code, response.text)
            site.ids[name] = response.json()["inbox_event_id"]
        again = site.post_mail(mail["first"])
        assert again.status_code == 200 and again.json() == {"inbox_event_id": site.ids["first"], "duplicate": True}
        assert site.post_mail(mail["second"], secret="not-the-secret").status_code == 401
        site.ids.update(sample1=samples[0], sample2=samples[1])

        expect = {"all": [pk for name, pk in site.ids.items() if name != "rule"]}
        out = site.manage_ok("shell", "-c", f"EXPECT = {json.dumps(expect)}\n{PROCESS_SCRIPT}")
        site.processed = json.loads(out.strip().splitlines()[-1])
        assert_no_error_lines(site.web_log(), "gunicorn (setting up)")
        yield site
    finally:
        site.web.stop()


@pytest.fixture(autouse=True)
def web_log_stays_clean(instance):
    """Whatever a test asks of the web server, it logs nothing at ERROR."""
    before = len(instance.web_log())
    yield
    assert_no_error_lines(instance.web_log()[before:], "gunicorn")


def test_mail_is_processed_set_based_with_the_rows_the_per_event_path_writes(instance):
    ids, result = instance.ids, instance.processed
    state = {int(pk): tuple(v) for pk, v in result["states"].items()}
    plain = [ids[n] for n in ("sample1", "sample2", "first", "second", "invoice")]
    assert result["same_outcomes"]  # and the script asserted every stored row equal (tests.support.batch.assert_same)
    # The set-based path took every plain message itself (no fallback) and left the reply, thread work, to the
    # per-event path; the review and quarantine verdicts it settled on the way.
    assert set(result["left_by_set_based"]) == {ids["reply"]}
    assert all(state[pk] == ("completed", "") for pk in [*plain, ids["reply"]])
    assert state[ids["review"]] == state[ids["api_review"]] == ("awaiting_review", "recipient_not_allowed")
    assert state[ids["quarantine"]] == ("quarantined", "attachment_type")
    mappings = {int(pk): action for pk, action in result["mappings"].items()}
    assert mappings[ids["reply"]] == "add_comment" and all(mappings[pk] == "create_ticket" for pk in plain)
    assert dict(result["rule_hits"]) == {"invoices": 1}
    # The authenticated senders were acknowledged (file backend under the instance's var/), the sample's not.
    assert result["acknowledgments"] == {"sent": 3}
    # Django's file backend writes one file per connection, and a group of acknowledgments shares one: count
    # the messages (each starts with its headers, Message-ID among them), not the files.
    sent = "".join(path.read_text() for path in (instance.root / "var" / "sent-mail").iterdir())
    assert len(re.findall(r"^Message-ID: ", sent, flags=re.MULTILINE)) == 3


def test_front_door_favicon_and_view_site(instance):
    anonymous = requests.Session()
    root = anonymous.get(f"{instance.url}/", timeout=10, allow_redirects=False)
    assert root.status_code == 200 and 'id="open-console" href="/admin/"' in root.text  # the landing page
    icon = anonymous.get(f"{instance.url}/favicon.ico", timeout=10)
    assert icon.status_code == 200 and icon.content[:4] == b"\x00\x00\x01\x00"  # collectstatic's copy, by whitenoise
    index = anonymous.get(f"{instance.url}/api/v1/", timeout=10)
    assert index.status_code == 200 and index.json()["resources"]["events"] == f"{instance.url}/api/v1/events/"
    console = instance.console()
    page = console.get(f"{instance.url}/admin/", timeout=10)
    assert page.status_code == 200
    assert '<a href="/" id="start-page-link">Start page</a>' in page.text and 'rel="icon"' in page.text
    assert '<a href="/api/docs/">API docs</a>' in page.text
    assert console.get(f"{instance.url}/api/docs/", timeout=10).status_code == 200


def test_dashboard_shows_the_backlog_and_the_last_reconciliation(instance):
    instance.manage_ok("reconcile")
    console = instance.console()
    page = console.get(f"{instance.url}{QUEUE}dashboard/", timeout=10)
    assert page.status_code == 200, page.text[:2000]
    for state, count in (("awaiting_review", 2), ("quarantined", 1), ("received", 0)):
        assert re.search(rf'<tr class="backlog-{state}"><td>{state}</td><td>{count}</td>', page.text), state
    row = re.search(r'<tr class="reconciliation-demo">(.*?)</tr>', page.text, re.S).group(1)
    assert "<td>unmapped</td>" in row  # the latest of the pass's runs for the mailbox (the portable query)
    for plot in ("backlog", "hourly", "daily"):
        assert f'id="plot-{plot}"' in page.text


def test_recovery_queue_changelist_and_its_actions(instance):
    ids, url = instance.ids, f"{instance.url}{QUEUE}"
    console = instance.console()
    for query in ("", "?q=Run", "?o=2", "?state=quarantined", "?p=1", "?all="):
        assert console.get(url + query, timeout=10).status_code == 200, query
    listed = set(map(int, re.findall(r'name="_selected_action" value="(\d+)"', console.get(url, timeout=10).text)))
    mine = {ids["review"], ids["quarantine"]}  # the REST API's test has the third item
    assert mine <= listed <= mine | {ids["api_review"]}

    selected = {"_selected_action": sorted(mine), "csrfmiddlewaretoken": csrf(console)}
    assigned = console.post(url, data={**selected, "action": "assign_to_me"}, timeout=10, allow_redirects=False)
    assert assigned.status_code == 302
    preview = console.post(url, data={**selected, "action": "bulk_replay"}, timeout=10)
    assert preview.status_code == 200 and "Confirm bulk replay" in preview.text

    for pk in mine:
        assert console.get(f"{url}{pk}/change/", timeout=10).status_code == 200
    assert console.get(f"{url}{ids['quarantine']}/body/", timeout=10).status_code == 200
    for pk, action in ((ids["review"], "close"), (ids["quarantine"], "release")):
        done = console.post(
            f"{url}{pk}/act/{action}/",
            data={"reason": "parity test", "csrfmiddlewaretoken": csrf(console)},
            timeout=10,
            allow_redirects=False,
        )
        assert done.status_code == 302 and done.headers["Location"] == f"{QUEUE}{pk}/change/", action
    events = {e["id"]: e for e in instance.api().get(f"{instance.url}/api/v1/events/", timeout=10).json()["results"]}
    assert (events[ids["review"]]["state"], events[ids["review"]]["owner"]) == ("suppressed", "admin")
    assert events[ids["quarantine"]]["state"] == "ready"  # released: judged ready, waiting for a worker
    dry_run = console.get(f"{instance.url}/admin/ticketing/routingrule/{ids['rule']}/dry-run/", timeout=10)
    assert dry_run.status_code == 200


def test_rest_api(instance):
    api, base = instance.api(), f"{instance.url}/api/v1"
    index = requests.get(f"{base}/", timeout=10).json()
    for name, resource in index["resources"].items():
        response = api.get(resource, timeout=10)
        assert response.status_code == 200, (name, response.text[:500])
        assert requests.get(resource, timeout=10).status_code == 401, name
    first = instance.ids["first"]
    detail = api.get(f"{base}/events/{first}/", timeout=10).json()
    assert detail["state"] == "completed"
    for query in ("state=completed", "received_after=2020-01-01", "mailbox=demo", "page_size=2"):
        assert api.get(f"{base}/events/?{query}", timeout=10).status_code == 200, query
    assert api.get(f"{base}/mappings/?event={first}", timeout=10).json()["results"][0]["action"] == "create_ticket"
    assert api.get(f"{base}/events/{first}/body/", timeout=10).status_code == 200
    item = instance.ids["api_review"]
    queue = [row["id"] for row in api.get(f"{base}/queue/", timeout=10).json()["results"]]
    assert item in queue
    assigned = api.post(f"{base}/queue/{item}/assign/", json={"assignee": "admin"}, timeout=10)
    assert assigned.status_code == 200 and assigned.json()["event"]["owner"] == "admin", assigned.text
    closed = api.post(f"{base}/queue/{item}/close/", json={"reason": "parity test"}, timeout=10)
    assert closed.status_code == 200 and closed.json()["event"]["state"] == "suppressed", closed.text
    assert item not in [row["id"] for row in api.get(f"{base}/queue/", timeout=10).json()["results"]]
    for path in ("/api/schema/", "/api/docs/"):
        assert api.get(f"{instance.url}{path}", timeout=10).status_code == 200, path


def test_reconcile_exits_zero_with_a_line_per_reconciler(instance):
    out = instance.manage_ok("reconcile")
    kinds = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert {"provider", "unmapped", "destination", "outbox"} <= kinds
    assert "error" not in out


def test_drill_prints_its_table_passes_and_leaves_reconciliation_clean(instance):
    """Last: while it runs, the drill's scratch tenant is in the queue and the dashboard the tests above read."""
    out = instance.manage_ok("drill", timeout=500)
    lines = out.splitlines()
    header = next(n for n, line in enumerate(lines) if line.split()[:2] == ["scenario", "expected"])
    assert set(lines[header + 1]) <= {"-", " "}
    body = lines[header + 2 :]
    rows = body[: body.index("")] if "" in body else body  # the table ends at the first blank line
    assert rows and all(row.split()[-1] == "pass" for row in rows), "\n".join(lines)
    assert "drill passed" in out
    assert "error" not in instance.manage_ok("reconcile")  # nothing of the drill left for reconciliation to trip on


BULK_TICKETS_SCRIPT = """
import json, secrets
from django.utils import timezone
from ticketing.intents.creation import external_ref
from ticketing.models import Destination, Ticket
destination = Destination.objects.get(tenant__slug="demo", kind="builtin")
keys = [secrets.token_hex(32) for _ in range(1200)]
Ticket.objects.bulk_create([Ticket(destination=destination, idempotency_key=k, external_ref=external_ref(k),
                                   subject="bulk", created_at=timezone.now()) for k in keys])
print(json.dumps({"tickets": Ticket.objects.filter(destination=destination).count()}))
"""


def test_reconcile_reads_more_desk_records_than_one_sqlite_expression_holds(instance):
    """Last of all (it adds 1,200 unmapped tickets): the destination reconciler asks for their intents in
    chunks; one OR of 1,200 prefixes was 'Expression tree is too large' on SQLite, every 5 minutes of a soak."""
    made = json.loads(instance.manage_ok("shell", "-c", BULK_TICKETS_SCRIPT).strip().splitlines()[-1])
    assert made["tickets"] >= 1200
    out = instance.manage_ok("reconcile", "--destination", "demo/builtin")
    [line] = [line for line in out.splitlines() if line.startswith("destination")]
    assert "error" not in line and re.search(r"scanned\D+(\d+)", line), line
    assert int(re.search(r"scanned\D+(\d+)", line).group(1)) >= 1200, line

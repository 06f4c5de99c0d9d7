"""The real-world corpus through real processes: HTTP -> PostgreSQL -> relay -> Redis -> Celery worker.

Every message of `tests/corpus/` is posted to the live web server, each twice
(the second copy concurrently with the rest, as a provider retrying would),
and a separate worker process makes the tickets. Each message must end in the
state and reason its manifest line names, with exactly one event per distinct
message and one ticket per completed event — the two ServiceNow updates that
share a Message-ID included.
"""

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from intake.signing import signed_headers
from tests.corpus_manifest import CORPUS, load_manifest
from tests.live import (  # noqa: F401  (fixtures)
    LIVE_SECRET,
    event_states,
    live_broker,
    live_mailbox,
    live_processes,
    subprocess_env,
    wait_for,
)

pytestmark = pytest.mark.live

# Cases that need another mailbox configuration than the live mailbox's are left to the in-process test.
CASES = [case for case in load_manifest() if not case.get("allowed_recipients")]
FINAL = {"completed", "suppressed", "awaiting_review", "quarantined", "failed"}


def post(url: str, raw: bytes) -> requests.Response:
    return requests.post(
        url, data=raw, timeout=30, headers={**signed_headers(LIVE_SECRET, raw), "Content-Type": "message/rfc822"}
    )


def test_the_corpus_posted_twice_ends_as_its_manifest_says_with_one_ticket_each(
    live_server, live_mailbox, live_broker, live_processes, settings
):
    from intake.models import InboxEvent
    from ticketing.models import Ticket, TicketMapping

    env = subprocess_env(live_broker.url, MAILROOM_CLAMD="off")
    live_processes.worker(env)
    live_processes.relay(env)
    url = f"{live_server.url}/webhooks/raw/{live_mailbox.slug}/"

    # In manifest order first (a message named in `after` goes before the one naming it) ...
    raws = {case["file"]: (CORPUS / case["file"]).read_bytes() for case in CASES}
    first = {name: post(url, raw) for name, raw in raws.items()}
    assert {name: r.status_code for name, r in first.items() if r.status_code != 202} == {}
    events = {name: r.json()["inbox_event_id"] for name, r in first.items()}
    assert len(set(events.values())) == len(CASES), "a distinct message was taken for a duplicate"

    # ... then every message again, eight at a time: each answer names its first event.
    with ThreadPoolExecutor(max_workers=8) as pool:
        again = dict(zip(raws, pool.map(lambda raw: post(url, raw), raws.values()), strict=True))
    assert {
        name: (r.status_code, r.json())
        for name, r in again.items()
        if (r.status_code, r.json()) != (200, {"inbox_event_id": events[name], "duplicate": True})
    } == {}

    wait_for(
        lambda: set(event_states(events.values())) <= FINAL,
        timeout=120,
        interval=0.5,
        describe=lambda: f"states {dict(event_states(events.values()))}\n{live_processes.logs()}",
    )

    stored = {e.pk: e for e in InboxEvent.objects.filter(pk__in=events.values())}
    outcomes = {name: (stored[events[name]].state, stored[events[name]].reason_code) for name in events}
    expected = {case["file"]: (case["state"], case["reason"]) for case in CASES}
    assert outcomes == expected
    assert InboxEvent.objects.filter(mailbox=live_mailbox).count() == len(CASES)
    reused = {name for name in events if stored[events[name]].message_id_reused}
    assert reused == {case["file"] for case in CASES if case.get("message_id_reused")}

    completed = [events[name] for name, (state, _) in outcomes.items() if state == "completed"]
    mappings = TicketMapping.objects.filter(inbox_event_id__in=completed)
    per_event = Counter(mappings.values_list("inbox_event_id", flat=True))
    assert set(per_event) == set(completed) and set(per_event.values()) == {1}
    created = mappings.filter(action="create_ticket")
    assert created.count() == len(set(created.values_list("ticket_id", flat=True)))
    assert Ticket.objects.filter(destination__tenant=live_mailbox.tenant).count() == created.count()

"""The same action twice, and two OS processes racing for one event (docs/design.md §8 "Testing", failure windows).

`ticketing.services.process_inbox_event` promises to be safe to run any number
of times, concurrently: whatever the interleaving, one event yields exactly one
ticket, one mapping and one `ticket_created` audit row.
"""

import json
import subprocess
import time
from collections import Counter

import pytest

from tests.live import (  # noqa: F401  (fixtures)
    PYTHON,
    REPO_ROOT,
    audit_kinds,
    live_mailbox,
    make_email,
    subprocess_env,
    wait_for_other_sessions_to_end,
)

pytestmark = pytest.mark.live

N_RACES = 12
RACE_SPACING = 0.25  # seconds between two races: far longer than one event takes

# Runs in each racing process: set Django up and warm everything, say "ready",
# wait for the go file, then start event i at exactly t0 + i * spacing.
RACE_SCRIPT = r"""
import json, os, sys, time
import django
django.setup()
from django.db import connection
from intake.mime import parse_message
from ticketing import services, workers
from ticketing.destinations import builtin  # noqa: F401 (imported lazily by adapter_for)

ready, go, ids, spacing = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4])
with connection.cursor() as cursor:
    cursor.execute("SELECT 1")
open(ready, "w").close()
deadline = time.time() + 60
while not os.path.exists(go):
    if time.time() > deadline:
        sys.exit("no go signal")
    time.sleep(0.002)
with open(go) as handle:
    t0 = float(handle.read())
results = {}
for i, event_id in enumerate(ids):
    start = t0 + i * spacing
    while start - time.time() > 0.003:
        time.sleep(0.001)
    while time.time() < start:
        pass
    began = time.time()
    try:
        outcome = services.process_inbox_event(event_id)
    except Exception as exc:
        outcome = f"error: {type(exc).__name__}: {exc}"
    results[str(event_id)] = {"outcome": outcome, "began": began, "ended": time.time()}
print(json.dumps({"worker": workers.worker_identity(), "results": results}))
"""


def ingest_events(mailbox, n: int) -> list[int]:
    from intake.keys import provider_message_id_for_raw
    from intake.services import ingest

    ids = []
    for i in range(n):
        raw = make_email(f"Race #{i}")
        result = ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw")
        assert not result.duplicate
        ids.append(result.inbox_event_id)
    return ids


def assert_exactly_once(event_id: int):
    from ticketing.models import Intent, Ticket, TicketMapping

    mappings = list(TicketMapping.objects.filter(inbox_event_id=event_id).values_list("ticket_id", flat=True))
    assert len(mappings) == 1, (event_id, mappings)
    intents = list(Intent.objects.filter(inbox_event_id=event_id))
    assert len(intents) == 1, (event_id, intents)
    # Claimed once: no second worker ever got the intent in flight.
    assert (intents[0].state, intents[0].attempts) == ("succeeded", 1), (event_id, intents[0].state)
    tickets = list(Ticket.objects.filter(idempotency_key=intents[0].idempotency_key).values_list("pk", flat=True))
    assert [str(pk) for pk in tickets] == mappings
    kinds = audit_kinds(event_id)
    assert (kinds["received"], kinds["ticket_created"]) == (1, 1), (event_id, kinds)


def test_processing_one_event_twice_in_a_row_creates_one_ticket(live_mailbox):
    from intake.models import InboxEvent
    from ticketing import tasks
    from ticketing.models import Ticket, TicketMapping
    from ticketing.services import process_inbox_event

    [event_id] = ingest_events(live_mailbox, 1)

    assert process_inbox_event(event_id) == "created"
    assert process_inbox_event(event_id) == "done"
    # The Celery tasks, run in this process, are no-ops too.
    assert tasks.process_inbox_event(event_id) == {"done": 1}
    assert tasks.process_inbox_events([event_id, event_id]) == {"done": 2}

    assert InboxEvent.objects.get(pk=event_id).state == "completed"
    assert Ticket.objects.count() == 1
    assert TicketMapping.objects.count() == 1
    assert_exactly_once(event_id)


def test_two_processes_racing_for_the_same_events_create_each_ticket_once(live_mailbox, tmp_path):
    from intake.models import AuditEvent, InboxEvent
    from ticketing.models import Ticket, TicketMapping

    ids = ingest_events(live_mailbox, N_RACES)
    # Half of them as a worker that died after normalizing leaves them (`ready`): then the racers
    # meet at the intent rather than at the event's first state change.
    InboxEvent.objects.filter(pk__in=ids[::2]).update(state="ready")
    env = subprocess_env()  # no broker needed: the processes call the service directly
    go = tmp_path / "go"
    racers = []
    try:
        for n in range(2):
            racers.append(
                subprocess.Popen(
                    [
                        PYTHON,
                        "-c",
                        RACE_SCRIPT,
                        str(tmp_path / f"ready-{n}"),
                        str(go),
                        json.dumps(ids),
                        str(RACE_SPACING),
                    ],
                    cwd=REPO_ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready-{n}").exists() for n in range(2)):
            if any(r.poll() is not None for r in racers):
                for racer in racers:
                    racer.kill()
                pytest.fail(f"a racing process died: {[r.communicate() for r in racers]}")
            assert time.monotonic() < deadline, "racing processes did not get ready"
            time.sleep(0.02)
        (tmp_path / "go.tmp").write_text(repr(time.time() + 0.3))
        (tmp_path / "go.tmp").rename(go)  # atomic: both see the whole start time
        outputs = [r.communicate(timeout=60) for r in racers]
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
                racer.wait()
        wait_for_other_sessions_to_end()

    reports = []
    for racer, (stdout, stderr) in zip(racers, outputs, strict=True):
        assert racer.returncode == 0, stderr
        reports.append(json.loads(stdout.strip().splitlines()[-1]))
    assert reports[0]["worker"] != reports[1]["worker"]

    losers, overlapping = Counter(), 0
    for event_id in ids:
        calls = [report["results"][str(event_id)] for report in reports]
        outcomes = sorted(call["outcome"] for call in calls)
        # Exactly one process created the ticket; the other found it busy or done, and nothing failed.
        assert outcomes.count("created") == 1, (event_id, outcomes)
        loser = next(o for o in outcomes if o != "created")
        assert loser in ("busy", "done"), (event_id, outcomes)
        losers[loser] += 1
        # Both calls were in flight at the same time: a race, not two runs in a row.
        if max(c["began"] for c in calls) < min(c["ended"] for c in calls):
            overlapping += 1
        winner = next(r["worker"] for r in reports if r["results"][str(event_id)]["outcome"] == "created")
        actor = AuditEvent.objects.get(inbox_event_id=event_id, kind="ticket_created").actor
        assert actor == f"worker:{winner}"
        assert_exactly_once(event_id)

    assert set(InboxEvent.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"completed"}
    assert Ticket.objects.count() == N_RACES
    assert TicketMapping.objects.count() == N_RACES
    # The races were real: the two calls for an event were in flight together (on this machine: every time).
    assert overlapping >= N_RACES // 2, (overlapping, losers)

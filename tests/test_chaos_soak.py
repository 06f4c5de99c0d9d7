"""The seeded chaos soak, per destination kind: 300 emails through the real web door, relay, workers
and sweeps, with the fake desk failing on purpose (lost answers after the write, 429s, 500s, stalls
past the read timeout) and a whole worker SIGKILLed twice mid-run.

Zendesk keeps our idempotency key, Salesforce upserts on our external id, Jira Service Management
has neither and a search that lags: each must end with zero duplicates (one record per reference)
and zero orphans (no record without its mapping, no mapping without its record); whatever did not
complete is an item in the recovery queue with a reason. Right after it settles, no desk record may
lack its mapping: an attempt that failed for good after an earlier one's answer was lost asks the desk
first (ticketing.intents.record_failure), so such a ticket ends mapped, never as a `failed` item.
"""

import importlib
import random
import signal
import time
from collections import Counter

import pytest
import requests

from intake.signing import signed_headers
from tests.live import (  # noqa: F401  (fixtures)
    LIVE_SECRET,
    kill_group,
    live_broker,
    live_mailbox,
    live_processes,
    make_email,
    wait_for,
)
from tests.support.windows import settled, state_of, sweeper, worker_env

pytestmark = [pytest.mark.live]

SEED = 20261129
FAULTS = {"drop_after_commit": 0.1, "rate_limit:1": 0.1, "error_500": 0.1, "stall_after_commit:2": 0.1}


@pytest.fixture(params=["zendesk", "jira_sm", "salesforce"])
def soaked(request, live_mailbox, desk_factory, monkeypatch):
    """(kit, desk, destination): the kind's fake in its own process (SQLite file), as the default destination."""
    kit = importlib.import_module(f"tests.destination_kits.{request.param}")
    desk = desk_factory(process=True, db_path=True, dialect=kit.DIALECT, **kit.DESK_OPTIONS)
    destination = kit.configure(live_mailbox.tenant, desk, monkeypatch, retry_base_seconds=0.05, retry_cap_seconds=0.5)
    return kit, desk, destination


def test_seeded_soak_with_faults_and_killed_workers(
    soaked, live_server, live_mailbox, live_broker, live_processes, monkeypatch
):
    from intake.models import AuditEvent, InboxEvent
    from reconciliation.selectors import recovery_queue
    from ticketing.models import Intent, TicketMapping

    kit, desk, _ = soaked
    n_emails = 300
    monkeypatch.setenv("CELERY_BROKER_URL", live_broker.url)
    desk.set_plan(random_spec={"seed": SEED, "weights": FAULTS})
    env = worker_env(live_broker)
    live_processes.relay(env)
    workers = [live_processes.worker(env, concurrency=1), live_processes.worker(env, concurrency=1)]
    url = f"{live_server.url}/webhooks/raw/{live_mailbox.slug}/"
    rng = random.Random(SEED)
    ids, kills = [], 0
    with sweeper(stale_seconds=5):
        for n in range(n_emails):
            body = make_email(f"Soak #{n}")
            response = requests.post(url, data=body, timeout=15, headers=signed_headers(LIVE_SECRET, body))
            assert response.status_code == 202
            ids.append(response.json()["inbox_event_id"])
            if n in (100, 200):  # SIGKILL a whole worker mid-run, then start a fresh one
                victim = workers.pop(rng.randrange(len(workers)))
                kill_group(victim.pid, signal.SIGKILL)
                victim.popen.wait(10)
                kills += 1
                workers.append(live_processes.worker(env, concurrency=1))
            time.sleep(0.01)
        wait_for(
            lambda: all(settled(i) for i in ids),
            timeout=180,
            interval=0.5,
            describe=lambda: f"{Counter(state_of(i) for i in ids)}\n{live_processes.logs(10)}",
        )
    assert_no_record_without_its_mapping(desk, ids)

    states = Counter(InboxEvent.objects.filter(pk__in=ids).values_list("state", flat=True))
    records = desk.tickets()
    by_reference = Counter(r["external_id"] for r in records)
    mappings = {m.inbox_event_id: m for m in TicketMapping.objects.filter(inbox_event_id__in=ids)}
    faults = Counter(r["fault"] for r in desk.requests_log())
    # Tickets a failure for good after an unknown outcome found by asking the desk (record_failure).
    asked = AuditEvent.objects.filter(inbox_event_id__in=ids, kind="ticket_created", detail__settled_by="lookup")
    reasons = Counter(
        InboxEvent.objects.filter(pk__in=ids).exclude(state="completed").values_list("reason_code", flat=True)
    )
    print(
        f"\nsoak {kit.DIALECT}: {n_emails} emails, seed {SEED}, workers killed {kills}; event states "
        f"{dict(states)}; records {len(records)}, mappings {len(mappings)}, writes {sum(faults.values())}, "
        f"faults {dict(faults)}, found by asking after a failure {asked.count()}; reasons {dict(reasons)}"
    )

    assert max(by_reference.values(), default=1) == 1, "a duplicate: two records carry one reference"
    record_ids = {kit.ticket_id_of(r) for r in records}
    assert record_ids == {m.ticket_id for m in mappings.values()}, "an orphan record, or a mapping without one"
    for event_id in ids:
        intent = Intent.objects.get(inbox_event_id=event_id)
        if InboxEvent.objects.get(pk=event_id).state == "completed":
            [record] = [r for r in records if r["external_id"] == intent.external_ref]
            assert mappings[event_id].ticket_id == kit.ticket_id_of(record), event_id
    not_completed = [i for i in ids if InboxEvent.objects.get(pk=i).state != "completed"]
    queue = {e.pk: e for e in recovery_queue()}
    for event_id in not_completed:
        assert event_id in queue and queue[event_id].reason_code, state_of(event_id)
    assert states["completed"] + len(not_completed) == n_emails
    assert states["completed"] >= n_emails * 0.7, "the faults are a minority: most mail must get through"
    # No message here is poison: mail that waited in a busy broker, or whose call waited in the destination
    # pool, was never a take without progress (intake.services.record_taken).
    assert not reasons.get("poison"), reasons


def assert_no_record_without_its_mapping(desk, ids):
    """Right after the soak settles: every desk record carries the external reference of an intent that
    succeeded with its mapping. A record whose intent failed (or is held) is the orphan that a failure
    recorded after an unknown outcome, without asking the desk, would leave."""
    from ticketing.models import Intent, TicketMapping

    mapped = TicketMapping.objects.filter(inbox_event_id__in=ids, action="create_ticket").values("inbox_event_id")
    mapped_refs = set(
        Intent.objects.filter(inbox_event_id__in=mapped, action="create_ticket", state="succeeded").values_list(
            "external_ref", flat=True
        )
    )
    unmapped = [record["external_id"] for record in desk.tickets() if record["external_id"] not in mapped_refs]
    intents = {i.external_ref: i for i in Intent.objects.filter(external_ref__in=unmapped)}
    assert not unmapped, "desk records without a mapping: " + "; ".join(
        f"{ref}: {state_of(intents[ref].inbox_event_id)}, {intents[ref].attempts} attempts, "
        f"last {intents[ref].last_error_kind}"
        if ref in intents
        else f"{ref}: no intent"
        for ref in unmapped
    )

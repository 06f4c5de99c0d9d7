"""Scale-out on one PostgreSQL and one broker: two complete nodes, one of them SIGKILLed mid-run.

Each node is a prefork worker for the default queue (`-n nodeN@%h`), a thread-pool worker for the destinations
queue (`-n nodeN-calls@%h`, ticketing.bulkhead), a relay (`manage.py run_relay`) and a web server (gunicorn),
as `manage.py run_stack` starts them. The desk is FakeDesk in its own process, spoken to as Zendesk, with a
quarter of its writes slowed so that calls are in flight when the node dies. Emails go alternately to both
web servers, as a load balancer would send them; a post that finds its web server dead is sent again, freshly
signed, to the other one. Half-way, once the first node's thread pool holds a live claim, every process of
that node (each its own process group: the workers' children too) is SIGKILLed at once. What beat does runs
from a sweeper thread on a short period (tests.support.windows.sweeper). Every email must end with one
ticket at the desk, one mapping and one succeeded intent, on Redis and on RabbitMQ with quorum queues.
"""

import os
import signal
import socket
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from config.celery import READY_FILE_VAR
from intake.signing import signed_headers
from tests.factories import make_desk_destination
from tests.live import (  # noqa: F401  (fixtures)
    LIVE_SECRET,
    PIPELINE_REDIS_DB,
    PYTHON,
    flushed_broker,
    free_port,
    kill_group,
    live_mailbox,
    live_processes,
    make_email,
    wait_for,
)
from tests.support.windows import settled, state_of, sweeper, worker_env

pytestmark = [pytest.mark.live, pytest.mark.fakedesk(process=True, db_path=True)]

N_EMAILS = 300
DESTINATION_QUEUE = "destinations"
# A vhost of its own keeps these queues apart from anything else on the broker (MAILROOM_LIVE_AMQP_URL moves it).
AMQP_URL = os.environ.get("MAILROOM_LIVE_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
GUNICORN = str(Path(PYTHON).parent / "gunicorn")


@contextmanager
def fresh_rabbitmq(url: str):
    """The broker's task queues deleted before and after: the workers declare them again, as quorum queues."""
    from kombu import Connection

    def delete_queues():
        with Connection(url) as connection:
            channel = connection.channel()
            for name in ("celery", DESTINATION_QUEUE):
                channel.queue_delete(name)

    delete_queues()
    try:
        yield SimpleNamespace(url=url)
    finally:
        delete_queues()


@pytest.fixture(params=["redis", "rabbitmq"])
def broker(request):
    if request.param == "redis":
        with flushed_broker(PIPELINE_REDIS_DB) as live:
            yield live
    else:
        with fresh_rabbitmq(AMQP_URL) as live:
            yield live


class Node:
    """One host's processes: its workers, its relay and its web server."""

    def __init__(self, name: str, live_processes, env: dict, ready_dir: Path):
        celery = [
            PYTHON,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--loglevel",
            "WARNING",
            "--without-mingle",
            "--without-gossip",
        ]
        self.name, self.ready_files = name, [ready_dir / f"{name}.ready", ready_dir / f"{name}-calls.ready"]
        self.worker = live_processes.start(
            f"{name}-worker",
            celery + ["--concurrency", "1", "-Q", "celery", "-n", f"{name}@%h"],
            {**env, READY_FILE_VAR: str(self.ready_files[0])},
        )
        self.calls = live_processes.start(
            f"{name}-calls",
            celery + ["--pool", "threads", "--concurrency", "4", "-Q", DESTINATION_QUEUE, "-n", f"{name}-calls@%h"],
            {**env, READY_FILE_VAR: str(self.ready_files[1])},
        )
        self.relay = live_processes.relay(env)
        self.port = free_port()
        self.web = live_processes.start(
            f"{name}-web",
            [GUNICORN, "config.wsgi", "--bind", f"127.0.0.1:{self.port}", "--workers", "2", "--no-control-socket"],
            env,
        )
        self.processes = [self.worker, self.calls, self.relay, self.web]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        if not all(path.exists() for path in self.ready_files):
            return False
        try:
            return requests.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def claimed_by_its_pool(self):
        """Intents whose live claim is this node's thread-pool worker's (claimed_by is host:pid/thread)."""
        from ticketing.models import Intent

        return Intent.objects.filter(
            state="in_flight", claimed_by__startswith=f"{socket.gethostname()}:{self.calls.pid}/"
        )

    def kill(self) -> None:
        """SIGKILL every process of the node at once, each with its process group (the workers' children)."""
        for process in self.processes:
            kill_group(process.pid, signal.SIGKILL)
        for process in self.processes:
            process.popen.wait(10)


def post(nodes: list[Node], first: int, slug: str, body: bytes) -> tuple[int, int]:
    """(inbox_event_id, status): to nodes[first], else to the next one that answers, signed afresh each time."""
    for k in range(len(nodes)):
        node = nodes[(first + k) % len(nodes)]
        try:
            response = requests.post(
                f"{node.url}/webhooks/raw/{slug}/", data=body, timeout=15, headers=signed_headers(LIVE_SECRET, body)
            )
        except requests.ConnectionError:
            continue  # that web server is gone: the other one takes the email
        assert response.status_code in (200, 202), (response.status_code, response.text[:200])
        return response.json()["inbox_event_id"], response.status_code
    pytest.fail("no web server answered")


def test_two_nodes_one_killed_every_email_has_exactly_one_ticket(
    broker, live_mailbox, live_processes, desk, monkeypatch, tmp_path
):
    from intake.models import InboxEvent
    from ticketing.models import Intent, TicketMapping

    destination = make_desk_destination(live_mailbox.tenant, desk, monkeypatch, read_timeout=2.0)
    desk.set_plan(random_spec={"seed": 26, "weights": {"stall_before_commit:0.3": 0.25}})
    env = worker_env(broker, MAILROOM_DESTINATION_QUEUE=DESTINATION_QUEUE, MAILROOM_DESTINATION_THREADS=4)
    nodes = [Node(f"node{n}", live_processes, env, tmp_path) for n in (1, 2)]
    wait_for(
        lambda: all(node.ready() for node in nodes), timeout=90, interval=0.3, describe=lambda: live_processes.logs(15)
    )
    started = time.monotonic()

    ids, statuses, victim = [], Counter(), nodes[0]
    claims_at_kill = 0
    with sweeper(stale_seconds=10):
        for n in range(N_EMAILS):
            if n == N_EMAILS // 2:
                # Kill while the node holds work: a live claim of its pool (a call at the desk, or about to be).
                claims_at_kill = wait_for(
                    lambda: victim.claimed_by_its_pool().count(),
                    timeout=20,
                    interval=0.02,
                    describe=lambda: live_processes.logs(10),
                )
                victim.kill()
            event_id, status = post(nodes, n % 2, live_mailbox.slug, make_email(f"Two nodes #{n}"))
            ids.append(event_id)
            statuses[status] += 1
        wait_for(
            lambda: all(settled(i) for i in ids),
            timeout=120,
            interval=0.5,
            describe=lambda: f"{Counter(state_of(i) for i in ids)}\n{live_processes.logs(10)}",
        )
    wall = time.monotonic() - started

    assert statuses == {202: N_EMAILS} and len(set(ids)) == N_EMAILS  # every post stored once, by either server
    assert claims_at_kill >= 1
    states = Counter(InboxEvent.objects.filter(pk__in=ids).values_list("state", flat=True))
    assert states == {"completed": N_EMAILS}, states
    records = desk.tickets()
    by_reference = Counter(r["external_id"] for r in records)
    print(
        f"\ntwo nodes on {broker.url.split(':')[0]}: {N_EMAILS} emails in {wall:.1f} s, node1 SIGKILLed "
        f"holding {claims_at_kill} claim(s); desk records {len(records)}, "
        f"writes {len(desk.requests_log())}"
    )
    assert len(records) == N_EMAILS and max(by_reference.values()) == 1, "a duplicate at the desk"
    mappings = TicketMapping.objects.filter(inbox_event_id__in=ids)
    assert Counter(mappings.values_list("inbox_event_id", flat=True)) == {i: 1 for i in ids}
    assert {m.ticket_id for m in mappings} == {str(r["id"]) for r in records}  # no orphan, no mapping without
    intents = Intent.objects.filter(inbox_event_id__in=ids, action="create_ticket")
    assert Counter(intents.filter(state="succeeded").values_list("inbox_event_id", flat=True)) == {i: 1 for i in ids}
    assert set(intents.values_list("destination_id", flat=True)) == {destination.pk}
    # Both nodes made calls: each thread pool's pid is on intents it completed.
    claimers = Counter(intents.values_list("claimed_by", flat=True))
    for node in nodes:
        pool = f"{socket.gethostname()}:{node.calls.pid}/"
        assert sum(n for claimer, n in claimers.items() if claimer.startswith(pool)) > 0, (node.name, claimers)

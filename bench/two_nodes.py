"""Scale-out: the end-to-end pipeline on one worker node and on two, with the same total concurrency.

A node is what one host runs: a prefork worker for the default queue (`-n <node>@%h`), a thread-pool worker for
the destinations queue, a relay (`manage.py run_relay`) and beat (intake.beat: the second stands by), as
`manage.py run_stack` starts them, all on one PostgreSQL database and one Redis; one gunicorn serves the posts
in every phase, so only the worker side changes. Phases, alternating (`--rounds`):

- one node, prefork `--concurrency 2`;
- two nodes, prefork `--concurrency 1` each;

each posting N emails (bench/e2e.py's phase: as fast as 4 clients go, then until every one has its ticket and
mapping) to the built-in destination: emails/s, goal two nodes >= 90 % of one node. Then a kill phase: two nodes,
N emails posted, and once a third of them is mapped every process of the first node (each its own process
group: workers' children too, its relay, its beat) is SIGKILLed; the other node and its beat, taking over,
finish. Goal: 0 lost, 0 duplicates (one ticket, one mapping, one succeeded intent per email) in every phase.

    flock /tmp/mailroom-bench.lock .venv/bin/python bench/two_nodes.py --quick
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
import uuid

import psycopg

import e2e
from lib.db import app_env, clean_up, db_url, prepare_database
from lib.load import post_with_python_clients
from lib.messages import make_messages
from lib.report import log
from lib.stack import (
    BIN,
    PYTHON,
    Stack,
    add_common_arguments,
    flush_broker,
    free_port,
    git_revision,
    install_signal_handlers,
    make_tmp,
    start_gunicorn,
    with_app_name,
)

DB_NAME = e2e.DB_NAME  # e2e's helpers (phase, verify, wait_for_mappings) read it; one bench runs at a time
READY_FILE_VAR = "MAILROOM_WORKER_READY_FILE"  # config.celery: a worker writes it once it consumes
NODE_PROCESSES = ("worker", "calls", "relay", "beat")
# The kill phase's recovery, shortened so that it fits the run: claims, redelivery, the stale-event sweep.
RECOVERY_ENV = {
    "MAILROOM_CLAIM_SECONDS": "5",
    "MAILROOM_BROKER_VISIBILITY_TIMEOUT": "15",
    "MAILROOM_STALE_EVENT_SECONDS": "10",
    "MAILROOM_SWEEP_SECONDS": "2",
}


def start_node(stack: Stack, env: dict, name: str, concurrency: int, threads: int) -> list[str]:
    """The node's processes, each in its own process group (Stack); returns their names once both workers
    consume."""
    celery = [str(BIN / "celery"), "-A", "config"]
    ready = [stack.tmp / f"{name}-worker.ready", stack.tmp / f"{name}-calls.ready"]
    for path in ready:
        path.unlink(missing_ok=True)
    commands = {
        "worker": celery
        + ["worker", "--concurrency", str(concurrency), "-Q", "celery", "-n", f"{name}@%h", "--loglevel", "WARNING"],
        "calls": celery
        + [
            "worker",
            "--pool",
            "threads",
            "--concurrency",
            str(threads),
            "-Q",
            "destinations",
            "-n",
            f"{name}-calls@%h",
            "--loglevel",
            "WARNING",
        ],
        "relay": [str(PYTHON), "manage.py", "run_relay"],
        "beat": celery + ["beat", "--loglevel", "WARNING"],
    }
    for process, argv in commands.items():
        process_env = with_app_name(env, f"{name}-{process}")
        if process in ("worker", "calls"):
            process_env[READY_FILE_VAR] = str(ready[process == "calls"])
        stack.start(f"{name}-{process}", argv, process_env)
    deadline = time.monotonic() + 120
    while not all(path.exists() for path in ready):
        stack.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: workers not consuming after 120 s\n" + stack.tail(f"{name}-worker"))
        time.sleep(0.2)
    return [f"{name}-{process}" for process in NODE_PROCESSES]


def stop_nodes(stack: Stack, names: list[str]) -> None:
    for name in names:
        stack.stop(name)


def kill_node(stack: Stack, names: list[str]) -> None:
    """SIGKILL every process group of the node at once, then reap them."""
    for name in names:
        try:
            os.killpg(stack.pid(name), signal.SIGKILL)
        except ProcessLookupError:
            pass
    stop_nodes(stack, names)


def mapped_count(ids: list[int]) -> int:
    with psycopg.connect(db_url(DB_NAME), autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM ticketing_ticketmapping WHERE inbox_event_id = ANY(%s)", (ids,)
        ).fetchone()[0]


def layout(stack, env, nodes: int, concurrency: int, threads: int) -> list[list[str]]:
    return [start_node(stack, env, f"node{k + 1}", concurrency, threads) for k in range(nodes)]


def groups_of(stack: Stack, nodes: list[list[str]]) -> dict[str, int]:
    groups = {"web": stack.pid("gunicorn"), "clients+script": os.getpgid(0)}
    groups.update({name: stack.pid(name) for node in nodes for name in node})
    return groups


def throughput(args, port, stack, env, nodes: int, concurrency: int, label: str) -> dict:
    running = layout(stack, env, nodes, concurrency, args.threads)
    try:
        warm = make_messages("w" + uuid.uuid4().hex[:10], 20, args.body_bytes)  # each worker child's first tasks
        e2e.post_and_wait(port, stack, warm, args.clients, 60, "warm-up")
        return e2e.phase(args, port, stack, groups_of(stack, running), args.emails, label)
    finally:
        for node in running:
            stop_nodes(stack, node)


def kill_phase(args, port, stack, env) -> dict:
    running = layout(stack, {**env, **RECOVERY_ENV}, 2, 1, args.threads)
    try:
        messages = make_messages("k" + uuid.uuid4().hex[:10], args.emails, args.body_bytes)
        tickets_before, outbox_before = e2e.max_ids()
        log(f"kill phase: {args.emails} emails to two nodes; node1 is SIGKILLed once a third is mapped")
        posted = post_with_python_clients(port, messages, args.clients)
        ids = [r[3] for r in posted["results"] if r[2] == 202 and r[3] is not None]
        if len(ids) != len(messages):
            raise RuntimeError(f"kill phase: {len(ids)} of {len(messages)} posts answered 202: {posted['statuses']}")
        deadline = time.monotonic() + args.timeout
        while (mapped := mapped_count(ids)) < len(ids) // 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        kill_node(stack, running.pop(0))
        log(f"kill phase: node1 SIGKILLed with {mapped} of {len(ids)} mapped")
        done_at, _ = e2e.wait_for_mappings(ids, args.timeout + 60, stack)
        time.sleep(2)  # a late duplicate, were there one, would land now
        check = e2e.verify(ids, tickets_before, outbox_before)
        return {
            "n": len(ids),
            "mapped_at_kill": mapped,
            "check": check,
            "timed_out": done_at is None,
            "recovered_in": None if done_at is None else done_at - max(r[1] for r in posted["results"]),
        }
    finally:
        for node in running:
            stop_nodes(stack, node)


def guarantees(check: dict, n: int) -> tuple[bool, int, int]:
    """(every guarantee holds, emails without their mapping, tickets beyond one per email)."""
    ok = all(
        check[k] == n
        for k in (
            "events",
            "completed",
            "one_mapping",
            "one_succeeded_intent",
            "one_ticket",
            "consistent",
            "tickets_made",
        )
    )
    return ok, n - check["one_mapping"], max(0, check["tickets_made"] - check["one_ticket"])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--emails", type=int, default=1000, help="emails per phase (default 1000)")
    parser.add_argument("--rounds", type=int, default=2, help="one-node/two-node pairs, alternating (default 2)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent posting clients (default 4)")
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn workers (default 2)")
    parser.add_argument("--threads", type=int, default=4, help="each node's destinations thread pool (default 4)")
    parser.add_argument("--body-bytes", type=int, default=3000, help="size of each message (default 3000)")
    parser.add_argument("--timeout", type=float, default=180, help="seconds to wait for the last mapping")
    parser.add_argument("--no-kill", action="store_true", help="skip the kill phase")
    add_common_arguments(parser, "(not used here)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 300 emails, one round")
    args = parser.parse_args()
    args.corpus, args.profile = "bench", False  # what e2e.phase reads
    if args.quick:
        args.emails, args.rounds, args.preload, args.quiet_wait = 300, 1, 2000, 5

    install_signal_handlers()
    tmp = make_tmp("mailroom-bench-two-nodes-")
    env = app_env(DB_NAME, tmp, args.log_level)
    env["MAILROOM_DESTINATION_QUEUE"] = "destinations"
    stack = Stack(tmp)
    try:
        print(f"Mailroom two-node benchmark — revision {git_revision()}, {os.cpu_count()} cores")
        prepare_database(DB_NAME, env, args.preload)
        flush_broker()
        port = free_port()
        start_gunicorn(stack, with_app_name(env, "web"), args.web_workers, port)
        one, two = [], []
        for i in range(args.rounds):
            one.append(throughput(args, port, stack, env, 1, 2, f"one node, concurrency 2 (round {i + 1})"))
            log(f"one node: {one[-1]['rate']:,.1f} emails/s")
            two.append(throughput(args, port, stack, env, 2, 1, f"two nodes, concurrency 1 each (round {i + 1})"))
            log(f"two nodes: {two[-1]['rate']:,.1f} emails/s")
        killed = None if args.no_kill else kill_phase(args, port, stack, env)

        one_rate, two_rate = statistics.median(r["rate"] for r in one), statistics.median(r["rate"] for r in two)
        print()
        print("=" * 78)
        print(
            f"TWO NODES — {args.emails} emails per phase to the built-in destination, {args.clients} clients, "
            f"gunicorn {args.web_workers} workers; a node = prefork worker + {args.threads}-thread destinations "
            f"worker + relay + beat; one PostgreSQL, one Redis"
        )
        ok = True
        for r in one + two:
            good, lost, dup = guarantees(r["check"], r["n"])
            ok &= good and not r["timed_out"]
            print(
                f"  {r['label']}: {r['rate']:,.1f} emails/s over {r['wall']:.1f} s; lost {lost}, duplicates {dup}"
                f"{'' if good else '  GUARANTEE BROKEN: ' + str(r['check'])}"
            )
        ratio = two_rate / one_rate
        print(
            f"RESULT: one node {one_rate:,.1f} emails/s, two nodes {two_rate:,.1f} emails/s (medians of "
            f"{len(one)}): two/one {ratio * 100:.0f} %; goal >= 90 %: {'MET' if ratio >= 0.9 else 'MISSED'}"
        )
        if killed:
            good, lost, dup = guarantees(killed["check"], killed["n"])
            ok &= good and not killed["timed_out"]
            took = killed["recovered_in"]
            recovered = "never" if took is None else f"{took:.1f} s after the last post"
            print(
                f"KILL: node1 SIGKILLed with {killed['mapped_at_kill']} of {killed['n']} mapped; all mapped "
                f"{recovered}; lost {lost} (goal 0), duplicates {dup} (goal 0): {'MET' if good else 'MISSED'}"
                f"{'' if good else '  ' + str(killed['check'])}"
            )
        print(f"CHECK: every guarantee in every phase: {'OK' if ok else 'FAILED'}")
        print("=" * 78)
        return 0 if ok else 1
    except KeyboardInterrupt:
        log("interrupted: stopping what this run started")
        return 130
    finally:
        clean_up(stack, DB_NAME, tmp, args.keep)


if __name__ == "__main__":
    sys.exit(main())

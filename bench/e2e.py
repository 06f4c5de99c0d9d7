"""End-to-end benchmark: N signed emails posted, then the wall time until every one has its
ticket and its mapping; optionally the peer (django-helpdesk) timed in the same run.

Starts gunicorn (the webhook), the outbox relay (`manage.py run_relay`, LISTEN/NOTIFY fast path)
and a Celery worker (prefork, `--workers` processes, CELERY_DB_REUSE_MAX=1000) on a database of
its own. Throughput phase (`--runs` times): N unique signed emails from 4 client processes as fast
as they go; the database is polled until every event has its TicketMapping; prints emails/s,
post->mapping latency and the CPU per email by process (web, relay, worker parent and children,
and the PostgreSQL backends serving each). With `--peer` (and PEER_DIR), django-helpdesk's
`get_email` imports the same N mails after each Mailroom run (alternating), and the ratio of the
medians is printed (goal >= 5x). Latency phase: posts paced at half the measured maximum rate for
`--latency-seconds`; prints p50/p99 post->mapping (goals p50 < 150 ms, p99 < 1 s). Every phase
checks every guarantee: per event exactly one Ticket, one TicketMapping pointing at it, one
succeeded Intent, the event `completed`; no other ticket made; a 202 for every post.

    .venv/bin/python bench/e2e.py                # 2,000 emails, 2 worker processes, latency phase
    .venv/bin/python bench/e2e.py --quick        # 300 emails: a smoke run
    PEER_DIR=/tmp/peer .venv/bin/python bench/e2e.py --peer --runs 3

Needs PostgreSQL on 127.0.0.1:5432 (user postgres, trust) and Redis on 6379 (uses db 14 and
flushes it); creates and drops the database `mailroom_bench_e2e`. See bench/README.md.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import uuid

import psycopg

import peer
from lib.db import analyze, app_env, clean_up, db_url, pg_sessions, prepare_database
from lib.load import post_with_python_clients
from lib.messages import make_messages as make_signed_messages, sign
from lib.procstat import cpu_by_group, cpu_ceiling, cpu_delta, wait_for_quiet
from lib.profile import Profiler
from lib.report import log, ms, percentile
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

DB_NAME = "mailroom_bench_e2e"


def wait_for_mappings(event_ids: list[int], timeout: float, stack: Stack, poll: float = 0.05):
    """Poll until every event has its mapping; returns (time all were there, mapped count)."""
    lo = min(event_ids)
    want = len(event_ids)
    deadline = time.time() + timeout
    last_check = 0.0
    mapped = 0
    with psycopg.connect(db_url(DB_NAME), autocommit=True) as conn:
        while True:
            mapped = conn.execute(
                "SELECT count(*) FROM ticketing_ticketmapping WHERE inbox_event_id >= %s", (lo,)
            ).fetchone()[0]
            now = time.time()
            if mapped >= want:
                return now, mapped
            if now > deadline:
                return None, mapped
            if now - last_check > 1:
                stack.check_alive()
                last_check = now
            time.sleep(poll)


def verify(event_ids: list[int], max_ticket_before: int, outbox_before: int) -> dict:
    with psycopg.connect(db_url(DB_NAME), autocommit=True) as conn:
        row = conn.execute(
            """
            WITH ev AS (SELECT id, state FROM intake_inboxevent WHERE id = ANY(%(ids)s)),
            per AS (
              SELECT ev.id, ev.state,
                (SELECT count(*) FROM ticketing_ticketmapping m WHERE m.inbox_event_id = ev.id) AS mappings,
                (SELECT count(*) FROM ticketing_intent i WHERE i.inbox_event_id = ev.id
                   AND i.action = 'create_ticket') AS intents,
                (SELECT count(*) FROM ticketing_intent i WHERE i.inbox_event_id = ev.id
                   AND i.action = 'create_ticket' AND i.state = 'succeeded') AS succeeded,
                (SELECT count(*) FROM ticketing_intent i
                   JOIN ticketing_ticket t ON t.idempotency_key = i.idempotency_key
                  WHERE i.inbox_event_id = ev.id AND i.action = 'create_ticket') AS tickets,
                (SELECT count(*) FROM ticketing_ticketmapping m
                   JOIN ticketing_ticket t ON t.id::text = m.ticket_id
                   JOIN ticketing_intent i ON i.idempotency_key = t.idempotency_key AND i.inbox_event_id = ev.id
                  WHERE m.inbox_event_id = ev.id AND i.result_ref = m.ticket_id) AS consistent
              FROM ev)
            SELECT count(*),
                   count(*) FILTER (WHERE state = 'completed'),
                   count(*) FILTER (WHERE mappings = 1),
                   count(*) FILTER (WHERE intents = 1 AND succeeded = 1),
                   count(*) FILTER (WHERE tickets = 1),
                   count(*) FILTER (WHERE consistent = 1),
                   (SELECT count(*) FROM ticketing_ticket WHERE id > %(max_ticket)s)
            FROM per
            """,
            {"ids": event_ids, "max_ticket": max_ticket_before},
        ).fetchone()
        states = dict(
            conn.execute(
                "SELECT state, count(*) FROM intake_inboxevent WHERE id = ANY(%s) GROUP BY state", (event_ids,)
            ).fetchall()
        )
        # Other intents of these events (e.g. the requester's acknowledgment): reported, not waited for.
        others = conn.execute(
            "SELECT action, state, count(*) FROM ticketing_intent WHERE inbox_event_id = ANY(%s) "
            "AND action <> 'create_ticket' GROUP BY action, state ORDER BY 1, 2",
            (event_ids,),
        ).fetchall()
        batches = conn.execute(
            """SELECT count(*), count(DISTINCT published_at) FROM intake_outboxmessage
               WHERE topic = 'inbox_event.process' AND (payload->>'inbox_event_id')::bigint = ANY(%s)""",
            (event_ids,),
        ).fetchone()
        sizes = [
            r[0]
            for r in conn.execute(
                """SELECT count(*) FROM intake_outboxmessage WHERE topic = 'inbox_event.process'
               AND (payload->>'inbox_event_id')::bigint = ANY(%s) GROUP BY published_at""",
                (event_ids,),
            ).fetchall()
        ]
        topics = dict(
            conn.execute(
                "SELECT topic, count(*) FROM intake_outboxmessage WHERE id > %s GROUP BY topic", (outbox_before,)
            ).fetchall()
        )
    keys = ("events", "completed", "one_mapping", "one_succeeded_intent", "one_ticket", "consistent", "tickets_made")
    out = dict(zip(keys, row, strict=True))
    out["states"] = states
    out["other_intents"] = {f"{a}/{st}": n for a, st, n in others}
    out["outbox_rows"], out["relay_batches"] = batches
    out["batch_sizes"] = sorted(sizes)
    out["outbox_topics"] = topics
    return out


def mapping_times(event_ids: list[int]) -> dict[int, float]:
    with psycopg.connect(db_url(DB_NAME), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT inbox_event_id, extract(epoch FROM created_at) FROM ticketing_ticketmapping "
            "WHERE inbox_event_id = ANY(%s)",
            (event_ids,),
        ).fetchall()
    return {eid: float(at) for eid, at in rows}


def max_ids() -> tuple[int, int]:
    with psycopg.connect(db_url(DB_NAME), autocommit=True) as conn:
        return conn.execute(
            "SELECT (SELECT coalesce(max(id), 0) FROM ticketing_ticket), "
            "(SELECT coalesce(max(id), 0) FROM intake_outboxmessage)"
        ).fetchone()


def post_and_wait(port, stack, messages, clients, timeout, label, rate=None):
    posted = post_with_python_clients(port, messages, clients, rate=rate)
    ids = [r[3] for r in posted["results"] if r[2] == 202 and r[3] is not None]
    if len(ids) != len(messages):
        raise RuntimeError(
            f"{label}: {len(ids)} of {len(messages)} posts answered 202: {posted['statuses']}\n"
            + stack.tail("gunicorn")
        )
    done_at, mapped = wait_for_mappings(ids, timeout, stack)
    return posted, ids, done_at, mapped


def signed(raws: list[bytes]) -> list[tuple[bytes, dict]]:
    ts = int(time.time())
    return [
        (
            raw,
            {"X-Mailroom-Timestamp": str(ts), "X-Mailroom-Signature": sign(raw, ts), "Content-Type": "message/rfc822"},
        )
        for raw in raws
    ]


def make_messages(args, n: int, tag: str) -> list[tuple[bytes, dict]]:
    if args.corpus == "peer":
        return signed(peer.corpus_messages(peer.peer_dir(), n, tag))
    return make_signed_messages(tag, n, args.body_bytes)


def phase(args, port, stack, groups, n: int, label: str, rate: float | None = None, timeout: float = 0) -> dict:
    """Post n emails (as fast as they go, or paced at `rate`/s), wait for every mapping, check them."""
    messages = make_messages(args, n, label[0] + uuid.uuid4().hex[:10])
    tickets_before, outbox_before = max_ids()
    busy_before = wait_for_quiet(args.quiet_wait)
    profiler = Profiler(stack.tmp) if args.profile and rate is None else None
    if profiler:
        profiler.start("gunicorn", groups["web"], subprocesses=True)
        profiler.start("relay", groups["relay"])
        profiler.start("celery", groups["worker"], subprocesses=True)
        time.sleep(1)
    time.sleep(1.2)  # let PostgreSQL's statistics settle before reading the session count
    sessions0 = pg_sessions(DB_NAME)
    cpu0 = cpu_by_group(groups, DB_NAME, leaders=("worker",), backends=True)
    log(
        f"{label}: {n} emails from {args.clients} client processes"
        + (f", paced at {rate:,.1f}/s" if rate else ", as fast as they go")
    )
    posted, ids, done_at, mapped = post_and_wait(
        port, stack, messages, args.clients, timeout or args.timeout, label, rate
    )
    cpu1 = cpu_by_group(groups, DB_NAME, leaders=("worker",), backends=True)
    if profiler:
        profiler.stop()
    time.sleep(1.5)  # statistics are flushed by each backend at most once a second
    sessions1 = pg_sessions(DB_NAME)
    first_post = min(r[0] for r in posted["results"])
    sent_at = {r[3]: r[0] for r in posted["results"]}
    maps = mapping_times(ids)
    if not maps:
        raise RuntimeError("no mapping at all: see the logs\n" + stack.tail("celery") + stack.tail("relay"))
    wall = max(maps.values()) - first_post
    check = verify(ids, tickets_before, outbox_before)
    ok = done_at is not None and all(
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
    return {
        "label": label,
        "n": n,
        "rate": len(maps) / wall,
        "wall": wall,
        "posted": posted,
        "mapped": mapped,
        "latencies": sorted(maps[i] - sent_at[i] for i in ids if i in maps),
        "check": check,
        "ok": ok,
        "timed_out": done_at is None,
        "cpu": cpu_delta(cpu0, cpu1),
        "busy_before": busy_before,
        "sessions": None if None in (sessions0, sessions1) else sessions1 - sessions0,
        "profile": profiler.report() if profiler else "",
    }


def print_phase(r: dict, args) -> None:
    n, check, posted, lat = r["n"], r["check"], r["posted"], r["latencies"]
    post_lat = sorted(x[1] - x[0] for x in posted["results"])
    sizes = check["batch_sizes"]
    group = int(os.environ.get("MAILROOM_RELAY_GROUP") or args.relay_group or 50)
    tasks = sum(math.ceil(s / group) for s in sizes)
    print("-" * 78)
    print(f"{r['label'].upper()} — {n} emails")
    print(
        f"  posting               : {posted['requests']} posts in {posted['wall']:.2f} s "
        f"({posted['requests'] / posted['wall']:,.0f}/s), answer p50 {ms(percentile(post_lat, 50))}, "
        f"p99 {ms(percentile(post_lat, 99))}"
    )
    if r["timed_out"]:
        print(f"  TIMEOUT               : only {r['mapped']} of {n} mapped in time")
    print(
        f"  wall time             : {r['wall']:.2f} s from the first post to the last mapping -> "
        f"{r['rate']:,.1f} emails/s"
    )
    print(
        f"  latency post->mapping : p50 {ms(percentile(lat, 50))}, p99 {ms(percentile(lat, 99))}, "
        f"max {ms(lat[-1]) if lat else 'n/a'}"
    )
    print(
        f"  relay                 : {check['relay_batches']} batches for {check['outbox_rows']} outbox rows "
        f"(median {sizes[len(sizes) // 2] if sizes else 0}, max {max(sizes) if sizes else 0} rows per batch) "
        f"-> ~{tasks} tasks (~{n / max(1, tasks):.1f} events per task)"
    )
    if r["sessions"] is not None:
        print(f"  PostgreSQL sessions   : {r['sessions']} opened on {DB_NAME} (includes this script's own)")
    cpu = r["cpu"]
    by_process = ", ".join(f"{k} {v / n * 1000:.2f}" for k, v in cpu.items() if k not in ("other", "postgres-other"))
    print(f"  CPU ms per email by process: {by_process}")
    per, ceiling = cpu_ceiling(cpu, n)
    print(
        f"    total {per:.2f} ms/email (2 cores would saturate near {ceiling:,.0f} emails/s: an estimate); "
        f"rest of PostgreSQL {cpu['postgres-other'] / n * 1000:.2f} ms/email; other work on the machine "
        f"{cpu['other'] / r['wall'] * 100:.0f}% of a core (before timing: {r['busy_before'] * 100:.0f}%)"
    )
    print(
        f"  CHECK per event: completed {check['completed']}, one mapping {check['one_mapping']}, one succeeded "
        f"create_ticket intent {check['one_succeeded_intent']}, one ticket {check['one_ticket']}, consistent "
        f"{check['consistent']}; tickets made {check['tickets_made']}; states {check['states']} -> "
        f"{'OK' if r['ok'] else 'FAILED'}"
    )
    if check["other_intents"]:
        print(f"  other intents of these events at the end (not waited for): {check['other_intents']}")
    if r["profile"]:
        print(r["profile"])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--emails", type=int, default=2000, help="emails per throughput run, and the peer's N")
    parser.add_argument("--runs", type=int, default=1, help="throughput runs (alternating with the peer's)")
    parser.add_argument("--peer", action="store_true", help="time django-helpdesk's get_email too (needs PEER_DIR)")
    parser.add_argument(
        "--corpus",
        choices=("bench", "peer"),
        default="bench",
        help="bench: unique plain messages of --body-bytes; peer: the peer's own N mails (a quarter "
        "with a 20 KB attachment, HTML, non-ASCII), Message-IDs made unique per run",
    )
    parser.add_argument("--latency-seconds", type=float, default=20, help="paced latency phase (0: skip)")
    parser.add_argument(
        "--latency-rate",
        type=float,
        default=0,
        help="posts/s of that phase (default: half the median throughput measured)",
    )
    parser.add_argument("--clients", type=int, default=4, help="concurrent posting clients (default 4)")
    parser.add_argument("--workers", "--worker", type=int, default=2, help="Celery --concurrency (default 2)")
    parser.add_argument("--web-workers", type=int, default=4, help="gunicorn workers (default 4)")
    parser.add_argument("--worker-class", default="sync", help="gunicorn --worker-class (default sync)")
    parser.add_argument("--threads", type=int, default=1, help="gunicorn --threads (gthread)")
    parser.add_argument("--body-bytes", type=int, default=3000, help="size of each message (default 3000)")
    parser.add_argument("--warmup", type=int, default=100, help="emails sent through the whole stack first")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for the last mapping")
    parser.add_argument(
        "--relay-group",
        type=int,
        default=0,
        help="MAILROOM_RELAY_GROUP for the relay (event ids per task); 0: the app's default",
    )
    add_common_arguments(
        parser,
        "py-spy the web, relay and worker processes during the throughput runs and print "
        "where their CPU goes (needs .venv/bin/pip install py-spy)",
    )
    parser.add_argument("--quick", action="store_true", help="a fast smoke run: 300 emails, 5 s of latency phase")
    args = parser.parse_args()
    if args.quick:
        args.emails, args.warmup, args.preload, args.quiet_wait, args.latency_seconds = 300, 40, 2000, 5, 5

    install_signal_handlers()
    if args.peer or args.corpus == "peer":
        peer.ensure_prepared(peer.peer_dir())
    tmp = make_tmp("mailroom-bench-e2e-")
    env = app_env(DB_NAME, tmp, args.log_level)
    if args.relay_group:
        env["MAILROOM_RELAY_GROUP"] = str(args.relay_group)
    stack = Stack(tmp)
    try:
        print(f"Mailroom end-to-end benchmark — revision {git_revision()}, {os.cpu_count()} cores")
        prepare_database(DB_NAME, env, args.preload)
        flush_broker()
        port = free_port()
        start_gunicorn(
            stack,
            with_app_name(env, "web"),
            args.web_workers,
            port,
            worker_class=args.worker_class,
            threads=args.threads,
        )
        stack.start("relay", [str(PYTHON), "manage.py", "run_relay"], with_app_name(env, "relay"))
        stack.start(
            "celery",
            [
                str(BIN / "celery"),
                "-A",
                "config",
                "worker",
                "--concurrency",
                str(args.workers),
                "--loglevel",
                "WARNING",
            ],
            with_app_name(env, "worker"),
        )
        log(
            f"started gunicorn ({args.web_workers} {args.worker_class} workers), the relay, and a Celery worker "
            f"(prefork, concurrency {args.workers})"
        )
        warm = make_signed_messages("w" + uuid.uuid4().hex[:10], args.warmup, args.body_bytes)
        t0 = time.time()
        _, warm_ids, warm_done, warm_mapped = post_and_wait(port, stack, warm, args.clients, 90, "warm-up")
        if warm_done is None:
            raise RuntimeError(
                f"warm-up: only {warm_mapped} of {len(warm_ids)} mapped after 90 s\n"
                + stack.tail("celery")
                + "\n"
                + stack.tail("relay")
            )
        log(f"warm-up: {len(warm_ids)} emails through the stack in {warm_done - t0:.1f} s")
        analyze(DB_NAME)
        groups = {
            "web": stack.pid("gunicorn"),
            "relay": stack.pid("relay"),
            "worker": stack.pid("celery"),
            "clients+script": os.getpgid(0),
        }

        runs, peers = [], []
        for i in range(args.runs):
            runs.append(phase(args, port, stack, groups, args.emails, f"throughput run {i + 1}"))
            if args.peer:
                wait_for_quiet(args.quiet_wait)
                log(f"peer run {i + 1}: django-helpdesk get_email, {args.emails} mails")
                peers.append(peer.run_once(peer.peer_dir(), args.emails))
                log("peer: " + peer.describe(peers[-1]))
        rate = statistics.median(r["rate"] for r in runs)
        latency = None
        if args.latency_seconds > 0:
            paced = args.latency_rate or rate / 2
            count = max(args.clients, int(paced * args.latency_seconds))
            latency = phase(
                args,
                port,
                stack,
                groups,
                count,
                "latency phase",
                rate=paced,
                timeout=args.latency_seconds + args.timeout,
            )

        print()
        print("=" * 78)
        print(
            f"END TO END — webhook -> InboxEvent + outbox -> relay -> Celery -> Ticket + TicketMapping; corpus "
            f"{args.corpus}" + (f" ({args.body_bytes}-byte plain messages)" if args.corpus == "bench" else "")
        )
        print(
            f"  processes: gunicorn {args.web_workers} {args.worker_class} workers; 1 relay (LISTEN/NOTIFY); Celery "
            f"prefork, concurrency {args.workers}; {args.clients} Python client processes; CELERY_DB_REUSE_MAX="
            f"1000, LOG_LEVEL={args.log_level}; {args.preload} events of history preloaded, ANALYZEd"
        )
        for r in runs + ([latency] if latency else []):
            print_phase(r, args)
        print("-" * 78)
        ok = all(r["ok"] for r in runs + ([latency] if latency else []))
        print(
            f"RESULT: {rate:,.1f} emails/s end to end (median of {len(runs)}: "
            f"{', '.join(format(r['rate'], ',.1f') for r in runs)}), {args.workers} worker processes"
        )
        if peers:
            peer_rate = statistics.median(p["rate"] for p in peers)
            pairs = ", ".join(f"{r['rate'] / p['rate']:.2f}x" for r, p in zip(runs, peers, strict=True))
            print(
                f"  peer (django-helpdesk get_email, same N={args.emails}, alternating): {peer_rate:,.1f} mails/s "
                f"(median of {len(peers)}: {', '.join(format(p['rate'], ',.1f') for p in peers)}); CPU of get_email "
                f"{statistics.median(p['cpu_ms_per_mail'] for p in peers):.2f} ms/mail"
            )
            print(
                f"  RATIO Mailroom / peer: {rate / peer_rate:.2f}x (per pair: {pairs}); goal >= 5x: "
                f"{'MET' if rate >= 5 * peer_rate else 'MISSED'}"
            )
        if latency:
            lat = latency["latencies"]
            p50, p99 = percentile(lat, 50), percentile(lat, 99)
            print(
                f"  latency at {latency['n'] / args.latency_seconds:,.1f} posts/s (paced): p50 {ms(p50)} "
                f"(goal < 150 ms: {'MET' if p50 < 0.150 else 'MISSED'}), p99 {ms(p99)} "
                f"(goal < 1 s: {'MET' if p99 < 1.0 else 'MISSED'})"
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

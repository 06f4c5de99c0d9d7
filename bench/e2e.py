"""End-to-end benchmark: N signed emails posted, then the wall time until every one has its
ticket and its mapping.

Starts gunicorn (the webhook), the outbox relay (`manage.py run_relay`, LISTEN/NOTIFY fast path)
and a Celery worker (prefork, `--workers` processes, CELERY_DB_REUSE_MAX=1000) on a database of
its own; posts N unique signed emails from 4 concurrent clients as fast as they go, recording
when each post was sent per inbox_event_id; polls the database until every event has a
TicketMapping; then prints emails/s, p50/p99 latency from post to mapping, the worker count, and
checks every guarantee: per event exactly one Ticket, one TicketMapping pointing at it, one
succeeded Intent, and the event `completed`; no other ticket was made.

    .venv/bin/python bench/e2e.py                # 2,000 emails, 2 worker processes
    .venv/bin/python bench/e2e.py --quick        # 300 emails: a smoke run
    .venv/bin/python bench/e2e.py --workers 1 --emails 5000

Needs PostgreSQL on 127.0.0.1:5432 (user postgres, trust) and Redis on 6379 (uses db 14 and
flushes it); creates and drops the database `mailroom_bench_e2e`. See bench/README.md.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import uuid

import psycopg

import _common as c

DB_NAME = "mailroom_bench_e2e"


def wait_for_mappings(event_ids: list[int], timeout: float, stack: c.Stack, poll: float = 0.05):
    """Poll until every event has its mapping; returns (time all were there, mapped count)."""
    lo = min(event_ids)
    want = len(event_ids)
    deadline = time.time() + timeout
    last_check = 0.0
    mapped = 0
    with psycopg.connect(c.db_url(DB_NAME), autocommit=True) as conn:
        while True:
            mapped = conn.execute("SELECT count(*) FROM ticketing_ticketmapping WHERE inbox_event_id >= %s",
                                  (lo,)).fetchone()[0]
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
    with psycopg.connect(c.db_url(DB_NAME), autocommit=True) as conn:
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
            """, {"ids": event_ids, "max_ticket": max_ticket_before}).fetchone()
        states = dict(conn.execute("SELECT state, count(*) FROM intake_inboxevent WHERE id = ANY(%s) GROUP BY state",
                                   (event_ids,)).fetchall())
        # Other intents of these events (e.g. the requester's acknowledgment): reported, not waited for.
        others = conn.execute("SELECT action, state, count(*) FROM ticketing_intent WHERE inbox_event_id = ANY(%s) "
                              "AND action <> 'create_ticket' GROUP BY action, state ORDER BY 1, 2",
                              (event_ids,)).fetchall()
        batches = conn.execute(
            """SELECT count(*), count(DISTINCT published_at) FROM intake_outboxmessage
               WHERE topic = 'inbox_event.process' AND (payload->>'inbox_event_id')::bigint = ANY(%s)""",
            (event_ids,)).fetchone()
        sizes = [r[0] for r in conn.execute(
            """SELECT count(*) FROM intake_outboxmessage WHERE topic = 'inbox_event.process'
               AND (payload->>'inbox_event_id')::bigint = ANY(%s) GROUP BY published_at""", (event_ids,)).fetchall()]
        topics = dict(conn.execute(
            "SELECT topic, count(*) FROM intake_outboxmessage WHERE id > %s GROUP BY topic",
            (outbox_before,)).fetchall())
    keys = ("events", "completed", "one_mapping", "one_succeeded_intent", "one_ticket", "consistent",
            "tickets_made")
    out = dict(zip(keys, row, strict=True))
    out["states"] = states
    out["other_intents"] = {f"{a}/{st}": n for a, st, n in others}
    out["outbox_rows"], out["relay_batches"] = batches
    out["batch_sizes"] = sorted(sizes)
    out["outbox_topics"] = topics
    return out


def mapping_times(event_ids: list[int]) -> dict[int, float]:
    with psycopg.connect(c.db_url(DB_NAME), autocommit=True) as conn:
        rows = conn.execute("SELECT inbox_event_id, extract(epoch FROM created_at) FROM ticketing_ticketmapping "
                            "WHERE inbox_event_id = ANY(%s)", (event_ids,)).fetchall()
    return {eid: float(at) for eid, at in rows}


def max_ids() -> tuple[int, int]:
    with psycopg.connect(c.db_url(DB_NAME), autocommit=True) as conn:
        return conn.execute("SELECT (SELECT coalesce(max(id), 0) FROM ticketing_ticket), "
                            "(SELECT coalesce(max(id), 0) FROM intake_outboxmessage)").fetchone()


def post_and_wait(port, stack, messages, clients, timeout, label):
    posted = c.post_with_python_clients(port, messages, clients)
    ids = [r[3] for r in posted["results"] if r[2] == 202 and r[3] is not None]
    if len(ids) != len(messages):
        raise RuntimeError(f"{label}: {len(ids)} of {len(messages)} posts answered 202: {posted['statuses']}\n"
                           + stack.tail("gunicorn"))
    done_at, mapped = wait_for_mappings(ids, timeout, stack)
    return posted, ids, done_at, mapped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--emails", type=int, default=2000, help="emails posted (default 2000)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent posting clients (default 4)")
    parser.add_argument("--workers", "--worker", type=int, default=2,
                        help="Celery worker processes, --concurrency (default 2)")
    parser.add_argument("--web-workers", type=int, default=4, help="gunicorn sync workers (default 4)")
    parser.add_argument("--body-bytes", type=int, default=3000, help="size of each message (default 3000)")
    parser.add_argument("--warmup", type=int, default=100, help="emails sent through the whole stack first")
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for the last mapping")
    parser.add_argument("--relay-group", type=int, default=0,
                        help="MAILROOM_RELAY_GROUP for the relay (event ids per task); 0: the app's default")
    c.add_common_arguments(parser, "py-spy the web, relay and worker processes during the timed run and print where "
                                   "their CPU goes (needs .venv/bin/pip install py-spy; lowers the figures a little)")
    parser.add_argument("--quick", action="store_true", help="a fast smoke run: 300 emails")
    args = parser.parse_args()
    if args.quick:
        args.emails, args.warmup, args.preload, args.quiet_wait = 300, 40, 2000, 5

    c.install_signal_handlers()
    tmp = c.make_tmp("mailroom-bench-e2e-")
    env = c.app_env(DB_NAME, tmp, args.log_level)
    if args.relay_group:
        env["MAILROOM_RELAY_GROUP"] = str(args.relay_group)
    stack = c.Stack(tmp)
    ok = False
    try:
        print(f"Mailroom end-to-end benchmark — revision {c.git_revision()}, {os.cpu_count()} cores")
        c.prepare_database(DB_NAME, env, args.preload)
        c.flush_broker()
        port = c.free_port()
        c.start_gunicorn(stack, env, args.web_workers, port)
        stack.start("relay", [str(c.PYTHON), "manage.py", "run_relay"], env)
        stack.start("celery", [str(c.BIN / "celery"), "-A", "config", "worker", "--concurrency", str(args.workers),
                               "--loglevel", "WARNING"], env)
        c.log(f"started gunicorn ({args.web_workers} sync workers), the relay, and a Celery worker "
              f"(prefork, concurrency {args.workers})")

        # Warm-up through the whole stack: proves every process is ready and warms their connections.
        warm = c.make_messages("w" + uuid.uuid4().hex[:10], args.warmup, args.body_bytes)
        t0 = time.time()
        _, warm_ids, warm_done, warm_mapped = post_and_wait(port, stack, warm, args.clients, 90, "warm-up")
        if warm_done is None:
            raise RuntimeError(f"warm-up: only {warm_mapped} of {len(warm_ids)} mapped after 90 s\n"
                               + stack.tail("celery") + "\n" + stack.tail("relay"))
        c.log(f"warm-up: {len(warm_ids)} emails through the stack in {warm_done - t0:.1f} s")
        c.analyze(DB_NAME)

        tag = "e" + uuid.uuid4().hex[:10]
        t0 = time.monotonic()
        messages = c.make_messages(tag, args.emails, args.body_bytes)
        c.log(f"precomputed {args.emails} unique signed messages of {len(messages[0][0])} bytes "
              f"({time.monotonic() - t0:.1f} s, not timed)")
        tickets_before, outbox_before = max_ids()
        busy_before = c.wait_for_quiet(args.quiet_wait)
        groups = {"gunicorn": stack.procs[0][1].pid, "relay": stack.procs[1][1].pid,
                  "celery": stack.procs[2][1].pid, "clients+script": os.getpgid(0)}
        profiler = c.Profiler(tmp) if args.profile else None
        if profiler:
            profiler.start("gunicorn", groups["gunicorn"], subprocesses=True)
            profiler.start("relay", groups["relay"])
            profiler.start("celery", groups["celery"], subprocesses=True)
            time.sleep(1)
        time.sleep(1.2)  # let PostgreSQL's statistics settle before reading the session count
        sessions0 = c.pg_sessions(DB_NAME)
        cpu0 = c.cpu_by_group(groups, DB_NAME)
        c.log(f"timed run: {args.emails} emails from {args.clients} client processes")
        posted, ids, done_at, mapped = post_and_wait(port, stack, messages, args.clients, args.timeout, "run")
        cpu1 = c.cpu_by_group(groups, DB_NAME)
        if profiler:
            profiler.stop()
        time.sleep(1.5)  # statistics are flushed by each backend at most once a second
        sessions1 = c.pg_sessions(DB_NAME)

        first_post = min(r[0] for r in posted["results"])
        last_answer = max(r[1] for r in posted["results"])
        sent_at = {r[3]: r[0] for r in posted["results"]}
        maps = mapping_times(ids)
        last_mapping = max(maps.values()) if maps else float("nan")
        latencies = sorted(maps[i] - sent_at[i] for i in ids if i in maps)
        wall = last_mapping - first_post
        rate = len(maps) / wall if wall > 0 else float("nan")
        check = verify(ids, tickets_before, outbox_before)
        n = args.emails
        if not maps:
            raise RuntimeError("no mapping at all: see the logs\n" + stack.tail("celery") + stack.tail("relay"))
        ok = (done_at is not None and all(check[k] == n for k in ("events", "completed", "one_mapping",
              "one_succeeded_intent", "one_ticket", "consistent", "tickets_made")))
        post_lat = sorted(r[1] - r[0] for r in posted["results"])
        group = int(env.get("MAILROOM_RELAY_GROUP", 50))
        tasks = sum(math.ceil(s / group) for s in check["batch_sizes"])
        sizes = check["batch_sizes"]

        print()
        print("=" * 78)
        print(f"END TO END — {n} signed, unique {args.body_bytes}-byte emails: webhook -> InboxEvent + outbox "
              f"-> relay -> Celery -> Ticket + TicketMapping")
        print(f"  processes             : gunicorn {args.web_workers} sync workers; 1 relay (LISTEN/NOTIFY); "
              f"Celery prefork worker, concurrency {args.workers}; {args.clients} Python client processes")
        print(f"  settings              : CELERY_DB_REUSE_MAX=1000, MAILROOM_RELAY_GROUP={group}, "
              f"LOG_LEVEL={args.log_level}; {args.preload} events of history preloaded, ANALYZEd")
        print(f"  posting               : {posted['requests']} posts in {last_answer - first_post:.2f} s "
              f"({posted['requests'] / (last_answer - first_post):,.0f}/s), "
              f"answer p50 {c.ms(post_lat[len(post_lat) // 2])}"
              f", p99 {c.ms(c.percentile(post_lat, 99))}")
        if done_at is None:
            print(f"  TIMEOUT               : only {mapped} of {n} mapped after {args.timeout:g} s")
        print(f"  wall time             : {wall:.2f} s from the first post to the last mapping")
        print(f"  emails/s              : {rate:,.0f}")
        print(f"  latency post->mapping : p50 {c.ms(c.percentile(latencies, 50))}, "
              f"p99 {c.ms(c.percentile(latencies, 99))}, max {c.ms(latencies[-1]) if latencies else 'n/a'}")
        print(f"  worker processes      : {args.workers} (Celery --concurrency)")
        print(f"  relay                 : {check['relay_batches']} batches for {check['outbox_rows']} outbox rows "
              f"(median {sizes[len(sizes) // 2] if sizes else 0}, max {max(sizes) if sizes else 0} rows per batch) "
              f"-> ~{tasks} tasks (~{n / max(1, tasks):.1f} events per task)")
        if sessions0 is not None and sessions1 is not None:
            print(f"  PostgreSQL sessions   : {sessions1 - sessions0} opened on {DB_NAME} during the run "
                  f"(pg_stat_database.sessions; includes this script's own polling/check connections)")
        cpu = c.cpu_delta(cpu0, cpu1)
        print("  " + c.format_cpu(cpu, wall, n, "email"))
        per, ceiling = c.cpu_ceiling(cpu, n)
        print(f"  CPU per email (web + relay + worker + clients + their PostgreSQL backends): {per:.2f} ms -> an "
              f"idle 2-core machine would saturate near {ceiling:,.0f} emails/s (estimate; other work used "
              f"{cpu.get('other', 0) / wall * 100:.0f}% of a core here)")
        print(f"  machine load from other work just before timing: {busy_before * 100:.0f}% of one core")
        print("-" * 78)
        print(f"CHECK per event (of {n}): completed {check['completed']}, exactly one TicketMapping "
              f"{check['one_mapping']}, exactly one create_ticket Intent and it succeeded "
              f"{check['one_succeeded_intent']}, "
              f"exactly one Ticket {check['one_ticket']}, mapping->ticket->intent consistent {check['consistent']}; "
              f"tickets made in the run {check['tickets_made']}; states {check['states']} -> "
              f"{'OK' if ok else 'FAILED'}")
        if profiler:
            print(profiler.report())
            print("-" * 78)
        if check["other_intents"]:
            print(f"  other intents of these events at the end (not waited for): {check['other_intents']}")
        print(f"  outbox rows written during the run, by topic: {check['outbox_topics']}")
        print(f"RESULT: {rate:,.0f} emails/s end to end with {args.workers} worker processes "
              f"(p50 {c.ms(c.percentile(latencies, 50))}, p99 {c.ms(c.percentile(latencies, 99))}); "
              f"target >= 375 emails/s: {'MET' if rate >= 375 and ok else 'MISSED'}")
        print("=" * 78)
        return 0 if ok else 1
    except KeyboardInterrupt:
        c.log("interrupted: stopping what this run started")
        return 130
    finally:
        c.clean_up(stack, DB_NAME, tmp, args.keep)


if __name__ == "__main__":
    sys.exit(main())

"""Ingest benchmark: signed raw webhooks against the app served by gunicorn on PostgreSQL.

Prints requests/s, p50/p99 latency and errors for 4 concurrent clients, checks that every 202
answer left exactly one InboxEvent, and, in the same run, measures the framework floor: a bare
Django view (bench/floor_app: no apps, no middleware) doing the same HMAC check and the same
one-statement insert under the same gunicorn settings, timed the same way, alternating with the
app over --rounds; then prints the app's rate as a share of the floor's (goal >= 90 %). Last, a
raw psycopg 3 baseline: single-row INSERT + COMMIT into a table with a unique text index from
the same number of concurrent connections. No Celery worker and no relay run here: outbox rows
accumulate.

    .venv/bin/python bench/ingest.py              # ~10 s timed, 4 clients (about 1 minute in all)
    .venv/bin/python bench/ingest.py --quick      # smoke run
    .venv/bin/python bench/ingest.py --web-workers 2,4,6   # try several gunicorn worker counts

Needs PostgreSQL on 127.0.0.1:5432 (user postgres, trust) and Redis on 6379; creates and drops
the database `mailroom_bench_ingest`. See bench/README.md.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import sys
import time
import uuid

import psycopg

from lib.db import analyze, app_env, clean_up, db_url, prepare_database
from lib.load import find_wrk, post_with_python_clients, post_with_wrk
from lib.messages import make_body, make_messages
from lib.procstat import cpu_by_group, cpu_ceiling, cpu_delta, format_cpu, wait_for_quiet
from lib.profile import Profiler
from lib.report import log, ms, percentile
from lib.stack import (
    Stack,
    add_common_arguments,
    flush_broker,
    free_port,
    git_revision,
    install_signal_handlers,
    make_tmp,
    start_gunicorn,
)

DB_NAME = "mailroom_bench_ingest"


# --------------------------------------------------------------------------- raw psycopg baseline
BASELINE_DDL = """
CREATE TABLE bench_baseline (id bigserial PRIMARY KEY, k text NOT NULL, payload bytea, at timestamptz NOT NULL);
CREATE UNIQUE INDEX bench_baseline_k ON bench_baseline (k);
CREATE TABLE bench_event (id bigserial PRIMARY KEY, dedupe_key text NOT NULL UNIQUE, mailbox_id int NOT NULL,
                          provider_message_id text NOT NULL, raw bytea, size int NOT NULL,
                          received_at timestamptz NOT NULL, state text NOT NULL);
CREATE UNIQUE INDEX bench_event_mailbox_pmid ON bench_event (mailbox_id, provider_message_id);
CREATE TABLE bench_audit (id bigserial PRIMARY KEY, event_id bigint NOT NULL REFERENCES bench_event (id)
                          DEFERRABLE INITIALLY DEFERRED, kind text NOT NULL, detail jsonb NOT NULL,
                          at timestamptz NOT NULL);
CREATE INDEX bench_audit_event ON bench_audit (event_id, at);
CREATE TABLE bench_outbox (id bigserial PRIMARY KEY, topic text NOT NULL, payload jsonb NOT NULL,
                           created_at timestamptz NOT NULL, published_at timestamptz);
"""


def _baseline_proc(dsn, kind, worker, deadline, start_evt, out_q, payload):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    latencies = []
    # autocommit off: INSERT, then an explicit COMMIT ("cte": one autocommitted statement)
    with psycopg.connect(dsn, autocommit=(kind == "cte")) as conn:
        cur = conn.cursor()
        start_evt.wait()
        i = 0
        tag = uuid.uuid4().hex[:8]
        while True:
            t0 = time.perf_counter()
            if time.time() >= deadline:
                break
            key = f"{tag}-{worker}-{i}"
            if kind == "row":
                cur.execute("INSERT INTO bench_baseline (k, payload, at) VALUES (%s, %s, now())", (key, payload))
            elif kind == "cte":  # the same three rows and NOTIFY as one statement, autocommitted
                cur.execute(
                    "WITH ev AS (INSERT INTO bench_event (dedupe_key, mailbox_id, provider_message_id, raw, "
                    "size, received_at, state) VALUES (%s, 1, %s, %s, %s, now(), 'received') "
                    "ON CONFLICT DO NOTHING RETURNING id), "
                    "au AS (INSERT INTO bench_audit (event_id, kind, detail, at) "
                    "SELECT id, 'received', '{\"size\": 1}', now() FROM ev), "
                    "ob AS (INSERT INTO bench_outbox (topic, payload, created_at) "
                    "SELECT 'inbox_event.process', jsonb_build_object('inbox_event_id', id), now() FROM ev) "
                    "SELECT id, pg_notify('bench_outbox', '') FROM ev",
                    (key, key, payload, len(payload)),
                )
                cur.fetchone()
            else:  # the shape of one ingest transaction: event + audit + outbox + NOTIFY
                cur.execute(
                    "INSERT INTO bench_event (dedupe_key, mailbox_id, provider_message_id, raw, size, "
                    "received_at, state) VALUES (%s, 1, %s, %s, %s, now(), 'received') RETURNING id",
                    (key, key, payload, len(payload)),
                )
                event_id = cur.fetchone()[0]
                cur.execute(
                    "INSERT INTO bench_audit (event_id, kind, detail, at) VALUES (%s, 'received', "
                    "'{\"size\": 1}', now())",
                    (event_id,),
                )
                cur.execute(
                    "INSERT INTO bench_outbox (topic, payload, created_at) VALUES ('inbox_event.process', %s, now())",
                    (f'{{"inbox_event_id": {event_id}}}',),
                )
                cur.execute("NOTIFY bench_outbox")
            if kind != "cte":
                conn.commit()
            latencies.append(time.perf_counter() - t0)
            i += 1
    out_q.put(latencies)


def run_baseline(kind: str, connections: int, duration: float, payload: bytes) -> dict:
    ctx = multiprocessing.get_context("fork")
    start_evt, out_q = ctx.Event(), ctx.Queue()
    deadline = time.time() + 0.5 + duration
    procs = [
        ctx.Process(
            target=_baseline_proc, args=(db_url(DB_NAME), kind, w, deadline, start_evt, out_q, payload), daemon=True
        )
        for w in range(connections)
    ]
    latencies: list[float] = []
    try:
        for p in procs:
            p.start()
        time.sleep(0.5)
        t0 = time.time()
        start_evt.set()
        for _ in procs:
            latencies.extend(out_q.get(timeout=duration + 60))
        wall = time.time() - t0
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(5)
    latencies.sort()
    return {
        "rows": len(latencies),
        "rate": len(latencies) / wall,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
    }


def prepare_baseline_tables(preload: int, payload: bytes) -> None:
    with psycopg.connect(db_url(DB_NAME), autocommit=True) as conn:
        conn.execute(BASELINE_DDL)
        # Tables that already hold rows, as for the app's tables (then ANALYZE).
        conn.execute(
            "INSERT INTO bench_baseline (k, payload, at) SELECT 'pre-' || g, %s, now() FROM generate_series(1, %s) g",
            (payload[:64], preload),
        )
        conn.execute(
            "INSERT INTO bench_event (dedupe_key, mailbox_id, provider_message_id, raw, size, received_at, "
            "state) SELECT 'pre-' || g, 1, 'pre-' || g, %s, 64, now(), 'completed' "
            "FROM generate_series(1, %s) g",
            (payload[:64], preload),
        )
        conn.execute(
            "INSERT INTO bench_audit (event_id, kind, detail, at) SELECT id, 'received', '{}', now() FROM bench_event"
        )
        conn.execute(
            "INSERT INTO bench_outbox (topic, payload, created_at, published_at) "
            "SELECT 'inbox_event.process', '{}', now(), now() FROM generate_series(1, %s)",
            (preload,),
        )
        conn.execute("VACUUM ANALYZE")


# --------------------------------------------------------------------------- the app
def count_events(tag: str) -> tuple[int, int]:
    with psycopg.connect(db_url(DB_NAME), autocommit=True) as conn:
        events = conn.execute(
            "SELECT count(*) FROM intake_inboxevent WHERE provider_message_id LIKE %s", (f"{tag}.%",)
        ).fetchone()[0]
        unpublished = conn.execute("SELECT count(*) FROM intake_outboxmessage WHERE published_at IS NULL").fetchone()[0]
    return events, unpublished


def timed_phase(args, wrk: str | None, port: int, stack: Stack, web_workers: int, tmp, kind: str = "app") -> dict:
    tag = "m" + uuid.uuid4().hex[:10]
    if args.requests:
        count = args.requests
        duration = None
    else:
        duration = args.duration
        # Enough unique messages for `max_rate` requests/s; a client that runs out stops and says so.
        count = int(args.duration * args.max_rate)
    t0 = time.monotonic()
    messages = make_messages(tag, count, args.body_bytes)
    log(
        f"precomputed {count} unique signed messages of {len(messages[0][0])} bytes "
        f"({time.monotonic() - t0:.1f} s, not timed)"
    )
    groups = {"gunicorn": stack.pid(kind)}
    box: dict = {}

    def on_start(proc):
        groups["client(wrk)"] = proc.pid
        box["cpu0"] = cpu_by_group(groups, DB_NAME)

    def on_end(proc):
        box["cpu1"] = cpu_by_group(groups, DB_NAME)

    what = f"{args.clients} clients, " + (f"{count} requests" if args.requests else f"{duration:g} s")
    box["quiet"] = wait_for_quiet(args.quiet_wait)
    profiler = Profiler(tmp / f"profile-{web_workers}") if args.profile else None
    if profiler:
        profiler.outdir.mkdir(exist_ok=True)
        profiler.start("gunicorn", groups["gunicorn"], subprocesses=True)
        time.sleep(1)
    if wrk:
        log(f"timed phase ({kind}): wrk, {what}, gunicorn {web_workers} {args.worker_class} workers")
        result = post_with_wrk(
            wrk, port, messages, args.clients, duration, tmp / f"wrk-{tag}", on_start=on_start, on_end=on_end
        )
        if args.requests:
            result["exhausted_threads"] = 0  # expected: every client sends its share, then stops
    else:
        log(
            f"timed phase ({kind}): Python http.client processes, {what}, gunicorn {web_workers} "
            f"{args.worker_class} workers"
        )
        groups["client(python)"] = os.getpgid(0)  # this script's group: the client processes are forked from it
        box["cpu0"] = cpu_by_group(groups, DB_NAME)
        result = post_with_python_clients(port, messages, args.clients, duration)
        box["cpu1"] = cpu_by_group(groups, DB_NAME)
        result["errors"] = sum(v for k, v in result["statuses"].items() if k not in (200, 202))
        result["exhausted_threads"] = 0
    cpu = cpu_delta(box["cpu0"], box["cpu1"])
    if profiler:
        profiler.stop()
        result["profile"] = profiler.report()
    result["busy_before"] = box["quiet"]
    events, unpublished = count_events(tag)
    result.update(
        tag=tag,
        events=events,
        unpublished=unpublished,
        cpu=cpu,
        web_workers=web_workers,
        client="wrk" if wrk else "python",
        count=count,
        kind=kind,
        rate=result["requests"] / result["wall"],
    )
    return result


def print_result(r: dict) -> None:
    accepted = r["statuses"].get(202, 0)
    rate = r["requests"] / r["wall"]
    served = "the app (config.wsgi)" if r["kind"] == "app" else "the FLOOR (bench/floor_app)"
    print(f"  served by             : {served} — gunicorn workers {r['web_workers']}")
    print(f"  client                : {r['client']}, {r['requests']} requests in {r['wall']:.2f} s")
    print(f"  requests/s            : {rate:,.0f}")
    print(f"  latency               : p50 {ms(r['p50'])}, p99 {ms(r['p99'])}, max {ms(r['max'])}")
    print(
        f"  answers               : 202 x {accepted}, 200 (duplicate) x {r['statuses'].get(200, 0)}, "
        f"errors {r['errors']}" + (f" {r.get('socket_errors')}" if r.get("socket_errors") else "")
    )
    ok = r["events"] == accepted
    print(f"  InboxEvent rows       : {r['events']} for {accepted} answers 202 -> {'OK' if ok else 'MISMATCH'}")
    if r["kind"] == "app":
        print(f"  outbox rows waiting   : {r['unpublished']} (no relay runs in this benchmark)")
    if r.get("exhausted_threads"):
        print(
            f"  NOTE: {r['exhausted_threads']} client(s) ran out of precomputed messages before the end; "
            f"raise --max-rate"
        )
    print("  " + format_cpu(r["cpu"], r["wall"], r["requests"]))
    per, ceiling = cpu_ceiling(r["cpu"], r["requests"])
    other = r["cpu"].get("other", 0) / r["wall"] * 100
    print(
        f"  CPU per request (app + client + its PostgreSQL backends): {per:.2f} ms -> an idle 2-core machine "
        f"would saturate near {ceiling:,.0f} requests/s (estimate; other work used {other:.0f}% of a core here)"
    )
    print(f"  machine load from other work just before timing: {r['busy_before'] * 100:.0f}% of one core")
    if r.get("profile"):
        print(r["profile"])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=10.0, help="timed phase length in seconds (default 10)")
    parser.add_argument("--requests", type=int, default=0, help="a fixed number of requests instead of --duration")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients/connections (default 4)")
    parser.add_argument(
        "--web-workers", default="4", help="gunicorn workers; a comma list (e.g. 2,4,6) runs the timed phases for each"
    )
    parser.add_argument(
        "--worker-class", default="sync", help="gunicorn --worker-class, app and floor alike (default sync)"
    )
    parser.add_argument("--threads", type=int, default=1, help="gunicorn --threads (gthread), app and floor")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="app and floor timed phases alternate this many times per worker count (default 2)",
    )
    parser.add_argument("--no-floor", action="store_true", help="skip the framework floor")
    parser.add_argument("--warmup", type=int, default=600, help="warm-up requests before the timed phase")
    parser.add_argument("--body-bytes", type=int, default=3000, help="size of each message (default 3000)")
    parser.add_argument(
        "--client",
        choices=("auto", "wrk", "python"),
        default="auto",
        help="auto: wrk if it is on PATH (install it yourself; nothing is installed here), else Python processes",
    )
    parser.add_argument(
        "--max-rate", type=float, default=2500, help="messages precomputed per second of --duration (default 2500)"
    )
    parser.add_argument("--baseline-duration", type=float, default=3.0, help="seconds per raw psycopg baseline")
    add_common_arguments(
        parser,
        "py-spy the gunicorn workers during the timed phase and print where their CPU "
        "goes (needs .venv/bin/pip install py-spy; lowers the figures a little)",
    )
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (about 20 s)")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.warmup, args.baseline_duration, args.preload, args.rounds = 3.0, 100, 1.0, 2000, 1
        args.quiet_wait = min(args.quiet_wait, 5)
    web_workers = [int(w) for w in str(args.web_workers).split(",") if w.strip()]

    install_signal_handlers()
    tmp = make_tmp("mailroom-bench-ingest-")
    env = app_env(DB_NAME, tmp, args.log_level)
    stack = Stack(tmp)
    results = []
    try:
        wrk = None
        if args.client in ("auto", "wrk"):
            wrk = find_wrk()
            if wrk is None and args.client == "wrk":
                raise SystemExit(
                    "wrk is not on PATH: install it yourself (e.g. your distribution's wrk package), "
                    "or use --client python"
                )
            if wrk is None:
                log(
                    "wrk not on PATH (install it yourself to use it): falling back to Python http.client processes "
                    "(they use CPU of their own)"
                )
        print(f"Mailroom ingest benchmark — revision {git_revision()}, {os.cpu_count()} cores")
        info = prepare_database(DB_NAME, env, args.preload)
        flush_broker()
        port = free_port()
        floor_env = dict(env, FLOOR_TENANT=str(info["tenant"]), FLOOR_MAILBOX=str(info["mailbox"]))
        kinds = ("app",) if args.no_floor else ("app", "floor")
        for n in web_workers:
            for _ in range(args.rounds):
                for kind in kinds:  # alternating, so that drifting load on the machine hits both alike
                    app, extra = ("config.wsgi", ()) if kind == "app" else ("floor_app.wsgi", ("--pythonpath", "bench"))
                    start_gunicorn(
                        stack,
                        env if kind == "app" else floor_env,
                        n,
                        port,
                        app=app,
                        name=kind,
                        worker_class=args.worker_class,
                        threads=args.threads,
                        extra=extra,
                    )
                    warm = make_messages("w" + uuid.uuid4().hex[:10], args.warmup, args.body_bytes)
                    w = post_with_python_clients(port, warm, args.clients)
                    bad = {k: v for k, v in w["statuses"].items() if k != 202}
                    log(
                        f"warm-up ({kind}): {w['requests']} requests, {w['requests'] / w['wall']:.0f}/s "
                        f"(Python clients), answers {w['statuses']}"
                    )
                    if bad:
                        raise RuntimeError(f"warm-up got answers other than 202: {bad}\n" + stack.tail(kind))
                    analyze(DB_NAME)
                    results.append(timed_phase(args, wrk, port, stack, n, tmp, kind))
                    stack.check_alive()
                    stack.stop(kind)

        payload = make_body("baseline", 0, args.body_bytes)
        prepare_baseline_tables(args.preload, payload)
        wait_for_quiet(args.quiet_wait)
        log(f"baseline: raw psycopg 3, {args.clients} connections (processes), {args.baseline_duration:g} s each")
        row = run_baseline("row", args.clients, args.baseline_duration, payload)
        shape = run_baseline("shape", args.clients, args.baseline_duration, payload)
        cte = run_baseline("cte", args.clients, args.baseline_duration, payload)

        print()
        print("=" * 78)
        print(
            f"INGEST — POST /webhooks/raw/<mailbox>/ (signed, unique, {args.body_bytes}-byte messages), "
            f"{args.clients} concurrent clients"
        )
        print("  Django app under gunicorn on PostgreSQL 127.0.0.1; no Celery worker and no relay run")
        print(f"  (outbox rows accumulate); app LOG_LEVEL={args.log_level}; {args.preload} events preloaded, ANALYZEd")
        for r in results:
            print("-" * 78)
            print_result(r)
        print("-" * 78)
        print(f"BASELINE (same run) — raw psycopg 3, {args.clients} concurrent connections, durability on:")
        print(
            f"  single-row INSERT + COMMIT, unique text index   : {row['rate']:,.0f} rows/s "
            f"(p50 {ms(row['p50'])}, p99 {ms(row['p99'])})"
        )
        print(
            f"  ingest-shaped txn (BEGIN, 3 INSERTs, NOTIFY, COMMIT): {shape['rate']:,.0f} txn/s "
            f"(p50 {ms(shape['p50'])}, p99 {ms(shape['p99'])})"
        )
        print(
            f"  the same rows as ONE statement (CTE, autocommit): {cte['rate']:,.0f} txn/s "
            f"(p50 {ms(cte['p50'])}, p99 {ms(cte['p99'])})"
        )
        print("-" * 78)
        consistent = True
        for n in web_workers:
            app = [r["rate"] for r in results if r["kind"] == "app" and r["web_workers"] == n]
            floor = [r["rate"] for r in results if r["kind"] == "floor" and r["web_workers"] == n]
            rate = statistics.median(app)
            line = (
                f"RESULT ({n} gunicorn {args.worker_class} workers): app {rate:,.0f} requests/s "
                f"(median of {len(app)}: {', '.join(f'{v:,.0f}' for v in app)})"
            )
            if floor:
                floor_rate = statistics.median(floor)
                line += (
                    f"; floor {floor_rate:,.0f} requests/s (median of {len(floor)}: "
                    f"{', '.join(f'{v:,.0f}' for v in floor)}); app/floor {rate / floor_rate * 100:.0f}% "
                    f"(goal >= 90%: {'MET' if rate >= 0.9 * floor_rate else 'MISSED'})"
                )
            print(line)
            print(
                f"  = {rate / row['rate'] * 100:.0f}% of the raw INSERT+COMMIT baseline; target >= 1,000 "
                f"requests/s: {'MET' if rate >= 1000 else 'MISSED'}"
            )
        for r in results:
            if r["events"] != r["statuses"].get(202, 0):
                print(
                    f"CHECK FAILED ({r['kind']}): {r['events']} InboxEvent rows for {r['statuses'].get(202, 0)} "
                    f"answers 202"
                )
                consistent = consistent and r["kind"] != "app"  # a floor mismatch is the bench's bug, not the app's
        print(f"CHECK: InboxEvent rows == 202 answers in every timed phase of the app: {'yes' if consistent else 'NO'}")
        print("=" * 78)
        return 0 if consistent else 1
    except KeyboardInterrupt:
        log("interrupted: stopping what this run started")
        return 130
    finally:
        clean_up(stack, DB_NAME, tmp, args.keep)


if __name__ == "__main__":
    sys.exit(main())

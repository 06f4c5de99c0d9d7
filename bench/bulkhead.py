"""Bulkhead benchmark: two tenants, each with its own FakeDesk (Zendesk) as its destination; N emails split
between their mailboxes; each destination's throughput in a no-fault run and in a run where one desk
("beta") stalls 15 % of its writes past the read timeout, while the other ("alpha") stays healthy.

Each round runs both modes in the same run, alternating: `inline` (the call made inside the per-event
prefork task, MAILROOM_DESTINATION_QUEUE="": what the code did before the bulkheads) and `pooled` (the
calls on the `destinations` queue, a `--pool threads` worker, ticketing.bulkhead's per-destination cap).
Throughput of a destination = its emails / (the phase's first post -> that destination's last mapping).
Goals (issue 16, item 4): under the faults alpha keeps >= 80 % of its no-fault throughput, beta >= 50 %.

    flock /tmp/mailroom-bench.lock .venv/bin/python bench/bulkhead.py              # 600 emails, 1 round
    flock /tmp/mailroom-bench.lock .venv/bin/python bench/bulkhead.py --rounds 3 --emails 400

Stack: gunicorn, the relay, a sweeper (beat's sweeps on a 0.5 s period: stale events, expired claims, due
retries, unknown outcomes, as the tests' sweeper does), Celery workers, two FakeDesk processes. Checks per
phase: every event completed with one mapping and one succeeded create_ticket intent, and in its desk
exactly one ticket per reference (no duplicate), the one the mapping names. Database
`mailroom_bench_bulkhead` (dropped at the end), Redis db 14 (flushed).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import signal
import statistics
import sys
import time
import uuid
from collections import Counter

import psycopg

from lib.db import analyze, app_env, clean_up, db_url, recreate_database
from lib.messages import make_body, sign
from lib.procstat import wait_for_quiet
from lib.report import log
from lib.stack import (
    BIN,
    PYTHON,
    REPO,
    Stack,
    flush_broker,
    free_port,
    git_revision,
    install_signal_handlers,
    make_tmp,
    manage,
    start_gunicorn,
)

sys.path.insert(0, str(REPO))
from fakedesk.client import DeskClient  # noqa: E402  (standard library only; needs the repository on the path)

DB_NAME = "mailroom_bench_bulkhead"
SLUGS = ("alpha", "beta")  # alpha: the healthy desk; beta: the one that stalls
SEED = 20261130

SETUP = r"""
import json, os
from intake.models import Mailbox, Tenant
from ticketing.models import Destination
for slug in ("alpha", "beta"):
    tenant = Tenant.objects.create(slug=slug, name=slug.title())
    Mailbox.objects.create(tenant=tenant, slug=slug, address=f"support@{slug}.test", provider="raw",
                           webhook_secret_ref="env:BENCH_SECRET",
                           settings={"acknowledge": False, "sender_rate_limit": {"count": 1000000, "seconds": 600}})
    Destination.objects.create(tenant=tenant, slug="desk", kind="zendesk", is_default=True,
                               base_url=os.environ["BENCH_DESK_" + slug.upper()],
                               credentials_ref="env:MAILROOM_T_" + slug.upper() + "_DESK",
                               settings={"read_timeout": float(os.environ["BENCH_READ_TIMEOUT"]),
                                         "retry_base_seconds": 0.05, "retry_cap_seconds": 0.5})
print("BENCH_SETUP ok")
"""

SWEEPER = r"""
import time
from intake.services import requeue_stale_events
from ticketing import intents
while True:
    requeue_stale_events(); intents.expire_claims(); intents.enqueue_due(); intents.resolve_unknown_intents()
    time.sleep(0.5)
"""


def _poster(port, items, start_evt, out_q):
    """One client process: posts (path, body, headers) one after the other; (t_send, status, event id, slug)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    conn, results = http.client.HTTPConnection("127.0.0.1", port, timeout=30), []
    start_evt.wait()
    for slug, body, headers in items:
        t0 = time.time()
        try:
            conn.request("POST", f"/webhooks/raw/{slug}/", body=body, headers=headers)
            resp = conn.getresponse()
            data, status = resp.read(), resp.status
            if resp.will_close:
                conn.close()
        except (OSError, http.client.HTTPException):
            conn.close()
            results.append((t0, -1, None, slug))
            continue
        results.append((t0, status, json.loads(data).get("inbox_event_id") if status in (200, 202) else None, slug))
    out_q.put(results)


def post(port: int, n: int, clients: int, body_bytes: int) -> list:
    tag, ts = "b" + uuid.uuid4().hex[:10], int(time.time())
    items = []
    for i in range(n):
        slug = SLUGS[i % 2]
        body = make_body(tag, i, body_bytes).replace(b"support@bench.test", f"support@{slug}.test".encode())
        items.append(
            (
                slug,
                body,
                {
                    "X-Mailroom-Timestamp": str(ts),
                    "X-Mailroom-Signature": sign(body, ts),
                    "Content-Type": "message/rfc822",
                },
            )
        )
    ctx = multiprocessing.get_context("fork")
    start_evt, out_q = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_poster, args=(port, items[k::clients], start_evt, out_q), daemon=True)
        for k in range(clients)
    ]
    for proc in procs:
        proc.start()
    time.sleep(0.2)
    start_evt.set()
    results = [r for _ in procs for r in out_q.get(timeout=600)]
    for proc in procs:
        proc.join(5)
    bad = Counter(r[1] for r in results if r[1] != 202)
    if bad:
        raise RuntimeError(f"posts not answered 202: {dict(bad)}")
    return results


def wait_mapped(ids: list[int], timeout: float, stack: Stack) -> bool:
    deadline = time.time() + timeout
    with psycopg.connect(db_url(DB_NAME), autocommit=True) as conn:
        while time.time() < deadline:
            done = conn.execute(
                "SELECT count(*) FROM ticketing_ticketmapping WHERE inbox_event_id = ANY(%s)", (ids,)
            ).fetchone()[0]
            if done >= len(ids):
                return True
            stack.check_alive()
            time.sleep(0.1)
    return False


def check(ids: list[int], desk: DeskClient) -> tuple[float, dict]:
    """(time of the last mapping, guarantee counts) for one destination's events of a phase."""
    with psycopg.connect(db_url(DB_NAME), autocommit=True) as conn:
        rows = conn.execute(
            """SELECT e.id, e.state,
                 (SELECT count(*) FROM ticketing_ticketmapping m WHERE m.inbox_event_id = e.id),
                 (SELECT max(extract(epoch FROM m.created_at)) FROM ticketing_ticketmapping m
                   WHERE m.inbox_event_id = e.id),
                 (SELECT max(m.ticket_id) FROM ticketing_ticketmapping m WHERE m.inbox_event_id = e.id),
                 (SELECT count(*) FROM ticketing_intent i WHERE i.inbox_event_id = e.id AND i.action = 'create_ticket'),
                 (SELECT count(*) FROM ticketing_intent i WHERE i.inbox_event_id = e.id AND i.action = 'create_ticket'
                    AND i.state = 'succeeded'),
                 (SELECT max(i.external_ref) FROM ticketing_intent i WHERE i.inbox_event_id = e.id
                    AND i.action = 'create_ticket')
               FROM intake_inboxevent e WHERE e.id = ANY(%s)""",
            (ids,),
        ).fetchall()
    tickets = desk.tickets()
    by_ref = Counter(t["external_id"] for t in tickets)
    id_of = {t["external_id"]: str(t["id"]) for t in tickets}
    counts = {
        "completed": sum(r[1] == "completed" for r in rows),
        "one_mapping": sum(r[2] == 1 for r in rows),
        "one_succeeded_intent": sum(r[5] == 1 and r[6] == 1 for r in rows),
        "one_desk_ticket_matching": sum(by_ref.get(r[7]) == 1 and id_of.get(r[7]) == r[4] for r in rows),
    }
    counts["duplicates_in_desk"] = sum(n - 1 for n in by_ref.values() if n > 1)
    counts["desk_tickets"] = len(tickets)
    return max(float(r[3] or 0.0) for r in rows), counts


def start_workers(stack: Stack, env: dict, mode: str, args) -> None:
    celery = [
        str(BIN / "celery"),
        "-A",
        "config",
        "worker",
        "--loglevel",
        "WARNING",
        "--without-mingle",
        "--without-gossip",
    ]
    if mode == "inline":
        stack.start("celery", celery + ["--concurrency", str(args.workers)], dict(env, MAILROOM_DESTINATION_QUEUE=""))
        return
    env = dict(env, MAILROOM_DESTINATION_QUEUE="destinations")
    stack.start("celery", celery + ["--concurrency", str(args.workers), "-Q", "celery", "-n", "cpu@%h"], env)
    stack.start(
        "calls",
        celery + ["--pool", "threads", "--concurrency", str(args.threads), "-Q", "destinations", "-n", "calls@%h"],
        env,
    )


def phase(label: str, port: int, stack: Stack, desks: dict, faulty: bool, args) -> dict:
    for desk in desks.values():
        desk.reset()
    if faulty:
        desks["beta"].set_plan(random_spec={"seed": SEED, "weights": {f"stall_after_commit:{args.stall}": 0.15}})
    busy = wait_for_quiet(args.quiet_wait)
    results = post(port, args.emails, args.clients, args.body_bytes)
    first = min(r[0] for r in results)
    ids = {slug: [r[2] for r in results if r[3] == slug] for slug in SLUGS}
    finished = wait_mapped(ids["alpha"] + ids["beta"], args.timeout, stack)
    out = {"busy": busy, "finished": finished}
    for slug in SLUGS:
        last, counts = check(ids[slug], desks[slug])
        n = len(ids[slug])
        out[slug] = {
            "n": n,
            "rate": n / (last - first) if last > first else float("nan"),
            "wall": last - first,
            "ok": finished
            and counts["duplicates_in_desk"] == 0
            and all(
                counts[k] == n for k in ("completed", "one_mapping", "one_succeeded_intent", "one_desk_ticket_matching")
            ),
            **counts,
        }
        desks[slug].set_plan()
    writes = Counter(r["fault"] for r in desks["beta"].requests_log())
    log(
        f"{label}: alpha {out['alpha']['rate']:.1f}/s, beta {out['beta']['rate']:.1f}/s "
        f"(machine {busy * 100:.0f}% busy before; beta's writes by fault {dict(writes)})"
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--emails", type=int, default=600, help="emails per phase, split between alpha and beta")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of (inline, pooled), alternating")
    parser.add_argument("--modes", default="inline,pooled")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="prefork --concurrency (default 2)")
    parser.add_argument("--threads", type=int, default=32, help="the destinations worker's threads (default 32)")
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--body-bytes", type=int, default=3000)
    parser.add_argument("--read-timeout", type=float, default=1.0, help="the destinations' read_timeout (1 s)")
    parser.add_argument("--stall", type=float, default=2.0, help="seconds a stalled write hangs (2, > read timeout)")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--quiet-wait", type=float, default=15)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args()

    install_signal_handlers()
    tmp = make_tmp("mailroom-bench-bulkhead-")
    env = app_env(DB_NAME, tmp, args.log_level, mailboxes=SLUGS)
    stack = Stack(tmp)
    ok, runs = True, []
    try:
        print(f"Mailroom bulkhead benchmark — revision {git_revision()}, {os.cpu_count()} cores")
        desks = {}
        for slug in SLUGS:
            port, token = free_port(), uuid.uuid4().hex
            stack.start(
                f"desk-{slug}",
                [
                    str(PYTHON),
                    "-m",
                    "fakedesk",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--db",
                    str(tmp / f"{slug}.sqlite3"),
                    f"--token={token}",
                    "--log-level",
                    "WARNING",
                ],
                dict(env, PYTHONPATH=str(REPO)),
            )
            desks[slug] = DeskClient(f"http://127.0.0.1:{port}", token=token).wait_until_up()
            env[f"BENCH_DESK_{slug.upper()}"] = desks[slug].url
            env[f"MAILROOM_T_{slug.upper()}_DESK"] = f"agent@{slug}.test/token:{token}"
        env["BENCH_READ_TIMEOUT"] = str(args.read_timeout)
        recreate_database(DB_NAME)
        manage(env, "migrate", "--noinput", "-v0")
        manage(env, "shell", "-c", SETUP)
        flush_broker()
        port = free_port()
        start_gunicorn(stack, env, args.web_workers, port)
        stack.start("relay", [str(PYTHON), "manage.py", "run_relay"], env)
        stack.start("sweeper", [str(PYTHON), "manage.py", "shell", "-c", SWEEPER], env)
        modes = args.modes.split(",")
        for round_ in range(args.rounds):
            for mode in modes if round_ % 2 == 0 else modes[::-1]:
                start_workers(stack, env, mode, args)
                warm = post(port, 40, args.clients, args.body_bytes)
                if not wait_mapped([r[2] for r in warm], 120, stack):
                    raise RuntimeError(f"{mode}: warm-up did not complete\n{stack.tail('celery')}")
                analyze(DB_NAME)
                run = {"mode": mode, "round": round_ + 1}
                run["clean"] = phase(f"round {round_ + 1} {mode} no-fault", port, stack, desks, False, args)
                run["faulty"] = phase(f"round {round_ + 1} {mode} beta stalls 15%", port, stack, desks, True, args)
                runs.append(run)
                ok &= all(run[p][s]["ok"] for p in ("clean", "faulty") for s in SLUGS)
                stack.stop("celery")
                stack.stop("calls")
        report(runs, args)
        return 0 if ok else 1
    except KeyboardInterrupt:
        log("interrupted: stopping what this run started")
        return 130
    finally:
        clean_up(stack, DB_NAME, tmp, args.keep)


def report(runs: list, args) -> None:
    print("=" * 78)
    print(
        f"BULKHEADS — {args.emails} emails per phase (half alpha, half beta), {args.clients} clients; prefork "
        f"--concurrency {args.workers}; pooled: + threads worker ({args.threads}); read_timeout "
        f"{args.read_timeout:g} s, beta stalls 15 % of writes for {args.stall:g} s (seeded)"
    )
    print(
        f"{'round':>5} {'mode':7} {'alpha clean':>11} {'alpha fault':>11} {'ratio':>6} {'beta clean':>10} "
        f"{'beta fault':>10} {'ratio':>6}  checks"
    )
    for run in runs:
        a0, a1, b0, b1 = (run[p][s]["rate"] for s in SLUGS for p in ("clean", "faulty"))
        checks = (
            "OK"
            if all(run[p][s]["ok"] for p in ("clean", "faulty") for s in SLUGS)
            else "FAILED " + json.dumps({p: {s: run[p][s] for s in SLUGS} for p in ("clean", "faulty")})
        )
        print(
            f"{run['round']:>5} {run['mode']:7} {a0:>9.1f}/s {a1:>9.1f}/s {a1 / a0:>6.2f} {b0:>8.1f}/s "
            f"{b1:>8.1f}/s {b1 / b0:>6.2f}  {checks}"
        )
    for mode in dict.fromkeys(r["mode"] for r in runs):
        mine = [r for r in runs if r["mode"] == mode]
        alpha = statistics.median(r["faulty"]["alpha"]["rate"] / r["clean"]["alpha"]["rate"] for r in mine)
        beta = statistics.median(r["faulty"]["beta"]["rate"] / r["clean"]["beta"]["rate"] for r in mine)
        print(
            f"RESULT {mode}: under beta's stalls alpha keeps {alpha * 100:.0f}% of its no-fault throughput "
            f"(goal >= 80%: {'MET' if alpha >= 0.8 else 'MISSED'}), beta keeps {beta * 100:.0f}% "
            f"(goal >= 50%: {'MET' if beta >= 0.5 else 'MISSED'}); median of {len(mine)} round(s)"
        )
    print("=" * 78)


if __name__ == "__main__":
    sys.exit(main())

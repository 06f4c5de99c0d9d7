"""Desk quota benchmark: N emails with attachments through the whole pipeline to a Zendesk destination whose
desk enforces an API quota, every worker sharing the destination's request budget (ticketing.budget).

FakeDesk (Zendesk) runs in this process with `quota_per_minute` Q: past Q API requests in a sliding minute it
answers 429 with Retry-After, every request counted (uploads, creates and reads), as Zendesk counts them. The
destination declares the same quota (`requests_per_minute` Q). Each email carries `--attachments` files (a PNG
and a PDF, alternating), so each ticket costs one upload per file and one create. The emails are all posted at
once; the pipeline then drains at the budget's pace. Goals (issue 22, point 9): the desk answers no 429, and
the run sustains >= 90 % of the quota (admitted requests per minute, first to last request at the desk).

    flock /tmp/mailroom-bench.lock .venv/bin/python bench/desk_quota.py                # 300 emails, Q = 120
    flock /tmp/mailroom-bench.lock .venv/bin/python bench/desk_quota.py --emails 60 --quota 600
    flock /tmp/mailroom-bench.lock .venv/bin/python bench/desk_quota.py --emails 100 --no-budget   # the contrast:
                                   # the destination declares no quota (requests_per_minute 0), workers only react

Stack: gunicorn, the relay, a sweeper (beat's sweeps on a 0.5 s period, as the tests' sweeper does), a prefork
worker for the per-event path and a `--pool threads` worker for the destination calls (the `destinations`
queue, PostgreSQL's default). The malware scanner is off (MAILROOM_CLAMD=off): it is not what is measured.
Checks: every event completed with one mapping and one succeeded create_ticket intent, exactly one desk ticket
per reference, each with all its files. Database `mailroom_bench_desk_quota` (dropped at the end), Redis db 14
(`BENCH_BROKER_URL`; flushed).
"""

from __future__ import annotations

import argparse
import email.message
import json
import multiprocessing
import os
import struct
import sys
import threading
import time
import uuid
import zlib
from collections import Counter

import psycopg

from lib.db import app_env, clean_up, db_url, recreate_database
from lib.messages import MAILBOX_SLUG, WEBHOOK_PATH, sign
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
from fakedesk.server import FakeDesk  # noqa: E402  (standard library only; needs the repository on the path)

DB_NAME = "mailroom_bench_desk_quota"

SETUP = r"""
import os
from intake.models import Mailbox, Tenant
from ticketing.models import Destination
tenant = Tenant.objects.create(slug="quota", name="Quota")
Mailbox.objects.create(tenant=tenant, slug=os.environ["BENCH_MAILBOX"], address="support@quota.test", provider="raw",
                       webhook_secret_ref="env:BENCH_SECRET",
                       settings={"acknowledge": False, "sender_rate_limit": {"count": 1000000, "seconds": 600}})
Destination.objects.create(tenant=tenant, slug="desk", kind="zendesk", is_default=True,
                           base_url=os.environ["BENCH_DESK_URL"], credentials_ref="env:MAILROOM_T_QUOTA_DESK",
                           settings={"requests_per_minute": int(os.environ["BENCH_DESTINATION_QUOTA"]),
                                     "retry_base_seconds": 0.5, "retry_cap_seconds": 5})
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


class DeskLog:
    """A request hook of the in-process desk: when each API request arrived and what it was; and, told by the
    desk's quota, when each request it admitted arrived."""

    def __init__(self):
        self.lock = threading.Lock()
        self.arrivals: list[tuple[float, str, str]] = []
        self.admitted: list[float] = []

    def __call__(self, request):
        with self.lock:
            self.arrivals.append((time.time(), request.method, request.path))
        return None  # then the quota and FakeDesk itself answer

    def admit(self, at: float):
        with self.lock:
            self.admitted.append(at)

    def snapshot(self) -> tuple[list[tuple[float, str, str]], list[float]]:
        with self.lock:
            return list(self.arrivals), list(self.admitted)


def png(seed: int, side: int = 64) -> bytes:
    """A real PNG (so that the type sniffer says image/png), different for every seed."""
    rows = b"".join(b"\x00" + bytes((seed * 7 + x * 3 + y) % 256 for x in range(side * 3)) for y in range(side))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def pdf(seed: int) -> bytes:
    text = f"Invoice {seed}: the printer, the extinguisher, the third floor. " * 40
    stream = f"BT /F1 10 Tf 40 700 Td ({text[:900]}) Tj ET".encode()
    return (
        b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n"
        b"2 0 obj << /Type /Pages /Kids [3 0 R] /Count 1 >> endobj\n"
        b"3 0 obj << /Type /Page /Parent 2 0 R /Contents 4 0 R >> endobj\n"
        + f"4 0 obj << /Length {len(stream)} >> stream\n".encode()
        + stream
        + b"\nendstream endobj\n%%EOF\n"
    )


def make_message(tag: str, i: int, attachments: int) -> bytes:
    message = email.message.EmailMessage()
    message["From"] = f"Customer {i} <customer{i}@example.com>"
    message["To"] = "support@quota.test"
    message["Subject"] = f"[{tag}] request {i}: the printer is on fire"
    message["Date"] = "Mon, 06 Jan 2025 10:00:00 +0000"
    message["Message-ID"] = f"<{tag}.{i}@bench.mailroom>"
    message.set_content("Hello support team, photos and the invoice are attached. Thanks.\n")
    for n in range(attachments):
        if n % 2 == 0:
            message.add_attachment(png(i * 10 + n), maintype="image", subtype="png", filename=f"photo-{i}-{n}.png")
        else:
            message.add_attachment(
                pdf(i * 10 + n), maintype="application", subtype="pdf", filename=f"invoice-{i}-{n}.pdf"
            )
    return message.as_bytes()


def _poster(port, items, start_evt, out_q):
    import http.client

    conn, results = http.client.HTTPConnection("127.0.0.1", port, timeout=60), []
    start_evt.wait()
    for body, headers in items:
        try:
            conn.request("POST", WEBHOOK_PATH, body=body, headers=headers)
            resp = conn.getresponse()
            data, status = resp.read(), resp.status
            if resp.will_close:
                conn.close()
        except (OSError, http.client.HTTPException):
            conn.close()
            results.append((-1, None))
            continue
        results.append((status, json.loads(data).get("inbox_event_id") if status in (200, 202) else None))
    out_q.put(results)


def post(port: int, n: int, clients: int, attachments: int) -> list[int]:
    tag, ts = "q" + uuid.uuid4().hex[:10], int(time.time())
    items = []
    for i in range(n):
        body = make_message(tag, i, attachments)
        items.append(
            (
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
    bad = Counter(status for status, _ in results if status != 202)
    if bad:
        raise RuntimeError(f"posts not answered 202: {dict(bad)}")
    return [event_id for _, event_id in results]


def wait_mapped(ids: list[int], timeout: float, stack: Stack, desk_log: DeskLog) -> bool:
    deadline, last_note = time.time() + timeout, 0.0
    with psycopg.connect(db_url(DB_NAME), autocommit=True) as conn:
        while time.time() < deadline:
            done = conn.execute(
                "SELECT count(*) FROM ticketing_ticketmapping WHERE inbox_event_id = ANY(%s)", (ids,)
            ).fetchone()[0]
            if done >= len(ids):
                return True
            if time.time() - last_note >= 60:
                log(f"{done}/{len(ids)} mapped, {len(desk_log.snapshot()[0])} desk requests so far")
                last_note = time.time()
            stack.check_alive()
            time.sleep(0.5)
    return False


def check(ids: list[int], desk: FakeDesk, attachments: int) -> dict:
    with psycopg.connect(db_url(DB_NAME), autocommit=True) as conn:
        rows = conn.execute(
            """SELECT e.id, e.state,
                 (SELECT count(*) FROM ticketing_ticketmapping m WHERE m.inbox_event_id = e.id),
                 (SELECT max(m.ticket_id) FROM ticketing_ticketmapping m WHERE m.inbox_event_id = e.id),
                 (SELECT count(*) FROM ticketing_intent i WHERE i.inbox_event_id = e.id AND i.action = 'create_ticket'
                    AND i.state = 'succeeded'),
                 (SELECT max(i.external_ref) FROM ticketing_intent i WHERE i.inbox_event_id = e.id
                    AND i.action = 'create_ticket'),
                 (SELECT max(i.attempts) FROM ticketing_intent i WHERE i.inbox_event_id = e.id
                    AND i.action = 'create_ticket')
               FROM intake_inboxevent e WHERE e.id = ANY(%s)""",
            (ids,),
        ).fetchall()
        retries = conn.execute(
            """SELECT a.detail->>'reason', count(*) FROM intake_auditevent a
               WHERE a.inbox_event_id = ANY(%s) AND a.detail ? 'retry_at' AND a.detail->>'retry_at' IS NOT NULL
               GROUP BY 1""",
            (ids,),
        ).fetchall()
    tickets = desk.tickets()
    by_ref = Counter(t["external_id"] for t in tickets)
    ticket_of = {t["external_id"]: t for t in tickets}
    return {
        "completed": sum(r[1] == "completed" for r in rows),
        "one_mapping": sum(r[2] == 1 for r in rows),
        "one_succeeded_intent": sum(r[4] == 1 for r in rows),
        "one_desk_ticket_matching": sum(by_ref.get(r[5]) == 1 and str(ticket_of[r[5]]["id"]) == r[3] for r in rows),
        "all_files_on_ticket": sum(
            r[5] in ticket_of and len(ticket_of[r[5]].get("attachments") or ()) == attachments for r in rows
        ),
        "duplicates_in_desk": sum(n - 1 for n in by_ref.values() if n > 1),
        "attempts_over_one": sum((r[6] or 0) > 1 for r in rows),
        "retries_by_reason": {reason: count for reason, count in retries},
    }


def most_in_a_minute(times: list[float]) -> int:
    times, most, start = sorted(times), 0, 0
    for end, at in enumerate(times):
        while times[start] <= at - 60.0:
            start += 1
        most = max(most, end - start + 1)
    return most


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--emails", type=int, default=300)
    parser.add_argument("--quota", type=int, default=120, help="the desk's quota and the destination's (per minute)")
    parser.add_argument("--attachments", type=int, default=2, help="files per email (default 2)")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="prefork --concurrency (default 2)")
    parser.add_argument("--threads", type=int, default=16, help="the destinations worker's threads (default 16)")
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for every mapping (default: twice the time the quota needs, plus 2 minutes)",
    )
    parser.add_argument(
        "--no-budget",
        action="store_true",
        help="the contrast: the destination declares no quota (requests_per_minute 0)",
    )
    parser.add_argument("--quiet-wait", type=float, default=15)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args()

    install_signal_handlers()
    tmp = make_tmp("mailroom-bench-desk-quota-")
    env = dict(app_env(DB_NAME, tmp, args.log_level), MAILROOM_CLAMD="off", MAILROOM_DESTINATION_QUEUE="destinations")
    stack = Stack(tmp)
    token = uuid.uuid4().hex
    desk = FakeDesk(
        host="127.0.0.1", port=0, db_path=str(tmp / "desk.sqlite3"), token=token, quota_per_minute=args.quota
    ).start()
    desk_log = DeskLog()
    try:
        print(f"Mailroom desk quota benchmark — revision {git_revision()}, {os.cpu_count()} cores")
        env.update(
            BENCH_DESK_URL=desk.url,
            BENCH_DESTINATION_QUOTA=str(0 if args.no_budget else args.quota),
            BENCH_MAILBOX=MAILBOX_SLUG,
            MAILROOM_T_QUOTA_DESK=f"agent@quota.test/token:{token}",
        )
        recreate_database(DB_NAME)
        manage(env, "migrate", "--noinput", "-v0")
        manage(env, "shell", "-c", SETUP)
        flush_broker()
        port = free_port()
        start_gunicorn(stack, env, args.web_workers, port)
        stack.start("relay", [str(PYTHON), "manage.py", "run_relay"], env)
        stack.start("sweeper", [str(PYTHON), "manage.py", "shell", "-c", SWEEPER], env)
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
        stack.start("celery", celery + ["--concurrency", str(args.workers), "-Q", "celery", "-n", "cpu@%h"], env)
        stack.start(
            "calls",
            celery + ["--pool", "threads", "--concurrency", str(args.threads), "-Q", "destinations", "-n", "calls@%h"],
            env,
        )
        requests_needed = args.emails * (args.attachments + 1)
        timeout = args.timeout or 2 * requests_needed / args.quota * 60 + 120
        busy = wait_for_quiet(args.quiet_wait)
        desk.add_request_hook(desk_log)
        desk.quota.on_admit = desk_log.admit
        log(
            f"posting {args.emails} emails with {args.attachments} files each: about {requests_needed} desk "
            f"requests, {requests_needed / args.quota:.1f} minutes at the quota"
        )
        posted_at = time.time()
        ids = post(port, args.emails, args.clients, args.attachments)
        finished = wait_mapped(ids, timeout, stack, desk_log)
        time.sleep(1.0)  # the last answers
        counts = check(ids, desk, args.attachments)
        arrivals, admitted_at = desk_log.snapshot()
        quota = desk.quota_report()
        ok = (
            finished
            and counts["duplicates_in_desk"] == 0
            and all(
                counts[k] == len(ids)
                for k in (
                    "completed",
                    "one_mapping",
                    "one_succeeded_intent",
                    "one_desk_ticket_matching",
                    "all_files_on_ticket",
                )
            )
        )
        met = report(args, arrivals, admitted_at, quota, counts, posted_at, busy, ok)
        return 0 if ok and met else 1
    except KeyboardInterrupt:
        log("interrupted: stopping what this run started")
        return 130
    finally:
        clean_up(stack, DB_NAME, tmp, args.keep)
        desk.stop()


def report(
    args, arrivals, admitted_at: list[float], quota: dict, counts: dict, posted_at: float, busy: float, ok: bool
) -> bool:
    times = sorted(admitted_at)  # what the desk served (a refused request is no throughput)
    kinds = Counter(
        "upload" if path.startswith("/api/v2/uploads") else f"{method} {path}" for _, method, path in arrivals
    )
    admitted, refused = quota["admitted"], quota["refused"]
    span = times[-1] - times[0] if len(times) > 1 else float("nan")
    overall = (len(times) - 1) / span * 60 if span > 0 else float("nan")  # requests a minute, first to last
    # Each whole minute from the first request (the last, partial one left out): what the run sustained.
    minutes = [sum(times[0] + 60 * k <= at < times[0] + 60 * (k + 1) for at in times) for k in range(int(span // 60))]
    sustained = sum(minutes) / len(minutes) if minutes else overall
    share = sustained / args.quota
    print("=" * 78)
    print(
        f"DESK QUOTA — {args.emails} emails x {args.attachments} files to Zendesk (FakeDesk, quota "
        f"{args.quota}/min, sliding minute; destination requests_per_minute "
        f"{0 if args.no_budget else args.quota}); prefork "
        f"--concurrency {args.workers} + threads worker ({args.threads}); machine {busy * 100:.0f}% busy before"
    )
    print(
        f"desk requests: {len(arrivals)} arrived, {admitted} admitted, {refused} answered 429 by the quota; "
        f"arrivals by kind {dict(kinds)}"
    )
    print(
        f"first request {times[0] - posted_at:.1f} s after the first post; first to last admitted request "
        f"{span:.1f} s; busiest sliding minute {most_in_a_minute(times)} admitted "
        f"({most_in_a_minute([at for at, _, _ in arrivals])} arrived)"
    )
    print(
        f"admitted requests in each whole minute from the first: {minutes or 'none (a run under a minute)'}; "
        f"first to last: {overall:.1f}/min"
    )
    print(
        f"sustained: {sustained:.1f} requests/min = {share * 100:.1f} % of the quota "
        f"({'mean of the whole minutes' if minutes else 'first to last: under a minute, mostly the burst'}); "
        f"{counts['completed']} tickets in {span / 60:.1f} min"
    )
    print(f"checks: {'OK' if ok else 'FAILED'} {json.dumps(counts)}")
    no_429 = refused == 0
    met = no_429 and share >= 0.9
    print(
        f"RESULT: 429s at the desk {refused} (goal 0: {'MET' if no_429 else 'MISSED'}); sustained "
        f"{share * 100:.1f} % of the quota (goal >= 90 %: {'MET' if share >= 0.9 else 'MISSED'})"
    )
    print("=" * 78)
    return met


if __name__ == "__main__":
    sys.exit(main())

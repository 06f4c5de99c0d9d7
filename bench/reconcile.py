"""Reconciliation benchmark: how long one pass takes as history grows, with the window fixed.

For each size (default 10k, 100k, 1M stored events) the scratch database is filled with
`generate_series` (no ORM): completed events spread over the past year, each with its intent,
built-in ticket and mapping, of which a fixed 1,000 fall in the 3-day window; 20 open events stuck
without a mapping; 10 unpublished outbox rows; then `VACUUM ANALYZE`. One pass is then timed
(`reconciliation.reconcilers.reconcile()`, the beat task's work): every reconciler over the raw
mailbox, the built-in destination and the outbox. The mailbox's provider is replaced by a stub that
lists the window's 1,000 provider ids (all stored), so the provider reconciler's database side (the
compare against the unique index) is measured without a mail server. The first pass opens the
findings; the median of the next `--passes` is printed, then the 10k → 1M growth ratio (goal ≤ 1.5×).

    .venv/bin/python bench/reconcile.py                      # 10k, 100k, 1M (a few minutes)
    .venv/bin/python bench/reconcile.py --sizes 10000,100000 --passes 3

Needs PostgreSQL on 127.0.0.1:5432 (user postgres, trust; BENCH_PG_ADMIN_DSN overrides); creates
and drops the database `mailroom_bench_reconcile`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import psycopg

from lib.db import app_env, db_url, drop_database, recreate_database
from lib.report import log
from lib.stack import make_tmp, manage, remove_tmp

DB_NAME = "mailroom_bench_reconcile"
WINDOW_EVENTS = 1000
STUCK_EVENTS = 20
STUCK_OUTBOX = 10

PASS_SCRIPT = r'''
import json, os, time
from intake.providers.base import ListedMessage, Listing, Provider
from intake.models import InboxEvent, Mailbox
from reconciliation import reconcilers
from reconciliation.reconcilers import provider as provider_reconciler
from django.utils import timezone

class Stub(Provider):
    """Lists what a mail server would hold in the window: the window's provider ids."""
    supports_listing = True
    def list_recent(self, since, until, limit, resume=None):
        ids = (InboxEvent.objects.filter(mailbox=self.mailbox, received_at__gte=since, received_at__lte=until)
               .order_by("received_at").values_list("provider_message_id", flat=True)[:limit])
        return Listing([ListedMessage(i, i) for i in ids], None)
    def fetch_listed(self, listed):
        return []

provider_reconciler.provider_for = Stub
durations = []
for n in range(int(os.environ["BENCH_PASSES"]) + 1):
    t0 = time.perf_counter()
    summaries = reconcilers.reconcile()
    durations.append(time.perf_counter() - t0)
from reconciliation.models import ReconciliationRun
last = ReconciliationRun.objects.order_by("-pk")[:len(summaries)]
parts = {r.kind: round((r.finished_at - r.started_at).total_seconds() * 1000, 1) for r in last}
print("BENCH_PASS " + json.dumps({"durations": durations, "lines": [s.line() for s in summaries], "parts": parts}))
'''


def columns(conn, table: str) -> list[tuple[str, str, bool, bool]]:
    return conn.execute(
        "SELECT column_name, data_type, is_nullable = 'YES', column_default IS NOT NULL FROM information_schema.columns"
        " WHERE table_name = %s ORDER BY ordinal_position",
        (table,),
    ).fetchall()


FILLER = {
    "boolean": "false",
    "integer": "0",
    "bigint": "0",
    "smallint": "0",
    "text": "''",
    "character varying": "''",
    "jsonb": "'{}'::jsonb",
    "timestamp with time zone": "now()",
    "double precision": "0",
    "bytea": "NULL",
}


def insert_series(conn, table: str, count_sql: str, values: dict[str, str]) -> None:
    """INSERT INTO table SELECT ... FROM generate_series: `values` per column (SQL over `i`), the rest filled."""
    cols, exprs = [], []
    for name, kind, nullable, has_default in columns(conn, table):
        if name == "id":
            continue
        if name in values:
            cols.append(name)
            exprs.append(values[name])
        elif not nullable and not has_default:
            cols.append(name)
            exprs.append(FILLER.get(kind, "''"))
    conn.execute(f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(exprs)} FROM {count_sql}")


def fill(size: int, ids: dict) -> None:
    tenant, mailbox, destination = ids["tenant"], ids["mailbox"], ids["destination"]
    history = size - WINDOW_EVENTS - STUCK_EVENTS
    with psycopg.connect(db_url(DB_NAME), autocommit=True) as conn:
        for table in (
            "reconciliation_finding",
            "reconciliation_reconciliationrun",
            "ticketing_ticketmapping",
            "ticketing_intent",
            "ticketing_ticket",
            "intake_auditevent",
            "intake_outboxmessage",
            "intake_inboxevent",
        ):
            conn.execute(f"TRUNCATE {table} RESTART IDENTITY CASCADE")
        # Ids grow with time: the history first (a year ago up to 4 days ago), then the window, then the stuck.
        step = f"(interval '361 days' / {max(history, 1)})"
        when = (
            f"CASE WHEN i <= {history} THEN now() - interval '365 days' + (i * {step})"
            f" WHEN i <= {history + WINDOW_EVENTS} THEN now() - interval '3 days' + interval '20 minutes'"
            f" + ((i - {history}) * (interval '2 days' / {WINDOW_EVENTS}))"
            f" ELSE now() - interval '1 hour' END"
        )
        insert_series(
            conn,
            "intake_inboxevent",
            f"generate_series(1, {size}) AS i",
            {
                "tenant_id": str(tenant),
                "mailbox_id": str(mailbox),
                "provider_message_id": "'bench-' || i || '@bench'",
                "dedupe_key": "md5(i::text) || md5('k' || i::text)",
                "source": "'raw'",
                "state": f"CASE WHEN i > {history + WINDOW_EVENTS} THEN 'received' ELSE 'completed' END",
                "received_at": when,
                "updated_at": when,
                "size": "100",
                "raw": "NULL",
                "dispatch_count": "1",
                "thread_key": "md5('t' || i::text)",
                "sender": "'old@example.com'",
                "subject": "'old'",
            },
        )
        completed = "(SELECT id, received_at FROM intake_inboxevent WHERE state = 'completed') AS e"
        key = "md5('a' || e.id::text) || md5('b' || e.id::text)"
        insert_series(
            conn,
            "ticketing_ticket",
            completed,
            {
                "destination_id": str(destination),
                "idempotency_key": key,
                "external_ref": f"'mailroom-' || left({key}, 40)",
                "subject": "'old'",
                "status": "'new'",
                "tags": "'[]'::jsonb",
                "created_at": "e.received_at",
                "priority": "'normal'",
            },
        )
        with_ticket = completed + f" JOIN ticketing_ticket t ON t.idempotency_key = {key}"
        insert_series(
            conn,
            "ticketing_intent",
            with_ticket,
            {
                "idempotency_key": key,
                "inbox_event_id": "e.id",
                "action": "'create_ticket'",
                "action_version": "1",
                "destination_id": str(destination),
                "state": "'succeeded'",
                "attempts": "1",
                "external_ref": "t.external_ref",
                "result_ref": "t.id::text",
                "created_at": "e.received_at",
                "completed_at": "e.received_at",
            },
        )
        insert_series(
            conn,
            "ticketing_ticketmapping",
            with_ticket,
            {
                "inbox_event_id": "e.id",
                "action": "'create_ticket'",
                "destination_id": str(destination),
                "ticket_id": "t.id::text",
                "ticket_url": "''",
                "created_at": "e.received_at",
            },
        )
        insert_series(
            conn,
            "intake_outboxmessage",
            f"generate_series(1, {STUCK_OUTBOX}) AS i",
            {
                "topic": "'inbox_event.process'",
                "payload": "'{}'::jsonb",
                "created_at": "now() - interval '1 hour'",
                "published_at": "NULL",
                "attempts": "0",
            },
        )
        conn.execute("VACUUM ANALYZE")


SETUP = r"""
import json
from intake.models import Mailbox, Tenant
from ticketing.models import Destination
tenant = Tenant.objects.create(slug="bench", name="Benchmark tenant")
mailbox = Mailbox.objects.create(tenant=tenant, slug="bench", address="support@bench.test", provider="raw",
                                 webhook_secret_ref="env:BENCH_SECRET")
destination = Destination.objects.create(tenant=tenant, slug="builtin", kind="builtin", is_default=True)
print("BENCH_SETUP " + json.dumps({"tenant": tenant.pk, "mailbox": mailbox.pk, "destination": destination.pk}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000", help="stored events per run (comma-separated)")
    parser.add_argument("--passes", type=int, default=5, help="timed passes per size (after a first, untimed one)")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    tmp = make_tmp("mailroom-bench-reconcile-")
    env = app_env(DB_NAME, tmp, "WARNING")
    results = {}
    try:
        recreate_database(DB_NAME)
        manage(env, "migrate", "--noinput", "-v0")
        out = manage(env, "shell", "-c", SETUP)
        ids = json.loads(next(x for x in out.splitlines() if x.startswith("BENCH_SETUP ")).split(" ", 1)[1])
        for size in sizes:
            t0 = time.monotonic()
            fill(size, ids)
            log(f"{size:>9,} stored events generated and analysed in {time.monotonic() - t0:.1f} s")
            out = manage(dict(env, BENCH_PASSES=str(args.passes)), "shell", "-c", PASS_SCRIPT, timeout=1800)
            data = json.loads(next(x for x in out.splitlines() if x.startswith("BENCH_PASS ")).split(" ", 1)[1])
            timed = data["durations"][1:]
            results[size] = statistics.median(timed)
            log(
                f"{size:>9,} events: one pass {results[size] * 1000:.1f} ms (median of {len(timed)}; "
                f"first pass {data['durations'][0] * 1000:.1f} ms)"
            )
            log(f"           last pass per reconciler (ms): {data['parts']}")
            for line in data["lines"]:
                log(f"           {line}")
    finally:
        if not args.keep:
            drop_database(DB_NAME)
        remove_tmp(tmp, keep=args.keep)
    print()
    print("stored events   pass duration")
    for size, seconds in results.items():
        print(f"{size:>13,}   {seconds * 1000:9.1f} ms")
    if len(results) > 1:
        smallest, largest = min(results), max(results)
        ratio = results[largest] / results[smallest]
        print(f"growth {smallest:,} -> {largest:,}: {ratio:.2f}x (goal <= 1.5x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

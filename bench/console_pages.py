"""Console page loads with a full recovery queue: how long the operator's main pages take on PostgreSQL.

The scratch database gets `--items` (default 10,000) recovery items over three tenants (the operator sees two of
them) and six mailboxes, in every recovery state with reasons that fit it, varied senders and subjects, a
quarter assigned, a tenth overdue; each with its audit rows (received, then the move into the queue) and, for
destination outcomes, its failed or unknown intent. Beside them `--history` (default 20,000) completed events
with their intents and mappings, so that the tables have a realistic shape; then `VACUUM ANALYZE`. All rows are
bulk inserts through the ORM (`manage.py shell`), never one request per row.

gunicorn (1 sync worker, production-like settings: DEBUG off) serves the app; an operator of two tenants logs
in through the real login form (`requests`), and each page is fetched `--runs` times (after `--warmup`
untimed fetches), one request at a time: the time until the whole HTML has arrived. Printed per page: median
and p95 against the goal (median < 300 ms), PASS or FAIL.

    .venv/bin/python bench/console_pages.py                    # 10,000 items, 20 runs per page (~1 minute)
    .venv/bin/python bench/console_pages.py --items 2000 --runs 15 --keep

Needs PostgreSQL on 127.0.0.1:5432 (user postgres, trust; BENCH_PG_ADMIN_DSN overrides); creates and drops the
database `mailroom_bench_console`. The exit status is 1 when a page answers other than 200, or misses its goal.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time

import requests

from lib.db import app_env, clean_up, recreate_database
from lib.procstat import cpu_by_group, cpu_delta, wait_for_quiet
from lib.report import log, percentile
from lib.stack import Stack, free_port, install_signal_handlers, make_tmp, manage, start_gunicorn

DB_NAME = "mailroom_bench_console"
GOAL_MS = 300.0
QUEUE = "/admin/reconciliation/recoveryitem/"
PASSWORD = "bench console password 42"

SEED_SCRIPT = r"""
import hashlib, json, os, random
from datetime import timedelta
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from django.utils import timezone
from intake.keys import dedupe_key
from intake.models import AuditEvent, InboxEvent, Mailbox, Tenant
from reconciliation.services import ensure_role_groups
from ticketing.intents.creation import external_ref
from ticketing.models import Destination, Intent, TicketMapping

rng = random.Random(20261201)
items, history = int(os.environ["BENCH_ITEMS"]), int(os.environ["BENCH_HISTORY"])
password = os.environ["BENCH_PASSWORD"]
now = timezone.now()
ensure_role_groups()
User = get_user_model()
operator = User.objects.create_user("bench-oper", "oper@bench.test", password, is_staff=True)
operator.groups.add(Group.objects.get(name="operator"))
colleagues = [User.objects.create_user(f"agent{i}", f"agent{i}@bench.test", "x", is_staff=True) for i in range(4)]
layout = {"acme": ["support", "billing", "sales"], "globex": ["help", "it-desk"], "initech": ["initech-support"]}
mailboxes, destinations = [], {}
for slug, boxes in layout.items():
    tenant = Tenant.objects.create(slug=slug, name=slug.title())
    if slug != "initech":  # the operator's tenants; initech's rows are there to be filtered out
        tenant.members.add(operator, *colleagues)
    destinations[tenant.pk] = Destination.objects.create(tenant=tenant, slug="builtin", kind="builtin", is_default=True)
    for box in boxes:
        mailboxes.append(Mailbox.objects.create(tenant=tenant, slug=box, address=f"{box}@{slug}.test", provider="raw",
                                                webhook_secret_ref="env:BENCH_SECRET"))

FIRST = ["anna", "bernd", "chloe", "dmitri", "elif", "farid", "grace", "hiro", "ines", "jamal", "katja", "lucas",
         "maria", "nils", "olga", "pavel", "quinn", "rosa", "sven", "tariq", "ulla", "vera", "wen", "yusuf"]
LAST = ["schmidt", "okafor", "martin", "ivanova", "yilmaz", "haddad", "lee", "tanaka", "garcia", "brown", "novak"]
DOMAINS = ["gmail.com", "outlook.com", "customer-corp.example", "bigretail.example", "stadtwerke-nord.example",
           "university.example.edu", "logistics-partner.example", "web.de"]
TOPICS = ["Invoice {n} is wrong", "Cannot log in since the update", "Re: Order #{n} not delivered",
          "Password reset does not arrive", "Refund for order {n}", "AW: Vertrag {n} kündigen",
          "URGENT: production outage in region {n}", "Question about my subscription",
          "Fwd: Delivery note {n} - missing items", "Printer on floor {n} is on fire",
          "Please update my billing address", "Feature request: export to CSV",
          "Our whole accounting department cannot open the invoices you sent last week (batch {n})"]
REASONS = {  # state: (share, reasons, audit kind)
    "failed": (40, ["credentials", "invalid_fields", "retries_exhausted", "poison", "configuration"], "intent_failed"),
    "awaiting_review": (25, ["missing_sender", "encrypted", "low_confidence", "no_destination",
                             "recipient_not_allowed", "sender_rate_limited"], "awaiting_review"),
    "quarantined": (20, ["malware", "attachment_type", "too_large", "too_many_attachments"], "quarantined"),
    "unknown": (15, ["timeout", "connection_lost", "claim_expired", "server_error"], "intent_unknown"),
}
states = [s for s, (share, _, _) in REASONS.items() for _ in range(share)]
B = 2000

def key(*parts):
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()

for start in range(0, items, B):
    batch = []
    for i in range(start, min(items, start + B)):
        box = rng.choice(mailboxes)
        state = rng.choice(states)
        reason = rng.choice(REASONS[state][1])
        received = now - timedelta(minutes=rng.randint(5, 60 * 24 * 21))
        entered = received + timedelta(seconds=rng.randint(2, 600))
        escalate = entered + timedelta(hours=rng.choice([1, 4, 24, 24, 48]))
        if rng.random() < 0.1:
            escalate = now - timedelta(minutes=rng.randint(1, 600))
        sender = "" if reason == "missing_sender" else f"{rng.choice(FIRST)}.{rng.choice(LAST)}@{rng.choice(DOMAINS)}"
        pmid = f"<item-{i}.{rng.getrandbits(40):x}@{sender.split('@')[-1] or 'unknown.example'}>"
        batch.append(InboxEvent(
            tenant_id=box.tenant_id, mailbox=box, provider_message_id=pmid,
            dedupe_key=dedupe_key(box.tenant_id, box.pk, pmid), source=rng.choice(["raw", "imap", "graph"]),
            state=state, reason_code=reason, reason_detail=f"bench: {reason}", received_at=received,
            updated_at=entered, raw=None, size=rng.randint(2_000, 400_000), message_id_header=pmid.strip("<>"),
            sender=sender, subject=rng.choice(TOPICS).format(n=rng.randint(100, 99999)),
            thread_key=key("thread", i % 3000), escalate_at=escalate, dispatch_count=rng.randint(1, 3),
            owner=(operator if rng.random() < 0.1 else rng.choice(colleagues)) if rng.random() < 0.25 else None))
    events = InboxEvent.objects.bulk_create(batch)
    audits, intents = [], []
    for e in events:
        audits.append(AuditEvent(inbox_event=e, actor=f"provider:{e.source}", kind="received", detail={},
                                 at=e.received_at))
        audits.append(AuditEvent(inbox_event=e, actor="worker:bench", kind=REASONS[e.state][2],
                                 detail={"reason_code": e.reason_code}, at=e.updated_at))
        if e.owner_id:
            audits.append(AuditEvent(inbox_event=e, actor="user:agent0", kind="assigned", detail={}, at=e.updated_at))
        if e.state in ("failed", "unknown"):
            intents.append(Intent(idempotency_key=key("intent", e.pk), inbox_event=e, action="create_ticket",
                                  action_version=1, destination=destinations[e.tenant_id], state=e.state,
                                  attempts=rng.randint(1, 6), last_error_kind=e.reason_code,
                                  last_error=f"bench: {e.reason_code}", external_ref=external_ref(key("intent", e.pk)),
                                  created_at=e.received_at))
    AuditEvent.objects.bulk_create(audits)
    Intent.objects.bulk_create(intents)

then = now - timedelta(days=10)
for start in range(0, history, B):
    box_batch = [rng.choice(mailboxes) for _ in range(min(B, history - start))]
    events = InboxEvent.objects.bulk_create([
        InboxEvent(tenant_id=box.tenant_id, mailbox=box, provider_message_id=f"<done-{start + n}@bench>",
                   dedupe_key=dedupe_key(box.tenant_id, box.pk, f"<done-{start + n}@bench>"), source="raw",
                   state="completed", received_at=then + timedelta(seconds=n),
                   updated_at=then + timedelta(seconds=n + 2),
                   size=3000, sender="old@customer.example", subject="old request", dispatch_count=1)
        for n, box in enumerate(box_batch)])
    intents = Intent.objects.bulk_create([
        Intent(idempotency_key=key("done", e.pk), inbox_event=e, action="create_ticket", action_version=1,
               destination=destinations[e.tenant_id], state="succeeded", attempts=1, external_ref=f"mailroom-d{e.pk}",
               result_ref=str(e.pk), created_at=e.received_at, completed_at=e.updated_at) for e in events])
    TicketMapping.objects.bulk_create([
        TicketMapping(inbox_event=e, action="create_ticket", destination=destinations[e.tenant_id],
                      ticket_id=str(e.pk), ticket_url="", created_at=e.updated_at) for e in events])
    AuditEvent.objects.bulk_create(
        [AuditEvent(inbox_event=e, actor="provider:raw", kind="received", detail={}, at=e.received_at) for e in events]
        + [AuditEvent(inbox_event=e, actor="worker:bench", kind="ticket_created", detail={}, at=e.updated_at)
           for e in events])

with connection.cursor() as cursor:
    cursor.execute("VACUUM ANALYZE")
visible = InboxEvent.objects.filter(tenant__slug__in=["acme", "globex"], state__in=InboxEvent.RECOVERY_STATES)
sample = visible.filter(state="failed").order_by("received_at").values_list("pk", flat=True)[items // 20]
print("BENCH_SEED " + json.dumps({"items": InboxEvent.objects.filter(state__in=InboxEvent.RECOVERY_STATES).count(),
                                  "visible": visible.count(), "item": sample,
                                  "credentials": visible.filter(reason_code="credentials").count()}))
"""


def log_in(base: str) -> requests.Session:
    session = requests.Session()
    form = session.get(f"{base}/admin/login/?next={QUEUE}", timeout=30)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    answer = session.post(
        f"{base}/admin/login/?next={QUEUE}",
        timeout=30,
        allow_redirects=False,
        data={"username": "bench-oper", "password": PASSWORD, "csrfmiddlewaretoken": token, "next": QUEUE},
        headers={"Referer": f"{base}/admin/login/"},
    )
    if answer.status_code != 302:
        raise RuntimeError(f"login failed: HTTP {answer.status_code}")
    return session


def time_page(session: requests.Session, url: str, warmup: int, runs: int) -> tuple[list[float], int]:
    """Seconds per fetch (the whole body read), and the number of answers other than 200."""
    bad = 0
    for _ in range(warmup):
        bad += session.get(url, timeout=60).status_code != 200
    durations = []
    for _ in range(runs):
        t0 = time.perf_counter()
        answer = session.get(url, timeout=60)
        _ = answer.content
        durations.append(time.perf_counter() - t0)
        bad += answer.status_code != 200
    return sorted(durations), bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=10000, help="recovery items to seed (default 10,000)")
    parser.add_argument("--history", type=int, default=20000, help="completed events of history (default 20,000)")
    parser.add_argument("--runs", type=int, default=20, help="timed fetches per page (at least 15)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed fetches per page first")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=15,
        help="wait up to this long for other work on the machine to stop before timing",
    )
    parser.add_argument("--keep", action="store_true", help="keep the database and the logs")
    args = parser.parse_args()
    if args.runs < 15:
        parser.error("--runs must be at least 15")
    install_signal_handlers()
    tmp = make_tmp("mailroom-bench-console-")
    env = app_env(DB_NAME, tmp, "WARNING")
    stack = Stack(tmp)
    failed = False
    try:
        recreate_database(DB_NAME)
        t0 = time.monotonic()
        manage(env, "migrate", "--noinput", "-v0", timeout=600)
        out = manage(
            dict(env, BENCH_ITEMS=str(args.items), BENCH_HISTORY=str(args.history), BENCH_PASSWORD=PASSWORD),
            "shell",
            "-c",
            SEED_SCRIPT,
            timeout=1800,
        )
        seed = json.loads(next(x for x in out.splitlines() if x.startswith("BENCH_SEED ")).split(" ", 1)[1])
        log(
            f"seeded {seed['items']:,} recovery items ({seed['visible']:,} in the operator's two tenants) and "
            f"{args.history:,} completed events, ANALYZEd ({time.monotonic() - t0:.1f} s)"
        )
        port = free_port()
        start_gunicorn(stack, env, workers=1, port=port)
        base = f"http://127.0.0.1:{port}"
        session = log_in(base)
        pages = [  # (name, path, held to the goal); the search is shown for information
            ("queue, first page", QUEUE, True),
            ("queue, filtered by reason", f"{QUEUE}?reason=credentials", True),
            ("item page", f"{QUEUE}{seed['item']}/change/", True),
            ("dashboard", f"{QUEUE}dashboard/", True),
            ("queue, searched by sender", f"{QUEUE}?q=olga.novak", False),
        ]
        wait_for_quiet(args.quiet_wait)
        results = []
        groups = {"web": stack.pid("gunicorn")}
        for name, path, held in pages:
            before = cpu_by_group(groups, DB_NAME)
            durations, bad = time_page(session, base + path, args.warmup, args.runs)
            spent = cpu_delta(before, cpu_by_group(groups, DB_NAME))
            fetches = args.warmup + args.runs
            cpu = (spent["web"] / fetches, spent["postgres"] / fetches)  # the app, its database backend
            results.append((name, held, durations, bad, cpu))
            stack.check_alive()
    finally:
        clean_up(stack, DB_NAME, tmp, args.keep)
    print()
    print(f"{seed['items']:,} recovery items; {args.runs} timed fetches per page, one at a time, 1 gunicorn worker")
    print("CPU/load: CPU of the gunicorn worker and its PostgreSQL backend per fetch, what one load costs")
    print("whatever else the machine runs (an idle machine's wall time is about this plus the network).")
    print(f"{'page':<28} {'median':>9} {'p95':>9} {'CPU/load (app + db)':>24} {'goal':>9}  result")
    for name, held, durations, bad, cpu in results:
        median, p95 = statistics.median(durations) * 1000, percentile(durations, 95) * 1000
        ok = median < GOAL_MS and not bad
        failed |= bool(bad) or (held and not ok)
        verdict = ("PASS" if ok else "FAIL") if held else ("info" if not bad else "FAIL")
        extra = f" ({bad} answer(s) not 200)" if bad else ""
        goal = "< 300 ms" if held else "-"
        split = f"{sum(cpu) * 1000:6.1f} ms ({cpu[0] * 1000:.0f} + {cpu[1] * 1000:.0f})"
        print(f"{name:<28} {median:7.1f} ms {p95:7.1f} ms {split:>24} {goal:>9}  {verdict}{extra}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

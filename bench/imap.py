"""IMAP benchmark: the initial sync of a mailbox of 10,000 messages from a real Dovecot.

Starts a private Dovecot (tests/dovecot.py's recipe, on a free port under a temporary folder),
fills one user's INBOX with N unique ~3,000-byte messages (written as maildir files, then indexed
by an untimed SELECT and read once, so both sides find a warm server), and, in the same run:

* raw: `imapclient` logs in, EXAMINEs INBOX, `UID SEARCH ALL` and `UID FETCH <batch> BODY.PEEK[]`
  in batches of --batch-size: the floor a client of this server can reach;
* Mailroom: `intake.channels.polling.poll_mailbox` (what `manage.py poll_mailbox` and the scheduled polls
  run) on a new IMAP mailbox, again until the cursor is caught up (no `more` left).

Prints both rates and Mailroom's as a share of the raw fetch (goal >= 70 %), and checks N events
with distinct ids and distinct provider message ids, and the cursor at the server's last UID.

    .venv/bin/python bench/imap.py                # 10,000 messages
    .venv/bin/python bench/imap.py --messages 2000 --runs 3

Needs PostgreSQL on 127.0.0.1:5432, Dovecot (installed with apt-get if missing, as root);
creates and drops the database `mailroom_bench_imap`. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time

import psycopg

from lib.db import app_env, clean_up, db_url, prepare_database
from lib.messages import make_body
from lib.procstat import wait_for_quiet
from lib.report import log
from lib.stack import REPO, Stack, git_revision, install_signal_handlers, make_tmp, manage

sys.path.insert(0, str(REPO))
from tests.dovecot import start_dovecot  # noqa: E402  (the tests' recipe for a private Dovecot)

DB_NAME = "mailroom_bench_imap"
PASSWORD_VAR = "MAILROOM_T_BENCH_IMAP_PASSWORD"  # a tenant-scoped secret of the bench tenant

SYNC_SCRIPT = r"""
import json, os, time
from intake.channels import polling
from intake.models import Mailbox, Tenant
tenant = Tenant.objects.get(slug="bench")
mailbox = Mailbox.objects.create(
    tenant=tenant, slug=os.environ["BENCH_SLUG"], address=os.environ["BENCH_SLUG"] + "@bench.test", provider="imap",
    poll_enabled=False, credentials_ref="env:" + os.environ["BENCH_PASSWORD_VAR"],
    webhook_secret_ref="env:BENCH_SECRET",
    settings={"host": "127.0.0.1", "port": int(os.environ["BENCH_PORT"]), "ssl": False,
              "username": os.environ["BENCH_USER"], "folder": "INBOX"})
new = duplicates = batches = polls = 0
profiler = None
if os.environ.get("BENCH_PROFILE"):
    import cProfile
    profiler = cProfile.Profile()
    profiler.enable()
c0, t0 = time.process_time(), time.perf_counter()
while True:
    report = polling.poll_mailbox(mailbox.pk, trigger=polling.MANUAL)
    polls += 1
    if report.status != "ok":
        raise SystemExit(f"poll failed: {report.status} {report.detail}")
    new, duplicates, batches = new + report.new, duplicates + report.duplicates, batches + report.batches
    if not report.more:
        break
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
if profiler is not None:
    import pstats
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
print("BENCH_IMAP " + json.dumps({"mailbox": mailbox.pk, "wall": wall, "cpu": cpu, "new": new,
                                  "duplicates": duplicates, "batches": batches, "polls": polls,
                                  "cursor": report.cursor}))
"""


def fill_maildir(server, user: str, password: str, n: int, tag: str) -> int:
    """N unique messages as maildir files of `user`'s INBOX; returns the server's last UID."""
    with server.client(user, password) as client:  # the first login creates the Maildir
        client.select_folder("INBOX")
    maildir = server.directory / "mail" / user / "Maildir"
    for sub in ("new", "cur", "tmp"):
        (maildir / sub).mkdir(parents=True, exist_ok=True)
        shutil.chown(maildir / sub, "nobody", "nogroup")
    now = int(time.time())
    for i in range(n):
        path = maildir / "new" / f"{now}.M{i}P{os.getpid()}.bench"
        path.write_bytes(make_body(tag, i, 3000))
        shutil.chown(path, "nobody", "nogroup")
    with server.client(user, password) as client:  # SELECT (read-write): Dovecot indexes the new files
        info = client.select_folder("INBOX")
        if info[b"EXISTS"] != n:
            raise RuntimeError(f"Dovecot sees {info[b'EXISTS']} messages, expected {n}")
        return max(client.search("ALL"))


def raw_fetch(server, user: str, password: str, batch: int) -> dict:
    """What a bare imapclient does for the same initial sync: EXAMINE, UID SEARCH, UID FETCH in batches."""
    c0, t0 = time.process_time(), time.perf_counter()
    count = size = 0
    with server.client(user, password) as client:
        client.select_folder("INBOX", readonly=True)
        uids = client.search("ALL")
        for start in range(0, len(uids), batch):
            for data in client.fetch(uids[start : start + batch], ["BODY.PEEK[]"]).values():
                count += 1
                size += len(data[b"BODY[]"])
    wall = time.perf_counter() - t0
    return {"wall": wall, "cpu": time.process_time() - c0, "count": count, "bytes": size, "rate": count / wall}


def mailroom_sync(env: dict, server, user: str, password: str, run: int, profile: bool = False) -> dict:
    sync_env = dict(
        env,
        BENCH_SLUG=f"imap-{run}",
        BENCH_USER=user,
        BENCH_PORT=str(server.port),
        BENCH_PASSWORD_VAR=PASSWORD_VAR,
        **{PASSWORD_VAR: password},
    )
    if profile:
        sync_env["BENCH_PROFILE"] = "1"
    out = manage(sync_env, "shell", "-c", SYNC_SCRIPT, timeout=3600)
    if profile:
        print(out)
    result = json.loads(next(x for x in out.splitlines() if x.startswith("BENCH_IMAP ")).split(" ", 1)[1])
    result["rate"] = result["new"] / result["wall"]
    return result


def check(mailbox_id: int, n: int, last_uid: int, cursor: dict) -> dict:
    with psycopg.connect(db_url(DB_NAME), autocommit=True) as conn:
        events, ids, pmids = conn.execute(
            "SELECT count(*), count(DISTINCT id), count(DISTINCT provider_message_id) FROM intake_inboxevent "
            "WHERE mailbox_id = %s",
            (mailbox_id,),
        ).fetchone()
    ok = events == ids == pmids == n and cursor.get("last_uid") == last_uid
    return {
        "events": events,
        "distinct_ids": ids,
        "distinct_pmids": pmids,
        "last_uid": cursor.get("last_uid"),
        "ok": ok,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=10000, help="messages in the mailbox (default 10,000)")
    parser.add_argument("--runs", type=int, default=1, help="raw fetch and Mailroom sync alternate this many times")
    parser.add_argument("--batch-size", type=int, default=200, help="UIDs per raw FETCH (the IMAP adapter's default)")
    parser.add_argument("--preload", type=int, default=2000, help="completed events of history loaded first")
    parser.add_argument("--log-level", default="INFO", help="the app's LOG_LEVEL")
    parser.add_argument("--quiet-wait", type=float, default=15, help="wait this long at most for a quiet machine")
    parser.add_argument("--keep", action="store_true", help="keep the database and the logs")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the polling process and print where its CPU goes (slows it down)",
    )
    args = parser.parse_args()

    install_signal_handlers()
    tmp = make_tmp("mailroom-bench-imap-")
    env = app_env(DB_NAME, tmp, args.log_level)
    stack = Stack(tmp)
    server = None
    try:
        print(f"Mailroom IMAP benchmark — revision {git_revision()}, {os.cpu_count()} cores")
        prepare_database(DB_NAME, env, args.preload)
        server = start_dovecot()
        user, password = server.add_user()
        t0 = time.monotonic()
        last_uid = fill_maildir(server, user, password, args.messages, "i" + os.urandom(4).hex())
        warm = raw_fetch(server, user, password, args.batch_size)
        log(
            f"Dovecot on port {server.port}: {args.messages} messages ({warm['bytes']:,} bytes) in INBOX, "
            f"indexed and read once ({time.monotonic() - t0:.1f} s, not timed)"
        )
        raws, syncs, checks = [], [], []
        for run in range(args.runs):
            wait_for_quiet(args.quiet_wait)
            raws.append(raw_fetch(server, user, password, args.batch_size))
            log(f"raw fetch {run + 1}: {raws[-1]['count']} messages, {raws[-1]['rate']:,.0f}/s")
            wait_for_quiet(args.quiet_wait)
            syncs.append(mailroom_sync(env, server, user, password, run, args.profile))
            checks.append(check(syncs[-1]["mailbox"], args.messages, last_uid, syncs[-1]["cursor"]))
            log(
                f"Mailroom sync {run + 1}: {syncs[-1]['new']} new in {syncs[-1]['wall']:.1f} s, "
                f"{syncs[-1]['rate']:,.0f}/s"
            )

        print()
        print("=" * 78)
        print(f"IMAP INITIAL SYNC — {args.messages} messages of ~3,000 bytes from a local Dovecot (maildir)")
        for i, (raw, sync, ck) in enumerate(zip(raws, syncs, checks, strict=True)):
            print(
                f"  run {i + 1}: raw imapclient {raw['rate']:,.0f} messages/s ({raw['wall']:.2f} s, CPU "
                f"{raw['cpu'] / raw['count'] * 1000:.2f} ms/message); Mailroom {sync['rate']:,.0f} messages/s "
                f"({sync['wall']:.2f} s, {sync['polls']} poll(s), {sync['batches']} batches, CPU of the polling "
                f"process {sync['cpu'] / max(1, sync['new']) * 1000:.2f} ms/message)"
            )
            print(
                f"    CHECK: {ck['events']} events, {ck['distinct_ids']} distinct ids, {ck['distinct_pmids']} "
                f"distinct provider message ids, cursor last_uid {ck['last_uid']} (server's last UID {last_uid}) "
                f"-> {'OK' if ck['ok'] else 'FAILED'}"
            )
        raw_rate = statistics.median(r["rate"] for r in raws)
        rate = statistics.median(s["rate"] for s in syncs)
        print("-" * 78)
        met = "MET" if rate >= 0.7 * raw_rate else "MISSED"
        print(
            f"RESULT: Mailroom {rate:,.0f} messages/s, raw imapclient {raw_rate:,.0f} messages/s (medians of "
            f"{args.runs}): {rate / raw_rate * 100:.0f}% (goal >= 70%: {met})"
        )
        ok = all(ck["ok"] for ck in checks)
        print(f"CHECK: every run stored each message once, the cursor caught up: {'OK' if ok else 'FAILED'}")
        print("=" * 78)
        return 0 if ok else 1
    except KeyboardInterrupt:
        log("interrupted: stopping what this run started")
        return 130
    finally:
        if server is not None:
            server.cleanup()
        clean_up(stack, DB_NAME, tmp, args.keep)


if __name__ == "__main__":
    sys.exit(main())

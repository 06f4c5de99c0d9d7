"""Is the embedded broker sound? Several producer processes and several real Celery workers on it, counting
what was lost, delivered twice, or crashed a worker. Prints figures against goals; exits non-zero when one
of lost / duplicated / crashed is not 0.

    .venv/bin/python bench/broker_embedded.py                      # the embedded broker (config.broker), ~1 min
    .venv/bin/python bench/broker_embedded.py --transport sqla     # kombu's stock SQLAlchemy transport
    .venv/bin/python bench/broker_embedded.py --transport filesystem   # the file-system transport it replaced
    .venv/bin/python bench/broker_embedded.py --producers 6 --messages 3000 --workers 3 --concurrency 2

Each producer sends `--messages` tasks `bench.record(producer, seq)` as fast as it can (Celery's publish retry
on); each worker (`celery worker`, prefork, acks late, prefetch 1: the project's settings) appends one line per
task run to a file of its own. With `--corrupt N` (default 20), N messages that no consumer can decode are
written while the run is under way: for the SQLite transports, rows in the message table (not JSON, a bare
string, an envelope without properties, a base64 body that is not JSON); for the file-system transport, empty
message files, what its reader finds when it takes a file before the writer has filled it (celery/kombu#1551).
They must be dropped with a WARNING, and no worker may stop. The broker lives in a temporary folder; nothing
of the project's database is used.

Lost = published (send_task returned) - delivered at least once - still queued at the end;
duplicated = deliveries beyond the first of a message; crashed = workers that exited before we stopped them
or whose consumer stopped on an unrecoverable error.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from celery import Celery

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = os.environ.get("BROKER_BENCH_OUT", "")
TASK = "bench.record"


def broker_config(transport: str, folder: Path, polling: float) -> dict:
    """Celery settings for one of the transports, as the project's settings would set them."""
    if transport == "embedded":
        return {
            "broker_url": f"sqlite:///{folder / 'broker.sqlite3'}",
            "broker_transport": "config.broker:Transport",
            "broker_transport_options": {"polling_interval": polling, "accept_content": ["json"]},
        }
    if transport == "sqla":  # stock: its transport options go to create_engine, so no polling_interval (1 s)
        return {"broker_url": f"sqla+sqlite:///{folder / 'broker.sqlite3'}", "broker_transport_options": {}}
    if transport == "filesystem":  # what settings.py set before
        queue = str(folder / "queue")
        return {
            "broker_url": "filesystem://",
            "broker_transport_options": {
                "data_folder_in": queue,
                "data_folder_out": queue,
                "processed_folder": str(folder / "processed"),
                "control_folder": str(folder / "control"),
                "store_processed": False,
                "polling_interval": polling,
            },
        }
    raise SystemExit(f"unknown transport {transport!r}")


def make_app() -> Celery:
    """The Celery app of the workers and producers: the project's delivery settings, a bench task."""
    # Celery would prefer these to the configured broker, and with DJANGO_SETTINGS_MODULE it would set Django up
    # (whose settings may set them again): this app is not Django's.
    for name in ("CELERY_BROKER_URL", "CELERY_BROKER_READ_URL", "CELERY_BROKER_WRITE_URL", "DJANGO_SETTINGS_MODULE"):
        os.environ.pop(name, None)
    app = Celery("broker_bench", set_as_current=True)
    app.conf.update(
        **broker_config(
            os.environ.get("BROKER_BENCH_TRANSPORT", "embedded"),
            Path(os.environ.get("BROKER_BENCH_DIR", ".")),
            float(os.environ.get("BROKER_BENCH_POLLING", "0.1")),
        ),
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=True,
        worker_redirect_stdouts=True,
    )
    return app


app = make_app()


@app.task(name=TASK)
def record(producer: int, seq: int) -> None:
    with open(os.path.join(OUT, f"run-{os.getpid()}.txt"), "a") as handle:
        handle.write(f"{producer} {seq}\n")


def produce(producer: int, count: int, result_path: str) -> None:
    """One producer process: `count` tasks; the seqs whose publish returned go to `result_path`."""
    sent, failed = [], 0
    started = time.monotonic()
    for seq in range(count):
        try:
            app.send_task(TASK, args=[producer, seq])
            sent.append(seq)
        except Exception:  # noqa: BLE001 - a publish that failed after Celery's retries: counted, not sent
            failed += 1
    Path(result_path).write_text(json.dumps({"sent": sent, "failed": failed, "seconds": time.monotonic() - started}))


CORRUPT_PAYLOADS = [
    "{",  # a half-written row: the shape of celery/kombu#1551
    '"just a string"',
    '{"body": "e30=", "headers": {}}',  # no properties
    '{"body": "bm90IGpzb24=", "content-type": "application/json", "content-encoding": "utf-8", "headers": {}, '
    '"properties": {"delivery_tag": "x", "delivery_info": {}, "body_encoding": "base64"}}',  # base64 of "not json"
]


def inject_corrupt(transport: str, folder: Path, count: int) -> int:
    """Messages no consumer can decode: rows in the SQLite broker's message table, or, for the file-system
    transport, empty message files (what a reader sees when it takes a file its writer has not filled yet)."""
    if transport == "filesystem":
        for _ in range(count):
            (folder / "queue" / f"{int(time.monotonic() * 1000)}_{uuid.uuid4()}.celery.msg").write_bytes(b"")
        return count
    conn = sqlite3.connect(folder / "broker.sqlite3", timeout=30)
    try:
        queue_id = conn.execute("SELECT id FROM kombu_queue WHERE name = 'celery'").fetchone()[0]
        for n in range(count):
            conn.execute(
                "INSERT INTO kombu_message (visible, timestamp, payload, version, queue_id) "
                "VALUES (1, datetime('now'), ?, 1, ?)",
                (CORRUPT_PAYLOADS[n % len(CORRUPT_PAYLOADS)], queue_id),
            )
            conn.commit()
    finally:
        conn.close()
    return count


def queued(transport: str, folder: Path) -> int:
    if transport in ("embedded", "sqla"):
        conn = sqlite3.connect(folder / "broker.sqlite3", timeout=30)
        try:
            return conn.execute("SELECT COUNT(*) FROM kombu_message WHERE visible = 1").fetchone()[0]
        finally:
            conn.close()
    return len(list((folder / "queue").glob("*.msg")))


def deliveries(out: Path) -> Counter:
    seen: Counter = Counter()
    for path in out.glob("run-*.txt"):
        for line in path.read_text().splitlines():
            if line.strip():
                producer, seq = line.split()
                seen[(int(producer), int(seq))] += 1
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transport", choices=["embedded", "sqla", "filesystem"], default="embedded")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=2500, help="tasks per producer")
    parser.add_argument("--workers", type=int, default=3, help="celery worker processes")
    parser.add_argument("--concurrency", type=int, default=2, help="prefork children per worker")
    parser.add_argument("--corrupt", type=int, default=20, help="undecodable messages injected during the run")
    parser.add_argument(
        "--polling",
        type=float,
        default=0.1,
        help="the transport's polling interval (settings: MAILROOM_BROKER_POLLING_SECONDS, 0.1)",
    )
    parser.add_argument("--settle", type=float, default=20, help="seconds without progress before giving up")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder and print where")
    args = parser.parse_args()

    sys.path.insert(0, str(HERE))
    from lib.report import log
    from lib.stack import BIN, Stack

    tmp = Path(tempfile.mkdtemp(prefix="mailroom-broker-bench-"))
    out = tmp / "out"
    out.mkdir()
    bench_env = {
        "BROKER_BENCH_TRANSPORT": args.transport,
        "BROKER_BENCH_DIR": str(tmp),
        "BROKER_BENCH_OUT": str(out),
        "BROKER_BENCH_POLLING": str(args.polling),
    }
    os.environ.update(bench_env)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]), "PYTHONUNBUFFERED": "1"}
    global app, OUT
    app, OUT = make_app(), str(out)
    if args.transport == "filesystem":
        for name in ("queue", "processed", "control"):
            (tmp / name).mkdir()
    with app.connection_for_write() as conn:  # creates the tables / declares the queue before anyone races
        conn.default_channel.queue_declare("celery")
    stack = Stack(tmp)
    total = args.producers * args.messages
    log(
        f"{args.transport} broker in {tmp}: {args.producers} producers x {args.messages} tasks, "
        f"{args.workers} workers x {args.concurrency} children"
    )
    try:
        for n in range(args.workers):
            stack.start(
                f"worker-{n}",
                [
                    str(BIN / "python"),
                    "-m",
                    "celery",
                    "-A",
                    "broker_embedded",
                    "worker",
                    "--loglevel",
                    "INFO",
                    "--concurrency",
                    str(args.concurrency),
                    "-n",
                    f"bench{n}@%h",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ],
                env,
            )
        deadline = time.monotonic() + 60
        while not all(" ready." in stack.tail(f"worker-{n}", 200) for n in range(args.workers)):
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not start:\n" + stack.tail("worker-0"))
            stack.check_alive()
            time.sleep(0.2)

        context = multiprocessing.get_context("fork")
        started = time.monotonic()
        producers = [
            context.Process(target=produce, args=(p, args.messages, str(tmp / f"sent-{p}.json")))
            for p in range(args.producers)
        ]
        for proc in producers:
            proc.start()
        corrupt = 0
        if args.corrupt:
            time.sleep(0.5)  # under way
            corrupt = inject_corrupt(args.transport, tmp, args.corrupt)
        for proc in producers:
            proc.join()
        produced_at = time.monotonic()
        results = [json.loads((tmp / f"sent-{p}.json").read_text()) for p in range(args.producers)]
        sent = {(p, seq) for p, r in enumerate(results) for seq in r["sent"]}
        failed = sum(r["failed"] for r in results)

        # Wait for the workers to finish: until every sent message was delivered, or nothing moved for --settle s.
        last_count, last_change = -1, time.monotonic()
        while True:
            count = sum(deliveries(out).values())
            if count != last_count:
                last_count, last_change = count, time.monotonic()
            if len(set(deliveries(out)) & sent) >= len(sent) or time.monotonic() - last_change > args.settle:
                break
            if all(proc.poll() is not None for _, proc in stack.procs):
                break
            time.sleep(0.5)
        finished = time.monotonic()
        # The logs as they were before we stop anything (a stop makes lines of its own). A worker whose consumer
        # died ("Unrecoverable error") counts as crashed even while its process lingers.
        worker_logs = {name: (tmp / f"{name}.log").read_text(errors="replace") for name, _ in stack.procs}
        logs = "\n".join(worker_logs.values())
        crashed = [
            name for name, proc in stack.procs if proc.poll() is not None or "Unrecoverable error" in worker_logs[name]
        ]
        for _, proc in stack.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # the worker itself: a warm shutdown, as run_stack stops it
        for _, proc in stack.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        seen = deliveries(out)
        left = queued(args.transport, tmp)
    finally:
        stack.stop(timeout=20)

    delivered = set(seen) & sent
    lost = len(sent - delivered) - min(left, len(sent - delivered))
    duplicated = sum(n - 1 for key, n in seen.items() if n > 1)
    errors = [
        line for line in logs.splitlines() if " ERROR" in line or " CRITICAL" in line or "Unrecoverable error" in line
    ]
    dropped = logs.count("embedded broker: dropped message")
    publish_seconds = produced_at - started
    print(f"\n{args.transport} broker, {args.producers} producers, {args.workers} workers x {args.concurrency}:")
    print(
        f"  published            {len(sent):>8,d} of {total:,d} ({failed} publishes failed after retries), "
        f"{len(sent) / publish_seconds:,.0f}/s while producing"
    )
    print(
        f"  delivered            {len(delivered):>8,d} distinct, {sum(seen.values()):,d} runs, "
        f"{len(delivered) / max(0.001, finished - started):,.0f}/s first publish to last delivery"
    )
    print(f"  still queued         {left:>8,d}")
    print(f"  lost                 {lost:>8,d}   goal 0   {'MET' if lost == 0 else 'MISSED'}")
    print(f"  duplicated           {duplicated:>8,d}   goal 0   {'MET' if duplicated == 0 else 'MISSED'}")
    print(
        f"  workers crashed      {len(crashed):>8,d}   goal 0   {'MET' if not crashed else 'MISSED'}"
        f"{'  (' + ', '.join(crashed) + ')' if crashed else ''}"
    )
    print(f"  ERROR/CRITICAL lines {len(errors):>8,d}   goal 0   {'MET' if not errors else 'MISSED'}")
    if args.corrupt:
        print(
            f"  corrupt messages     {corrupt:>8,d} injected, {dropped:,d} dropped with a WARNING "
            f"{'MET' if dropped == corrupt else 'MISSED'}"
        )
    for line in errors[:5]:
        print(f"    {line[:200]}")
    print(
        json.dumps(
            {
                "transport": args.transport,
                "published": len(sent),
                "publish_failed": failed,
                "delivered": len(delivered),
                "queued": left,
                "lost": lost,
                "duplicated": duplicated,
                "crashed": len(crashed),
                "errors": len(errors),
                "corrupt": corrupt,
                "dropped": dropped,
            }
        )
    )
    if args.keep:
        print(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if lost or duplicated or crashed else 0


if __name__ == "__main__":
    sys.exit(main())

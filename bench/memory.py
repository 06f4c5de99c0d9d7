"""Memory benchmark: one large message (default 25,000,000 bytes raw: a short text body and two
attachments in base64, a PDF-like scan and a JPEG-like photo) posted to the webhook and processed
by a real Celery worker (prefork, concurrency 1) against the built-in destination, with attachment scanning on as in
production: a private clamd (tests/clamd.py's recipe, StreamMaxLength 30 MiB) unless `--clamd off`.

Prints the worker child's RSS before, its peak while it processes the message (VmRSS sampled
every 10 ms, and VmHWM after resetting it just before the post), its growth, and the growth
divided by the message's raw size (goal < 3x); the same for the gunicorn worker that answers the
POST. Checks the guarantee: one event, `completed`, one ticket, one mapping, one succeeded
create_ticket intent. Exits non-zero only when that check fails.

    .venv/bin/python bench/memory.py
    .venv/bin/python bench/memory.py --size 10000000

Needs PostgreSQL on 127.0.0.1:5432 and Redis on 6379 (db 14, flushed); creates and drops the
database `mailroom_bench_memory`. See bench/README.md.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import random
import sys
import threading
import time

import psycopg

from lib.db import app_env, clean_up, db_url, prepare_database
from lib.messages import WEBHOOK_PATH, make_messages, sign
from lib.procstat import children, memory_kib, reset_peak_rss, wait_for_quiet
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
    start_gunicorn,
)

sys.path.insert(0, str(REPO))
from tests.clamd import start_clamd  # noqa: E402  (the tests' recipe for a private clamd)

DB_NAME = "mailroom_bench_memory"
MiB = 1024 * 1024


def _base64_lines(blob: bytes) -> bytes:
    """base64 in 76-character lines with CRLF, as mail clients write it: 78 bytes for every 57 of the blob."""
    return base64.encodebytes(blob).replace(b"\n", b"\r\n")


def _encoded_len(blob_len: int) -> int:
    chars = -(-blob_len // 3) * 4
    return chars + 2 * -(-chars // 76)


def big_message(tag: str, size: int) -> bytes:
    """A realistic large message of exactly `size` bytes (or a few bytes less): a text body and two
    attachments in base64, a PDF-like scan (60 % of the bytes) and a JPEG-like photo (the rest)."""
    head = (
        f"From: Big Sender <big.sender@example.com>\r\nTo: support@bench.test\r\n"
        f"Subject: [{tag}] scanned contract attached\r\nDate: Mon, 06 Jan 2025 10:00:00 +0000\r\n"
        f"Message-ID: <{tag}.big@bench.mailroom>\r\nMIME-Version: 1.0\r\n"
        f'Content-Type: multipart/mixed; boundary="b-{tag}"\r\n\r\n'
        f"--b-{tag}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 7bit\r\n\r\n"
        + "Hello, please find the signed contract and a photo of the site attached. Large, sorry.\r\n"
        * 20
        + f'\r\n--b-{tag}\r\nContent-Type: application/pdf; name="contract.pdf"\r\n'
        f'Content-Disposition: attachment; filename="contract.pdf"\r\nContent-Transfer-Encoding: base64\r\n\r\n'
    ).encode()
    middle = (
        f'\r\n--b-{tag}\r\nContent-Type: image/jpeg; name="site-photo.jpg"\r\n'
        f'Content-Disposition: attachment; filename="site-photo.jpg"\r\n'
        f"Content-Transfer-Encoding: base64\r\n\r\n"
    ).encode()
    tail = f"\r\n--b-{tag}--\r\n".encode()
    blobs_len = (size - len(head) - len(middle) - len(tail)) * 57 // 78
    pdf_len = blobs_len * 6 // 10 // 57 * 57  # whole base64 lines: no padding before the second part
    rng = random.Random(16)
    pdf = b"%PDF-1.7\n" + rng.randbytes(pdf_len - 16) + b"\n%%EOF\n"
    jpeg_len = blobs_len - pdf_len
    while len(head) + _encoded_len(pdf_len) + len(middle) + _encoded_len(jpeg_len) + len(tail) > size:
        jpeg_len -= 1  # the last, short base64 line and its padding
    jpeg = (
        b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
        + rng.randbytes(jpeg_len - 22)
        + b"\xff\xd9"
    )
    message = head + _base64_lines(pdf) + middle + _base64_lines(jpeg) + tail
    assert len(message) <= size
    return message


class Sampler(threading.Thread):
    """Polls VmRSS of a process every `interval` seconds and keeps the largest value seen."""

    def __init__(self, pid: int, interval: float = 0.01):
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak, self.samples = pid, interval, 0, 0
        self.running = True

    def run(self) -> None:
        while self.running:
            rss = memory_kib(self.pid).get("VmRSS", 0)
            self.peak = max(self.peak, rss)
            self.samples += 1
            time.sleep(self.interval)


def post(port: int, body: bytes) -> tuple[int, dict]:
    ts = int(time.time())
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request(
        "POST",
        WEBHOOK_PATH,
        body=body,
        headers={
            "X-Mailroom-Timestamp": str(ts),
            "X-Mailroom-Signature": sign(body, ts),
            "Content-Type": "message/rfc822",
        },
    )
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    try:
        return resp.status, json.loads(data)
    except ValueError:
        return resp.status, {"body": data[:200].decode(errors="replace")}


def check(event_id: int) -> dict:
    with psycopg.connect(db_url(DB_NAME), autocommit=True) as conn:
        return dict(
            zip(
                ("state", "mappings", "intents", "succeeded", "tickets"),
                conn.execute(
                    """SELECT e.state,
                 (SELECT count(*) FROM ticketing_ticketmapping m WHERE m.inbox_event_id = e.id),
                 (SELECT count(*) FROM ticketing_intent i WHERE i.inbox_event_id = e.id AND i.action = 'create_ticket'),
                 (SELECT count(*) FROM ticketing_intent i WHERE i.inbox_event_id = e.id AND i.action = 'create_ticket'
                    AND i.state = 'succeeded'),
                 (SELECT count(*) FROM ticketing_intent i
                   JOIN ticketing_ticket t ON t.idempotency_key = i.idempotency_key
                   WHERE i.inbox_event_id = e.id AND i.action = 'create_ticket')
               FROM intake_inboxevent e WHERE e.id = %s""",
                    (event_id,),
                ).fetchone(),
                strict=True,
            )
        )


def wait_mapped(event_id: int, timeout: float, stack: Stack) -> float | None:
    deadline = time.time() + timeout
    with psycopg.connect(db_url(DB_NAME), autocommit=True) as conn:
        while time.time() < deadline:
            if conn.execute("SELECT 1 FROM ticketing_ticketmapping WHERE inbox_event_id = %s", (event_id,)).fetchone():
                return time.time()
            stack.check_alive()
            time.sleep(0.05)
    return None


def mib(kib: int) -> str:
    return f"{kib / 1024:,.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size",
        type=int,
        default=25_000_000,
        help="raw message size in bytes (default 25,000,000; at most the app's 25 MiB limit)",
    )
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for the mapping")
    parser.add_argument("--preload", type=int, default=2000, help="completed events of history loaded first")
    parser.add_argument("--log-level", default="INFO", help="the app's LOG_LEVEL")
    parser.add_argument("--quiet-wait", type=float, default=15, help="wait this long at most for a quiet machine")
    parser.add_argument("--keep", action="store_true", help="keep the database and the logs")
    parser.add_argument(
        "--clamd",
        choices=("start", "off"),
        default="start",
        help="start: a private clamd scans the attachments (default); off: MAILROOM_CLAMD=off",
    )
    args = parser.parse_args()

    install_signal_handlers()
    tmp = make_tmp("mailroom-bench-memory-")
    env = app_env(DB_NAME, tmp, args.log_level)
    stack = Stack(tmp)
    clamd = None
    try:
        if args.clamd == "start":
            clamd = start_clamd(stream_max_length=30 * MiB)
            env["MAILROOM_CLAMD"] = clamd.tcp_address
        else:
            env["MAILROOM_CLAMD"] = "off"
        print(f"Mailroom memory benchmark — revision {git_revision()}, {os.cpu_count()} cores")
        prepare_database(DB_NAME, env, args.preload)
        flush_broker()
        port = free_port()
        start_gunicorn(stack, env, 1, port)
        stack.start("relay", [str(PYTHON), "manage.py", "run_relay"], env)
        stack.start(
            "celery",
            [str(BIN / "celery"), "-A", "config", "worker", "--concurrency", "1", "--loglevel", "WARNING"],
            env,
        )
        # Warm-up: every process has imported what it needs and holds its connections before we measure.
        for i, (body, _headers) in enumerate(make_messages("w" + os.urandom(4).hex(), 20, 3000)):
            status, answer = post(port, body)
            if status != 202 or wait_mapped(answer["inbox_event_id"], 60, stack) is None:
                raise RuntimeError(f"warm-up message {i}: {status} {answer}\n" + stack.tail("celery"))
        tag = "big" + os.urandom(4).hex()
        raw = big_message(tag, args.size)
        log(f"warm-up done; message built: {len(raw):,} bytes raw ({len(raw) / MiB:.2f} MiB)")
        web = children(stack.pid("gunicorn"))
        workers = children(stack.pid("celery"))
        if len(web) != 1 or len(workers) != 1:
            raise RuntimeError(f"expected one gunicorn worker and one Celery child, found {web} and {workers}")
        web_pid, child = web[0], workers[0]
        wait_for_quiet(args.quiet_wait)
        web_before, child_before = memory_kib(web_pid), memory_kib(child)
        hwm_reset = reset_peak_rss(web_pid) and reset_peak_rss(child)
        sampler = Sampler(child)
        sampler.start()
        t0 = time.time()
        status, answer = post(port, raw)
        posted = time.time()
        web_after = memory_kib(web_pid)
        if status != 202:
            raise RuntimeError(f"the large message was answered {status}: {answer}\n" + stack.tail("gunicorn"))
        done = wait_mapped(answer["inbox_event_id"], args.timeout, stack)
        time.sleep(0.5)  # the acknowledgment's work, if any, follows the mapping
        sampler.running = False
        sampler.join()
        child_after = memory_kib(child)
        still = children(stack.pid("celery"))
        result = check(answer["inbox_event_id"])
        ok = done is not None and result == {
            "state": "completed",
            "mappings": 1,
            "intents": 1,
            "succeeded": 1,
            "tickets": 1,
        }
        peak = max(sampler.peak, child_after.get("VmHWM", 0) if hwm_reset else 0)
        growth = peak - child_before["VmRSS"]
        web_peak = web_after.get("VmHWM", 0) if hwm_reset else web_after.get("VmRSS", 0)
        web_growth = web_peak - web_before["VmRSS"]

        print()
        print("=" * 78)
        print(
            f"MEMORY — one {len(raw):,}-byte message ({len(raw) / MiB:.2f} MiB raw: text body + two base64 "
            f"attachments, PDF-like and JPEG-like), Celery prefork concurrency 1, built-in destination, "
            f"clamd {args.clamd}"
        )
        print(
            f"  POST answered {status} in {posted - t0:.2f} s; mapped "
            + (f"{done - t0:.2f} s after the post" if done else f"NOT within {args.timeout:g} s")
        )
        print(
            f"  worker child (pid {child}): RSS before {mib(child_before['VmRSS'])}, peak {mib(peak)} "
            f"({sampler.samples} samples every 10 ms"
            + (", and VmHWM reset before the post)" if hwm_reset else ")")
            + f", after {mib(child_after.get('VmRSS', 0))}"
        )
        print(
            f"  worker growth         : {mib(growth)} = {growth * 1024 / len(raw):.2f}x the message size "
            f"(goal < 3x: {'MET' if growth * 1024 < 3 * len(raw) else 'MISSED'})"
        )
        if still != [child]:
            print(f"  NOTE: the worker's children changed during the run ({workers} -> {still}): peak may be low")
        print(
            f"  web worker (pid {web_pid}): RSS before {mib(web_before['VmRSS'])}, peak {mib(web_peak)}, after "
            f"{mib(web_after.get('VmRSS', 0))}"
        )
        print(
            f"  web growth            : {mib(web_growth)} = {web_growth * 1024 / len(raw):.2f}x the message size "
            f"(goal < 2x: {'MET' if web_growth * 1024 < 2 * len(raw) else 'MISSED'})"
        )
        print(
            f"CHECK: event {result['state']}, {result['mappings']} mapping, {result['tickets']} ticket, "
            f"{result['succeeded']} of {result['intents']} create_ticket intent succeeded -> "
            f"{'OK' if ok else 'FAILED'}"
        )
        print("=" * 78)
        return 0 if ok else 1
    except KeyboardInterrupt:
        log("interrupted: stopping what this run started")
        return 130
    finally:
        clean_up(stack, DB_NAME, tmp, args.keep)
        if clamd is not None:
            clamd.stop()


if __name__ == "__main__":
    sys.exit(main())

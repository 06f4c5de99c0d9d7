"""HTTP load on the webhook: forked Python client processes (`post_with_python_clients`), or wrk
(`post_with_wrk`, its script `wrk_post.lua`) when it is installed."""

from __future__ import annotations

import http.client
import json
import multiprocessing
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .messages import WEBHOOK_PATH
from .report import percentile

# The Lua script post_with_wrk gives wrk (read when it runs, copied into the work folder).
WRK_SCRIPT = Path(__file__).resolve().with_name("wrk_post.lua")


def raw_http_request(port: int, path: str, body: bytes, headers: dict) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


# --------------------------------------------------------------------------- python HTTP client
def _client_proc(port, messages, deadline_at, start_evt, out_q, pace=None):
    """One client: posts its messages one after the other on a keep-alive-capable connection.

    Records (t_send, t_answer, status, inbox_event_id) per post. gunicorn's sync workers close
    the connection after each answer; http.client then reconnects by itself.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler: terminate() just ends us
    results = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    start_evt.wait()
    started = time.time()
    for k, (body, headers) in enumerate(messages):
        if pace:  # (offset, interval): an open-loop schedule, whatever the answers' latency
            delay = started + pace[0] + k * pace[1] - time.time()
            if delay > 0:
                time.sleep(delay)
        t0 = time.time()
        if deadline_at and t0 >= deadline_at:
            break
        try:
            conn.request("POST", WEBHOOK_PATH, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            status = resp.status
            if resp.will_close:
                conn.close()
        except (OSError, http.client.HTTPException):
            conn.close()
            results.append((t0, time.time(), -1, None))
            continue
        event_id = None
        if status in (200, 202):
            try:
                event_id = json.loads(data)["inbox_event_id"]
            except (ValueError, KeyError):
                pass
        results.append((t0, time.time(), status, event_id))
    conn.close()
    out_q.put(results)


def post_with_python_clients(
    port: int, messages: list, clients: int, duration: float | None = None, rate: float | None = None
) -> dict:
    """Post `messages` from `clients` processes (forked, so the client's CPU is not our GIL).

    With `rate` (posts/s in all), the posts are paced: client i sends its k-th post at
    (i + k * clients) / rate seconds after the start, so together they post evenly at `rate`."""
    ctx = multiprocessing.get_context("fork")
    start_evt = ctx.Event()
    out_q = ctx.Queue()
    shares = [messages[i::clients] for i in range(clients)]
    # The processes are forked before the start signal; a duration becomes an absolute deadline.
    deadline_at = time.time() + 0.3 + duration if duration else 0
    paces = [(i / rate, clients / rate) if rate else None for i in range(clients)]
    procs = [
        ctx.Process(target=_client_proc, args=(port, share, deadline_at, start_evt, out_q, pace), daemon=True)
        for share, pace in zip(shares, paces, strict=True)
    ]
    results = []
    wall0 = wall1 = time.time()
    try:
        for p in procs:
            p.start()
        time.sleep(0.2)  # let every process reach the start line
        start_evt.set()
        for _ in procs:
            results.extend(out_q.get(timeout=600))
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(5)
    if results:
        wall0 = min(r[0] for r in results)
        wall1 = max(r[1] for r in results)
    latencies = sorted(r[1] - r[0] for r in results)
    statuses: dict = {}
    for r in results:
        statuses[r[2]] = statuses.get(r[2], 0) + 1
    return {
        "results": results,
        "wall": max(1e-9, wall1 - wall0),
        "requests": len(results),
        "statuses": statuses,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "max": latencies[-1] if latencies else float("nan"),
    }


# --------------------------------------------------------------------------- wrk client
def find_wrk() -> str | None:
    """The path of wrk, or None when it is not on PATH: nothing is installed here (install wrk
    yourself, e.g. your distribution's `wrk` package); the caller falls back to Python clients."""
    return shutil.which("wrk")


def post_with_wrk(
    wrk: str, port: int, messages: list, clients: int, duration: float | None, workdir: Path, on_start=None, on_end=None
) -> dict:
    """Run wrk with one thread per connection; each sends its share of `messages` once.

    Every thread stops after a whole answer, never with a request in flight: when it has sent its
    share, or, with `duration`, once that time is up (a thread that runs out of messages first
    stops early and says so). Then we stop wrk with SIGINT and read its summary.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    for i in range(clients):
        with open(workdir / f"req-{i}.bin", "wb") as f:
            share = messages[i::clients]
            if i == 0 and share:
                # wrk calls request() once on thread 0 to check the script before it starts:
                # that call takes this sacrificial copy, never sent.
                share = [share[0]] + share
            for body, headers in share:
                req = raw_http_request(port, WEBHOOK_PATH, body, headers)
                f.write(f"{len(req)}\n".encode())
                f.write(req)
    script = workdir / "post.lua"
    script.write_text(WRK_SCRIPT.read_text())
    argv = [
        wrk,
        "-t",
        str(clients),
        "-c",
        str(clients),
        "-d",
        "600s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        f"http://127.0.0.1:{port}{WEBHOOK_PATH}",
        "--",
        str(workdir),
    ]
    out_path = workdir / "wrk.out"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    try:
        t_start = time.monotonic()
        if on_start:
            on_start(proc)
        stop_file = workdir / "stop"
        while True:
            if proc.poll() is not None:
                raise RuntimeError("wrk exited early:\n" + out_path.read_text(errors="replace")[-2000:])
            now = time.monotonic()
            if duration and now - t_start >= duration and not stop_file.exists():
                stop_file.write_text("stop")
            if all((workdir / f"done-{i}").exists() for i in range(clients)):
                break
            if now - t_start > (duration or 0) + 300:
                raise RuntimeError("wrk did not finish")
            time.sleep(0.005)
        if on_end:
            on_end(proc)
        proc.send_signal(signal.SIGINT)  # wrk then prints its summary as usual
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out_path.read_text(errors="replace")
    line = next((row for row in text.splitlines() if row.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError("wrk printed no summary:\n" + text[-2000:])
    r = json.loads(line.split(" ", 1)[1])
    wall = r["duration_us"] / 1e6
    errors = r["connect"] + r["read"] + r["write"] + r["timeout"] + r["sother"]
    return {
        "wall": wall,
        "requests": r["s202"] + r["s200"] + r["sother"],
        "statuses": {202: r["s202"], 200: r["s200"], "other": r["sother"]},
        "socket_errors": {k: r[k] for k in ("connect", "read", "write", "timeout")},
        "errors": errors,
        "p50": r["p50_us"] / 1e6,
        "p90": r["p90_us"] / 1e6,
        "p99": r["p99_us"] / 1e6,
        "max": r["max_us"] / 1e6,
        "exhausted_threads": r["exhausted"],
        "raw": r,
    }

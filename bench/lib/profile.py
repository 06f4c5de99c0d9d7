"""Optional profiling of chosen processes with py-spy (`--profile`), summarised after the run."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

from .report import log
from .stack import BIN


# --------------------------------------------------------------------------- optional profiling (py-spy)
class Profiler:
    """py-spy on chosen processes during the timed phase (`--profile`); summarised afterwards.

    Sampling costs some CPU of its own: figures of a profiled run are a little lower.
    """

    def __init__(self, outdir: Path, rate: int = 250):
        self.outdir = outdir
        self.rate = rate
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []
        self.exe = shutil.which("py-spy", path=str(BIN)) or shutil.which("py-spy")

    def start(self, name: str, pid: int, subprocesses: bool = False) -> None:
        if not self.exe:
            log("py-spy not installed (.venv/bin/pip install py-spy): no profile")
            return
        out = self.outdir / f"profile-{name}.txt"
        # --gil: only samples that hold the GIL, i.e. Python code running on a CPU. Without it,
        # py-spy here also counts threads blocked in socket waits (psycopg's wait, gunicorn's
        # graceful close) as active, which reads as CPU time that is not.
        argv = [
            self.exe,
            "record",
            "-p",
            str(pid),
            "-f",
            "raw",
            "-o",
            str(out),
            "-r",
            str(self.rate),
            "--nonblocking",
            "--gil",
        ]
        if subprocesses:
            argv.append("--subprocesses")
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True
        )
        self.procs.append((name, proc, out))

    def stop(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for _, proc, _ in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def report(self, top: int = 22) -> str:
        lines = []
        for name, _, out in self.procs:
            lines.append(summarise_profile(name, out, top))
        return "\n".join(lines)


def summarise_profile(name: str, path: Path, top: int = 22) -> str:
    from collections import Counter

    total = 0
    own: Counter = Counter()
    inclusive: Counter = Counter()
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"[{name}] no profile written"
    for line in text.splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        # py-spy marks threads/processes in the first frame; skip idle loops of the process
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    if not total:
        return f"[{name}] no samples"
    out = [f"[{name}] {total} samples holding the GIL: where the Python CPU time goes (self %)"]
    out += [f"  {n / total * 100:5.1f}%  {f[:140]}" for f, n in own.most_common(top)]
    out.append(f"[{name}] inclusive %, application and library entry points")
    interesting = [
        (f, n)
        for f, n in inclusive.most_common(400)
        if any(
            k in f
            for k in (
                "intake/",
                "ticketing/",
                "config/",
                "celery/app/trace",
                "kombu/",
                "django/db/models/query.py",
                "django/db/transaction",
                "django/db/backends/utils.py",
                "django/core/handlers",
                "logging/__init__",
                "psycopg/",
                "redis/",
            )
        )
    ]
    out += [f"  {n / total * 100:5.1f}%  {f[:140]}" for f, n in interesting[:top]]
    return "\n".join(out)

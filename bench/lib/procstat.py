"""Readings from /proc (Linux): CPU seconds per process group and per PostgreSQL backend, how busy
the whole machine is, children and memory of a process."""

from __future__ import annotations

import os
import time

import psycopg

from .db import PG_ADMIN_DSN
from .report import log

# --------------------------------------------------------------------------- CPU accounting
_TICK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: str):
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    comm = data[data.index("(") + 1 : data.rindex(")")]
    fields = data[data.rindex(")") + 2 :].split()
    # fields[0] is state (field 3); pgrp is field 5, utime 14, stime 15, cutime 16, cstime 17
    # own CPU plus that of reaped children (e.g. our finished client processes)
    return comm, int(fields[2]), sum(int(v) for v in fields[11:15]) / _TICK


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy since boot (all cores)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    return (sum(values) - values[3] - values[4]) / _TICK


def pg_backend_labels(db_name: str) -> dict[int, str]:
    """pid -> application_name of the PostgreSQL backends serving `db_name` (see with_app_name)."""
    try:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid, application_name FROM pg_stat_activity WHERE datname = %s", (db_name,)
            ).fetchall()
    except psycopg.Error:
        return {}
    return {int(pid): (app or "unnamed") for pid, app in rows}


def cpu_by_group(
    groups: dict[str, int], db_name: str | None = None, leaders: tuple[str, ...] = (), backends: bool = False
) -> dict[str, float]:
    """CPU seconds used so far by each process group in `groups` (name -> pgid), by the PostgreSQL
    backends of `db_name` ("postgres"), by the rest of PostgreSQL (WAL writer, checkpointer, other
    databases: "postgres-other"), and by everything else on the machine ("other").

    `leaders`: groups whose leader (e.g. Celery's parent process) is counted apart from its
    children, as "<name> parent" and "<name> children". `backends`: the database's backends are
    split by the application_name of their connection ("postgres[<name>]", pg_stat_activity).
    Take the difference of two of these with cpu_delta, which goes process by process."""
    out: dict = {name: 0.0 for name in groups if name not in leaders}
    for name in leaders:
        out[f"{name} parent"] = out[f"{name} children"] = 0.0
    out["postgres"] = 0.0
    out["postgres-other"] = 0.0
    labels = pg_backend_labels(db_name) if (backends and db_name) else {}
    for label in sorted(set(labels.values())):
        out[f"postgres[{label}]"] = 0.0
    by_pgid = {pgid: name for name, pgid in groups.items()}
    pids: dict[int, tuple[str, float]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        st = _proc_stat(pid)
        if st is None:
            continue
        comm, pgrp, cpu = st
        if pgrp in by_pgid:
            name = by_pgid[pgrp]
            if name in leaders:
                name += " parent" if int(pid) == pgrp else " children"
        elif comm == "postgres":
            if int(pid) in labels:
                name = f"postgres[{labels[int(pid)]}]"
            elif db_name and f" {db_name} " in _cmdline(pid):
                name = "postgres"
            else:
                name = "postgres-other"
        else:
            continue
        out[name] += cpu
        pids[int(pid)] = (name, cpu)
    # Exited processes (e.g. finished backends) drop out of the sums above; "other" absorbs that.
    out["_machine"] = machine_busy()
    out["other"] = out["_machine"] - sum(v for k, v in out.items() if k != "_machine")
    out["_pids"] = pids
    return out


def children(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc/<pid>/task/*/children)."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(v) for v in f.read().split()]
    except OSError:
        pass
    return out


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of `pid`, in KiB ({} once the process is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line.split(":")[0]] = int(line.split()[1])
    except OSError:
        return {}
    return out


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM of `pid` (writing 5 to clear_refs, Linux >= 4.0; needs the right to)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def wait_for_quiet(max_wait: float, threshold: float = 0.3) -> float:
    """Wait (up to `max_wait` s) until the machine is nearly idle, since other sessions share it.
    Returns the busy fraction of one core measured over the last second."""
    deadline = time.monotonic() + max_wait
    while True:
        b0 = machine_busy()
        time.sleep(1.0)
        busy = machine_busy() - b0
        if busy <= threshold or time.monotonic() >= deadline:
            if busy > threshold:
                log(
                    f"WARNING: the machine is busy with other work ({busy * 100:.0f}% of one core); "
                    f"figures will be lower than on an idle machine"
                )
            return busy
        log(f"machine busy with other work ({busy * 100:.0f}% of one core): waiting")


def cpu_delta(before: dict, after: dict) -> dict:
    """CPU seconds spent between two cpu_by_group() readings, per name. Counted process by process:
    a process that exited in between (a backend whose connection closed) is left to "other",
    and one that started counts from zero."""
    names = [k for k in {**before, **after} if not k.startswith("_")]
    out = {k: 0.0 for k in names}
    old = before["_pids"]
    for pid, (name, cpu) in after["_pids"].items():
        prev = old.get(pid)
        out[name] += cpu - (prev[1] if prev and prev[0] == name else 0.0)
    out["other"] = 0.0
    out["other"] = (after["_machine"] - before["_machine"]) - sum(out.values())
    return out


def format_cpu(delta: dict, wall: float, count: int, what: str = "request") -> str:
    parts = [
        f"{name} {sec / wall * 100:.0f}% ({sec / max(1, count) * 1000:.2f} ms/{what})" for name, sec in delta.items()
    ]
    return "CPU over the timed phase (100% = one core): " + ", ".join(parts)


def cpu_ceiling(delta: dict, count: int) -> tuple[float, float]:
    """(CPU ms per unit spent by this benchmark's own processes and its database, the rate that
    would saturate this machine's cores with that much work per unit). Other sessions' load and
    the rest of PostgreSQL are left out: an estimate for an idle machine, not a measurement."""
    ours = sum(v for k, v in delta.items() if k not in ("other", "postgres-other"))
    per_unit = ours / max(1, count)
    return per_unit * 1000, (os.cpu_count() or 1) / per_unit if per_unit > 0 else float("nan")

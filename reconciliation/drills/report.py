"""The JSON report of a drill run: what the printed table says, with the run's times and its tenant's fate.

Written by `manage.py drill` (default `<MAILROOM_VAR_DIR>/drill/<slug>.json`, or `--report PATH`): with the
scratch tenant discarded, the table and this file are the evidence of the run.
"""

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from django.conf import settings

from .runner import HEADER, DrillRun


def default_path(slug: str) -> Path:
    return Path(settings.VAR_DIR) / "drill" / f"{slug}.json"


def as_report(run: DrillRun) -> dict:
    scenarios = []
    for result in run.results:
        observed = result.observed
        scenarios.append(
            {
                "name": result.scenario.name,
                "expected": asdict(result.scenario.expect),
                "observed": None
                if observed is None
                else {
                    "tickets": observed.tickets,
                    "event": observed.event,
                    "intent": observed.intent,
                    "in_queue": observed.in_queue,
                    "problems": list(observed.problems),
                },
                "error": result.error,
                "pass": result.passed,
                "row": dict(zip(HEADER, result.cells(), strict=True)),  # the table's row, cell for cell
            }
        )
    passed = sum(1 for s in scenarios if s["pass"])
    return {
        "slug": run.slug,
        "mailbox": run.mailbox,
        "destination": run.destination,
        "started_at": run.started_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "kept": run.kept,
        "scenarios": scenarios,
        "totals": {"scenarios": len(scenarios), "passed": passed, "failed": len(scenarios) - passed},
        "passed": bool(scenarios) and passed == len(scenarios) and not run.cleanup_error,
        "cleanup": {
            "discarded": not run.kept and not run.cleanup_error,
            "rows": dict(sorted(run.discarded.items())),
            "error": run.cleanup_error,
        },
    }


def write_report(run: DrillRun, path: Path | None = None) -> Path:
    """Write the report (atomically: a reader never sees half a file); returns its path."""
    path = Path(path) if path else default_path(run.slug)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(as_report(run), out, indent=2)
            out.write("\n")
        os.chmod(temporary, 0o644)  # mkstemp's 0600 is for secrets; a report holds none
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path

"""bench/soak_embedded.py, short: `make run`'s stack on the embedded default under steady use for 45 s.

The soak's own figures are asserted: no child exited or was restarted, no ERROR/CRITICAL line in the children's
logs, every posted message accounted for (here: completed, as the demo's sample mail is), the recovery queue
and the dashboard answered 200 to the logged-in admin, a drill on the live stack passed, and Ctrl-C stopped
it all.
"""

import json
import subprocess

import pytest

from tests.live import PYTHON, REPO_ROOT

pytestmark = [pytest.mark.live, pytest.mark.timeout(600)]


def test_a_short_soak_of_the_embedded_default_accounts_for_everything():
    result = subprocess.run(
        [
            PYTHON,
            str(REPO_ROOT / "bench" / "soak_embedded.py"),
            "--seconds",
            "45",
            "--post-every",
            "2",
            "--pages-every",
            "15",
            "--drill-every",
            "15",
            "--settle",
            "60",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    report = result.stdout + result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0, report
    assert figures["exits"] == 0 and figures["restarts"] == 0, report
    assert figures["errors"] == 0, report
    assert figures["posted"] == figures["posts"] >= 20, report  # every post answered 202
    assert figures["unaccounted"] == 0 and figures["completed"] == figures["posted"], report
    assert figures["pages_opened"] >= 6 and figures["pages_ok"] == figures["pages_opened"], report
    assert figures["drills_run"] >= 1 and figures["drills_passed"] == figures["drills_run"], report
    assert figures["stopped_cleanly"], report

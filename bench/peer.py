"""The peer in the end-to-end comparison: django-helpdesk's `get_email`, timed by the peer's own scripts
(provided beside the project, not part of it) under $PEER_DIR.

Used by `bench/e2e.py --peer`; runnable alone to time the peer once:

    PEER_DIR=/tmp/peer .venv/bin/python bench/peer.py --n 2000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from lib.report import log
from lib.stack import REPO

PEER_SCRIPTS = REPO.parent / "shared" / "peer" / "django-helpdesk"


def peer_dir() -> Path:
    value = os.environ.get("PEER_DIR")
    if not value:
        raise SystemExit("--peer needs PEER_DIR (a scratch folder for django-helpdesk; see bench/README.md)")
    return Path(value)


def ensure_prepared(root: Path) -> None:
    """Run the peer's prepare.sh once (idempotent; it installs django-helpdesk in its own venv)."""
    if (
        (root / "venv" / "bin" / "python").exists()
        and (root / "bench" / "bench.py").exists()
        and (root / "work" / "tmpl").exists()
    ):
        return
    log(f"preparing the peer in {root} (prepare.sh: venv, django-helpdesk, template databases)")
    proc = subprocess.run(
        ["bash", str(PEER_SCRIPTS / "prepare.sh")],
        env=dict(os.environ, PEER_DIR=str(root)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the peer's prepare.sh failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def corpus(root: Path, n: int) -> Path:
    """The peer's N synthetic mails (its genmail.py, deterministic), generated once."""
    folder = root / "work" / f"corpus_{n}"
    if not folder.is_dir() or len(os.listdir(folder)) != n:
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(["python3", str(root / "bench" / "genmail.py"), str(folder), str(n)], check=True)
    return folder


def corpus_messages(root: Path, n: int, tag: str) -> list[bytes]:
    """The peer's corpus as Mailroom posts it: the same bytes, with each Message-ID made unique to
    this run (Mailroom would rightly answer a second run's posts as duplicates)."""
    folder = corpus(root, n)
    out = []
    for name in sorted(os.listdir(folder)):
        raw = (folder / name).read_bytes()
        out.append(raw.replace(b"Message-ID: <bench-", f"Message-ID: <{tag}-".encode(), 1))
    return out


def run_once(root: Path, n: int) -> dict:
    """One timed `get_email` import of N mails into a fresh database; returns its figures."""
    proc = subprocess.run(
        [
            str(root / "venv" / "bin" / "python"),
            str(root / "bench" / "bench.py"),
            "--db",
            "pg",
            "--n",
            str(n),
            "--runs",
            "1",
        ],
        env=dict(os.environ, PEER_DIR=str(root)),
        capture_output=True,
        text=True,
        timeout=3600,
        start_new_session=True,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(
            f"the peer's bench.py failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    r = json.loads(line)
    r["rate"] = n / r["wall_s"]
    r["cpu_ms_per_mail"] = (r["user_s"] + r["sys_s"]) / n * 1000
    return r


def describe(r: dict) -> str:
    return (
        f"{r['rate']:,.1f} mails/s ({r['n']} mails in {r['wall_s']:.2f} s; get_email rc {r['rc']}; "
        f"CPU of the get_email process {r['cpu_ms_per_mail']:.2f} ms/mail; tickets {r['tickets']}, "
        f"follow-ups {r['followups']}, mails left {r['mails_left']}, peak RSS {r['max_rss_mb']} MB)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="mails imported (default 2000)")
    args = parser.parse_args()
    root = peer_dir()
    ensure_prepared(root)
    r = run_once(root, args.n)
    print("peer (django-helpdesk get_email): " + describe(r))
    return 0 if r["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

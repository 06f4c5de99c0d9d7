"""The throw-away database of a run: create, drop, migrate and preload it; the app's environment
pointing at it; and the clean-up at the end of a run, which drops it.

`app_env` and `clean_up` live here rather than in `stack`, which this module imports (`manage`),
so that the two modules do not import each other.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psycopg

from .messages import MAILBOX_SLUG, SECRET
from .report import log
from .stack import BROKER_URL, manage, remove_tmp

PG_ADMIN_DSN = os.environ.get("BENCH_PG_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
# The program that creates the bench tenant, mailbox and destination and preloads history; run
# through `manage.py shell -c` (its text, read when a run prepares its database), never imported.
PRELOAD_SCRIPT = Path(__file__).resolve().with_name("preload.py")


def db_url(name: str) -> str:
    return PG_ADMIN_DSN.rsplit("/", 1)[0] + "/" + name


def recreate_database(name: str) -> None:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(name: str) -> None:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_sessions(name: str) -> int | None:
    """Sessions ever opened on database `name` (pg_stat_database.sessions, PostgreSQL 14+)."""
    try:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = %s", (name,)).fetchone()
            return None if row is None else int(row[0])
    except psycopg.Error:
        return None


def app_env(db_name: str, tmp: Path, log_level: str, mailboxes: tuple[str, ...] = (MAILBOX_SLUG,)) -> dict:
    """The app's environment for a bench run; the bench's webhook secret is bound to `mailboxes` (their slugs)."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL=db_url(db_name),
        CELERY_BROKER_URL=BROKER_URL,
        BENCH_SECRET=SECRET,
        # The mailboxes' webhook secret, a platform reference bound to each of them.
        MAILROOM_PLATFORM_SECRET_REFS="env:BENCH_SECRET=" + "|".join(f"mailbox:{slug}" for slug in mailboxes),
        CELERY_DB_REUSE_MAX="1000",
        MAILROOM_VAR_DIR=str(tmp / "var"),
        LOG_LEVEL=log_level,
        DEBUG="false",
        MAILROOM_ENV="development",  # plain HTTP on 127.0.0.1, the built-in SECRET_KEY
        PYTHONUNBUFFERED="1",
    )
    return env


def prepare_database(db_name: str, env: dict, preload: int) -> dict:
    """Drop and create the database, migrate it, and create tenant, raw mailbox and default destination."""
    recreate_database(db_name)
    t0 = time.monotonic()
    manage(env, "migrate", "--noinput", "-v0")
    setup_env = dict(env, BENCH_PRELOAD=str(preload), BENCH_MAILBOX=MAILBOX_SLUG)
    out = manage(setup_env, "shell", "-c", PRELOAD_SCRIPT.read_text())
    line = next(text for text in out.splitlines() if text.startswith("BENCH_SETUP "))
    info = json.loads(line.split(" ", 1)[1])
    log(
        f"database {db_name}: migrated, tenant + raw mailbox + default built-in destination, "
        f"{preload} completed events of history preloaded, ANALYZEd ({time.monotonic() - t0:.1f} s)"
    )
    return info


def analyze(db_name: str) -> None:
    with psycopg.connect(db_url(db_name), autocommit=True) as conn:
        conn.execute("ANALYZE")


def clean_up(stack, db_name: str, tmp: Path, keep: bool) -> None:
    """Stop what a run started, then drop its database and temporary files (unless --keep)."""
    stack.stop()
    if not keep:
        try:
            drop_database(db_name)
        except psycopg.Error as exc:
            log(f"could not drop {db_name}: {exc}")
    remove_tmp(tmp, keep=keep)

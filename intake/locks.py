"""One holder at a time for a named piece of work, across processes and hosts.

    with exclusive(namespace, key, "poll-mailbox-7") as acquired:   # False: someone else holds it

PostgreSQL: a session-level advisory lock `(namespace, key)` on a dedicated connection, so a
killed holder loses its session and the lock with it. SQLite (the embedded default, one host):
an fcntl lock on `VAR_DIR/locks/<name>.lock`. Never blocks: the caller decides what to do.
"""
import fcntl
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections


@contextmanager
def exclusive(namespace: int, key: int, name: str):
    """Yields True when this process now holds the lock, False when another one does."""
    if settings.USING_POSTGRES:
        lock_connection = connections.create_connection(DEFAULT_DB_ALIAS)
        try:
            lock_connection.ensure_connection()
            lock_connection.set_autocommit(True)
            with lock_connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [namespace, key])
                acquired = bool(cursor.fetchone()[0])
            yield acquired
        finally:
            # Ending the session releases its advisory locks, whatever happened above.
            lock_connection.close()
        return
    lock_dir = Path(settings.VAR_DIR) / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{name}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

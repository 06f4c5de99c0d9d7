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
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections


class HeldLock:
    """The lock `(namespace, key)` held across calls (a standby retries `acquire`); `acquire` never blocks."""

    def __init__(self, namespace: int, key: int, name: str):
        self.namespace, self.key, self.name = namespace, key, name
        self._connection = None
        self._file = None

    @property
    def held(self) -> bool:
        return self._connection is not None or self._file is not None

    def acquire(self) -> bool:
        if self.held:
            return True
        if settings.USING_POSTGRES:
            lock_connection = connections.create_connection(DEFAULT_DB_ALIAS)
            try:
                lock_connection.ensure_connection()
                lock_connection.set_autocommit(True)
                with lock_connection.cursor() as cursor:
                    cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [self.namespace, self.key])
                    acquired = bool(cursor.fetchone()[0])
            except DatabaseError:
                lock_connection.close()
                raise
            if acquired:
                self._connection = lock_connection
            else:
                lock_connection.close()
            return acquired
        lock_dir = Path(settings.VAR_DIR) / "locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        handle = open(lock_dir / f"{self.name}.lock", "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self._file = handle
        return True

    def still_held(self) -> bool:
        """False once the lock's session is gone (a restarted server, a dropped connection): someone else may
        hold it now. The file lock lasts as long as the open file."""
        if self._connection is None:
            return self._file is not None
        try:
            with self._connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            return True
        except DatabaseError:
            self.release()
            return False

    def release(self) -> None:
        if self._connection is not None:
            self._connection.close()  # ending the session releases its advisory locks
            self._connection = None
        if self._file is not None:
            self._file.close()  # closing the file releases its fcntl lock
            self._file = None


@contextmanager
def exclusive(namespace: int, key: int, name: str):
    """Yields True when this process now holds the lock, False when another one does."""
    lock = HeldLock(namespace, key, name)
    try:
        yield lock.acquire()
    finally:
        lock.release()

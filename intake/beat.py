"""The beat scheduler: django-celery-beat's DatabaseScheduler, ticking in one process at a time.

Two `celery beat` processes on one database would each send every periodic task. `LockedScheduler` ticks only
while it holds the beat lock; another beat stands by, tries the lock every STANDBY_SECONDS, and takes over
when the holder dies, so running beat on two hosts (or twice by mistake) is safe:

- PostgreSQL: a session-level advisory lock (pg_try_advisory_lock) on a connection of its own, opened for the
  lock alone. A holder that dies, even by SIGKILL, loses its session and the lock with it. A session lock
  needs a direct session to PostgreSQL, never PgBouncer in transaction mode (docs/deployment.md).
- SQLite (the embedded default, one host): an fcntl lock on `VAR_DIR/locks/beat.lock`, released by the
  kernel when the holder's process ends.

No tick is sent twice across a takeover: a due entry's new last run is written to the database before its task
is sent (`reserve`), and the beat that takes over reads the schedule afresh. A holder killed between that write
and the send loses that one tick; the next period sends it again. Every periodic task is a sweep that is safe to
run twice anyway (docs/deployment.md), so a doubled tick, were one to happen, would cost work, not correctness.
"""

import logging

from django.db import DatabaseError
from django_celery_beat.schedulers import DatabaseScheduler

from .locks import HeldLock

logger = logging.getLogger(__name__)

LOCK_NAMESPACE = 0x4D524254  # "MRBT": the beat lock, apart from the other advisory locks (intake.locks)
LOCK_KEY = 1
STANDBY_SECONDS = 1.0  # how often a standby beat tries the lock: the longest a takeover waits after the holder died


class BeatLock(HeldLock):
    """One holder per database (PostgreSQL) or per VAR_DIR (SQLite)."""

    def __init__(self):
        super().__init__(LOCK_NAMESPACE, LOCK_KEY, "beat")


class LockedScheduler(DatabaseScheduler):
    """DatabaseScheduler that ticks only while it holds the beat lock (CELERY_BEAT_SCHEDULER)."""

    def __init__(self, *args, **kwargs):
        self.beat_lock = BeatLock()
        self._standing_by = False
        super().__init__(*args, **kwargs)

    def tick(self, *args, **kwargs):
        if self.beat_lock.held and not self.beat_lock.still_held():
            logger.warning("beat: lost the beat lock (its database session ended); standing by")
        if not self.beat_lock.held:
            try:
                acquired = self.beat_lock.acquire()
            except DatabaseError:
                logger.warning("beat: could not reach the database for the beat lock; retrying")
                return STANDBY_SECONDS
            if not acquired:
                if not self._standing_by:
                    logger.info("beat: another beat holds the beat lock; standing by")
                    self._standing_by = True
                return STANDBY_SECONDS
            logger.info("beat: holding the beat lock; scheduling")
            self._standing_by = False
            self._read_schedule_afresh()
        return super().tick(*args, **kwargs)

    def _read_schedule_afresh(self) -> None:
        """What the last holder wrote, its last runs included: the schedule is due from there, not from
        whatever this process read when it started."""
        self._schedule = self.all_as_schedule()
        self._heap = None
        self._heap_invalidated = False  # the heap is rebuilt from this schedule at the next tick anyway
        self.old_schedulers = None

    def reserve(self, entry):
        new_entry = super().reserve(entry)
        # DatabaseScheduler keeps the entry it read, with the last run before this one: a heap rebuilt from it
        # would find the entry due again and send it twice.
        self._schedule[new_entry.name] = new_entry
        self.sync()  # the new last run is in the database before the task is sent (see the module's docstring)
        return new_entry

    def close(self):
        super().close()
        self.beat_lock.release()

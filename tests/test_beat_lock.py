"""Beat runs safely twice (intake.beat): one `celery beat` ticks, the other stands by and takes over when the
first dies, and no tick is sent twice.

The live test runs two real beats on the test database and Redis with a one-second periodic task that no worker
consumes: the broker's queue is the record of every tick, each message naming the process that sent it (its
`origin` header). The lock itself is tested directly on PostgreSQL (an advisory lock on a session of its own)
and on SQLite's fallback (an fcntl file lock).
"""

import json
import signal
import threading
import time

import pytest
from django.db import connection

from intake.beat import LOCK_KEY, LOCK_NAMESPACE, BeatLock
from tests.live import (  # noqa: F401  (fixtures)
    PYTHON,
    kill_group,
    live_broker,
    live_processes,
    subprocess_env,
    wait_for,
)
from tests.support.locks import IN_THIS_DATABASE

PROBE_TASK = "tests.beat_probe"  # never run: beat sends by name, and the test reads the queue


class Ticks:
    """Takes every message beat sends off the broker's default queue, with the time it was seen."""

    def __init__(self, broker):
        self.broker, self.seen, self.stop = broker, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            while (raw := self.broker.redis.rpop("celery")) is not None:  # kombu pushes left, pops right
                headers = json.loads(raw)["headers"]
                if headers["task"] == PROBE_TASK:
                    self.seen.append((time.monotonic(), headers["origin"]))
            time.sleep(0.02)

    def by(self, pid: int) -> list[float]:
        return [at for at, origin in self.seen if origin.startswith(f"gen{pid}@")]

    def close(self):
        self.stop.set()
        self.thread.join(5)


@pytest.fixture
def probe_every_second(transactional_db):
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.SECONDS)
    return PeriodicTask.objects.create(name="beat-probe", task=PROBE_TASK, interval=every)


@pytest.mark.live
def test_second_beat_stands_by_and_takes_over_without_doubling_a_tick(probe_every_second, live_broker, live_processes):
    env = subprocess_env(live_broker.url)
    beat = [PYTHON, "-m", "celery", "-A", "config", "beat", "--loglevel", "INFO"]
    ticks = Ticks(live_broker)
    try:
        first = live_processes.start("beat-1", beat, env)
        wait_for(lambda: len(ticks.by(first.pid)) >= 2, timeout=60, describe=lambda: live_processes.logs(20))
        second = live_processes.start("beat-2", beat, env)
        # The second beat is up (its log says it stands by) and sends nothing while the first lives.
        wait_for(lambda: "standing by" in second.tail(), timeout=60, describe=lambda: live_processes.logs(20))
        time.sleep(3)
        assert ticks.by(second.pid) == []
        kill_group(first.pid, signal.SIGKILL)  # the whole beat, mid-run
        killed_at = time.monotonic()
        first.popen.wait(10)
        wait_for(lambda: len(ticks.by(second.pid)) >= 3, timeout=30, describe=lambda: live_processes.logs(20))
    finally:
        ticks.close()

    before, after = ticks.by(first.pid), ticks.by(second.pid)
    assert len(before) >= 5 and max(before) <= killed_at + 0.1
    assert min(after) > killed_at  # the standby sent nothing before the holder died
    assert {origin.split("@")[0] for _, origin in ticks.seen} == {f"gen{first.pid}", f"gen{second.pid}"}
    times = sorted(at for at, _ in ticks.seen)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    # One tick a second, never two at once, across the takeover too; and the takeover within a few seconds.
    assert min(gaps) > 0.5, gaps
    assert min(after) - max(before) < 6, (max(before), min(after))
    print(
        f"\nbeat: {len(before)} ticks by the first beat, SIGKILLed; the standby's first tick "
        f"{min(after) - max(before):.2f} s after the last one; smallest gap {min(gaps):.2f} s"
    )


@pytest.mark.django_db(transaction=True)
def test_postgres_lock_has_one_holder_and_goes_with_its_session():
    first, second = BeatLock(), BeatLock()
    try:
        assert first.acquire() and first.held
        assert not second.acquire() and not second.held
        assert first.still_held()
        # The holder's session ends under it (a restarted server, a cut connection): it knows it lost the lock,
        # and the other one gets it.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                f"AND classid = %s AND objid = %s AND {IN_THIS_DATABASE}",
                [LOCK_NAMESPACE, LOCK_KEY],
            )
            assert cursor.fetchall() == [(True,)]
        wait_for(lambda: second.acquire(), timeout=10)
        assert not first.still_held() and not first.held
        assert not first.acquire()
        second.release()
        assert first.acquire()
    finally:
        first.release()
        second.release()


def test_sqlite_fallback_is_a_file_lock_with_one_holder(settings, tmp_path):
    settings.USING_POSTGRES = False
    settings.VAR_DIR = tmp_path
    first, second = BeatLock(), BeatLock()
    try:
        assert first.acquire() and first.still_held()
        assert not second.acquire()
        assert (tmp_path / "locks" / "beat.lock").exists()
        first.release()
        assert not first.still_held()
        assert second.acquire()
        assert not first.acquire()
    finally:
        first.release()
        second.release()

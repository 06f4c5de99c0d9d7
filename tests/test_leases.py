"""Thread leases: token grows at every acquisition, expiry lets a second worker take over,
and a stale holder neither passes the check nor removes the newer lease."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from ticketing import leases
from ticketing.models import ThreadLease


def test_second_worker_waits_while_the_lease_is_live(mailbox):
    first = leases.acquire(mailbox.pk, "t1", "worker-a", seconds=30)
    assert first is not None and first.token == 1
    assert leases.acquire(mailbox.pk, "t1", "worker-b", seconds=30) is None
    assert leases.holds(first)
    assert leases.acquire(mailbox.pk, "t2", "worker-b", seconds=30).token == 1  # another thread is free


def test_takeover_after_expiry_bumps_the_token_and_fences_the_stale_holder(mailbox):
    stale = leases.acquire(mailbox.pk, "t1", "worker-a", seconds=30)
    ThreadLease.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert not leases.holds(stale)
    fresh = leases.acquire(mailbox.pk, "t1", "worker-b", seconds=30)
    assert fresh.token == stale.token + 1
    assert not leases.holds(stale)
    assert leases.release(stale) is False  # the stale release leaves the newer lease in place
    assert leases.holds(fresh)
    assert ThreadLease.objects.get().owner == "worker-b"
    assert leases.release(fresh) is True
    assert ThreadLease.objects.count() == 0
    assert leases.acquire(mailbox.pk, "t1", "worker-c", seconds=30).token == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_acquisition_has_one_winner(mailbox):
    barrier = threading.Barrier(6)
    won = []

    def contend(n):
        try:
            barrier.wait()
            lease = leases.acquire(mailbox.pk, "hot", f"worker-{n}", seconds=30)
            if lease:
                won.append(lease)
        finally:
            connection.close()

    threads = [threading.Thread(target=contend, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and won[0].token == 1

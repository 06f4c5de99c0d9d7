"""Thread leases (docs/design.md §7 "Threads, leases, ..."): one worker at a time works on a (mailbox, thread).

A lease has an owner, an expiry and a token that grows at every acquisition.
The holder checks token and expiry in the same transaction that claims its
intent, immediately before the external call; a worker that was paused past
its expiry and overtaken finds a newer token and stops. Release only removes a
lease whose token is still ours.
"""

from dataclasses import dataclass
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from .models import ThreadLease


@dataclass(frozen=True)
class Lease:
    mailbox_id: int
    thread_key: str
    owner: str
    token: int


def acquire(mailbox_id: int, thread_key: str, owner: str, seconds: float) -> Lease | None:
    """Take the lease if it is free or expired; None while someone else holds a live one."""
    now = timezone.now()
    table = ThreadLease._meta.db_table
    # One statement: insert, or take over an expired lease with token + 1. Both
    # PostgreSQL and SQLite (3.35+) speak this ON CONFLICT ... RETURNING.
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (mailbox_id, thread_key, owner, token, expires_at) VALUES (%s, %s, %s, 1, %s) "
            f"ON CONFLICT (mailbox_id, thread_key) DO UPDATE SET owner = excluded.owner, "
            f"token = {table}.token + 1, expires_at = excluded.expires_at WHERE {table}.expires_at < %s "
            f"RETURNING token",
            [mailbox_id, thread_key, owner, now + timedelta(seconds=seconds), now],
        )
        row = cursor.fetchone()
    return Lease(mailbox_id, thread_key, owner, row[0]) if row else None


def holds(lease: Lease, lock: bool = False) -> bool:
    """Still ours and not expired. Call inside the transaction that claims the intent;
    with `lock`, the row stays locked until that transaction ends, so no takeover
    can slip between this check and the claim."""
    current = ThreadLease.objects.filter(
        mailbox_id=lease.mailbox_id,
        thread_key=lease.thread_key,
        token=lease.token,
        owner=lease.owner,
        expires_at__gt=timezone.now(),
    )
    if lock:
        current = current.select_for_update()
    return current.exists()


def release(lease: Lease) -> bool:
    """Give the lease back, unless a newer holder has taken it over meanwhile."""
    deleted, _ = ThreadLease.objects.filter(
        mailbox_id=lease.mailbox_id, thread_key=lease.thread_key, token=lease.token, owner=lease.owner
    ).delete()
    return bool(deleted)

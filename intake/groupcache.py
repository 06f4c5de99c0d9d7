"""Lookups read once per task group instead of once per event.

A worker task carries a group of events (the relay publishes groups); the task opens a scope with its group
cache (`ticketing.tasks.process_inbox_events`), and the lookups deep in normalization and ticket building
that would otherwise run one query per event (the tenant's routing rules, its own addresses, its sender
lists) ask `remembered` for the value. Outside a scope (the console, commands, tests calling a function
directly) every call reads the database, as before.

The scope lasts one task, a fraction of a second to a few seconds: what an admin changes meanwhile is
seen by the next task, as a change made while one event was being processed always was.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")

_current: ContextVar[dict | None] = ContextVar("mailroom_group_cache", default=None)


@contextmanager
def scope(cache: dict) -> Iterator[dict]:
    """Lookups inside the block are remembered in `cache` (the task's group cache)."""
    token = _current.set(cache)
    try:
        yield cache
    finally:
        _current.reset(token)


def active() -> bool:
    return _current.get() is not None


def remembered(key: Hashable, compute: Callable[[], T]) -> T:
    """`compute()` once per scope for `key`; every call outside a scope."""
    cache = _current.get()
    if cache is None:
        return compute()
    full_key = ("groupcache", key)
    if full_key not in cache:
        cache[full_key] = compute()
    return cache[full_key]

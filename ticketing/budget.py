"""A request budget per destination, shared by every worker process and thread: calls wait for their turn
instead of drawing 429s from the desk.

The quota is the destination's `requests_per_minute` setting (0: none), else its kind's documented one
(`Capabilities.requests_per_minute`), else there is none and nothing here is asked (no query). Every request
to the desk counts, reads and uploads included, as the desks count them.

The shared state is one row per destination in `ticketing_destination_budget` (migration 0014), on the
application's own database (PostgreSQL, or the embedded SQLite file), so it works wherever Mailroom runs:
`spent_until`, the moment until which the budget is spoken for (the "theoretical arrival time" of the generic
cell rate algorithm). `take` reserves the next slot in one statement (an upsert with RETURNING): the row is
locked for that statement only, never across the call. The slot is the caller's, first come first served,
and `take` says how long to wait for it; a wait longer than `max_wait` reserves nothing (`OverBudget`). The
time is the database's clock, so workers on several hosts agree on it.

The pace keeps the desk's own count under the quota in every sliding minute, not just on average: a quiet
destination may send a burst of about two seconds' worth at once, and the sustained pace leaves that burst and
a little headroom (late arrivals, the window's edges) out of the quota. At 120 per minute that is a burst of 4
and 114 requests a minute; at Zendesk's 700, 23 and 669.

`note_retry_after` records a desk's `Retry-After` (a 429, or a 503 that names one): no worker's next slot
comes before it, and the pace resumes from there without a burst.

Call these outside a transaction (the pipeline does: an HTTP destination's call is never inside one); inside
one, the row would stay locked until it ends.
"""

import math
from dataclasses import dataclass

from django.db import connection

TABLE = "ticketing_destination_budget"
BURST_SECONDS = 2.0  # how much of the rate a quiet destination may send at once


@dataclass(frozen=True)
class Quota:
    per_minute: int
    burst: int  # requests that may go at once after a quiet spell
    interval: float  # seconds between two requests at the sustained pace

    @property
    def tolerance(self) -> float:
        """How far ahead of the sustained pace a request may go (the burst, in seconds)."""
        return (self.burst - 1) * self.interval

    @property
    def paced_per_minute(self) -> float:
        return 60.0 / self.interval


class OverBudget(Exception):
    """The next slot is further away than the caller would wait; nothing was reserved."""

    def __init__(self, wait: float):
        super().__init__(f"the request budget is spent for the next {wait:.1f} s")
        self.wait = wait


def pace(per_minute: int) -> Quota:
    """The burst and the sustained interval that keep every sliding minute at or under `per_minute`."""
    burst = max(1, min(round(per_minute * BURST_SECONDS / 60), per_minute // 4))
    headroom = 1 + per_minute // 100
    paced = per_minute - burst - headroom
    if paced < 1:  # a quota of a handful a minute: no burst, and the pace below it
        burst, paced = 1, max(per_minute - 2, 0.5)
    return Quota(per_minute=per_minute, burst=burst, interval=60.0 / paced)


def quota_for(destination, capabilities=None) -> Quota | None:
    """The destination's quota (its setting, else its kind's), or None: unlimited. Reads no database."""
    setting = (destination.settings or {}).get("requests_per_minute")
    if setting is None:
        if capabilities is None:
            from .destinations import adapter_class  # the adapters import this module

            try:
                capabilities = adapter_class(destination.kind).capabilities
            except LookupError:
                return None
        setting = capabilities.requests_per_minute
    try:
        per_minute = int(setting or 0)
    except (TypeError, ValueError):
        return None
    if per_minute <= 0 or not getattr(destination, "pk", None):
        return None  # no quota; or an unsaved destination ("test connection" before saving): nothing to share
    return pace(per_minute)


def _clock(now: float | None) -> tuple[str, list]:
    """The SQL for "now" in epoch seconds, and its parameters: the database's clock unless `now` is given."""
    if now is not None:
        return "%s", [float(now)]
    if connection.vendor == "postgresql":
        return "extract(epoch from statement_timestamp())", []
    return "((julianday('now') - 2440587.5) * 86400.0)", []  # SQLite: one value for the whole statement


def _greatest() -> str:
    return "GREATEST" if connection.vendor == "postgresql" else "MAX"


def take(destination, *, quota: Quota | None = None, max_wait: float = math.inf, now: float | None = None) -> float:
    """Reserve the destination's next request slot: the seconds to wait before sending (0: go now).

    The slot is the caller's once this returns; sleep that long, then send. When the slot is more than
    `max_wait` seconds away, nothing is reserved and `OverBudget` says how far it is. Without a quota: 0, and
    no query."""
    quota = quota or quota_for(destination)
    if quota is None:
        return 0.0
    clock, clock_params = _clock(now)
    greatest, interval, tolerance = _greatest(), quota.interval, quota.tolerance
    # Reserve only when the slot (the later of the budget's end and now, less the burst) is close enough;
    # RETURNING gives the wait for the reserved slot, on the same clock.
    slot_start = f"{greatest}(b.spent_until, {clock}) - %s"
    sql = (
        f"INSERT INTO {TABLE} AS b (destination_id, spent_until) VALUES (%s, {clock} + %s) "
        f"ON CONFLICT (destination_id) DO UPDATE SET spent_until = {greatest}(b.spent_until, {clock}) + %s "
        f"WHERE {slot_start} - {clock} <= %s "
        f"RETURNING {greatest}(spent_until - %s - %s - {clock}, 0)"
    )
    params = [
        destination.pk,
        *clock_params,
        interval,
        *clock_params,
        interval,
        *clock_params,
        tolerance,
        *clock_params,
        _finite(max_wait),
        interval,
        tolerance,
        *clock_params,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
        if row is not None:
            return float(row[0])
        # Over `max_wait`: how far the slot is (nothing reserved).
        cursor.execute(
            f"SELECT {greatest}(spent_until - %s - {clock}, 0) FROM {TABLE} WHERE destination_id = %s",
            [tolerance, *clock_params, destination.pk],
        )
        row = cursor.fetchone()
    raise OverBudget(float(row[0]) if row else 0.0)


def note_retry_after(destination, seconds: float, *, quota: Quota | None = None, now: float | None = None) -> None:
    """The desk asked for `seconds` of quiet (Retry-After): no worker's next slot comes sooner. Without a
    quota nothing is recorded (nobody asks the budget)."""
    quota = quota or quota_for(destination)
    if quota is None or seconds is None or seconds <= 0:
        return
    clock, clock_params = _clock(now)
    greatest = _greatest()
    # The end of the quiet plus the burst tolerance: the first slot is the quiet's end, then the pace.
    sql = (
        f"INSERT INTO {TABLE} AS b (destination_id, spent_until) VALUES (%s, {clock} + %s) "
        f"ON CONFLICT (destination_id) DO UPDATE SET spent_until = {greatest}(b.spent_until, {clock} + %s)"
    )
    until = float(seconds) + quota.tolerance
    with connection.cursor() as cursor:
        cursor.execute(sql, [destination.pk, *clock_params, until, *clock_params, until])


def forget(destination) -> None:
    """Drop the destination's budget row (a deleted destination; tests)."""
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {TABLE} WHERE destination_id = %s", [destination.pk])


def _finite(value: float) -> float:
    return 1e12 if value is None or math.isinf(value) else float(value)

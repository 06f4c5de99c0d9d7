"""One way to write a time in the console: "2026-12-01 08:51 UTC", with a relative age where it helps.

The queue, the item page, the dashboard and the timeline all call these (directly or through the
`console` template filters), so an operator reads the same format everywhere.
"""

from datetime import datetime

from django.utils import timezone
from django.utils.timesince import timesince

ABSOLUTE_FORMAT = "%Y-%m-%d %H:%M %Z"
EMPTY = "—"


def absolute(value: datetime | None) -> str:
    """The time in the site's time zone, to the minute, with the zone's name."""
    if value is None:
        return EMPTY
    return timezone.localtime(value).strftime(ABSOLUTE_FORMAT)


def relative(value: datetime | None, *, now: datetime | None = None) -> str:
    """ "3 hours ago" or "in 20 minutes" (the larger unit only)."""
    if value is None:
        return EMPTY
    now = now or timezone.now()
    if value <= now:
        return f"{timesince(value, now, depth=1)} ago"
    return f"in {timesince(now, value, depth=1)}"


def when(value: datetime | None, *, now: datetime | None = None) -> str:
    """Both: "2026-12-01 08:51 UTC (3 hours ago)"."""
    if value is None:
        return EMPTY
    return f"{absolute(value)} ({relative(value, now=now)})"

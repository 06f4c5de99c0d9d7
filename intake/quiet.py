"""How long a mailbox may stay silent before it is unusual: its own traffic history decides (a selector).

`threshold_hours(mailbox, now=...)` -> hours, or None when the alarm is off for the mailbox.

`Mailbox.settings["quiet_alarm"]`: `{"enabled": false}` turns it off; `{"after_hours": 8}` sets the threshold
(and turns it on whatever the traffic); `{"enabled": true}` turns it on for a low-traffic mailbox too.
Otherwise the threshold is max(`MAILROOM_QUIET_MIN_HOURS` (6), `MAILROOM_QUIET_FACTOR` (1.5) x the 95th
percentile of the mailbox's silences over the last `MAILROOM_QUIET_HISTORY_DAYS` (14)), and the alarm is off
for mailboxes that averaged fewer than `MAILROOM_QUIET_MIN_PER_DAY` (5) messages a day over that window.

The percentile is weighted by time: the silence a random moment of the window fell in. Counted per gap, the
many short daytime gaps would hide the one long night and raise the alarm every night; weighted by time,
nights and weekends are part of "usual" (a mailbox that is busy only on weekdays is better served by its own
`after_hours`). Archived history (`InboxEvent.history`) is not traffic.
"""

from datetime import datetime, timedelta

from django.conf import settings

from .models import InboxEvent, Mailbox

MAX_SAMPLE = 50_000  # the newest this many messages of the window are enough to know a busy mailbox's rhythm


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


def config(mailbox: Mailbox) -> dict:
    own = (mailbox.settings or {}).get("quiet_alarm")
    return own if isinstance(own, dict) else {}


def weighted_percentile(gaps: list[float], fraction: float) -> float:
    """The gap g such that `fraction` of the total time lies in gaps no longer than g."""
    total = sum(gaps)
    if total <= 0:
        return 0.0
    covered = 0.0
    for gap in sorted(gaps):
        covered += gap
        if covered >= fraction * total:
            return gap
    return max(gaps)


def threshold_hours(mailbox: Mailbox, *, now: datetime) -> float | None:
    conf = config(mailbox)
    if conf.get("enabled") is False:
        return None
    if conf.get("after_hours"):
        return float(conf["after_hours"])
    days = _setting("MAILROOM_QUIET_HISTORY_DAYS", 14)
    stamps = list(
        InboxEvent.objects.filter(
            mailbox_id=mailbox.pk, history=False, received_at__gte=now - timedelta(days=days), received_at__lte=now
        )
        .order_by("-received_at")
        .values_list("received_at", flat=True)[:MAX_SAMPLE]
    )
    busy = len(stamps) >= MAX_SAMPLE or len(stamps) / days >= _setting("MAILROOM_QUIET_MIN_PER_DAY", 5)
    if len(stamps) < 3 or not (busy or conf.get("enabled") is True):
        return None
    gaps = [(newer - older).total_seconds() for newer, older in zip(stamps, stamps[1:], strict=False)]
    usual = weighted_percentile(gaps, 0.95) / 3600
    return max(_setting("MAILROOM_QUIET_MIN_HOURS", 6), _setting("MAILROOM_QUIET_FACTOR", 1.5) * usual)

"""Business hours as pure functions: when is the next opening, and when are N business hours over.

A `Schedule` is a timezone, the open intervals of each weekday in local time ("09:00"-"17:00", "24:00"
ends a day) and the public holidays of a country (and subdivision) from the `holidays` library, which are
closed all day. Arithmetic is done in UTC: local times only say where intervals begin and end, so a DST
change shortens or lengthens that day's hours as a clock on the wall does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import holidays

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
DAY_WORDS = {"mon": "Mon", "tue": "Tue", "wed": "Wed", "thu": "Thu", "fri": "Fri", "sat": "Sat", "sun": "Sun"}
CLOCK = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$|^24:00$")
# How far ahead a promise is looked for: a schedule open on no day within a year promises nothing.
MAX_DAYS = 400
MAX_INTERVALS_PER_DAY = 6


def _clock(value: str) -> time | None:
    """ "09:30" -> 09:30; "24:00" -> None (the end of the day)."""
    return None if value == "24:00" else time(int(value[:2]), int(value[3:]))


def weekly_errors(weekly) -> list[str]:
    if not isinstance(weekly, dict):
        return ['must be an object such as {"mon": [["09:00", "17:00"]]}']
    messages = []
    for day, intervals in weekly.items():
        if day not in DAYS:
            messages.append(f"{day!r} is not a day (use {', '.join(DAYS)})")
            continue
        if not isinstance(intervals, list) or len(intervals) > MAX_INTERVALS_PER_DAY:
            messages.append(f"{day}: a list of at most {MAX_INTERVALS_PER_DAY} [start, end] pairs")
            continue
        previous_end = ""
        for interval in intervals:
            if (
                not isinstance(interval, list)
                or len(interval) != 2
                or not all(isinstance(v, str) and CLOCK.match(v) for v in interval)
            ):
                messages.append(f'{day}: {interval!r} is not a ["HH:MM", "HH:MM"] pair')
            elif interval[0] == "24:00" or interval[1] <= interval[0]:
                messages.append(f"{day}: {interval[0]}-{interval[1]} must end after it starts (same day)")
            elif interval[0] < previous_end:
                messages.append(f"{day}: intervals must be in order and not overlap")
            else:
                previous_end = interval[1]
    return messages


def settings_errors(*, timezone_name: str, weekly, country: str, subdivision: str) -> dict[str, str]:
    """Field name -> what is wrong (empty when the settings make a schedule)."""
    errors = {}
    try:
        ZoneInfo(timezone_name or "")
    except (ZoneInfoNotFoundError, ValueError):
        errors["timezone"] = f"{timezone_name!r} is not an IANA timezone (e.g. Europe/Berlin)."
    messages = weekly_errors(weekly)
    if messages:
        errors["weekly"] = "; ".join(messages)
    supported = holidays.list_supported_countries()
    if country and country not in supported:
        errors["holidays_country"] = f"{country!r} is not a country the holidays library knows (e.g. DE)."
    elif subdivision and not country:
        errors["holidays_subdivision"] = "A subdivision needs its country."
    elif subdivision and subdivision not in supported[country]:
        errors["holidays_subdivision"] = (
            f"{subdivision!r} is not a subdivision of {country} (one of {', '.join(supported[country][:12])}, ...)."
        )
    return errors


@lru_cache(maxsize=64)
def _holidays(country: str, subdivision: str):
    # Years are filled in as dates are asked for (the library's own expansion).
    return holidays.country_holidays(country, subdiv=subdivision or None)


@dataclass(frozen=True)
class Schedule:
    zone: ZoneInfo
    weekly: dict = field(default_factory=dict)  # weekday index (Monday 0) -> ((start, end | None), ...)
    country: str = ""
    subdivision: str = ""

    def is_holiday(self, day: date) -> bool:
        return bool(self.country) and day in _holidays(self.country, self.subdivision)

    def intervals(self, day: date):
        """The open intervals of `day` as (start, end) in UTC; none on a holiday."""
        if self.is_holiday(day):
            return
        for start, end in self.weekly.get(day.weekday(), ()):
            begin = datetime.combine(day, start, tzinfo=self.zone)
            close = (
                datetime.combine(day + timedelta(days=1), time(0), tzinfo=self.zone)
                if end is None
                else datetime.combine(day, end, tzinfo=self.zone)
            )
            begin, close = begin.astimezone(UTC), close.astimezone(UTC)
            if close > begin:
                yield begin, close


def schedule(*, timezone_name: str, weekly: dict, country: str = "", subdivision: str = "") -> Schedule:
    """A Schedule from stored settings (assumed valid: `settings_errors`)."""
    days = {}
    for index, name in enumerate(DAYS):
        days[index] = tuple((_clock(start), _clock(end)) for start, end in (weekly or {}).get(name, ()))
    return Schedule(zone=ZoneInfo(timezone_name), weekly=days, country=country, subdivision=subdivision)


def answer_by(plan: Schedule, start: datetime, hours: float) -> datetime | None:
    """`start` plus `hours` of open time: nights, closed days and holidays do not count. Outside the hours
    the count starts at the next opening (0 hours: the next opening itself). None: no opening in MAX_DAYS."""
    remaining = timedelta(hours=max(hours, 0))
    start = start.astimezone(UTC)
    day = start.astimezone(plan.zone).date() - timedelta(days=1)  # an interval of yesterday may run past midnight
    for _ in range(MAX_DAYS):
        for begin, close in plan.intervals(day):
            if close <= start:
                continue
            begin = max(begin, start)
            if remaining <= close - begin:
                return begin + remaining
            remaining -= close - begin
        day += timedelta(days=1)
    return None


def next_opening(plan: Schedule, moment: datetime) -> datetime | None:
    """`moment` itself when the hours are open then, else when they next open."""
    return answer_by(plan, moment, 0)


def is_open(plan: Schedule, moment: datetime) -> bool:
    moment = moment.astimezone(UTC)
    day = moment.astimezone(plan.zone).date()
    return any(begin <= moment < close for begin, close in plan.intervals(day))


def open_time_between(plan: Schedule, start: datetime, end: datetime) -> timedelta:
    """How much open time lies between `start` and `end` (for checking `answer_by`)."""
    total = timedelta()
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    day = start.astimezone(plan.zone).date() - timedelta(days=1)
    while datetime.combine(day, time(0), tzinfo=plan.zone) <= end:
        for begin, close in plan.intervals(day):
            overlap = min(close, end) - max(begin, start)
            total += max(overlap, timedelta())
        day += timedelta(days=1)
    return total


def describe(weekly: dict, timezone_name: str) -> str:
    """{"mon": [["09:00","17:00"]], ... "fri": ...} -> "Mon-Fri 09:00-17:00 (Europe/Berlin)"."""
    groups: list[list] = []  # [first day, last day, hours text]
    for name in DAYS:
        hours = ", ".join(f"{start}-{end}" for start, end in (weekly or {}).get(name, ()))
        if groups and hours and groups[-1][2] == hours and DAYS.index(groups[-1][1]) == DAYS.index(name) - 1:
            groups[-1][1] = name
        elif hours:
            groups.append([name, name, hours])
    if not groups:
        return "closed"
    text = "; ".join(
        (DAY_WORDS[a] if a == b else f"{DAY_WORDS[a]}-{DAY_WORDS[b]}") + f" {hours}" for a, b, hours in groups
    )
    return f"{text} ({timezone_name})"


def local_text(moment: datetime, timezone_name: str) -> str:
    """2026-12-07 17:00 (Europe/Berlin): unambiguous in every language the template is written in."""
    return f"{moment.astimezone(ZoneInfo(timezone_name)):%Y-%m-%d %H:%M} ({timezone_name})"

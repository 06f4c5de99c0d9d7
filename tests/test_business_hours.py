"""Business hours decide the "we will answer by" line: nights, weekends and holidays do not count, and outside
the hours the count starts at the next opening (ticketing.business_hours: pure functions, no database)."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given, settings, strategies as st

from ticketing import business_hours as hours

BERLIN = ZoneInfo("Europe/Berlin")
OFFICE = {day: [["09:00", "17:00"]] for day in ("mon", "tue", "wed", "thu", "fri")}


def berlin(*args) -> datetime:
    return datetime(*args, tzinfo=BERLIN)


def office(country="", subdivision="", weekly=OFFICE, zone="Europe/Berlin"):
    return hours.schedule(timezone_name=zone, weekly=weekly, country=country, subdivision=subdivision)


def test_friday_evening_with_eight_hours_to_answer_is_answered_on_monday():
    promised = hours.answer_by(office("DE"), berlin(2026, 12, 4, 18, 0), 8)
    assert promised == berlin(2026, 12, 7, 17, 0)
    assert promised.astimezone(BERLIN).strftime("%A") == "Monday"


def test_outside_the_hours_the_promise_starts_at_the_next_opening():
    saturday = berlin(2026, 12, 5, 10, 0)
    assert hours.next_opening(office(), saturday) == berlin(2026, 12, 7, 9, 0)
    assert hours.answer_by(office(), saturday, 1) == berlin(2026, 12, 7, 10, 0)
    assert hours.answer_by(office(), berlin(2026, 12, 8, 6, 30), 2) == berlin(2026, 12, 8, 11, 0)  # before opening


def test_inside_the_hours_the_count_starts_now_and_carries_over_night():
    assert hours.answer_by(office(), berlin(2026, 12, 8, 15, 30), 3) == berlin(2026, 12, 9, 10, 30)


def test_christmas_day_and_boxing_day_are_skipped_where_they_are_holidays():
    christmas_eve = berlin(2026, 12, 24, 16, 0)  # a Thursday; the 25th (Friday) and 26th are German holidays
    assert hours.answer_by(office("DE"), christmas_eve, 8) == berlin(2026, 12, 28, 16, 0)
    assert hours.answer_by(office(), christmas_eve, 8) == berlin(2026, 12, 25, 16, 0)  # no holidays configured
    assert hours.next_opening(office("DE"), berlin(2026, 12, 25, 12, 0)) == berlin(2026, 12, 28, 9, 0)


def test_a_subdivision_adds_its_own_holidays():
    evening = berlin(2027, 1, 5, 17, 0)  # Epiphany (6 January) is a holiday in Bavaria, not in all of Germany
    assert hours.answer_by(office("DE"), evening, 1) == berlin(2027, 1, 6, 10, 0)
    assert hours.answer_by(office("DE", "BY"), evening, 1) == berlin(2027, 1, 7, 10, 0)


def test_a_day_with_the_clock_put_forward_has_one_hour_less():
    sundays = office(weekly={"sun": [["00:00", "24:00"]]})
    start = berlin(2026, 3, 29, 0, 0)  # CET -> CEST at 02:00
    assert hours.answer_by(sundays, start, 23) == berlin(2026, 3, 30, 0, 0)
    assert hours.answer_by(sundays, start, 24) == berlin(2026, 4, 5, 1, 0)


def test_a_schedule_never_open_promises_nothing():
    assert hours.answer_by(office(weekly={}), berlin(2026, 12, 4, 18, 0), 8) is None


def test_settings_are_checked_with_a_reason_for_each_field():
    errors = hours.settings_errors(
        timezone_name="Mars/Olympus", weekly={"mon": [["17:00", "09:00"]], "xyz": []}, country="QQ", subdivision=""
    )
    assert set(errors) == {"timezone", "weekly", "holidays_country"}
    assert "must end after it starts" in errors["weekly"] and "'xyz' is not a day" in errors["weekly"]
    overlapping = {"tue": [["09:00", "13:00"], ["12:00", "17:00"]]}
    assert (
        "not overlap"
        in hours.settings_errors(timezone_name="UTC", weekly=overlapping, country="", subdivision="")["weekly"]
    )
    assert (
        "subdivision of DE"
        in hours.settings_errors(timezone_name="UTC", weekly=OFFICE, country="DE", subdivision="XX")[
            "holidays_subdivision"
        ]
    )
    assert hours.settings_errors(timezone_name="Europe/Berlin", weekly=OFFICE, country="DE", subdivision="BY") == {}


def test_hours_are_described_as_people_write_them():
    weekly = {**OFFICE, "fri": [["09:00", "14:00"]], "sat": [["10:00", "12:00"]]}
    assert (
        hours.describe(weekly, "Europe/Berlin")
        == "Mon-Thu 09:00-17:00; Fri 09:00-14:00; Sat 10:00-12:00 (Europe/Berlin)"
    )
    assert hours.describe({}, "UTC") == "closed"


# --- properties --------------------------------------------------------------------------------------

CLOCKS = [f"{h:02d}:{m:02d}" for h in range(24) for m in (0, 30)] + ["24:00"]


@st.composite
def weeklies(draw):
    weekly = {}
    for day in hours.DAYS:
        points = sorted(set(draw(st.lists(st.sampled_from(CLOCKS), max_size=4))))
        pairs = [points[i : i + 2] for i in range(0, len(points) - 1, 2)]
        if pairs:
            weekly[day] = pairs
    return weekly


zones = st.sampled_from(["Europe/Berlin", "America/New_York", "Asia/Kolkata", "UTC", "Australia/Lord_Howe"])
starts = st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2027, 12, 31)).map(
    lambda moment: moment.replace(tzinfo=UTC)
)


@settings(max_examples=150, deadline=None)
@given(
    weekly=weeklies(),
    zone=zones,
    start=starts,
    needed=st.integers(min_value=0, max_value=60),
    country=st.sampled_from(["", "DE"]),
)
def test_the_promise_is_exactly_the_hours_needed_of_open_time_after_the_start(weekly, zone, start, needed, country):
    plan = office(country, weekly=weekly, zone=zone)
    promised = hours.answer_by(plan, start, needed)
    if promised is None:
        assert not weekly
        return
    assert promised >= start
    assert hours.open_time_between(plan, start, promised) == timedelta(hours=needed)
    if needed == 0:
        assert hours.is_open(plan, promised)  # the next opening, never a closed moment
    else:
        assert hours.open_time_between(plan, promised - timedelta(minutes=1), promised) > timedelta()


@settings(max_examples=80, deadline=None)
@given(
    weekly=weeklies(),
    start=starts,
    fewer=st.integers(min_value=0, max_value=30),
    more=st.integers(min_value=0, max_value=30),
)
def test_more_hours_never_promise_an_earlier_answer(weekly, start, fewer, more):
    plan = office("DE", weekly=weekly)
    first, second = hours.answer_by(plan, start, fewer), hours.answer_by(plan, start, fewer + more)
    assert (first is None) == (second is None)
    if first is not None:
        assert first <= second

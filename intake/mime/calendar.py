"""The iTIP method of a message's calendar parts: is this a meeting request, or a client's answer to one?

    calendar_method(parsed=parsed) -> CalendarMethod   # CalendarMethod("REPLY", "DECLINED", "text/calendar")

Calendar clients mail iTIP (RFC 5546) objects: the organizer sends REQUEST (or PUBLISH, CANCEL,
DECLINECOUNTER), attendees answer with REPLY (PARTSTAT accepted, declined, tentative), COUNTER (a
proposed new time) or REFRESH. Real shapes: Outlook puts `text/calendar; method=REPLY` in a
multipart/alternative next to text/plain; Google Calendar adds the same object again as an
`application/ics` attachment named invite.ics; Apple Calendar sends only the text/calendar part;
Thunderbird/Lightning sends COUNTER in a multipart/mixed. The method is read from the part's
`method` Content-Type parameter when present (what Outlook and Google write), else from the
object's METHOD property, parsed with `icalendar`; PARTSTAT comes from the first ATTENDEE of the
first component that has one (a REPLY carries exactly the replying attendee), and is read only for
REPLY and COUNTER: a part that declares another method is not parsed at all. At most
`MAX_CALENDAR_PARTS` parts of at most `MAX_CALENDAR_BYTES` each are parsed, among the first
`MAX_WALKED_PARTS` parts: an invitation is a few KB near the top, and this runs on every message.
Never raises; a part that does not parse counts for nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, cast

from .headers import content_type_param
from .message import ParsedMessage

if TYPE_CHECKING:
    from email.message import Message

MAX_CALENDAR_PARTS = 4
MAX_WALKED_PARTS = 200  # a calendar part sits near the top; a 2,000-part message is not walked for one
MAX_CALENDAR_BYTES = 256 * 1024
CALENDAR_TYPES = frozenset({"text/calendar", "application/ics"})
# Methods whose attendee PARTSTAT is the answer worth reading from the object.
ANSWER_METHODS = frozenset({"REPLY", "COUNTER"})


class CalendarMethod(NamedTuple):
    method: str = ""  # uppercase iTIP method ("REQUEST", "REPLY", ...); "" when the message has none
    partstat: str = ""  # uppercase PARTSTAT of the first attendee ("ACCEPTED", ...); "" when none
    part_type: str = ""  # the Content-Type of the part that said so

    def __bool__(self) -> bool:  # a tuple of three is always true; this one is true when a method was found
        return bool(self.method)


def is_calendar_part(part: Message) -> bool:
    if part.is_multipart():
        return False
    if part.get_content_type() in CALENDAR_TYPES:
        return True
    name = str(part.get_filename("") or "").lower()
    return name.endswith(".ics")


def _parameter_method(part: Message) -> str:
    return content_type_param(part, "method").upper()[:40]


def _from_object(payload: bytes) -> tuple[str, str]:
    """(METHOD, PARTSTAT) read from the iCalendar object itself."""
    try:
        from icalendar import Calendar

        calendar = Calendar.from_ical(payload.decode("utf-8", "replace"))
    except Exception:
        return "", ""
    method = str(calendar.get("METHOD", "") or "").strip().upper()[:40]
    partstat = ""
    try:
        for component in calendar.walk():
            attendees = component.get("ATTENDEE")
            if attendees is None:
                continue
            first = attendees[0] if isinstance(attendees, list) else attendees
            partstat = str(getattr(first, "params", {}).get("PARTSTAT", "") or "").strip().upper()[:40]
            if partstat:
                break
    except Exception:
        partstat = ""
    return method, partstat


def _may_hold_calendar(parsed: ParsedMessage) -> bool:
    """Whether the parse saw a calendar part at all (as a file or an alternative): most mail has none, and
    walking it again costs more than the rest of validation."""
    if parsed.content_type in CALENDAR_TYPES:
        return True
    if any(str(alternative.get("type", "")) in CALENDAR_TYPES for alternative in parsed.alternatives):
        return True
    return any(a.declared_type in CALENDAR_TYPES or a.filename.lower().endswith(".ics") for a in parsed.attachments)


def calendar_method(*, parsed: ParsedMessage) -> CalendarMethod:
    """The iTIP method (and the attendee's PARTSTAT) of the first calendar part that names one."""
    message = parsed.email_message
    if message is None or not _may_hold_calendar(parsed):
        return CalendarMethod()
    examined = 0
    try:
        for index, part in enumerate(message.walk()):
            if index >= MAX_WALKED_PARTS:
                break
            if not is_calendar_part(part):
                continue
            examined += 1
            if examined > MAX_CALENDAR_PARTS:
                break
            declared = _parameter_method(part)
            if declared and declared not in ANSWER_METHODS:
                # A request (the ticket path, and most calendar mail) needs no object parsed: ~1.5 ms a part.
                return CalendarMethod(method=declared, part_type=part.get_content_type())
            payload = cast("bytes | None", part.get_payload(decode=True)) or b""  # a leaf: its decoded bytes
            method, partstat = _from_object(payload[:MAX_CALENDAR_BYTES]) if payload else ("", "")
            method = declared or method
            if method:
                return CalendarMethod(method=method, partstat=partstat, part_type=part.get_content_type())
    except Exception:
        return CalendarMethod()
    return CalendarMethod()

"""Meeting replies are a calendar client's answer, not a request: suppressed as `calendar_reply` with the
iTIP method and the attendee's PARTSTAT as evidence; meeting requests stay tickets with the .ics attached.
(The real-client shapes are in the corpus: tests/corpus/manifest-automation.json.)"""

from email.message import EmailMessage

import pytest

from intake.mime import parse_message
from intake.mime.calendar import calendar_method
from intake.models import AuditEvent, InboxEvent
from intake.validation import OK, SUPPRESSED, validate
from tests.factories import make_event
from ticketing.models import Ticket, TicketMapping
from ticketing.services import process_inbox_event


def ics(method: str | None, partstat="ACCEPTED") -> str:
    lines = ["BEGIN:VCALENDAR", "PRODID:-//Example Corp//Calendar 1.0//EN", "VERSION:2.0"]
    if method:
        lines.append(f"METHOD:{method}")
    lines += [
        "BEGIN:VEVENT",
        "UID:7e1f0a2b-3c4d@example.com",
        "DTSTAMP:20240622T081533Z",
        "DTSTART:20240628T120000Z",
        "DTEND:20240628T130000Z",
        "SUMMARY:Vendor onboarding call",
        "ORGANIZER;CN=Acme Support:mailto:support@acme.test",
        f"ATTENDEE;CN=Jane Doe;PARTSTAT={partstat}:mailto:jane@example.com",
        "END:VEVENT",
        "END:VCALENDAR",
        "",
    ]
    return "\r\n".join(lines)


def invitation(
    method: str | None,
    *,
    parameter=True,
    as_file=False,
    only_calendar=False,
    partstat="ACCEPTED",
    subject="Accepted: Vendor onboarding call",
) -> bytes:
    msg = EmailMessage()
    msg["From"] = "Jane Doe <jane@example.com>"
    msg["To"] = "support@acme.test"
    msg["Subject"] = subject
    msg["Message-ID"] = "<cal-1@example.com>"
    params = {"method": method} if parameter and method else {}
    body = ics(method, partstat)
    if only_calendar:
        msg.set_content(body, subtype="calendar", params=params)
        return msg.as_bytes()
    msg.set_content("Jane Doe has accepted this invitation.\n")
    if as_file:
        msg.add_attachment(body.encode(), maintype="application", subtype="ics", filename="invite.ics")
    else:
        msg.add_alternative(body, subtype="calendar", params=params)
    return msg.as_bytes()


def method_of(raw: bytes):
    return calendar_method(parsed=parse_message(raw))


def test_the_method_is_read_from_the_content_type_parameter_or_else_from_the_object():
    assert method_of(invitation("REPLY")) == ("REPLY", "ACCEPTED", "text/calendar")
    assert method_of(invitation("COUNTER", parameter=False, partstat="TENTATIVE")) == (
        "COUNTER",
        "TENTATIVE",
        "text/calendar",
    )
    assert method_of(invitation("REPLY", as_file=True, partstat="DECLINED")) == ("REPLY", "DECLINED", "application/ics")
    assert method_of(invitation("REPLY", only_calendar=True)).method == "REPLY"


def test_a_message_without_a_readable_calendar_part_has_no_method():
    assert not method_of(invitation(None))
    plain = EmailMessage()
    plain["From"] = "jane@example.com"
    plain.set_content("Lunch at noon?\n")
    assert not method_of(plain.as_bytes())
    garbage = EmailMessage()
    garbage["From"] = "jane@example.com"
    garbage.set_content(b"\x00\xffnot a calendar at all", maintype="text", subtype="calendar")
    assert not method_of(garbage.as_bytes())
    assert not calendar_method(parsed=parse_message(b""))


@pytest.mark.parametrize(
    "method, partstat, detail",
    [
        ("REPLY", "ACCEPTED", "iTIP METHOD:REPLY, PARTSTAT=ACCEPTED (text/calendar)"),
        ("REPLY", "DECLINED", "iTIP METHOD:REPLY, PARTSTAT=DECLINED (text/calendar)"),
        ("COUNTER", "TENTATIVE", "iTIP METHOD:COUNTER, PARTSTAT=TENTATIVE (text/calendar)"),
        ("REFRESH", "NEEDS-ACTION", "iTIP METHOD:REFRESH (text/calendar)"),
        # The organizer's withdrawals: the attendees' PARTSTAT says nothing about them.
        ("CANCEL", "NEEDS-ACTION", "iTIP METHOD:CANCEL (text/calendar)"),
        ("DECLINECOUNTER", "NEEDS-ACTION", "iTIP METHOD:DECLINECOUNTER (text/calendar)"),
    ],
)
def test_replies_and_cancellations_are_suppressed_with_their_method_as_evidence(method, partstat, detail):
    verdict = validate(parse_message(invitation(method, partstat=partstat)))
    assert (verdict.state, verdict.reason_code, verdict.detail) == (SUPPRESSED, "calendar_reply", detail)


@pytest.mark.parametrize("method", ["REQUEST", "PUBLISH"])
def test_requests_and_published_events_are_ordinary_mail(method):
    assert validate(parse_message(invitation(method, partstat="NEEDS-ACTION"))).state == OK


def test_a_reply_that_is_only_a_calendar_part_is_suppressed_not_reviewed_as_empty():
    verdict = validate(parse_message(invitation("REPLY", only_calendar=True)))
    assert (verdict.state, verdict.reason_code) == (SUPPRESSED, "calendar_reply")


@pytest.fixture
def box(mailbox, settings):
    settings.MAILROOM_CLAMD = "off"
    return mailbox


def test_a_meeting_request_becomes_a_ticket_with_the_ics_attached(box):
    raw = invitation("REQUEST", as_file=True, partstat="NEEDS-ACTION", subject="Invitation: Vendor onboarding call")
    event = make_event(box, raw)
    process_inbox_event(event.pk)
    event = InboxEvent.objects.get(pk=event.pk)
    assert event.state == "completed"
    assert [a["filename"] for a in event.details["attachments"]] == ["invite.ics"]
    mapping = TicketMapping.objects.get(inbox_event=event, action="create_ticket")
    assert "invite.ics" in Ticket.objects.get(pk=int(mapping.ticket_id)).description


def test_a_meeting_reply_is_suppressed_and_the_console_detail_names_the_method(box):
    event = make_event(box, invitation("REPLY", partstat="DECLINED", subject="Declined: Vendor onboarding call"))
    process_inbox_event(event.pk)
    event = InboxEvent.objects.get(pk=event.pk)
    assert (event.state, event.reason_code) == ("suppressed", "calendar_reply")
    assert event.reason_detail == "iTIP METHOD:REPLY, PARTSTAT=DECLINED (text/calendar)"
    assert not TicketMapping.objects.filter(inbox_event=event).exists()
    assert AuditEvent.objects.filter(inbox_event=event, kind="suppressed").count() == 1

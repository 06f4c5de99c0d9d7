"""Acceptance corpus: real-world mail through the real pipeline, on PostgreSQL.

`tests/corpus/*.eml` are messages as clients and systems really write them
(Gmail, Outlook/Exchange, Apple Mail, Thunderbird, ServiceNow, Jira, Zabbix,
Nagios, Mailman, bounces, auto-replies, legacy charsets, signed and encrypted
mail, broken headers, odd attachment names, list and monitoring mail, calendar
replies). `tests/corpus/manifest.json` and `manifest-*.json` (tests/corpus_manifest.py)
hold one line per message with what must come out of it:

    file                the .eml file
    sender, subject     InboxEvent.sender (compared case-insensitively; "" = none) and .subject
    state, reason       final InboxEvent.state and .reason_code ("" when completed)
    body                phrases the body text must contain (whitespace-normalized): the
                        ticket's description when a ticket was made, else the parsed text
    body_absent         phrases it must not contain (header lines, a stub alternative, markup)
    replacement_chars   exact number of U+FFFD in the body text
    attachments         exact filenames in event.details["attachments"], in order
    attachments_include filenames that must be among them
    ack                 true: an acknowledgment is planned (the sender is authenticated by the
                        corpus's MTA, mx1.acme.test); false: it is skipped (audit kind
                        `acknowledgment_skipped`) while the ticket is still made
    ack_reason          with "ack": false, the reason that audit row names (noreply_sender, list_mail, ...)
    after               a message delivered and processed first (same-Message-ID pairs)
    message_id_reused   expected InboxEvent.message_id_reused
    allowed_recipients  set on the mailbox before delivery
    note                what the message is

Each message is ingested as intake/views.py does for source "raw"
(`raw_message_keys` gives the provider id and the thread key), then
`process_inbox_event` runs (twice if the first run left the event waiting, e.g.
on its thread). Every mismatch of a message is reported at once.
"""

import pytest
from django.conf import settings as django_settings

from intake.keys import raw_message_keys
from intake.mime import parse_message
from intake.models import AuditEvent, InboxEvent
from intake.services import ingest
from tests.corpus_manifest import CORPUS, load_manifest
from ticketing.models import Intent, Ticket, TicketMapping
from ticketing.services import process_inbox_event

MANIFEST = load_manifest()
BY_FILE = {case["file"]: case for case in MANIFEST}
FINAL_STATES = {"completed", "suppressed", "awaiting_review", "quarantined", "failed"}
KEYS = {
    "file",
    "sender",
    "subject",
    "state",
    "reason",
    "body",
    "body_absent",
    "replacement_chars",
    "attachments",
    "attachments_include",
    "ack",
    "ack_reason",
    "after",
    "message_id_reused",
    "allowed_recipients",
    "note",
}
# An acknowledgment in one of these states will be (or was) sent.
SENDING_INTENT_STATES = (Intent.State.PENDING, Intent.State.IN_FLIGHT, Intent.State.RETRY_WAIT, Intent.State.SUCCEEDED)
MISSING = object()
CORPUS_MTA = "mx1.acme.test"  # the authserv-id of the MTA the corpus messages came through


@pytest.fixture(autouse=True)
def scanner_off(settings):
    settings.MAILROOM_CLAMD = "off"


def load(name: str) -> bytes:
    return (CORPUS / name).read_bytes()


def deliver(mailbox, raw: bytes):
    """Ingest as the raw webhook does, then process (again, if the first run left it waiting)."""
    provider_message_id, thread_key = raw_message_keys(raw)
    result = ingest(mailbox, provider_message_id, raw, source="raw", thread_key=thread_key)
    process_inbox_event(result.inbox_event_id)
    if InboxEvent.objects.get(pk=result.inbox_event_id).state in InboxEvent.OPEN_STATES:
        process_inbox_event(result.inbox_event_id)
    return result, InboxEvent.objects.get(pk=result.inbox_event_id)


def normalized(text: str) -> str:
    return " ".join(text.split())


# What Mailroom adds after the message's text on a ticket (ticketing.services.Work.ticket_request): the files,
# the people copied, an agent's forward. The corpus judges the message's own text.
MAILROOM_SECTIONS = ("\n\nAttachments:\n", "\n\nCopied: ", "\n\nForwarded by ")


def body_text(event: InboxEvent, raw: bytes) -> str:
    mapping = TicketMapping.objects.filter(inbox_event=event, action=Intent.Action.CREATE_TICKET).first()
    if mapping is not None:
        description = Ticket.objects.get(pk=int(mapping.ticket_id)).description
        ends = [description.find(marker) for marker in MAILROOM_SECTIONS if marker in description]
        return description[: min(ends)] if ends else description
    return parse_message(raw, loop_header=django_settings.MAILROOM_LOOP_HEADER).text


def mismatches(case: dict, raw: bytes, result, event: InboxEvent, earlier: InboxEvent | None) -> list[str]:
    problems = []

    def expect(what, got, wanted):
        if got != wanted:
            problems.append(f"{what}: got {got!r}, expected {wanted!r}")

    if result.duplicate:
        problems.append(f"ingest took it for a duplicate of event {result.inbox_event_id}")
    expect("state/reason", (event.state, event.reason_code), (case["state"], case["reason"]))
    expect("sender", event.sender.lower(), case["sender"].lower())
    expect("subject", event.subject, case["subject"])

    mappings = list(TicketMapping.objects.filter(inbox_event=event, action=Intent.Action.CREATE_TICKET))
    if case["state"] == "completed":
        if len(mappings) != 1:
            problems.append(f"expected one ticket for the event, found {len(mappings)}")
        else:
            ticket = Ticket.objects.get(pk=int(mappings[0].ticket_id))
            expect("ticket subject", ticket.subject, case["subject"] or "(no subject)")
            expect("ticket requester", ticket.requester.lower(), case["sender"].lower())
    elif mappings:
        problems.append(f"a {case['state']} message got a ticket")

    text = body_text(event, raw)
    flat = normalized(text)
    for phrase in case.get("body", []):
        if normalized(phrase) not in flat:
            problems.append(f"body lacks {phrase!r}; body starts {flat[:160]!r}")
    for phrase in case.get("body_absent", []):
        if phrase in text:
            problems.append(f"body contains {phrase!r}")
    if "replacement_chars" in case:
        expect("U+FFFD in body", text.count("\ufffd"), case["replacement_chars"])

    names = [a.get("filename", "") for a in (event.details or {}).get("attachments", [])]
    if "attachments" in case:
        expect("attachment names", names, case["attachments"])
    for name in case.get("attachments_include", []):
        if name not in names:
            problems.append(f"attachment {name!r} not listed; names: {names!r}")

    if "ack" in case:
        skipped = AuditEvent.objects.filter(inbox_event=event, kind="acknowledgment_skipped").exists()
        sending = Intent.objects.filter(
            inbox_event=event, action=Intent.Action.NOTIFY_REQUESTER, state__in=SENDING_INTENT_STATES
        ).exists()
        if case["ack"]:
            expect("acknowledgment planned / skipped", (sending, skipped), (True, False))
        else:
            expect("acknowledgment planned / skipped (audit acknowledgment_skipped)", (sending, skipped), (False, True))
            if "ack_reason" in case:
                reasons = [
                    row.detail.get("reason")
                    for row in AuditEvent.objects.filter(inbox_event=event, kind="acknowledgment_skipped")
                ]
                expect("acknowledgment skip reason", reasons, [case["ack_reason"]])

    if "message_id_reused" in case:
        flag = getattr(event, "message_id_reused", MISSING)
        if flag is MISSING:
            problems.append("InboxEvent has no field message_id_reused")
        else:
            expect("message_id_reused", flag, case["message_id_reused"])
    if earlier is not None:
        if earlier.pk == event.pk:
            problems.append(f"{case['file']} was stored as the same event as {case['after']}")
        else:
            expect("earlier event's message_id_reused", getattr(earlier, "message_id_reused", False), False)
            expect("earlier event still holds its own bytes", bytes(earlier.raw) == load(case["after"]), True)
        expect("events in the mailbox", InboxEvent.objects.filter(mailbox=event.mailbox).count(), 2)
        if case["state"] == "completed" and earlier.state == "completed":
            expect("tickets", Ticket.objects.count(), 2)
    return problems


@pytest.mark.parametrize("case", MANIFEST, ids=[case["file"] for case in MANIFEST])
def test_message(mailbox, case):
    # The corpus came in through the tenant's MTA, which wrote its Authentication-Results: only what that
    # MTA authenticated is acknowledged.
    mailbox.settings = {**(mailbox.settings or {}), "trusted_authserv_id": CORPUS_MTA}
    if case.get("allowed_recipients"):
        mailbox.allowed_recipients = case["allowed_recipients"]
    mailbox.save()
    earlier = None
    if case.get("after"):
        _, earlier = deliver(mailbox, load(case["after"]))
    raw = load(case["file"])
    result, event = deliver(mailbox, raw)
    problems = mismatches(case, raw, result, event, earlier)
    assert not problems, f"{case['file']} ({case.get('note', '')}):\n  " + "\n  ".join(problems)


def test_corpus_is_large_and_every_file_has_its_expectations():
    files = sorted(path.name for path in CORPUS.glob("*.eml"))
    assert len(MANIFEST) >= 45, f"only {len(MANIFEST)} messages"
    assert len(BY_FILE) == len(MANIFEST), "a file is listed twice"
    assert sorted(BY_FILE) == files, {"unlisted": set(files) - set(BY_FILE), "missing": set(BY_FILE) - set(files)}
    order = [case["file"] for case in MANIFEST]
    for case in MANIFEST:
        assert {"file", "sender", "subject", "state", "reason"} <= set(case) and set(case) <= KEYS, case["file"]
        assert case["state"] in FINAL_STATES, case["file"]
        assert (case["state"] == "completed") == (case["reason"] == ""), case["file"]
        if "after" in case:
            assert order.index(case["after"]) < order.index(case["file"]), case["file"]
    # Real mail is small: the corpus stays a few KB a message.
    assert max((CORPUS / name).stat().st_size for name in files) < 16 * 1024


def test_every_message_is_stored_byte_for_byte(mailbox):
    """All messages into one mailbox, in manifest order: each event holds exactly the bytes it was given."""
    altered = []
    for case in MANIFEST:
        raw = load(case["file"])
        result, event = deliver(mailbox, raw)
        if result.duplicate or bytes(event.raw) != raw:
            altered.append(f"{case['file']} (event {event.pk}, duplicate={result.duplicate})")
    assert not altered, "not stored as given: " + ", ".join(altered)
    assert InboxEvent.objects.filter(mailbox=mailbox).count() == len(MANIFEST)

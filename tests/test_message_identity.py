"""A reused Message-ID never merges two messages; a message delivered twice is still one event.

Some senders (monitoring and ticketing systems among them) put one Message-ID on
every message they send. Deduplication by that id alone answered "duplicate" to
the second, different message and nothing else happened: zero tickets, no trace.
Here: same id + same content (whatever the channel added) -> one event; same id
+ other content -> its own event, flagged `message_id_reused`, and its own ticket.
"""

import threading

import pytest
from django.db import connection
from django.test import Client

from intake import services
from intake.keys import content_fingerprint, provider_message_id_for_raw, reused_id
from intake.models import AuditEvent, InboxEvent
from tests.conftest import WEBHOOK_SECRET
from tests.dovecot import dovecot  # noqa: F401  (fixture)
from tests.mail import webhook_headers
from tests.support.imap import make_imap_box
from tests.support.inbound import basic, mailgun_fields, post_mailgun, post_postmark, post_sendgrid, postmark_payload
from ticketing.models import Intent, Ticket, TicketMapping
from ticketing.services import process_inbox_event

# A ServiceNow-style notification: the instance reuses one Message-ID for every update it
# sends about a record (the record's sys_id), so two updates share it.
SERVICENOW_ID = "<sn_notification.d4e5f6a7b8c9@acme.service-now.com>"


def servicenow_update(state: str, comment: str, sent="Mon, 30 Nov 2026 09:14:02 -0800", crlf=True) -> bytes:
    lines = [
        "Date: " + sent,
        'From: "ACME ServiceNow" <acme@service-now.com>',
        "Reply-To: acme@service-now.com",
        "To: support@acme.test",
        f"Message-ID: {SERVICENOW_ID}",
        f"Subject: Incident INC0010042 has been updated - state {state}",
        "MIME-Version: 1.0",
        "Content-Type: text/plain; charset=UTF-8",
        "Content-Transfer-Encoding: 7bit",
        "X-ServiceNow-Source: Notification-7c1f2b",
        "X-ServiceNow-SysEmail-Version: 2",
        "",
        f"Incident INC0010042 is now {state}.",
        "",
        f"Comment: {comment}",
        "",
        "Click here to view Incident: LINK",
        "Ref:MSG0934211",
        "",
    ]
    return ("\r\n" if crlf else "\n").join(lines).encode()


def post_raw(client, slug: str, raw: bytes):
    return client.post(
        f"/webhooks/raw/{slug}/", data=raw, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, raw)
    )


def test_two_different_messages_with_one_message_id_are_two_events_and_two_tickets(mailbox):
    client = Client()
    first_raw = servicenow_update("In Progress", "Looking into the VPN outage.")
    second_raw = servicenow_update("Resolved", "VPN concentrator replaced.", sent="Mon, 30 Nov 2026 11:40:19 -0800")
    first = post_raw(client, mailbox.slug, first_raw)
    second = post_raw(client, mailbox.slug, second_raw)
    assert first.status_code == second.status_code == 202, (first.content, second.content)
    assert first.json()["duplicate"] is second.json()["duplicate"] is False

    one, two = InboxEvent.objects.order_by("pk")
    assert one.provider_message_id == SERVICENOW_ID.strip("<>") and not one.message_id_reused
    assert two.message_id_reused
    assert two.provider_message_id == reused_id(one.provider_message_id, content_fingerprint(second_raw))
    assert two.fingerprint == content_fingerprint(second_raw) != one.fingerprint
    received = AuditEvent.objects.get(inbox_event=two, kind="received")
    assert received.detail["message_id_reused"] is True and received.detail["first_event"] == one.pk

    for event in (one, two):
        assert process_inbox_event(event.pk) == "created"
    assert Ticket.objects.count() == 2
    assert set(InboxEvent.objects.values_list("state", flat=True)) == {"completed"}
    by_event = {m.inbox_event_id: m.ticket_id for m in TicketMapping.objects.filter(action="create_ticket")}
    assert len(set(by_event.values())) == 2
    reused_ticket = Ticket.objects.get(pk=by_event[two.pk])
    assert "mailroom-message-id-reused" in reused_ticket.tags
    assert "Resolved" in reused_ticket.subject and "VPN concentrator replaced." in reused_ticket.description

    # Each of the two, delivered again, is a duplicate of its own event.
    assert post_raw(client, mailbox.slug, first_raw).json() == {"inbox_event_id": one.pk, "duplicate": True}
    assert post_raw(client, mailbox.slug, second_raw).json() == {"inbox_event_id": two.pk, "duplicate": True}
    assert InboxEvent.objects.count() == 2


def test_identical_bytes_posted_five_times_are_one_event(mailbox):
    client = Client()
    raw = servicenow_update("New", "Printer on floor 3 jams.")
    answers = [post_raw(client, mailbox.slug, raw) for _ in range(5)]
    assert [a.status_code for a in answers] == [202, 200, 200, 200, 200]
    assert len({a.json()["inbox_event_id"] for a in answers}) == 1
    assert InboxEvent.objects.count() == 1 and not InboxEvent.objects.get().message_id_reused


def test_transport_headers_line_endings_and_trailing_space_do_not_change_the_fingerprint():
    pushed = servicenow_update("New", "Printer on floor 3 jams.", crlf=False)
    # What an IMAP server hands back: CRLF, the MTA's trace headers on top, a refolded
    # Subject and trailing white space that a relay added.
    served = (
        b"Return-Path: <acme@service-now.com>\r\n"
        b"Delivered-To: support@acme.test\r\n"
        b"Received: from mx1.acme.test (mx1.acme.test [192.0.2.10])\r\n\tby imap.acme.test with LMTP; "
        b"Mon, 30 Nov 2026 17:14:05 +0000\r\n"
        + servicenow_update("New", "Printer on floor 3 jams.")
        .replace(
            b"Subject: Incident INC0010042 has been updated - state New",
            b"Subject: Incident INC0010042 has been\r\n updated - state New",
        )
        .replace(b"Ref:MSG0934211", b"Ref:MSG0934211   ")
    )
    assert content_fingerprint(pushed) == content_fingerprint(served)
    assert content_fingerprint(pushed) != content_fingerprint(servicenow_update("New", "Printer on floor 4 jams."))
    # Without a Message-ID the key is the fingerprint, so channels agree there too.
    no_id_pushed = pushed.replace(f"Message-ID: {SERVICENOW_ID}\n".encode(), b"")
    no_id_served = served.replace(f"Message-ID: {SERVICENOW_ID}\r\n".encode(), b"")
    assert provider_message_id_for_raw(no_id_pushed) == provider_message_id_for_raw(no_id_served)


def test_same_message_by_lmtp_and_by_imap_with_other_transport_headers_is_one_event(
    dovecot,
    tenant,  # noqa: F811
    monkeypatch,
):
    from intake.keys import raw_message_keys

    monkeypatch.setenv("MAILROOM_TEST_WEBHOOK_SECRET", WEBHOOK_SECRET)
    box = make_imap_box(dovecot, tenant, monkeypatch)
    pushed = servicenow_update("New", "The scanner on floor 2 is offline.", crlf=False)
    # The MTA hands the message over by LMTP (the raw webhook is for raw mailboxes only: a 404 here), which
    # stores it as intake.channels.lmtp.deliver_to_mailbox does ...
    assert post_raw(Client(), box.mailbox.slug, pushed).status_code == 404
    provider_message_id, thread_key = raw_message_keys(pushed)
    delivered_by_lmtp = services.ingest(box.mailbox, provider_message_id, pushed, source="lmtp", thread_key=thread_key)
    assert not delivered_by_lmtp.duplicate
    # ... and delivers a copy into the folder the mailbox polls: trace headers and CRLF.
    delivered = (
        b"Return-Path: <acme@service-now.com>\r\nDelivered-To: " + box.username.encode() + b"\r\n"
        b"Received: from mx1.acme.test by imap.acme.test with LMTP; Mon, 30 Nov 2026 17:14:05 +0000\r\n"
        + pushed.replace(b"\n", b"\r\n")
    )
    box.append([delivered])
    report = box.poll()
    assert (report.new, report.duplicates) == (0, 1)
    assert report.messages[0].inbox_event_id == delivered_by_lmtp.inbox_event_id
    # A different update under the same id, arriving by IMAP only, is its own event.
    box.append([servicenow_update("Resolved", "Scanner replaced.")])
    report = box.poll()
    assert (report.new, report.duplicates) == (1, 0)
    assert InboxEvent.objects.filter(mailbox=box.mailbox).count() == 2
    assert InboxEvent.objects.get(pk=report.messages[0].inbox_event_id).message_id_reused


@pytest.mark.parametrize("provider", ["mailgun", "postmark", "sendgrid"])
def test_inbound_parse_channels_keep_reused_ids_apart(provider, tenant, monkeypatch):
    from intake.models import Mailbox
    from tests.support.inbound import BASIC_PASSWORD, BASIC_USER, MAILGUN_KEY

    monkeypatch.setenv("MAILROOM_TEST_MAILGUN_KEY", MAILGUN_KEY)
    monkeypatch.setenv("MAILROOM_TEST_BASIC", f"{BASIC_USER}:{BASIC_PASSWORD}")
    secret = "MAILROOM_TEST_MAILGUN_KEY" if provider == "mailgun" else "MAILROOM_TEST_BASIC"
    Mailbox.objects.create(
        tenant=tenant,
        slug=f"{provider}-box",
        address=f"{provider}@acme.test",
        provider=provider,
        webhook_secret_ref=f"env:{secret}",
    )
    first = servicenow_update("In Progress", "Disk at 91 %.")
    second = servicenow_update("Resolved", "Disk cleaned up.", sent="Mon, 30 Nov 2026 12:00:00 -0800")

    def post(raw):
        client = Client()
        if provider == "mailgun":
            return post_mailgun(client, mailgun_fields(raw))
        if provider == "postmark":
            return post_postmark(client, postmark_payload(raw), **basic())
        return post_sendgrid(client, {"to": "sendgrid@acme.test", "email": raw}, **basic())

    answers = [post(first), post(second), post(first), post(second)]
    assert [a.status_code for a in answers] == [202, 202, 200, 200], [a.content for a in answers]
    events = [a.json()["inbox_events"][0]["inbox_event_id"] for a in answers]
    assert events[0] == events[2] and events[1] == events[3] and events[0] != events[1]
    assert list(InboxEvent.objects.order_by("pk").values_list("message_id_reused", flat=True)) == [False, True]


def test_provider_own_ids_are_never_split(tenant):
    from intake.models import Mailbox

    gmail = Mailbox.objects.create(tenant=tenant, slug="gmail-box", address="g@acme.test", provider="gmail")
    first = services.ingest(gmail, "18c2f0a9d1e2b3c4", servicenow_update("New", "a"), source="gmail")
    # Gmail's id names one stored message; a refetch that differs (labels, trace) is still that message.
    again = services.ingest(gmail, "18c2f0a9d1e2b3c4", servicenow_update("New", "b"), source="gmail")
    assert again.duplicate and again.inbox_event_id == first.inbox_event_id


def test_an_event_stored_before_fingerprints_is_compared_by_its_kept_bytes(mailbox):
    raw = servicenow_update("New", "Legacy row.")
    stored = services.ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw")
    InboxEvent.objects.filter(pk=stored.inbox_event_id).update(fingerprint="")
    assert services.ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw").duplicate
    other = servicenow_update("Resolved", "Legacy row fixed.")
    assert not services.ingest(mailbox, provider_message_id_for_raw(other), other, source="raw").duplicate


@pytest.mark.django_db(transaction=True)
def test_racing_deliveries_of_two_messages_with_one_id_store_exactly_two_events(monkeypatch):
    from intake.models import Mailbox, Tenant

    tenant = Tenant.objects.create(slug="race")
    box = Mailbox.objects.create(tenant=tenant, slug="race-box", address="support@acme.test", provider="raw")
    bodies = [servicenow_update("In Progress", "one"), servicenow_update("Resolved", "two")] * 4
    barrier, results, errors = threading.Barrier(len(bodies)), [], []

    def deliver(raw):
        try:
            barrier.wait()
            results.append(services.ingest(box, provider_message_id_for_raw(raw), raw, source="raw"))
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver, args=(raw,)) for raw in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert InboxEvent.objects.filter(mailbox=box).count() == 2
    assert sum(not r.duplicate for r in results) == 2 and len({r.inbox_event_id for r in results}) == 2


def test_a_reply_to_a_reused_id_goes_to_the_earliest_ticket_or_the_one_it_names_and_is_flagged(mailbox):
    client = Client()
    for raw in (servicenow_update("In Progress", "first"), servicenow_update("Resolved", "second")):
        event_id = post_raw(client, mailbox.slug, raw).json()["inbox_event_id"]
        assert process_inbox_event(event_id) == "created"
    earliest, later = TicketMapping.objects.filter(action="create_ticket").order_by("created_at", "pk")

    def reply(subject, body):
        raw = (
            f"From: Dana Smith <acme@service-now.com>\r\nTo: support@acme.test\r\nSubject: {subject}\r\n"
            f"Message-ID: <reply-{subject.__hash__() & 0xFFFF}@acme.service-now.com>\r\n"
            f"In-Reply-To: {SERVICENOW_ID}\r\nReferences: {SERVICENOW_ID}\r\n"
            "Date: Tue, 01 Dec 2026 08:00:00 -0800\r\n\r\n" + body + "\r\n"
        ).encode()
        event_id = post_raw(client, mailbox.slug, raw).json()["inbox_event_id"]
        assert process_inbox_event(event_id) == "created"
        return InboxEvent.objects.get(pk=event_id)

    plain = reply("RE: Incident INC0010042", "Thanks, confirmed on my side.")
    named = reply(f"RE: [#MR-{later.pk}] Incident INC0010042", "Still broken for me.")
    comments = {m.inbox_event_id: m.ticket_id for m in TicketMapping.objects.filter(action="add_comment")}
    assert comments == {plain.pk: earliest.ticket_id, named.pk: later.ticket_id}
    assert "ambiguous_thread" in plain.details["flags"] and "ambiguous_thread" in named.details["flags"]
    assert Ticket.objects.count() == 2
    assert Intent.objects.filter(action="add_comment", state="succeeded").count() == 2


@pytest.mark.parametrize(
    "one, other",
    [
        (b"\x00", b"\x01"),
        (b"not a message at all", b"not a message at all, either"),
        (b"Subject: x\r\njunk line one\r\n\r\nbody", b"Subject: x\r\njunk line two\r\n\r\nbody"),
        (b"From: a@example.com\r\n\r\nbody", b"From: b@example.com\r\n\r\nbody"),
    ],
)
def test_content_that_is_not_a_header_of_the_author_still_tells_messages_apart(one, other):
    # Bytes outside the author's headers count: two different non-messages are never one event.
    assert content_fingerprint(one) != content_fingerprint(other)
    assert provider_message_id_for_raw(one) != provider_message_id_for_raw(other)

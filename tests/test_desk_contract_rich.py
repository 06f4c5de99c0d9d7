"""The ticket a desk can work with, for every destination kind, through the whole pipeline against its
FakeDesk dialect over real HTTP: files and inline images (each exactly once, whatever answer is lost),
the requester and the people copied, who a reply is written as, agents' forwards, replies to closed
tickets and replies to the desk's own notifications. What each kind does is what its adapter declares
(`capabilities`) and its kit reads back from the fake (tests/destination_kits/<kind>.py).
"""

import hashlib
import importlib
import struct
import time
import zlib
from email.message import EmailMessage

import pytest
from django.utils import timezone

from intake.models import InboxEvent
from reconciliation import services as console
from reconciliation.selectors import recovery_queue
from tests.destination_kits import KINDS
from tests.factories import ingest_message
from tests.senderauth import stamped, trust_our_mta
from tests.support.contract import intent_of, settle_unknown
from tests.support.users import make_user
from ticketing import attachments
from ticketing.destinations import adapter_for
from ticketing.models import Intent, TicketMapping
from ticketing.services import process_inbox_event

pytestmark = pytest.mark.usefixtures("scanner_off")

AGENTS_DOMAIN = "acme-support.test"


def _png(width: int) -> bytes:
    """A real PNG (`width` x 1 pixels): each width its own bytes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(1))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, 1, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"
INVOICE = PDF.replace(b"%%EOF", b"% invoice 4471\n%%EOF")
SCREENSHOT = _png(3)
LOGO = _png(2)  # the inline image
TOOL = b"MZ\x90\x00\x03\x00\x00\x00\x04\x00\x00\x00\xff\xff\x00\x00" + b"\x00" * 200  # a Windows executable


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def apple_mail_message(
    *,
    sender="Alice Example <alice@customer.test>",
    cc="",
    executable=False,
    subject="Invoice 4471 charged twice",
    message_id=None,
) -> bytes:
    """As Apple Mail writes a message with an inline image and attachments: mixed > related > alternative."""
    message = EmailMessage()
    message["From"] = sender
    message["To"] = "Acme Support <support@acme.test>"
    if cc:
        message["Cc"] = cc
    message["Subject"] = subject
    message["Date"] = "Tue, 01 Dec 2026 09:14:00 +0100"
    message["Message-ID"] = message_id or f"<{time.monotonic_ns()}@customer.test>"
    message["X-Mailer"] = "Apple Mail (2.3774.300.61.1.2)"
    message.set_content("Hello,\n\nThe invoice shows the same line twice, see the screenshot.\n\nAlice\n")
    message.add_alternative(
        "<html><body><p>Hello,</p><p>The invoice shows the same line <b>twice</b>:</p>"
        '<img src="cid:logo.4471@customer.test" alt="logo"><p>Alice</p></body></html>',
        subtype="html",
    )
    html_part = message.get_payload()[1]
    html_part.add_related(
        LOGO,
        maintype="image",
        subtype="png",
        cid="<logo.4471@customer.test>",
        filename="logo.png",
        disposition="inline",
    )
    message.add_attachment(INVOICE, maintype="application", subtype="pdf", filename="invoice-4471.pdf")
    message.add_attachment(SCREENSHOT, maintype="image", subtype="png", filename="screenshot.png")
    if executable:
        message.add_attachment(TOOL, maintype="application", subtype="octet-stream", filename="fixer.exe")
    return message.as_bytes()


def plain_reply(
    *,
    sender: str,
    to_id: str,
    body: str,
    cc: str = "",
    subject="Re: Invoice 4471 charged twice",
    in_reply_to: bool = True,
) -> bytes:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = "support@acme.test"
    if cc:
        message["Cc"] = cc
    message["Subject"] = subject
    message["Date"] = "Tue, 01 Dec 2026 11:02:00 +0100"
    message["Message-ID"] = f"<{time.monotonic_ns()}@reply.test>"
    if in_reply_to:
        message["In-Reply-To"] = to_id
        message["References"] = to_id
    message.set_content(body)
    return message.as_bytes()


class Desk:
    def __init__(self, kit, desk, destination):
        self.kit, self.desk, self.destination = kit, desk, destination
        self.capabilities = adapter_for(destination).capabilities

    def records(self) -> list[dict]:
        return self.desk.tickets()

    def files(self, record: dict) -> dict[str, int]:
        """sha256 -> how many copies the record holds."""
        counts: dict[str, int] = {}
        for attachment in record.get("attachments") or []:
            counts[attachment["sha256"]] = counts.get(attachment["sha256"], 0) + 1
        return counts


@pytest.fixture(params=KINDS)
def desk(request, tenant, mailbox, desk_factory, monkeypatch):
    kit = importlib.import_module(f"tests.destination_kits.{request.param}")
    fake = desk_factory(dialect=kit.DIALECT, **kit.DESK_OPTIONS)
    tenant.settings = {**(tenant.settings or {}), "agent_addresses": [f"@{AGENTS_DOMAIN}"]}
    tenant.save(update_fields=["settings"])
    return Desk(kit, fake, kit.configure(tenant, fake, monkeypatch))


def carry_through(event_id: int, seconds: float = 20.0) -> None:
    """What workers and sweeps do until the event's intents are done: the ticket-making action, then its
    files (`attach_files`), each retried when due, unknown outcomes settled."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        process_inbox_event(event_id)
        making = intent_of(event_id)
        if making is not None and making.state in ("unknown", "pending", "retry_wait"):
            settle_unknown(event_id)
        files = Intent.objects.filter(inbox_event_id=event_id, action="attach_files").first()
        if files is None or files.state == "succeeded":
            if TicketMapping.objects.filter(inbox_event_id=event_id).exists():
                return
        elif files.state in ("pending", "retry_wait", "unknown"):
            if files.state == "unknown":
                from ticketing import intents

                intents.resolve_unknown(files.pk)
            Intent.objects.filter(pk=files.pk, state__in=("pending", "retry_wait")).update(
                next_attempt_at=timezone.now()
            )
            attachments.deliver(files.pk, "test-worker")
        time.sleep(0.05)
    raise AssertionError(f"event {event_id} not carried through in {seconds}s")


def the_record(desk: Desk, event_id: int) -> dict:
    mapping = TicketMapping.objects.get(inbox_event_id=event_id, action="create_ticket")
    [record] = [r for r in desk.records() if desk.kit.ticket_id_of(r) == mapping.ticket_id]
    return record


# --- files ----------------------------------------------------------------------------------------


def test_two_attachments_and_an_inline_image_reach_the_record_once_each(desk, mailbox):
    event_id = ingest_message(mailbox, raw=apple_mail_message()).inbox_event_id
    carry_through(event_id)
    record = the_record(desk, event_id)
    assert desk.files(record) == {sha(INVOICE): 1, sha(SCREENSHOT): 1, sha(LOGO): 1}
    description = record["description"]
    for name in ("invoice-4471.pdf", "screenshot.png", "logo.png"):
        assert name in description or name in str(record.get("comments"))


def test_a_released_quarantined_file_is_listed_on_the_ticket_and_never_sent(desk, mailbox, tenant):
    event_id = ingest_message(mailbox, raw=apple_mail_message(executable=True)).inbox_event_id
    assert process_inbox_event(event_id) == InboxEvent.State.QUARANTINED
    security = make_user("sec", groups=["security"], tenants=[tenant])
    console.do_release_quarantine(security, event_id, note="the customer's own tool, checked")
    carry_through(event_id)
    record = the_record(desk, event_id)
    assert desk.files(record) == {sha(INVOICE): 1, sha(SCREENSHOT): 1, sha(LOGO): 1}
    text = record["description"] + str(record.get("comments"))
    assert "fixer.exe" in text and "not attached here" in text
    assert f"/admin/reconciliation/recoveryitem/{event_id}/attachment/" in text


def _writes(desk: Desk) -> int:
    return len([w for w in desk.desk.requests_log() if w["method"] in ("POST", "PUT", "PATCH")])


def test_a_lost_answer_on_any_call_never_doubles_a_file(desk, mailbox, tenant):
    """Each write of a fault-free run in turn loses its answer (the desk did it, we never hear): every
    file still ends on the one record exactly once, or the item is held for a person with no file doubled."""
    first = ingest_message(mailbox, raw=apple_mail_message()).inbox_event_id
    carry_through(first)
    writes = _writes(desk)
    assert writes >= 1
    for lost in range(1, writes + 1):
        desk.desk.reset()
        desk.desk.set_plan(["ok"] * (lost - 1) + ["drop_after_commit"])
        event_id = ingest_message(mailbox, raw=apple_mail_message(subject=f"Invoice 4471, round {lost}")).inbox_event_id
        try:
            carry_through(event_id)
        except AssertionError:
            held = intent_of(event_id)
            assert held.state == "held", f"write {lost}: intent {held.state}"  # a kind with no protection
            assert len(desk.records()) <= 1
            continue
        [record] = desk.records()
        assert desk.files(record) == {sha(INVOICE): 1, sha(SCREENSHOT): 1, sha(LOGO): 1}, f"write {lost} lost"


# --- people --------------------------------------------------------------------------------------


def test_the_requester_and_two_copied_people_end_on_the_record_as_the_kind_declares(desk, mailbox):
    raw = apple_mail_message(cc="Bob Buyer <bob@customer.test>, carol@partner.test, support@acme.test")
    event_id = ingest_message(mailbox, raw=raw).inbox_event_id
    carry_through(event_id)
    record = the_record(desk, event_id)
    people = record["people"]
    assert people["requester"] == "alice@customer.test"
    if desk.kit.CC_ON_RECORD:
        assert sorted(people["cc"]) == ["bob@customer.test", "carol@partner.test"]
    else:
        assert "bob@customer.test" in record["description"] and "carol@partner.test" in record["description"]
    assert "support@acme.test" not in people["cc"]


def _ticket_with_reply(desk, mailbox, reply: bytes) -> tuple[dict, int]:
    raw = apple_mail_message(message_id="<root-4471@customer.test>")
    first = ingest_message(mailbox, raw=raw).inbox_event_id
    carry_through(first)
    reply_id = ingest_message(mailbox, raw=reply).inbox_event_id
    carry_through(reply_id)
    return the_record(desk, first), reply_id


def test_a_customer_reply_is_a_public_comment_written_as_the_customer(desk, mailbox):
    reply = plain_reply(
        sender="Alice Example <alice@customer.test>",
        to_id="<root-4471@customer.test>",
        body="Still charged twice today.\n",
    )
    record, reply_id = _ticket_with_reply(desk, mailbox, reply)
    [comment] = [c for c in desk.kit.comment_records_of(record) if "Still charged twice today." in c["body"]]
    assert comment["public"] is True
    if desk.kit.AUTHORED_COMMENTS:
        assert comment["author"] == "alice@customer.test"
    else:
        assert "alice@customer.test" in comment["body"].split("\n", 2)[0] + comment["body"].split("\n", 2)[1]
    assert TicketMapping.objects.get(inbox_event_id=reply_id).action == "add_comment"


def test_an_agents_reply_copying_support_is_an_internal_note(desk, mailbox):
    reply = plain_reply(
        sender=f"Sam Agent <sam@{AGENTS_DOMAIN}>",
        to_id="<root-4471@customer.test>",
        body="Refund approved on our side; waiting for finance.\n",
        cc="support@acme.test",
    )
    record, _ = _ticket_with_reply(desk, mailbox, reply)
    [note] = [c for c in desk.kit.comment_records_of(record) if "Refund approved" in c["body"]]
    assert note["public"] is False


def forward_from(agent: str) -> bytes:
    """As Gmail writes a forward: the original message quoted under its "Forwarded message" block."""
    message = EmailMessage()
    message["From"] = agent
    message["To"] = "support@acme.test"
    message["Subject"] = "Fwd: Cannot log in since Monday"
    message["Date"] = "Tue, 01 Dec 2026 10:00:00 +0100"
    message["Message-ID"] = f"<{time.monotonic_ns()}@mail.gmail.com>"
    message.set_content(
        "Customer called about this, forwarding.\n\n"
        "---------- Forwarded message ---------\n"
        "From: Dana Doe <dana@customer.test>\n"
        "Date: Mon, 30 Nov 2026 at 17:41\n"
        "Subject: Cannot log in since Monday\n"
        "To: <sam@acme-support.test>\n\n"
        "Hi Sam, I cannot log in since Monday. The reset link expires at once.\n\nDana\n"
    )
    return message.as_bytes()


def test_an_agents_forward_makes_the_original_sender_the_requester(desk, mailbox):
    trust_our_mta(mailbox)
    raw = stamped(forward_from(f"Sam Agent <sam@{AGENTS_DOMAIN}>"), AGENTS_DOMAIN)
    event_id = ingest_message(mailbox, raw=raw).inbox_event_id
    carry_through(event_id)
    assert the_record(desk, event_id)["people"]["requester"] == "dana@customer.test"
    assert InboxEvent.objects.get(pk=event_id).audit_events.filter(kind="requester_from_forward").exists()


def test_an_unauthenticated_agents_forward_keeps_its_sender(desk, mailbox):
    """Anyone can write an agent's From: without our MTA's word for it, a forward names no other requester."""
    event_id = ingest_message(mailbox, raw=forward_from(f"Sam Agent <sam@{AGENTS_DOMAIN}>")).inbox_event_id
    carry_through(event_id)
    assert the_record(desk, event_id)["people"]["requester"] == f"sam@{AGENTS_DOMAIN}"


def test_a_forward_from_anyone_else_keeps_its_sender(desk, mailbox):
    event_id = ingest_message(mailbox, raw=forward_from("Eve Colleague <eve@customer.test>")).inbox_event_id
    carry_through(event_id)
    assert the_record(desk, event_id)["people"]["requester"] == "eve@customer.test"


# --- closed tickets and the desk's own references -------------------------------------------------


def test_a_reply_to_a_closed_ticket_follows_the_destinations_policy(desk, mailbox):
    first = ingest_message(mailbox, raw=apple_mail_message(message_id="<root-closed@customer.test>")).inbox_event_id
    carry_through(first)
    closed = the_record(desk, first)
    desk.desk.close(closed["id"])
    reply = plain_reply(
        sender="Alice Example <alice@customer.test>",
        to_id="<root-closed@customer.test>",
        body="It happened again this month.\n",
    )
    reply_id = ingest_message(mailbox, raw=reply).inbox_event_id
    if "follow_up" in desk.capabilities.closed_policies:
        carry_through(reply_id)
        mapping = TicketMapping.objects.get(inbox_event_id=reply_id, action="create_ticket")
        [follow_up] = [r for r in desk.records() if desk.kit.ticket_id_of(r) == mapping.ticket_id]
        assert str(desk.kit.follow_up_of(follow_up)) == desk.kit.ticket_id_of(closed)
        assert "It happened again this month." in follow_up["description"]
        assert InboxEvent.objects.get(pk=reply_id).state == "completed"
    else:
        process_inbox_event(reply_id)
        event = InboxEvent.objects.get(pk=reply_id)
        assert (event.state, event.reason_code) == ("failed", "ticket_closed")
        assert event in recovery_queue()


def test_a_reply_quoting_the_desks_own_reference_threads_to_that_record(desk, mailbox):
    if not adapter_for(desk.destination).reference_patterns:
        # A kind whose desk writes no reference of its own: the reply is a new ticket, as the docs say.
        assert desk.kit.desk_reference({}) in ("", None)
        return
    first = ingest_message(mailbox, raw=apple_mail_message()).inbox_event_id
    carry_through(first)
    record = the_record(desk, first)
    reference = desk.kit.desk_reference(record)
    reply = plain_reply(
        sender="Alice Example <alice@customer.test>",
        to_id="",
        in_reply_to=False,
        subject=f"Re: {reference} Invoice 4471 charged twice",
        body=f"Answering your note. {reference}\nStill charged twice.\n",
    )
    reply_id = ingest_message(mailbox, raw=reply).inbox_event_id
    carry_through(reply_id)
    mapping = TicketMapping.objects.get(inbox_event_id=reply_id)
    assert mapping.action == "add_comment" and mapping.ticket_id == desk.kit.ticket_id_of(record)
    assert len(desk.records()) == 1

"""Replies carry only their new text; descriptions fit the destination's size limit.

`intake.replytext.reply_text` on replies as real clients write them (parsed
from MIME, as the pipeline does), a reply through the pipeline onto an
existing built-in ticket, and `Work.perform` trimming for Zendesk's limit.
"""

import time
from email.message import EmailMessage
from types import SimpleNamespace

import pytest

from intake.mime import ParsedMessage, parse_message
from intake.models import InboxEvent, Mailbox, Tenant
from intake.replytext import reply_text, strip_reply
from tests.factories import ingest_message
from ticketing.destinations.base import DestinationAdapter, TicketResult
from ticketing.execution import Work
from ticketing.models import Destination, Intent, Ticket, TicketComment, TicketMapping
from ticketing.services import process_inbox_event


def mime(plain: str | None = None, html: str | None = None, charset="utf-8") -> ParsedMessage:
    message = EmailMessage()
    message["From"] = "Jane Doe <jane@example.com>"
    message["To"] = "support@acme.test"
    message["Subject"] = "Re: [#MR-7] Printer on fire"
    message["In-Reply-To"] = "<ack-7@mailroom.invalid>"
    if plain is not None:
        message.set_content(plain, charset=charset)
        if html is not None:
            message.add_alternative(html, subtype="html", charset=charset)
    else:
        message.set_content(html, subtype="html", charset=charset)
    return parse_message(message.as_bytes())


# --- clients ------------------------------------------------------------------------------------

GMAIL_PLAIN = """\
Thanks, the new driver fixed it. Tray 2 still squeaks, though.

On Mon, Mar 4, 2024 at 10:15 AM Acme Support <support@acme.test> wrote:

> Hello,
>
> we have received your request and opened ticket MR-7.
>
> Reply to this email to add to it; keep [#MR-7] in the subject.
>
> --
> support@acme.test
>
"""

GMAIL_HTML = """\
<div dir="ltr">Thanks, the new driver fixed it. Tray 2 still squeaks, though.<div><br></div></div><br>\
<div class="gmail_quote gmail_quote_container"><div dir="ltr" class="gmail_attr">Am Mo., 4. März 2024 um \
10:15&nbsp;Uhr schrieb Acme Support &lt;<a href="mailto:support@acme.test">support@acme.test</a>&gt;:<br></div>\
<blockquote class="gmail_quote" style="margin:0px 0px 0px 0.8ex;border-left:1px solid rgb(204,204,204);\
padding-left:1ex">Hello,<br><br>we have received your request and opened ticket MR-7.<br></blockquote></div>
"""


def test_gmail_plain_text_reply():
    assert reply_text(mime(GMAIL_PLAIN, GMAIL_HTML)) == (
        "Thanks, the new driver fixed it. Tray 2 still squeaks, though."
    )


def test_gmail_html_only_reply_is_cut_at_gmail_quote():
    parsed = mime(html=GMAIL_HTML)
    assert parsed.body_source == "html"
    assert "we have received your request" in parsed.text  # the converted HTML holds the history
    assert reply_text(parsed) == "Thanks, the new driver fixed it. Tray 2 still squeaks, though."


def test_gmail_html_forward_keeps_the_forwarded_message():
    html = (
        '<div dir="ltr">FYI, from our vendor.<br><br><div class="gmail_quote"><div dir="ltr" '
        'class="gmail_attr">---------- Forwarded message ---------<br>From: <strong>Parts Inc</strong> '
        "&lt;orders@parts.example&gt;<br>Date: Mon, Mar 4, 2024 at 9:00 AM<br>Subject: Toner<br>"
        "To: &lt;jane@example.com&gt;<br></div><br><br>The toner ships on Friday.</div></div>"
    )
    text = reply_text(mime(html=html))
    assert text.startswith("FYI, from our vendor.") and "The toner ships on Friday." in text


def test_a_plain_text_forward_keeps_the_forwarded_message():
    body = (
        "FYI, from our vendor.\n\n---------- Forwarded message ---------\nFrom: Parts Inc <orders@parts.example>\n"
        "Date: Mon, Mar 4, 2024 at 9:00 AM\nSubject: Toner\nTo: <jane@example.com>\n\nThe toner ships on Friday.\n"
    )
    assert reply_text(mime(body)) == body.strip()


def test_outlook_original_message_separator():
    body = """\
The printer still jams on tray 2 after the update.

Bob Smith
Facilities, Example Corp

-----Original Message-----
From: Acme Support <support@acme.test>
Sent: Monday, March 4, 2024 10:15 AM
To: Bob Smith <bob@example.com>
Subject: RE: [#MR-7] Printer on fire

Please install the new driver.
"""
    assert reply_text(mime(body)) == (
        "The printer still jams on tray 2 after the update.\n\nBob Smith\nFacilities, Example Corp"
    )


def test_outlook_header_block():
    body = """\
Tray 1 works now, tray 2 does not.

Get Outlook for iOS<https://aka.ms/o0ukef>
________________________________
From: Acme Support <support@acme.test>
Sent: Monday, March 4, 2024 10:15:02 AM
To: Bob Smith <bob@example.com>
Cc: Facilities <facilities@example.com>
Subject: Re: [#MR-7] Printer on fire

Please try tray 1.
"""
    assert reply_text(mime(body)) == "Tray 1 works now, tray 2 does not."


def test_outlook_header_block_without_a_separator_line():
    body = """\
Tray 1 works now.

From: Acme Support <support@acme.test>
Sent: Monday, March 4, 2024 10:15 AM
To: Bob Smith <bob@example.com>
Subject: Re: [#MR-7] Printer on fire

Please try tray 1.
"""
    assert reply_text(mime(body)) == "Tray 1 works now."


def test_apple_mail_from_an_iphone():
    body = """\
Still broken after the restart.

Sent from my iPhone

> On 4 Mar 2024, at 10:15, Acme Support <support@acme.test> wrote:
>
> Please restart it.
"""
    assert reply_text(mime(body)) == "Still broken after the restart."


def test_thunderbird_with_signature():
    body = """\
Restarted, same error: E-502.

-- 
Jane Doe
Example Corp | +1 555 0100

On 04.03.24 10:15, Acme Support wrote:
> Please restart it.
>
> -- 
> support@acme.test
"""
    assert reply_text(mime(body)) == "Restarted, same error: E-502."


def test_german_client():
    body = """\
Der Drucker druckt wieder, danke!

Viele Grüße
Hans

Am Mo., 4. März 2024 um 10:15 Uhr schrieb Acme Support <support@acme.test>:
> Bitte den Drucker neu starten.
"""
    assert reply_text(mime(body)) == "Der Drucker druckt wieder, danke!\n\nViele Grüße\nHans"


def test_german_outlook():
    body = """\
Danke, geht wieder.

Von: Acme Support <support@acme.test>
Gesendet: Montag, 4. März 2024 10:15
An: Hans Müller <hans@example.de>
Betreff: AW: [#MR-7] Drucker

Bitte neu starten.
"""
    assert reply_text(mime(body)) == "Danke, geht wieder."


def test_chinese_foxmail():
    body = """\
打印机还是不工作，错误代码 E-502。

------------------ 原始邮件 ------------------
发件人: "Acme Support"<support@acme.test>;
发送时间: 2024年3月4日(星期一) 上午10:15
收件人: "张三"<zhang@example.cn>;
主题: 回复: [#MR-7] 打印机

请重新启动。
"""
    assert reply_text(mime(body, charset="gb18030")) == "打印机还是不工作，错误代码 E-502。"


def test_chinese_gmail_and_full_width_header_block():
    gmail = "打印机还是不工作。\n\n2024年3月4日周一 10:15，Acme Support <support@acme.test> 写道：\n> 请重新启动。\n"
    assert reply_text(mime(gmail)) == "打印机还是不工作。"
    outlook = (
        "打印机还是不工作。\n\n发件人：Acme Support <support@acme.test>\n发送时间：2024年3月4日 10:15\n"
        "收件人：张三 <zhang@example.cn>\n主题：回复：打印机\n\n请重新启动。\n"
    )
    assert reply_text(mime(outlook)) == "打印机还是不工作。"


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            "Ça marche maintenant.\n\nLe lun. 4 mars 2024 à 10:15, Acme Support <support@acme.test> a écrit :\n"
            "> Redémarrez.\n",
            "Ça marche maintenant.",
        ),
        (
            "Ya funciona.\n\nEl lun, 4 mar 2024 a las 10:15, Acme Support (<support@acme.test>) escribió:\n"
            "> Reinicie.\n",
            "Ya funciona.",
        ),
        (
            "Het werkt weer.\n\nOp ma 4 mrt 2024 om 10:15 schreef Acme Support <support@acme.test>:\n> Herstart.\n",
            "Het werkt weer.",
        ),
        (
            "Het werkt weer.\n\nOp 4 mrt. 2024 om 10:15 heeft Acme Support <support@acme.test> het volgende "
            "geschreven:\n\n> Herstart.\n",
            "Het werkt weer.",
        ),
        (
            "まだ動きません。\n\n2024年3月4日(月) 10:15 Acme Support <support@acme.test>:\n> 再起動してください。\n",
            "まだ動きません。",
        ),
    ],
)
def test_other_languages(body, expected):
    assert reply_text(mime(body)) == expected


def test_top_posted_reply_with_signature_and_a_long_history():
    body = """\
Hi team,

the printer on floor 3 is smoking again. Can someone come by today?

- it started at 9:00
- the display shows E-502

Thanks, but please hurry,
Jane

-- 
Jane Doe | Office Manager
Example Corp, 1 Main St

On Mon, Mar 4, 2024 at 10:15 AM Acme Support <support@acme.test> wrote:
> Hello,
> we have received your request and opened ticket MR-7.
>
> On Sun, Mar 3, 2024 at 8:00 PM Jane Doe <jane@example.com> wrote:
>> The printer is on fire.
"""
    assert reply_text(mime(body)) == (
        "Hi team,\n\nthe printer on floor 3 is smoking again. Can someone come by today?\n\n"
        "- it started at 9:00\n- the display shows E-502\n\nThanks, but please hurry,\nJane"
    )


def test_inline_answers_below_the_quote_keep_the_answers():
    body = """\
On 04.03.24 10:15, Acme Support wrote:
> Which tray jams?
Tray 2.
> Which error code?
E-502.
"""
    assert reply_text(mime(body)) == "Tray 2.\nE-502."


def test_text_customers_write_is_kept():
    # The library would drop these as sign-offs and disclaimers; they are the message.
    body = "Thanks, but it still fails:\n/var/log/cups/error_log says\nWarning: the mail queue is full.\n"
    assert reply_text(mime(body)) == body.strip()


def test_never_empty_when_the_message_had_text():
    only_quote = "> On Mon, Acme Support wrote:\n> Please restart it.\n"
    assert reply_text(mime(only_quote)) == only_quote.strip()
    assert reply_text(mime("-- \nJane Doe\nExample Corp\n")) == "-- \nJane Doe\nExample Corp"
    assert reply_text(mime("Sent from my iPhone\n")) == "Sent from my iPhone"
    assert reply_text(ParsedMessage()) == ""


@pytest.mark.parametrize(
    "hostile",
    [
        "On " * 21000 + "\n",
        "\n" * 65000 + "x",
        "a" + " " * 65000 + "b",
        "Am " * 21000 + "schrieb",
        ("From: a\nSent: b\n" * 4000),
        "> " * 30000,
    ],
)
def test_hostile_text_is_handled_in_linear_time(hostile):
    started = time.perf_counter()
    assert strip_reply(hostile[:65536]).strip()
    assert time.perf_counter() - started < 2


# --- through the pipeline ------------------------------------------------------------------------


def receive(mailbox, **message_fields) -> int:
    return ingest_message(mailbox, **message_fields).inbox_event_id


REPLY = """\
The new driver fixed it, thank you!

Sent from my iPhone

On Mon, Mar 4, 2024 at 10:15 AM Acme Support <support@acme.test> wrote:
> Please install the new driver.
> On Sun, Mar 3, 2024 at 8:00 PM Jane Doe <jane@example.com> wrote:
>> Printer on fire.
"""


def test_a_reply_in_a_thread_adds_only_its_new_text_to_the_ticket(mailbox, scanner_off):
    root = receive(
        mailbox,
        sender="jane@example.com",
        message_id="<root@example.com>",
        subject="Printer",
        body="Printer on fire.\n",
    )
    assert process_inbox_event(root) == "created"
    mapping = TicketMapping.objects.get(inbox_event_id=root)
    reply = receive(
        mailbox,
        sender="jane@example.com",
        subject="Re: Printer",
        body=REPLY,
        extra_headers={"In-Reply-To": "<root@example.com>", "References": "<root@example.com>"},
    )
    assert process_inbox_event(reply) == "created"
    assert process_inbox_event(reply) == "done"

    [comment] = TicketComment.objects.all()
    assert comment.ticket_id == int(mapping.ticket_id)
    assert comment.body == "The new driver fixed it, thank you!"
    assert Ticket.objects.count() == 1
    event = InboxEvent.objects.get(pk=reply)
    assert event.details["reply_text"] == comment.body  # stored at normalization
    assert b"Printer on fire." in bytes(event.raw)  # the whole message is still there


def test_an_event_normalized_before_reply_text_was_stored_gets_it_computed(mailbox, scanner_off):
    root = receive(mailbox, sender="jane@example.com", message_id="<root@example.com>", subject="Printer")
    assert process_inbox_event(root) == "created"
    reply = receive(
        mailbox,
        sender="jane@example.com",
        subject="Re: Printer",
        body=REPLY,
        extra_headers={"In-Reply-To": "<root@example.com>", "References": "<root@example.com>"},
    )
    # As an older normalization left it: judged ready, details without reply_text.
    InboxEvent.objects.filter(pk=reply).update(state="ready", sender="jane@example.com", details={})
    assert process_inbox_event(reply) == "created"
    assert TicketComment.objects.get().body == "The new driver fixed it, thank you!"


def test_the_stored_reply_text_is_what_every_attempt_sends(mailbox, scanner_off):
    root = receive(mailbox, sender="jane@example.com", message_id="<root@example.com>", subject="Printer")
    assert process_inbox_event(root) == "created"
    reply = receive(
        mailbox,
        sender="jane@example.com",
        subject="Re: Printer",
        body=REPLY,
        extra_headers={"In-Reply-To": "<root@example.com>", "References": "<root@example.com>"},
    )
    InboxEvent.objects.filter(pk=reply).update(
        state="ready", sender="jane@example.com", details={"reply_text": "As stored at normalization."}
    )
    assert process_inbox_event(reply) == "created"
    assert TicketComment.objects.get().body == "As stored at normalization."


# --- destination size limits ---------------------------------------------------------------------


def long_text(paragraphs=300, chars=250) -> str:
    return "\n\n".join(f"Paragraph {n}: " + "x" * chars for n in range(paragraphs))


def intent(key="key-1"):
    return SimpleNamespace(idempotency_key=key, external_ref=f"mailroom-{key}")


def test_a_description_over_zendesks_limit_is_trimmed_at_a_paragraph_with_a_notice(desk, monkeypatch, settings):
    from ticketing.destinations import adapter_for

    settings.MAILROOM_PUBLIC_URL = "https://mailroom.acme.test"
    monkeypatch.setenv("ZD_CREDENTIALS", f"agent@example.com/token:{desk.token}")
    adapter = adapter_for(
        Destination(
            kind="zendesk",
            slug="zd",
            base_url=desk.url,
            credentials_ref="env:ZD_CREDENTIALS",
            settings={"read_timeout": 5},
        )
    )
    assert adapter.max_description_chars == 64_000
    text = long_text()
    assert len(text) > 70_000
    parsed = ParsedMessage(subject="Logs", sender="jane@example.com", text=text)
    work = Work(stored_event(pk=4242, details={}), Intent.Action.CREATE_TICKET, parsed)

    first = work.perform(adapter, intent())
    again = work.perform(adapter, intent())  # a retry sends the same body under the same key

    assert first.ticket_id == again.ticket_id
    [ticket] = desk.tickets()
    description = ticket["description"]
    assert len(description) <= 64_000
    kept, notice = description.split("\n\n[Mailroom: ", 1)
    assert text.startswith(kept) and text[len(kept) :].startswith("\n\nParagraph ")  # a whole paragraph
    assert len(kept) > 60_000
    assert "shortened" in notice
    assert "https://mailroom.acme.test/admin/intake/inboxevent/4242/change/" in notice
    assert "4242" in notice


def stored_event(*, pk: int, details: dict):
    """An event as `Work` reads it, without a database: its tenant (no agents) and mailbox (default policy)."""
    return SimpleNamespace(
        pk=pk, details=details, tenant=Tenant(settings={}), tenant_id=None, mailbox=Mailbox(settings={}), history=False
    )


class RecordingAdapter(DestinationAdapter):
    max_description_chars = 1_000

    def __init__(self):
        super().__init__(None)
        self.sent = []

    def create_ticket(self, request, idempotency_key, external_ref):
        self.sent.append(request.description)
        return TicketResult(ticket_id="1")

    def add_comment(self, ticket_id, comment, idempotency_key, external_ref):
        self.sent.append(comment.body)
        return "c1"


def test_a_comment_over_the_limit_is_trimmed_the_same_way_every_time(settings):
    settings.MAILROOM_PUBLIC_URL = "https://mailroom.acme.test/"
    adapter = RecordingAdapter()
    body = long_text(paragraphs=20, chars=90)
    target = SimpleNamespace(ticket_id="1", ticket_url="")
    work = Work(
        stored_event(pk=7, details={"reply_text": body}),
        Intent.Action.ADD_COMMENT,
        ParsedMessage(sender="jane@example.com", text="ignored: the stored reply text is sent"),
        target=target,
    )
    work.perform(adapter, intent())
    work.perform(adapter, intent())
    first, second = adapter.sent
    assert first == second and len(first) <= 1_000
    assert "https://mailroom.acme.test/admin/intake/inboxevent/7/change/" in first
    assert body.startswith(first.split("\n\n[Mailroom: ")[0])


def test_no_limit_no_trim():
    adapter = RecordingAdapter()
    adapter.max_description_chars = None
    text = long_text()
    Work(stored_event(pk=1, details={}), Intent.Action.CREATE_TICKET, ParsedMessage(text=text)).perform(
        adapter, intent()
    )
    assert adapter.sent == [text]
    assert DestinationAdapter.max_description_chars is None

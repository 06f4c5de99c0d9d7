"""Forwarded mail: the original sender, read from each client's forward as that client writes it."""

import time
from email.message import EmailMessage

import pytest

from intake.mime import parse_message
from intake.mime.forwards import MAX_OWN_TEXT_CHARS, forwarded_original, is_forward_subject

AGENT = "Alice Agent <alice@acme.test>"
JANE = ("jane@example.com", "Jane Doe")


def forward(subject: str, text: str, html: str | None = None, sender: str = AGENT) -> bytes:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = "support@acme.test"
    message["Subject"] = subject
    message["Date"] = "Tue, 05 Mar 2024 09:00:00 +0000"
    message["Message-ID"] = "<fwd-1@acme.test>"
    message.set_content(text)
    if html is not None:
        message.add_alternative(html, subtype="html")
    return message.as_bytes()


def original_of(raw: bytes):
    return forwarded_original(parse_message(raw))


GMAIL_TEXT = """FYI, a customer.

---------- Forwarded message ---------
From: Jane Doe <jane@example.com>
Date: Mon, Mar 4, 2024 at 10:15\u202fAM
Subject: Printer on fire
To: <alice@acme.test>


The printer is on fire.
"""
GMAIL_HTML = (
    '<div dir="ltr">FYI, a customer.<br><br><div class="gmail_quote"><div dir="ltr" class="gmail_attr">'
    '---------- Forwarded message ---------<br>From: <strong class="gmail_sendername" dir="auto">Jane Doe'
    '</strong> <span dir="auto">&lt;<a href="mailto:jane@example.com">jane@example.com</a>&gt;</span><br>'
    'Date: Mon, Mar 4, 2024 at 10:15\u202fAM<br>Subject: Printer on fire<br>To: &lt;<a href="mailto:'
    'alice@acme.test">alice@acme.test</a>&gt;<br></div><br><br><div dir="ltr">The printer is on fire.</div>'
    "</div></div>"
)


def test_gmail_forward_with_its_html_alternative():
    assert original_of(forward("Fwd: Printer on fire", GMAIL_TEXT, GMAIL_HTML)) == JANE


def test_gmail_forward_sent_as_html_only():
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = AGENT, "support@acme.test", "Fwd: Printer on fire"
    message.set_content(GMAIL_HTML, subtype="html")
    assert original_of(message.as_bytes()) == JANE


def test_gmail_forward_in_german():
    text = (
        "\n---------- Weitergeleitete Nachricht ---------\nVon: Jane Doe <jane@example.com>\n"
        "Date: Mo., 4. März 2024 um 10:15 Uhr\nSubject: Drucker brennt\nTo: <alice@acme.test>\n\n\nHilfe!\n"
    )
    assert original_of(forward("Fwd: Drucker brennt", text)) == JANE


def test_outlook_classic_original_message_block():
    text = (
        "Please have a look.\n\n-----Original Message-----\nFrom: Jane Doe [mailto:jane@example.com] \n"
        "Sent: Monday, March 4, 2024 10:15 AM\nTo: Alice Agent <alice@acme.test>\nSubject: Printer on fire\n\n"
        "The printer is on fire.\n"
    )
    assert original_of(forward("FW: Printer on fire", text)) == JANE


def test_new_outlook_block_after_a_rule_in_german_and_french():
    german = (
        "Bitte übernehmen.\n\n________________________________\nVon: Jane Doe <jane@example.com>\n"
        "Gesendet: Montag, 4. März 2024 10:15\nAn: Alice Agent <alice@acme.test>\nBetreff: Drucker brennt\n\n"
        "Der Drucker brennt.\n"
    )
    assert original_of(forward("WG: Drucker brennt", german)) == JANE
    french = (
        "Pour toi.\n\n________________________________\nDe : Jane Doe <jane@example.com>\n"
        "Envoyé : lundi 4 mars 2024 10:15\nÀ : Alice Agent <alice@acme.test>\nObjet : Imprimante en feu\n\n"
        "L'imprimante brûle.\n"
    )
    assert original_of(forward("TR: Imprimante en feu", french)) == JANE


def test_outlook_block_without_a_rule_under_a_forward_subject():
    text = (
        "Can you take this?\n\nFrom: Jane Doe <jane@example.com>\nSent: Monday, March 4, 2024 10:15 AM\n"
        "To: Alice Agent <alice@acme.test>\nSubject: Printer on fire\n\nThe printer is on fire.\n"
    )
    assert original_of(forward("RV: Printer on fire", text)) == JANE


def test_an_outlook_reply_quotes_the_same_block_and_is_not_a_forward():
    text = (
        "We are on it.\n\n-----Original Message-----\nFrom: Jane Doe [mailto:jane@example.com]\n"
        "Sent: Monday, March 4, 2024 10:15 AM\nTo: Support <support@acme.test>\nSubject: Printer on fire\n\n"
        "The printer is on fire.\n"
    )
    assert original_of(forward("RE: Printer on fire", text)) is None


def test_apple_mail_forward():
    text = (
        "\n\nBegin forwarded message:\n\nFrom: Jane Doe <jane@example.com>\nSubject: Printer on fire\n"
        "Date: 4 March 2024 at 10:15:00 GMT\nTo: support@acme.test\n\nThe printer is on fire.\n"
    )
    assert original_of(forward("Fwd: Printer on fire", text)) == JANE


def test_apple_mail_forward_in_german_with_quoted_lines():
    text = (
        "Siehe unten.\n\nAnfang der weitergeleiteten Nachricht:\n\n> Von: Jane Doe <jane@example.com>\n"
        "> Betreff: Drucker brennt\n> Datum: 4. März 2024 um 10:15:00 MEZ\n> An: support@acme.test\n>\n"
        "> Der Drucker brennt.\n"
    )
    assert original_of(forward("WG: Drucker brennt", text)) == JANE


def test_thunderbird_forward_with_its_tab_separated_table():
    text = (
        "\n\n\n-------- Forwarded Message --------\nSubject: \tPrinter on fire\n"
        "Date: \tMon, 4 Mar 2024 10:15:00 +0000\nFrom: \tJane Doe <jane@example.com>\nTo: \tsupport@acme.test\n"
        "\n\n\nThe printer is on fire.\n"
    )
    assert original_of(forward("Fwd: Printer on fire", text)) == JANE


def test_thunderbird_forward_in_french_needs_no_forward_subject():
    text = (
        "-------- Message transféré --------\nSujet :\tImprimante en feu\nDate :\tMon, 4 Mar 2024 10:15:00 +0000\n"
        "De :\tJane Doe <jane@example.com>\nPour :\tsupport@acme.test\n\nL'imprimante brûle.\n"
    )
    assert original_of(forward("Imprimante en feu", text)) == JANE


def test_a_bare_address_has_no_display_name():
    text = (
        "---------- Forwarded message ---------\nFrom: jane@example.com\nDate: Mon, Mar 4, 2024\nSubject: x\n\nbody\n"
    )
    assert original_of(forward("Fwd: x", text)) == ("jane@example.com", "")


def test_prose_that_mentions_from_is_not_a_forward():
    text = (
        "Hello,\n\nFrom: the accounting team, a question about invoice 42.\nDate: whenever suits you.\n"
        "Subject: to approval, of course.\n\nThanks\n"
    )
    assert original_of(forward("Fwd: invoice 42", text)) is None
    assert original_of(forward("Question", "From: jane@example.com, who wrote to me yesterday\n")) is None


def test_a_forward_marker_without_a_header_block_is_not_a_forward():
    text = "---------- Forwarded message ---------\nThe printer is on fire, says Jane <jane@example.com>.\n"
    assert original_of(forward("Fwd: Printer", text)) is None


def test_a_forward_far_below_a_long_message_of_ones_own_is_not_the_forward():
    own = ("We looked into this at length. " * 20 + "\n\n") * (MAX_OWN_TEXT_CHARS // 600 + 1)
    assert original_of(forward("Fwd: Printer on fire", own + GMAIL_TEXT)) is None


def test_forward_subjects():
    for subject in (
        "Fwd: x",
        "FW: x",
        "Fw : x",
        "WG: x",
        "TR: x",
        "RV: x",
        "ENC: x",
        "VS: x",
        "Doorst: x",
        "[EXTERNAL] FW: x",
        "Fwd[2]: x",
    ):
        assert is_forward_subject(subject), subject
    for subject in ("Re: Fwd: x", "AW: x", "Forward planning", "Printer", "", "[Fwd: x"):
        assert not is_forward_subject(subject), subject


# --- attached messages ---------------------------------------------------------------------------------


def customer_message(sender="Jane Doe <jane@example.com>", subject="Printer on fire") -> EmailMessage:
    inner = EmailMessage()
    inner["From"] = sender
    inner["To"] = "alice@acme.test"
    inner["Subject"] = subject
    inner["Date"] = "Mon, 04 Mar 2024 10:15:00 +0000"
    inner["Message-ID"] = "<original@example.com>"
    inner.set_content("The printer is on fire.\n")
    inner.add_attachment(b"%PDF-1.4 fake", maintype="application", subtype="pdf", filename="photo.pdf")
    return inner


def attached_forward(subject: str, text: str, *messages: EmailMessage, files=()) -> bytes:
    outer = EmailMessage()
    outer["From"] = AGENT
    outer["To"] = "support@acme.test"
    outer["Subject"] = subject
    outer["Message-ID"] = "<fwd-2@acme.test>"
    outer.set_content(text)
    for message in messages:
        outer.add_attachment(message)  # message/rfc822, as "forward as attachment" sends it
    for name, data in files:
        outer.add_attachment(data, maintype="application", subtype="octet-stream", filename=name)
    return outer.as_bytes()


def test_an_attached_message_under_a_forward_subject():
    assert original_of(attached_forward("FW: Printer on fire", "See attached.\n", customer_message())) == JANE


def test_an_attached_message_that_is_the_only_file_is_the_forward_whatever_the_subject():
    encoded = customer_message(sender="=?utf-8?q?J=C3=BCrgen_M=C3=BCller?= <jurgen@example.com>")
    assert original_of(attached_forward("A customer", "Please help him.\n", encoded)) == (
        "jurgen@example.com",
        "Jürgen Müller",
    )


def test_an_eml_file_sent_as_octet_stream_counts_as_an_attached_message():
    outer = EmailMessage()
    outer["From"], outer["To"], outer["Subject"] = AGENT, "support@acme.test", "Fwd: Printer on fire"
    outer.set_content("\n")
    outer.add_attachment(
        customer_message().as_bytes(), maintype="application", subtype="octet-stream", filename="Printer on fire.eml"
    )
    assert original_of(outer.as_bytes()) == JANE


def test_an_attached_message_among_other_files_without_a_forward_subject_is_evidence_not_a_forward():
    raw = attached_forward(
        "Our contract",
        "Attached the mail and the contract.\n",
        customer_message(),
        files=[("contract.bin", b"\x00\x01")],
    )
    assert original_of(raw) is None


def test_attached_messages_from_different_senders_name_nobody():
    raw = attached_forward(
        "Fwd: two customers", "\n", customer_message(), customer_message(sender="Bob <bob@example.org>")
    )
    assert original_of(raw) is None
    same = attached_forward("Fwd: Jane twice", "\n", customer_message(), customer_message(subject="Again"))
    assert original_of(same) == JANE


def test_an_inline_forward_wins_over_a_file_the_original_carried():
    """Forwarded inline, the original's attached .eml becomes a file of the forward: the block says who wrote."""
    raw = attached_forward("Fwd: Printer on fire", GMAIL_TEXT, customer_message(sender="Bob <bob@example.org>"))
    assert original_of(raw) == JANE


def test_mail_that_is_no_forward():
    assert original_of(forward("Printer on fire", "The printer is on fire.\n")) is None
    assert forwarded_original(parse_message(b"")) is None


@pytest.mark.parametrize(
    "text",
    [
        "From: " * 200_000,
        ("From: x\nSent: y\n" * 60_000),
        ("-" * 10 + " Forwarded message " + "-" * 10 + "\n") * 50_000,
        "> " * 500_000 + "From: Jane <jane@example.com>",
        ("_" * 40 + "\nFrom: " + "a" * 900 + "\nSent: x\n") * 3_000,
    ],
)
def test_hostile_text_is_read_in_bounded_time(text):
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = AGENT, "support@acme.test", "FW: " + "[" * 5_000
    message.set_content(text)
    parsed = parse_message(message.as_bytes())
    started = time.perf_counter()
    forwarded_original(parsed)
    is_forward_subject("[" + "]" * 100 + " " * 10_000 + "x")
    assert time.perf_counter() - started < 0.5

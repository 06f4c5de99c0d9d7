"""Is this a mail system's report? The evidence that turns a daemon sender into a bounce. Pure, no I/O.

    bounce_evidence(parsed=parsed) -> list[str]     # ["DSN fields (Final-Recipient, Status: 5.1.1)", ...]

A `mailer-daemon@` or `postmaster@` address alone proves nothing: postmaster is a mailbox people
read and answer from (RFC 5321 §4.5.1 requires one), and a person there may write to support like
anyone else. So the `mailer_daemon` rule suppresses only with evidence, named in the finding's
detail, in the order collected here:

1. structure: a multipart/report, or a part of a report's types (message/delivery-status,
   message/global-delivery-status, message/disposition-notification, text/rfc822-headers);
2. DSN fields in the text (RFC 3464: Final-Recipient, Original-Recipient, Reporting-MTA,
   Remote-MTA, Diagnostic-Code; Action with a DSN action; Status with a status code; Postfix's
   X-Postfix-Queue-ID), or an enhanced SMTP reply ("550 5.1.1");
3. the fixed sentences of bounce templates (Postfix, Exim, qmail, Exchange, Gmail, Sendmail) in
   the subject or the text, a bounce subject ("Undeliverable:", "Returned mail:"), and the banner of
   a quoted original's headers. Only whole template sentences count: a person at postmaster@
   writing "some of your mail was not delivered" is not a bounce;
4. no body text at all (nobody writes an empty message from a mail system's address), or a From
   that names the mail system without any address (`From: MAILER-DAEMON`: no person's client
   sends that).

Only the first `MAX_TEXT_CHARS` of the text and the first `MAX_PARTS` parts are looked at: a
bounce says what it is at the top.
"""

from __future__ import annotations

import re

from ..mime import ParsedMessage

MAX_TEXT_CHARS = 20_000
MAX_PARTS = 50
REPORT_PART_TYPES = frozenset(
    {
        "message/delivery-status",
        "message/global-delivery-status",
        "message/disposition-notification",
        "text/rfc822-headers",
        "message/rfc822-headers",
    }
)
_DSN_FIELD = re.compile(
    r"^[ \t]*(Final-Recipient|Original-Recipient|Reporting-MTA|Remote-MTA|Diagnostic-Code|X-Postfix-Queue-ID)"
    r"[ \t]*:",
    re.I | re.M,
)
_DSN_STATUS = re.compile(r"^[ \t]*Status[ \t]*:[ \t]*([245]\.\d{1,3}\.\d{1,3})\b", re.I | re.M)
_DSN_ACTION = re.compile(r"^[ \t]*Action[ \t]*:[ \t]*(failed|delayed|delivered|relayed|expanded)\b", re.I | re.M)
_SMTP_REPLY = re.compile(r"\b([45]\d\d[ -][245]\.\d{1,3}\.\d{1,3})\b")
# Sentences bounce templates print, lowercase, whitespace-normalized.
BOUNCE_PHRASES = (
    "delivery to the following recipients failed",  # Gmail, Exchange
    "delivery to the following recipient failed",
    "delivery has failed to these recipients or groups",  # Exchange / Microsoft 365
    "this is the mail system at host",  # Postfix
    "could not be delivered to one or more recipients",  # Postfix
    "your message could not be delivered",
    "message could not be delivered",
    "undelivered mail returned to sender",  # Postfix subject
    "mail delivery failed: returning message to sender",  # Exim subject
    "this message was created automatically by mail delivery software",  # Exim
    "this is the qmail-send program",  # qmail
    "i'm afraid i wasn't able to deliver your message",  # qmail
    "your message wasn't delivered",  # Gmail
    "sorry, we were unable to deliver your message",  # Yahoo
    "permanent fatal errors",  # Sendmail
    "the original message was received at",  # Sendmail
    "delivery status notification (failure)",
    "delivery status notification (delay)",
    "returned mail: see transcript for details",  # Sendmail subject
    "failure notice",  # qmail subject
)
QUOTED_ORIGINAL = (
    "original message headers",  # Gmail
    "this is a copy of the message, including all the headers",  # Exim
    "original message follows",
    "the original message headers are included as attachment",
    "message headers follow",
    "------ this is a copy of the message",
)
_SUBJECT_PREFIXES = (
    "undeliverable:",
    "undelivered mail",
    "undeliverable mail",
    "returned mail:",
    "delivery status notification",
    "mail delivery failed",
    "failure notice",
    "delivery failure",
    "non remis",
    "unzustellbar:",
)


def _report_parts(parsed: ParsedMessage) -> list[str]:
    message = parsed.email_message
    if message is None:
        return []
    found = []
    try:
        for index, part in enumerate(message.walk()):
            if index >= MAX_PARTS:
                break
            content_type = part.get_content_type()
            if content_type in REPORT_PART_TYPES and content_type not in found:
                found.append(content_type)
    except Exception:
        return found
    return found


def _dsn_fields(text: str) -> str:
    names = []
    for match in _DSN_FIELD.finditer(text):
        name = match.group(1).title().replace("Mta", "MTA").replace("Id", "ID")
        if name not in names:
            names.append(name)
    action = _DSN_ACTION.search(text)
    if action:
        names.append(f"Action: {action.group(1).lower()}")
    status = _DSN_STATUS.search(text)
    if status:
        names.append(f"Status: {status.group(1)}")
    if not names:
        reply = _SMTP_REPLY.search(text)
        return f"SMTP reply {reply.group(1)}" if reply else ""
    return f"DSN fields ({', '.join(names[:6])})"


def bounce_evidence(*, parsed: ParsedMessage) -> list[str]:
    """What in `parsed` shows a mail system's report rather than a person's message; [] when nothing does."""
    evidence = []
    if parsed.content_type == "multipart/report":
        evidence.append(f"multipart/report (report-type={parsed.report_type or '?'})")
    parts = _report_parts(parsed)
    if parts:
        evidence.append(f"a {parts[0]} part")
    text = parsed.text[:MAX_TEXT_CHARS]
    fields = _dsn_fields(text)
    if fields:
        evidence.append(fields)
    flat = " ".join(text.lower().split())
    subject = " ".join(parsed.subject.lower().split())
    phrase = next((p for p in BOUNCE_PHRASES if p in subject or p in flat), None)
    if phrase is None:
        phrase = next((p for p in _SUBJECT_PREFIXES if subject.startswith(p)), None)
    if phrase:
        evidence.append(f"bounce text {phrase!r}")
    quoted = next((p for p in QUOTED_ORIGINAL if p in flat), None)
    if quoted:
        evidence.append(f"quoted original {quoted!r}")
    if not flat:
        evidence.append("no body text")
    if not parsed.sender and parsed.sender_hint:
        evidence.append("a From without an address")
    return evidence

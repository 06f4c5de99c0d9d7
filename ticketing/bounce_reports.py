"""Reading a bounce: which of our acknowledgments it reports on, and how it failed. Pure: no database.

A bounce names the message it reports on in one of these places, all read here:

- a DSN (RFC 3464, `multipart/report; report-type=delivery-status`: Postfix, Exchange, Gmail, Exim 4.9x,
  or RFC 6533's `global-delivery-status` for an SMTPUTF8 message): the returned `text/rfc822-headers`,
  `message/rfc822` or `message/global(-headers)` part's Message-ID, and its (global) delivery-status
  part's per-recipient Action, Status and Diagnostic-Code;
- a plain bounce (Exim's "This message was created automatically by mail delivery software", qmail's
  "Hi. This is the qmail-send program", older Postfix and Sendmail): the copy of the headers quoted in the
  text (a `Message-ID:` line), and the SMTP reply or enhanced status code (`550 5.1.1`, qmail's `#5.1.1`);
- the bounce's own In-Reply-To / References (Gmail's bounces thread to the message they report on).

A `multipart/report` of another report-type (a read receipt's disposition-notification) is no bounce and
names nothing. Only Message-IDs under our acknowledgments' domain (`ACK_MESSAGE_ID_DOMAIN`) are candidates; the caller
checks each against the intents that sent them. Diagnostics keep no address: each is cut to its domain.
"""

import email
import re
from dataclasses import dataclass
from email import policy
from email.message import Message

ACK_MESSAGE_ID_DOMAIN = "mailroom.invalid"  # `acknowledgments._compose`: the Message-ID's domain
DSN_REPORT_TYPES = ("delivery-status", "global-delivery-status")  # RFC 3464; RFC 6533 (an SMTPUTF8 message's)
STATUS_PART_TYPES = ("message/delivery-status", "message/global-delivery-status")
# The returned message or its headers, as the parser reads them: one embedded message (RFC 6533's in UTF-8).
RETURNED_MESSAGE_TYPES = ("message/rfc822", "message/global", "message/global-headers", "message/rfc822-headers")
MAX_BOUNCE_BYTES = 512 * 1024  # read this far: the report and returned headers come before any returned body
MAX_MESSAGE_IDS = 5
MAX_DIAGNOSTIC_CHARS = 200

_OUR_ID = rf"[^<>\s@]{{1,200}}@{re.escape(ACK_MESSAGE_ID_DOMAIN)}"
_ANY_OUR_ID = re.compile(rf"<({_OUR_ID})>", re.IGNORECASE)
# A quoted header line, folded or not (Django folds a long Message-ID onto the next line).
_MESSAGE_ID_LINE = re.compile(rf"^[ \t>]*Message-ID:[ \t]*(?:\r?\n[ \t>]+)?<({_OUR_ID})>", re.IGNORECASE | re.MULTILINE)
_ADDRESS = re.compile(r"[^\s<>@\"',;:()\[\]]+@([A-Za-z0-9\u0080-\uffff.-]+)")
# "550 5.1.1", "5.1.1", qmail's "(#5.1.1)": a permanent (5) or transient (4) enhanced status code.
_STATUS_CODE = re.compile(r"(?<![\d.])#?([45])\.(\d{1,3})\.(\d{1,3})(?![\d.]*\d)")
_SMTP_REPLY = re.compile(r"^\s*(?:.*?\s)?([45]\d\d)[ -]", re.MULTILINE)
_PERMANENT_WORDS = re.compile(
    r"permanent(?:ly)? (?:error|failure|fatal)|failed permanently|could not be delivered"
    r"|delivery has failed|undeliverable|address not found|user unknown|does not exist",
    re.IGNORECASE,
)
_DELAY_WORDS = re.compile(
    r"\bdelay(?:ed)?\b|will (?:continue|retry|be retried)|still trying|temporar(?:y|ily)"
    r"|not yet been delivered",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class BounceReport:
    message_ids: tuple[str, ...] = ()  # our acknowledgments' Message-IDs it names, bracketed, in order
    action: str = ""  # the DSN Action ("failed", "delayed", ...), or read from a plain bounce
    status: str = ""  # the enhanced status code ("5.1.1"), "" when none was given
    diagnostic: str = ""  # the diagnostic's first line, addresses cut to their domain
    recipient_domain: str = ""  # the domain of the Final-Recipient, when the report names one

    @property
    def permanent(self) -> bool:
        """A failure for good: a 5.x.x status, or a failed Action (or a permanent-error text) without one."""
        if self.status:
            return self.status.startswith("5.")
        return self.action == "failed"


def masked(text: str) -> str:
    """`jose@example.es` -> `***@example.es`: the DB keeps the domain of an address, never the address."""
    return _ADDRESS.sub(r"***@\1", text or "")


def first_line(text: str) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return masked(" ".join(line.split()))[:MAX_DIAGNOSTIC_CHARS]
    return ""


def _decoded_text(part: Message) -> str:
    payload = part.get_payload(decode=True)
    if isinstance(payload, bytes):
        return payload.decode(part.get_content_charset() or "utf-8", "replace")
    return payload if isinstance(payload, str) else ""


def _header_ids(value) -> list[str]:
    return [f"<{m}>" for m in _ANY_OUR_ID.findall(str(value or ""))]


def _status_fields(part: Message) -> dict[str, str]:
    """The first per-recipient block of a delivery-status part that has an Action (or a Status).

    The parser splits `message/delivery-status` into its blocks, reads `message/global-delivery-status`
    (RFC 6533, UTF-8) as one embedded message, and leaves an encoded one as text: all are read as text."""
    payload = part.get_payload()
    if isinstance(payload, list):
        text = "\n".join(block.as_string() for block in payload if isinstance(block, Message))
    else:
        text = _decoded_text(part)
    for chunk in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n")):
        block = email.message_from_string(chunk.strip() + "\n", policy=policy.compat32)
        if block.get("Action") or block.get("Status"):
            return {
                name: " ".join(str(block.get(name, "")).split())
                for name in ("Action", "Status", "Diagnostic-Code", "Final-Recipient")  # unfolded
            }
    return {}


def _after_type(value: str) -> str:
    """`rfc822; jane@example.com` / `smtp; 550 ...` -> the part after the type."""
    kind, sep, rest = value.partition(";")
    return rest.strip() if sep else kind.strip()


def _status_of(text: str) -> str:
    found = _STATUS_CODE.search(text or "")
    return ".".join(found.groups()) if found else ""


def _diagnostic_line(text: str) -> str:
    """The line of a plain bounce that carries the SMTP reply or status code (the remote server's words)."""
    for line in (text or "").splitlines():
        if _STATUS_CODE.search(line) or _SMTP_REPLY.match(line):
            return line
    return ""


def _parts(message: Message, depth: int = 0):
    """The parts of the bounce itself, not of the message it returns (that one's body is not the report)."""
    yield message
    if message.is_multipart() and depth < 10:
        for part in message.get_payload():
            if part.get_content_maintype() == "message":  # rfc822, delivery-status: read whole, not walked
                yield part
            else:
                yield from _parts(part, depth + 1)


def read_report(raw: bytes, *, in_reply_to: str = "", references: str = "") -> BounceReport:
    """What the stored bounce `raw` says about our acknowledgments (`message_ids` empty: none of ours)."""
    message = email.message_from_bytes(bytes(raw or b"")[:MAX_BOUNCE_BYTES], policy=policy.compat32)
    if (
        message.get_content_type() == "multipart/report"
        and str(message.get_param("report-type", "")).lower() not in DSN_REPORT_TYPES
    ):
        return BounceReport()  # a read receipt (disposition-notification) or another report: not a bounce
    ids: list[str] = []
    fields: dict[str, str] = {}
    texts: list[str] = []
    for part in _parts(message):
        kind = part.get_content_type()
        if kind in STATUS_PART_TYPES and not fields:
            fields = _status_fields(part)
        elif kind in RETURNED_MESSAGE_TYPES:
            inner = part.get_payload()
            if isinstance(inner, list) and inner and isinstance(inner[0], Message):
                ids += _header_ids(inner[0].get("Message-ID"))
        elif kind in ("text/rfc822-headers", "text/plain") and not part.is_multipart():
            text = _decoded_text(part)
            if kind == "text/rfc822-headers":
                headers = email.message_from_string(text.split("\n\n", 1)[0] + "\n", policy=policy.compat32)
                ids += _header_ids(headers.get("Message-ID"))
            else:
                ids += [f"<{m}>" for m in _MESSAGE_ID_LINE.findall(text)]
                texts.append(text)
    ids += _header_ids(in_reply_to or message.get("In-Reply-To")) + _header_ids(references or message.get("References"))
    unique = tuple(dict.fromkeys(ids))[:MAX_MESSAGE_IDS]
    if fields:
        diagnostic = _after_type(fields.get("Diagnostic-Code", ""))
        recipient = _after_type(fields.get("Final-Recipient", ""))
        status = _status_of(fields.get("Status", "")) or _status_of(diagnostic)
        return BounceReport(
            message_ids=unique,
            action=fields.get("Action", "").lower(),
            status=status,
            diagnostic=first_line(diagnostic),
            recipient_domain=recipient.rpartition("@")[2].lower() if "@" in recipient else "",
        )
    text = "\n".join(texts)
    line = _diagnostic_line(text)
    status = _status_of(line)
    action = (
        "delayed"
        if _DELAY_WORDS.search(text) and not _PERMANENT_WORDS.search(text)
        else "failed"
        if (_PERMANENT_WORDS.search(text) or status.startswith("5."))
        else ""
    )
    return BounceReport(message_ids=unique, action=action, status=status, diagnostic=first_line(line))

"""What rules (and the AI proposer) may look at: `MessageFacts`, built once per event. Pure, no I/O.

Headers are read from the stored raw message's header block (split and unfolded here, not parsed as MIME):
names lowercase, values as written (RFC 2047 encoded words decoded), at most `MAX_HEADERS` fields of at
most `MAX_HEADER_VALUE_CHARS` characters each, from the first `MAX_HEADER_BLOCK_BYTES` bytes. The risk
signals come from what normalization stored in `InboxEvent.details` (`intake.normalize`): the trusted spam
score, the spam flag and the attachment scan's verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from email.header import decode_header, make_header

MAX_HEADER_BLOCK_BYTES = 64 * 1024
MAX_HEADERS = 200
MAX_HEADER_VALUE_CHARS = 2000
# `details["attachment_scan"]` (intake.normalize); events stored before it was recorded say "unknown".
ATTACHMENT_VERDICTS = ("none", "clean", "infected", "unscanned", "unknown")


def header_fields(raw: bytes | None) -> tuple[tuple[str, str], ...]:
    """(lowercase name, value) for each header field of `raw`, in order, bounded (see the module docstring)."""
    if not raw:
        return ()
    head = bytes(raw[:MAX_HEADER_BLOCK_BYTES])
    for separator in (b"\r\n\r\n", b"\n\n"):
        end = head.find(separator)
        if end != -1:
            head = head[:end]
            break
    # Each field's pieces in a list, joined once: appending to a string per folded line is quadratic on a
    # block of thousands of one-character continuation lines. Pieces past what a value keeps are dropped.
    fields: list[tuple[str, list[str], list[int]]] = []
    for line in head.decode("utf-8", errors="replace").replace("\r\n", "\n").split("\n"):
        if line[:1] in (" ", "\t"):
            if fields and fields[-1][2][0] < MAX_HEADER_VALUE_CHARS * 2:  # a folded continuation of the field above
                piece = line.strip()
                fields[-1][1].append(piece)
                fields[-1][2][0] += len(piece) + 1
            continue
        name, colon, value = line.partition(":")
        name = name.strip()
        if not colon or not name or " " in name:
            continue
        if len(fields) == MAX_HEADERS:
            break
        value = value.strip()
        fields.append((name.lower(), [value], [len(value)]))
    return tuple((name, _decoded(" ".join(pieces))[:MAX_HEADER_VALUE_CHARS]) for name, pieces, _ in fields)


def _decoded(value: str) -> str:
    if "=?" not in value:
        return value
    try:
        return str(make_header(decode_header(value[: MAX_HEADER_VALUE_CHARS * 2])))
    except Exception:  # a malformed encoded word: the text as written
        return value


def _parsed_header_fields(parsed) -> tuple[tuple[str, str], ...]:
    """The parsed message's headers, for an event whose raw is gone (purged) or not at hand."""
    message = getattr(parsed, "email_message", None)
    if message is None:
        return ()
    try:
        return tuple((str(n).lower(), str(v)[:MAX_HEADER_VALUE_CHARS]) for n, v in message.raw_items())[:MAX_HEADERS]
    except Exception:
        return ()


def _spam_score(details: dict) -> float | None:
    stored = details.get("spam_score")
    try:
        return float(stored["score"]) if isinstance(stored, dict) else None
    except (KeyError, TypeError, ValueError):
        return None


def attachment_verdict(details: dict, attachment_count: int) -> str:
    verdict = details.get("attachment_scan")
    if verdict in ATTACHMENT_VERDICTS:
        return verdict
    if any(isinstance(f, dict) and f.get("reason") == "malware" for f in details.get("findings") or ()):
        return "infected"
    return "none" if not attachment_count else "unknown"


@dataclass(frozen=True)
class MessageFacts:
    recipients: tuple[str, ...] = ()  # To, Cc and Delivered-To (X-Original-To, Envelope-To), lowercase
    sender: str = ""  # the From address, lowercase
    subject: str = ""
    body: str = ""  # the readable body text as parsed
    attachment_types: tuple[str, ...] = ()  # sniffed types (what the bytes are), lowercase
    # Results recorded by our own MTA (the mailbox's trusted authserv-id) only: {"dmarc": "pass", ...}.
    auth: dict = field(default_factory=dict)
    is_reply: bool = False
    headers: tuple[tuple[str, str], ...] = ()  # (lowercase name, value), every instance, bounded
    spam_score: float | None = None  # the trusted score normalization stored (details["spam_score"])
    spam_flagged: bool = False
    attachment_verdict: str = "none"  # one of ATTACHMENT_VERDICTS

    def header_values(self, name: str) -> list[str]:
        name = name.lower()
        return [value for key, value in self.headers if key == name]

    @classmethod
    def from_event(cls, event, parsed) -> MessageFacts:
        recipients = []
        for address in [*(parsed.recipients or []), *(parsed.delivered_to or [])]:
            address = (address or "").strip().lower()
            if address and address not in recipients:
                recipients.append(address)
        auth = {str(k).lower(): str(v).lower() for k, v in (getattr(event, "auth_results", None) or {}).items()}
        details = getattr(event, "details", None) or {}
        raw = getattr(event, "raw", None)
        return cls(
            recipients=tuple(recipients),
            sender=(parsed.sender or "").strip().lower(),
            subject=parsed.subject or "",
            body=parsed.text or "",
            attachment_types=tuple((a.sniffed_type or "").lower() for a in parsed.attachments or ()),
            auth=auth,
            is_reply=bool(parsed.in_reply_to or parsed.references),
            headers=header_fields(raw) if raw else _parsed_header_fields(parsed),
            spam_score=_spam_score(details),
            spam_flagged=details.get("spam_flagged") is True,
            attachment_verdict=attachment_verdict(details, len(parsed.attachments or ())),
        )

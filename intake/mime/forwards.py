"""Who wrote the message that a forward carries: `forwarded_original(parsed) -> (address, name) | None`.

Two shapes, looked for in this order:

- an inline forward block, as mail clients write it at the top of the text:
  Gmail "---------- Forwarded message ---------" then From/Date/Subject/To; Apple Mail "Begin forwarded
  message:", a blank line, then From/Subject/Date/To; Thunderbird "-------- Forwarded Message --------" then
  Subject/Date/From/To; Outlook "-----Original Message-----" then From/Sent/To/Subject, or the newer
  Outlook's From/Sent/To/Subject after a rule of underscores (or alone); and their translations
  ("Weitergeleitete Nachricht", "Von:", "Message transféré", "De :", ...). A block counts when its
  fields hold a From with a valid address and a date, subject or recipient line. The Outlook shapes are
  also what a reply quotes, so they count only under a forward subject ("Fwd:", "FW:", "WG:", "TR:",
  "RV:", ...); the explicit "forwarded" markers count under any subject.
- an attached message (message/rfc822, or a .eml file) that is the forward: a forward subject and little
  text of the forwarder's own, or the only file of the mail; its From (several attached messages count
  when they all come from the same address).

Either way the forwarder's own text before the forward must be short (`MAX_OWN_TEXT_CHARS`): a long
message that quotes a forward further down is a message of its own. A "From:" in prose is no block.

Bounded work on hostile input: the first `MAX_SCAN_LINES` lines (`MAX_SCAN_CHARS` characters) of the text
are read line by line with plain string operations (no regex over the text but the anchored subject test);
lines longer than `MAX_LINE_CHARS` are skipped; an attached message is read only as far as its header block
(`MAX_ATTACHED_HEADER_BYTES`), at most `MAX_ATTACHED_MESSAGES` of them.
"""

from __future__ import annotations

import re
from typing import cast

from .addresses import is_valid_address, parse_address_list
from .message import Attachment, ParsedMessage
from .parse import parse_message
from .parts import attachment_payload

MAX_SCAN_CHARS = 20_000
MAX_SCAN_LINES = 300
MAX_LINE_CHARS = 1_000
MAX_OWN_TEXT_CHARS = 2_000  # the forwarder's own words before the forward ("FYI, see below")
MAX_BLOCK_LINES = 14  # header lines of one forward block (To and Cc lines may wrap)
MAX_ATTACHED_MESSAGES = 5
MAX_ATTACHED_HEADER_BYTES = 64 * 1024
MAX_NAME_CHARS = 200

FROM, DATE, TO, CC, SUBJECT = "from", "date", "to", "cc", "subject"

# Field labels of forward blocks, lower case, in the languages clients write them (Outlook's "Sent" is a date).
_LABELS = {
    FROM: ("from", "von", "de", "da", "van", "från", "fra", "od", "от", "expéditeur"),
    DATE: (
        "date",
        "sent",
        "datum",
        "gesendet",
        "envoyé",
        "envoye",
        "fecha",
        "enviado",
        "enviada",
        "data",
        "inviato",
        "verzonden",
        "skickat",
        "sendt",
        "wysłano",
        "отправлено",
        "дата",
    ),
    TO: ("to", "an", "à", "a", "para", "aan", "till", "til", "do", "pour", "кому", "destinataire"),
    CC: ("cc", "kopie", "copie", "cco", "bcc"),
    SUBJECT: (
        "subject",
        "betreff",
        "objet",
        "sujet",
        "asunto",
        "oggetto",
        "onderwerp",
        "assunto",
        "ämne",
        "emne",
        "temat",
        "тема",
    ),
}
_LABEL_KIND = {label: kind for kind, labels in _LABELS.items() for label in labels}
_LONGEST_LABEL = max(len(label) for label in _LABEL_KIND)

# The line above a block that says "this is a forward", without its dashes and colon.
_FORWARD_MARKERS = frozenset(
    {
        "forwarded message",
        "begin forwarded message",
        "forwarded message follows",
        "weitergeleitete nachricht",
        "anfang der weitergeleiteten nachricht",
        "message transféré",
        "message transfere",
        "début du message réexpédié",
        "début du message transféré",
        "mensaje reenviado",
        "inicio del mensaje reenviado",
        "messaggio inoltrato",
        "inizio messaggio inoltrato",
        "doorgestuurd bericht",
        "begin doorgestuurd bericht",
        "mensagem encaminhada",
        "início da mensagem reencaminhada",
        "início da mensagem encaminhada",
        "videresendt meddelelse",
        "videresendt melding",
        "vidarebefordrat meddelande",
        "wiadomość przekazana dalej",
        "пересылаемое сообщение",
    }
)
# The line above the block that Outlook (and older Thunderbird) writes for replies and forwards alike.
_ORIGINAL_MARKERS = frozenset(
    {
        "original message",
        "ursprüngliche nachricht",
        "originalnachricht",
        "message d'origine",
        "message original",
        "mensaje original",
        "messaggio originale",
        "oorspronkelijk bericht",
        "origineel bericht",
        "mensagem original",
        "ursprungligt meddelande",
        "oprindelig meddelelse",
        "opprinnelig melding",
        "wiadomość oryginalna",
        "исходное сообщение",
    }
)
_FORWARD, _ORIGINAL, _RULE = "forward", "original", "rule"
_MIN_RULE_CHARS = 10
_SPACES = str.maketrans({"\t": " ", "\u00a0": " ", "\u202f": " ", "\u2007": " ", "\u2019": "'", "\ufeff": ""})
_MARKER_DECORATION = "-_=*:> "

# "Fwd:", "FW:", "WG:" (German), "TR:" (French), "RV:" (Spanish), "ENC:" (Portuguese), "VS:"/"VB:"
# (Nordic), "VL:" (Finnish), "Doorst:" (Dutch), "I:" (Italian), "PD:" (Polish), "Fwd[2]:", after up to three "[tags]".
# Anchored, each repetition consumes its brackets: linear.
_FORWARD_SUBJECT = re.compile(
    r"\s*(?:\[[^\[\]]{0,60}\]\s*){0,3}(?:fwd?|wg|tr|rv|enc|vs|vb|doorst|vl|i|pd)\s*(?:\[\d{1,3}\]\s*)?:", re.IGNORECASE
)
_MESSAGE_TYPES = ("message/rfc822", "message/global")
_EML_TYPES = ("application/octet-stream", "application/x-eml", "application/eml", "text/plain")


def is_forward_subject(subject: str) -> bool:
    return bool(subject) and _FORWARD_SUBJECT.match(subject[:300]) is not None


def forwarded_original(parsed: ParsedMessage) -> tuple[str, str] | None:
    """(address, display name) of the original sender when `parsed` is a forward; None otherwise.
    See the module docstring for what counts."""
    forward_subject = is_forward_subject(parsed.subject)
    return _inline_original(parsed.text or "", forward_subject) or _attached_original(parsed, forward_subject)


# --- inline forward blocks -----------------------------------------------------------------------------


def _head_lines(text: str) -> list[str]:
    head = text[:MAX_SCAN_CHARS]
    return [line.translate(_SPACES) for line in head.split("\n", MAX_SCAN_LINES)[:MAX_SCAN_LINES]]


def _unquoted(line: str) -> str:
    """The line without reply quoting ("> ") and surrounding space."""
    return line.strip().lstrip("> ").rstrip()


def _marker(line: str) -> str | None:
    stripped = _unquoted(line)
    if len(stripped) >= _MIN_RULE_CHARS and not stripped.strip("_"):
        return _RULE
    core = " ".join(stripped.strip(_MARKER_DECORATION).lower().split())
    if core in _FORWARD_MARKERS:
        return _FORWARD
    if core in _ORIGINAL_MARKERS:
        return _ORIGINAL
    return None


def _field(line: str) -> tuple[str, str] | None:
    """(kind, value) of a header line of a forward block ("From: Jane <jane@example.com>", "De : ...",
    "*From:* ..."); None for any other line."""
    stripped = _unquoted(line)
    colon = stripped.find(":", 0, _LONGEST_LABEL + 4)
    if colon <= 0:
        return None
    label = " ".join(stripped[:colon].strip("* ").lower().split())
    kind = _LABEL_KIND.get(label)
    if kind is None:
        return None
    return kind, stripped[colon + 1 :].strip("* ")


def _mailbox(value: str) -> tuple[str, str] | None:
    """The first valid address of a From value ("Jane Doe <jane@x.com>", Outlook's "Jane Doe
    [mailto:jane@x.com]", a bare address) with its display name."""
    value = value[:MAX_LINE_CHARS]
    opening = value.find("[mailto:")
    if opening != -1 and value.endswith("]"):
        value = f"{value[:opening]}<{value[opening + 8 : -1]}>"
    for name, address in parse_address_list(value):
        address = address.strip()
        if is_valid_address(address):
            name = " ".join(name.split()).strip("'\" ")
            return address, ("" if name.lower() == address.lower() else name[:MAX_NAME_CHARS])
    return None


def _block_sender(lines: list[str], start: int, *, bare: bool) -> tuple[str, str] | None:
    """The From of the forward block at `start` (after at most two blank lines unless `bare`). A bare block
    (no marker line above it) must open with From followed by its date (Outlook's From / Sent)."""
    index = start
    if not bare:
        while index < len(lines) and index < start + 2 and not lines[index].strip():
            index += 1
    fields: dict[str, str] = {}
    order: list[str] = []
    for line in lines[index : index + MAX_BLOCK_LINES]:
        if not _unquoted(line):
            break
        if len(line) > MAX_LINE_CHARS:
            return None
        field = _field(line)
        if field is None:
            if not order:
                return None  # the first line after the marker is no header line: not a block
            continue  # a wrapped To or Cc line
        kind, value = field
        if kind not in fields:
            fields[kind] = value
            order.append(kind)
    if bare and order[:2] != [FROM, DATE]:
        return None
    if FROM not in fields or not {DATE, SUBJECT, TO} & fields.keys():
        return None
    return _mailbox(fields[FROM])


def _inline_original(text: str, forward_subject: bool) -> tuple[str, str] | None:
    if not text:
        return None
    lines = _head_lines(text)
    own_chars = 0
    for index, line in enumerate(lines):
        if own_chars > MAX_OWN_TEXT_CHARS:
            return None
        if len(line) > MAX_LINE_CHARS:
            own_chars += len(line)
            continue
        marker = _marker(line)
        if marker == _FORWARD or (marker in (_ORIGINAL, _RULE) and forward_subject):
            found = _block_sender(lines, index + 1, bare=False)
            if found:
                return found
        elif marker is None and forward_subject:
            field = _field(line)
            if field is not None and field[0] == FROM:
                found = _block_sender(lines, index, bare=True)
                if found:
                    return found
        own_chars += len(line.strip())
    return None


# --- attached messages ---------------------------------------------------------------------------------


def _header_block(data: bytes) -> bytes:
    head = data[:MAX_ATTACHED_HEADER_BYTES]
    ends = [end for end in (head.find(b"\r\n\r\n"), head.find(b"\n\n")) if end != -1]
    return head[: min(ends) + 2] if ends else head


def _attached_sender(parsed: ParsedMessage, index: int) -> tuple[str, str] | None:
    try:
        inner = parse_message(_header_block(attachment_payload(parsed, index)))
    except Exception:
        return None
    if inner.sender_source != "from" or not is_valid_address(inner.sender):
        return None
    name = " ".join((inner.sender_name or "").split()).strip("'\" ")
    return inner.sender, ("" if name.lower() == inner.sender.lower() else name[:MAX_NAME_CHARS])


def _is_message(attachment: Attachment) -> bool:
    if attachment.declared_type in _MESSAGE_TYPES:
        return True
    return attachment.declared_type in _EML_TYPES and attachment.filename.lower().endswith(".eml")


def _attached_original(parsed: ParsedMessage, forward_subject: bool) -> tuple[str, str] | None:
    top = [(index, a) for index, a in enumerate(parsed.attachments) if not a.nested]
    messages = [index for index, a in top if _is_message(a)]
    if not messages or len(messages) > MAX_ATTACHED_MESSAGES:
        return None
    other_files = [a for index, a in top if index not in messages and not a.is_inline]
    little_text = len((parsed.text or "").strip()) <= MAX_OWN_TEXT_CHARS
    if not ((forward_subject and little_text) or not other_files):
        return None
    senders = [_attached_sender(parsed, index) for index in messages]
    # Past the first test none is None: each an (address, name) pair.
    if (
        any(sender is None for sender in senders)
        or len({s[0].lower() for s in cast("list[tuple[str, str]]", senders)}) != 1
    ):
        return None
    return senders[0]

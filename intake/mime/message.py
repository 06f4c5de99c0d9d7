"""What `parse_message` gives: `ParsedMessage` and its `Attachment`s, and the defect list's cap."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from email.message import Message

    from .parts import AttachmentPart

DEFAULT_LOOP_HEADER = "X-Mailroom-Loop"
MAX_DEFECTS = 100


class Signature(TypedDict):
    """A signature part of signed mail, in `ParsedMessage.signatures`."""

    protocol: str  # "pgp" or "smime"
    type: str  # its content type
    size: int
    sha256: str


class Alternative(TypedDict):
    """One alternative of the body's multipart/alternative, in `ParsedMessage.alternatives`."""

    type: str
    chars: int | None  # readable characters; None for a part not read
    chosen: bool


@dataclass(frozen=True)
class Attachment:
    filename: str  # display name, path components and control characters removed; "" if none
    declared_type: str  # Content-Type as sent (lowercase), "text/plain" when missing or invalid
    sniffed_type: str  # what the bytes are (libmagic, refined for Office containers)
    size: int  # decoded bytes
    sha256: str
    content_id: str  # without angle brackets; "" if none
    is_inline: bool  # Content-Disposition inline, or a Content-ID and no disposition
    nested: bool = False  # inside another listed file (attached message, archive, .msg), which goes whole
    # Where the file came from: "" a MIME part; "tnef" unpacked from a winmail.dat (listed instead of
    # it); "encrypted" the payload of encrypted mail (kept, never judged by the type policy).
    origin: str = ""
    contents: str = ""  # archive or .msg: "listed" (files follow, nested), "encrypted", "unreadable"


@dataclass
class ParsedMessage:
    message_id: str = ""
    sender: str = ""  # From address ("" if missing or unparsable)
    recipients: list[str] = field(default_factory=list)  # To + Cc addresses, de-duplicated
    subject: str = ""
    date: str = ""
    in_reply_to: str = ""
    references: list[str] = field(default_factory=list)  # first = thread root
    text: str = ""  # readable body; HTML converted when there is no plain text
    defects: list[str] = field(default_factory=list)
    sender_name: str = ""
    reply_to: list[str] = field(default_factory=list)
    delivered_to: list[str] = field(default_factory=list)  # Delivered-To, X-Original-To, Envelope-To
    return_path: str | None = None  # None: no header; "": the null path "<>"
    auto_submitted: str | None = None  # first token, lowercase ("auto-replied", "no", ...)
    precedence: str | None = None  # lowercase ("bulk", "list", ...)
    x_autoreply: str | None = None
    x_autorespond: str | None = None
    content_type: str = "text/plain"  # top-level, lowercase ("multipart/report", ...)
    report_type: str = ""  # its report-type parameter, lowercase
    authentication_results: list[str] = field(default_factory=list)  # every instance, top first
    loop_header: str = DEFAULT_LOOP_HEADER
    loop_values: list[str] = field(default_factory=list)  # values of `loop_header`, if present
    body_source: str = ""  # "plain", "html", "plain+html" or "" (no body text)
    attachments: list[Attachment] = field(default_factory=list)
    size: int = 0  # bytes of the raw message
    raw_sha256: str = ""
    too_complex: bool = False  # a nesting or part limit stopped the walk
    # Which header gave `sender`: "from", "sender" or "reply-to" ("" when none did).
    sender_source: str = ""
    # Lowercased text of From when it holds no usable address ("mailer-daemon" on some bounces).
    sender_hint: str = ""
    encrypted: str = ""  # "pgp" or "smime" when the content is encrypted, else ""
    smime_certs_only: bool = False  # an S/MIME certs-only part (application/pkcs7-mime): no content
    # Signature parts of signed mail (multipart/signed): metadata, not attachments.
    # Each: {"protocol", "type", "size", "sha256"}.
    signatures: list[Signature] = field(default_factory=list)
    # The alternatives of the body (multipart/alternative): {"type", "chars", "chosen"}.
    alternatives: list[Alternative] = field(default_factory=list)
    text_truncated: bool = False  # `text` was cut (at a paragraph boundary) to its limit
    # The parsed message and the attachment parts, for decoding payloads on demand.
    _message: Message | None = field(default=None, repr=False, compare=False)
    _attachment_parts: list[AttachmentPart] = field(default_factory=list, repr=False, compare=False)

    @property
    def email_message(self) -> Message | None:
        """The parsed `email.message.EmailMessage` (header values read raw, `intake.mime.policy`), or None
        when the bytes could not be parsed: for readers of headers and parts this class does not keep
        (validation's automated-sender and calendar rules)."""
        return self._message


def add_defect(defects: list[str], name: str) -> None:
    if len(defects) < MAX_DEFECTS and name not in defects:
        defects.append(name)

"""The mailbox's policy: what one mailbox accepts, read from `Mailbox.settings`. Pure, no I/O.

    policy = MailboxPolicy.from_mailbox(mailbox)        # or MailboxPolicy.from_settings(...)

Attachment policy: the sniffed type decides what a file is (extension and
declared Content-Type are ignored for that), and it must be in
`allowed_types`; independently, a filename whose extension is in
`blocked_extensions` (executables and scripts, which sniff as text/plain or
application/octet-stream) is refused too. Either refusal quarantines the
message with `attachment_type` (the rule is in `intake.validation.rules`).
Office documents: modern ones are ZIP files;
`intake.mime.sniff_type` gives a ZIP the OOXML type only if it holds
`[Content_Types].xml` and a Word/Excel/PowerPoint main part (ODF: its
`mimetype` member), and `MACRO_OFFICE_TYPE` if it holds a VBA project, so the
defaults allow docx/xlsx/pptx/odt/ods/odp, not macro-enabled documents, not
executables, not a file whose name says pdf while its bytes say exe.

What real mail carries is allowed by default: contact cards (vCard), calendar
files, HTML pages, attached messages (.eml, sniffed as message/rfc822 from
their header block; Outlook .msg), S/MIME and OpenPGP signatures and keys,
audio and video. Archives (zip, 7z, gzip, bzip2, tar) are allowed as
containers only: `intake.mime` lists their members as attachments of their
own (`nested`, `origin="archive"`; the files of a .msg likewise with
`origin="outlook"`), each judged by this same policy, type and extension, so
a zip holding an .exe or a .js quarantines the message as if it were attached
alone. An archive whose members are encrypted goes to review
(`encrypted_archive`); one that could not be listed in full (limits, damage)
goes to review as `too_complex`. Empty (0-byte) attachments are not checked:
they hold nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..mime import DEFAULT_LOOP_HEADER
from .spamscore import DEFAULT_SPAM_SCORE_THRESHOLD

if TYPE_CHECKING:
    from ..models import Mailbox

DEFAULT_MAX_MESSAGE_BYTES = 25 * 1024 * 1024
DEFAULT_ALLOWED_TYPES = frozenset(
    {
        "application/pdf",
        "image/png",
        "image/jpeg",
        "image/gif",
        "image/webp",
        "image/bmp",
        "image/tiff",
        "image/heic",
        "image/heif",
        "text/plain",
        "text/csv",
        "text/calendar",
        "application/rtf",
        "text/rtf",
        # Data files people send along with logs and e-invoices.
        "application/json",
        "text/xml",
        "application/xml",
        # Contact cards: Apple Mail sends text/vcard, Outlook text/x-vcard, older clients text/directory.
        "text/vcard",
        "text/x-vcard",
        "text/directory",
        # Saved web pages and forwarded HTML receipts (XHTML sniffs as text/html too: intake.mime.sniff).
        "text/html",
        # Attached messages: .eml (sniffed from their header block) and Outlook .msg (whose files are listed).
        "message/rfc822",
        "application/vnd.ms-outlook",
        # Plain archives: allowed only as their members, each judged too (intake.mime.archives).
        "application/zip",
        "application/x-zip-compressed",
        "application/x-7z-compressed",
        "application/gzip",
        "application/x-gzip",
        "application/x-bzip2",
        "application/x-tar",
        # Signatures wherever they sit (a gateway that unwraps multipart/signed leaves them in multipart/mixed).
        "application/pkcs7-signature",
        "application/x-pkcs7-signature",
        "application/pgp-signature",
        "application/pkcs7-mime",  # only what intake.mime.sniff_type names so: S/MIME certificates-only (smime.p7c)
        # OpenPGP public keys: Thunderbird attaches the sender's key to signed mail by default.
        "application/pgp-keys",
        # Voice memos, recordings, phone videos.
        "audio/*",
        "video/*",
        # Office Open XML and OpenDocument (what intake.mime.sniff_type names a ZIP that really is one).
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        "application/vnd.oasis.opendocument.text",
        "application/vnd.oasis.opendocument.spreadsheet",
        "application/vnd.oasis.opendocument.presentation",
        # Legacy binary Office; those with a VBA project sniff as MACRO_OFFICE_TYPE instead.
        "application/msword",
        "application/vnd.ms-excel",
        "application/vnd.ms-powerpoint",
    }
)
DEFAULT_BLOCKED_EXTENSIONS = frozenset(
    {
        "ade",
        "adp",
        "apk",
        "app",
        "appx",
        "bat",
        "cab",
        "chm",
        "cmd",
        "com",
        "cpl",
        "dll",
        "dmg",
        "exe",
        "hta",
        "img",
        "iso",
        "jar",
        "js",
        "jse",
        "lnk",
        "msc",
        "msi",
        "msix",
        "msp",
        "pif",
        "ps1",
        "psm1",
        "reg",
        "scr",
        "sct",
        "sh",
        "svg",
        "sys",
        "vb",
        "vbe",
        "vbs",
        "vhd",
        "vhdx",
        "wsc",
        "wsf",
        "wsh",
        "xll",
        "docm",
        "dotm",
        "xlsm",
        "xltm",
        "xlam",
        "pptm",
        "potm",
        "ppsm",
    }
)
DEFAULT_MAX_ATTACHMENT_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_ATTACHMENTS = 50
# What SpamAssassin, Rspamd (in its SpamAssassin-compatible mode) and most gateways write.
DEFAULT_SPAM_HEADERS = (("X-Spam-Flag", "yes"), ("X-Spam-Status", "yes"))


def _spam_headers(value: object) -> tuple[tuple[str, str], ...]:
    if value is None:
        return DEFAULT_SPAM_HEADERS
    pairs = []
    for entry in _string_list(value, "spam_headers"):
        header, colon, prefix = entry.partition(":")
        if not colon or not re.fullmatch(r"[!-9;-~]+", header.strip()) or not prefix.strip():
            raise ValueError(f"spam_headers entries look like 'X-Spam-Flag: YES', not {entry!r}")
        pairs.append((header.strip(), prefix.strip()))
    return tuple(pairs)


def _spam_score_threshold(value: object) -> float:
    """`spam_score_threshold`: a number; at or above it a trusted spam score skips the acknowledgment."""
    if value is None:
        return DEFAULT_SPAM_SCORE_THRESHOLD
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 1000:
        raise ValueError(f"spam_score_threshold must be a number from -100 to 1000, not {value!r}")
    return float(value)


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, not {value!r}")
    return value


def _string_list(value: object, name: str) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} must be a list of strings, not {value!r}")
    return [v.strip().lower() for v in value if v.strip()]


@dataclass(frozen=True)
class AttachmentPolicy:
    allowed_types: frozenset[str] = DEFAULT_ALLOWED_TYPES  # sniffed types; "image/*" allows a main type
    blocked_extensions: frozenset[str] = DEFAULT_BLOCKED_EXTENSIONS
    max_bytes: int = DEFAULT_MAX_ATTACHMENT_BYTES  # per attachment
    max_attachments: int = DEFAULT_MAX_ATTACHMENTS

    @classmethod
    def from_settings(cls, data: dict[str, Any] | None) -> AttachmentPolicy:
        """From `Mailbox.settings["attachment_policy"]`; missing keys keep the defaults.

        Keys: `allowed_types` (replaces the defaults), `extra_allowed_types` (adds
        to them), `blocked_extensions` (replaces), `max_bytes`, `max_attachments`.
        Raises ValueError on a malformed value (validate the settings when saving them).
        """
        if not data:
            return cls()
        if not isinstance(data, dict):
            raise ValueError(f"attachment_policy must be an object, not {data!r}")
        unknown = set(data) - {
            "allowed_types",
            "extra_allowed_types",
            "blocked_extensions",
            "max_bytes",
            "max_attachments",
        }
        if unknown:
            raise ValueError(f"unknown attachment_policy keys: {sorted(unknown)}")
        allowed = set(DEFAULT_ALLOWED_TYPES)
        if "allowed_types" in data:
            allowed = set(_string_list(data["allowed_types"], "allowed_types"))
        allowed |= set(_string_list(data.get("extra_allowed_types", []), "extra_allowed_types"))
        blocked = DEFAULT_BLOCKED_EXTENSIONS
        if "blocked_extensions" in data:
            blocked = frozenset(e.lstrip(".") for e in _string_list(data["blocked_extensions"], "blocked_extensions"))
        return cls(
            allowed_types=frozenset(allowed),
            blocked_extensions=blocked,
            max_bytes=_positive_int(data.get("max_bytes", DEFAULT_MAX_ATTACHMENT_BYTES), "max_bytes"),
            max_attachments=_positive_int(data.get("max_attachments", DEFAULT_MAX_ATTACHMENTS), "max_attachments"),
        )

    def type_allowed(self, sniffed_type: str) -> bool:
        sniffed_type = sniffed_type.lower()
        return sniffed_type in self.allowed_types or f"{sniffed_type.split('/', 1)[0]}/*" in self.allowed_types


def _global_max_message_bytes() -> int:
    try:
        from django.conf import settings

        return int(getattr(settings, "MAILROOM_MAX_MESSAGE_BYTES", DEFAULT_MAX_MESSAGE_BYTES))
    except Exception:  # Django not configured: a plain library call
        return DEFAULT_MAX_MESSAGE_BYTES


@dataclass(frozen=True)
class MailboxPolicy:
    allowed_recipients: tuple[str, ...] = ()  # lowercase; "" entries dropped; "@domain" allows a domain
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    loop_header: str = DEFAULT_LOOP_HEADER
    trusted_authserv_id: str = ""  # our own MTA's authserv-id in Authentication-Results
    attachments: AttachmentPolicy = field(default_factory=AttachmentPolicy)
    # (header, lowercase value prefix) pairs that mean "a spam filter flagged this".
    spam_headers: tuple[tuple[str, str], ...] = DEFAULT_SPAM_HEADERS
    # A spam score (intake.validation.spamscore) at or above this skips the acknowledgment.
    spam_score_threshold: float = DEFAULT_SPAM_SCORE_THRESHOLD

    @classmethod
    def from_settings(
        cls,
        settings: dict[str, Any] | None,
        *,
        allowed_recipients: Iterable[str] | None = (),
        max_message_bytes: int | None = None,
    ) -> MailboxPolicy:
        """From a mailbox's settings JSON and its allowed recipients.

        Settings keys: `attachment_policy` (see AttachmentPolicy.from_settings),
        `max_message_bytes` (can only lower the global limit), `loop_header`,
        `trusted_authserv_id`, `spam_headers` (a list of "Header: value" strings;
        a header whose value starts with that value, case-insensitively, flags
        spam; replaces the SpamAssassin defaults), `spam_score_threshold` (a number,
        default 5.0: a trusted spam score at or above it skips the acknowledgment,
        `intake.validation.spamscore`). `max_message_bytes` defaults to
        settings.MAILROOM_MAX_MESSAGE_BYTES. Raises ValueError on malformed values.
        """
        settings = settings or {}
        if not isinstance(settings, dict):
            raise ValueError(f"mailbox settings must be an object, not {settings!r}")
        limit = max_message_bytes if max_message_bytes is not None else _global_max_message_bytes()
        if "max_message_bytes" in settings:
            limit = min(limit, _positive_int(settings["max_message_bytes"], "max_message_bytes"))
        loop_header = settings.get("loop_header", DEFAULT_LOOP_HEADER)
        if not isinstance(loop_header, str) or not re.fullmatch(r"[!-9;-~]+", loop_header):
            raise ValueError(f"loop_header must be a header name, not {loop_header!r}")
        trusted = settings.get("trusted_authserv_id", "")
        if not isinstance(trusted, str):
            raise ValueError(f"trusted_authserv_id must be a string, not {trusted!r}")
        return cls(
            spam_headers=_spam_headers(settings.get("spam_headers")),
            spam_score_threshold=_spam_score_threshold(settings.get("spam_score_threshold")),
            allowed_recipients=tuple(_string_list(list(allowed_recipients or ()), "allowed_recipients")),
            max_message_bytes=limit,
            loop_header=loop_header,
            trusted_authserv_id=trusted.strip(),
            attachments=AttachmentPolicy.from_settings(settings.get("attachment_policy")),
        )

    @classmethod
    def from_mailbox(cls, mailbox: Mailbox, *, max_message_bytes: int | None = None) -> MailboxPolicy:
        """From an `intake.Mailbox` (its `settings` and `allowed_recipients`)."""
        return cls.from_settings(
            mailbox.settings, allowed_recipients=mailbox.allowed_recipients or (), max_message_bytes=max_message_bytes
        )

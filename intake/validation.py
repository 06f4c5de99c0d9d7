"""What should happen to a parsed message before any ticket is made: pure functions, no I/O.

    policy = MailboxPolicy.from_mailbox(mailbox)        # or MailboxPolicy.from_settings(...)
    parsed = parse_message(raw, loop_header=policy.loop_header)
    verdict = validate(parsed, policy)                  # Verdict(state, reason_code, detail, findings)
    # after scanning the attachments (intake.scanning):
    verdict = validate(parsed, policy, extra=[malware_finding(name, signature)])

    authentication_results(parsed, trusted_authserv_id) -> dict[str, str]
    thread_key(parsed) -> str                            # 64 hex characters
    subject_ticket_token(subject) -> str | None          # "[#MR-1234]" -> "MR-1234"

`findings()` lists every rule that fired; `validate()` returns the one that
decides (`decide()`), with all of them attached for display.

Precedence (first wins; within a state, in the order of the tuples below):

1. quarantined  — `malware`, `attachment_type`
2. awaiting_review — `too_large`, `too_many_attachments`, `too_complex`,
   `encrypted`, `missing_sender`, `recipient_not_allowed`, `empty`,
   `sender_rate_limited`, then any other review reason the caller adds (e.g.
   `scanner_unavailable`)
3. suppressed — `own_mail_loop`, `delivery_report`, `mailer_daemon`,
   `empty_return_path`, `auto_submitted`, `autoreply_header`, `precedence_bulk`
4. ok

Why: only `ok` ever leads to a ticket or an acknowledgment, so a message on
which any loop rule fired can never be acknowledged, whatever wins. Among the
other states, dangerous content comes first: a quarantined message must not be
released by a reviewer who was only told "too large", nor sit unseen among
suppressed noise. Review comes before suppression because suppression is the
one state nobody is asked to look at: when a message is both invalid and looks
automatic, a person sees it ("invalid mail is never dropped"); suppression is
chosen only when nothing else is wrong with the message.

Attachment policy: the sniffed type decides what a file is (extension and
declared Content-Type are ignored for that), and it must be in
`allowed_types`; independently, a filename whose extension is in
`blocked_extensions` (executables and scripts, which sniff as text/plain or
application/octet-stream) is refused too. Either refusal quarantines the
message with `attachment_type`. Office documents: modern ones are ZIP files;
`intake.mime.sniff_type` gives a ZIP the OOXML type only if it holds
`[Content_Types].xml` and a Word/Excel/PowerPoint main part (ODF: its
`mimetype` member), and `MACRO_OFFICE_TYPE` if it holds a VBA project, so the
defaults allow docx/xlsx/pptx/odt/ods/odp but not a plain `application/zip`,
not macro-enabled documents, not executables. Empty (0-byte) attachments are
not checked: they hold nothing.

Signed mail is ordinary mail: the parser keeps signature parts as metadata, not
attachments. Encrypted mail goes to review as `encrypted` (a person decides):
its ciphertext parts (`Attachment.origin == "encrypted"`) are not judged by the
type policy, since ciphertext sniffs as opaque data and would otherwise
quarantine it. A bounce whose From holds no address (`From: MAILER-DAEMON`) is
a bounce (`mailer_daemon` / `delivery_report`), not `missing_sender`.

`spam_flagged(parsed, policy)` says whether a spam filter marked the message
(it informs the acknowledgment, never the ticket).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from .mime import DEFAULT_LOOP_HEADER, ParsedMessage
from .vocabulary import ReasonCode

OK = "ok"
AWAITING_REVIEW = "awaiting_review"
SUPPRESSED = "suppressed"
QUARANTINED = "quarantined"

# Reason codes (the words and their labels: intake.vocabulary.ReasonCode).
MALWARE = ReasonCode.MALWARE
ATTACHMENT_TYPE = ReasonCode.ATTACHMENT_TYPE
TOO_LARGE = ReasonCode.TOO_LARGE
TOO_MANY_ATTACHMENTS = ReasonCode.TOO_MANY_ATTACHMENTS
TOO_COMPLEX = ReasonCode.TOO_COMPLEX
MISSING_SENDER = ReasonCode.MISSING_SENDER
RECIPIENT_NOT_ALLOWED = ReasonCode.RECIPIENT_NOT_ALLOWED
EMPTY = ReasonCode.EMPTY
SCANNER_UNAVAILABLE = ReasonCode.SCANNER_UNAVAILABLE
ENCRYPTED = ReasonCode.ENCRYPTED
SENDER_RATE_LIMITED = ReasonCode.SENDER_RATE_LIMITED
OWN_MAIL_LOOP = ReasonCode.OWN_MAIL_LOOP
DELIVERY_REPORT = ReasonCode.DELIVERY_REPORT
MAILER_DAEMON = ReasonCode.MAILER_DAEMON
EMPTY_RETURN_PATH = ReasonCode.EMPTY_RETURN_PATH
AUTO_SUBMITTED = ReasonCode.AUTO_SUBMITTED
AUTOREPLY_HEADER = ReasonCode.AUTOREPLY_HEADER
PRECEDENCE_BULK = ReasonCode.PRECEDENCE_BULK

STATE_ORDER = (QUARANTINED, AWAITING_REVIEW, SUPPRESSED)
REASON_ORDER = {
    QUARANTINED: (MALWARE, ATTACHMENT_TYPE),
    AWAITING_REVIEW: (TOO_LARGE, TOO_MANY_ATTACHMENTS, TOO_COMPLEX, ENCRYPTED, MISSING_SENDER,
                      RECIPIENT_NOT_ALLOWED, EMPTY, SENDER_RATE_LIMITED),
    SUPPRESSED: (OWN_MAIL_LOOP, DELIVERY_REPORT, MAILER_DAEMON, EMPTY_RETURN_PATH, AUTO_SUBMITTED,
                 AUTOREPLY_HEADER, PRECEDENCE_BULK),
}

DEFAULT_MAX_MESSAGE_BYTES = 25 * 1024 * 1024
DEFAULT_ALLOWED_TYPES = frozenset({
    "application/pdf",
    "image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp", "image/tiff", "image/heic", "image/heif",
    "text/plain", "text/csv", "text/calendar", "application/rtf", "text/rtf",
    "message/rfc822",
    # OpenPGP public keys: Thunderbird attaches the sender's key to signed mail by default.
    "application/pgp-keys",
    # Office Open XML and OpenDocument (what intake.mime.sniff_type names a ZIP that really is one).
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    "application/vnd.oasis.opendocument.text",
    "application/vnd.oasis.opendocument.spreadsheet",
    "application/vnd.oasis.opendocument.presentation",
    # Legacy binary Office; those with a VBA project sniff as MACRO_OFFICE_TYPE instead.
    "application/msword", "application/vnd.ms-excel", "application/vnd.ms-powerpoint",
})
DEFAULT_BLOCKED_EXTENSIONS = frozenset({
    "ade", "adp", "apk", "app", "appx", "bat", "cab", "chm", "cmd", "com", "cpl", "dll", "dmg", "exe",
    "hta", "img", "iso", "jar", "js", "jse", "lnk", "msc", "msi", "msix", "msp", "pif", "ps1", "psm1",
    "reg", "scr", "sct", "sh", "svg", "sys", "vb", "vbe", "vbs", "vhd", "vhdx", "wsc", "wsf", "wsh", "xll",
    "docm", "dotm", "xlsm", "xltm", "xlam", "pptm", "potm", "ppsm",
})
DEFAULT_MAX_ATTACHMENT_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_ATTACHMENTS = 50
DAEMON_LOCAL_PARTS = frozenset({"mailer-daemon", "postmaster"})
# What SpamAssassin, Rspamd (in its SpamAssassin-compatible mode) and most gateways write.
DEFAULT_SPAM_HEADERS = (("X-Spam-Flag", "yes"), ("X-Spam-Status", "yes"))


@dataclass(frozen=True)
class Finding:
    state: str
    reason_code: str
    detail: str = ""


@dataclass(frozen=True)
class Verdict:
    state: str            # "ok", "awaiting_review", "suppressed" or "quarantined"
    reason_code: str      # "" when ok
    detail: str = ""
    findings: tuple[Finding, ...] = ()   # every rule that fired, deciding one first

    @property
    def ok(self) -> bool:
        return self.state == OK


def _spam_headers(value) -> tuple[tuple[str, str], ...]:
    if value is None:
        return DEFAULT_SPAM_HEADERS
    pairs = []
    for entry in _string_list(value, "spam_headers"):
        header, colon, prefix = entry.partition(":")
        if not colon or not re.fullmatch(r"[!-9;-~]+", header.strip()) or not prefix.strip():
            raise ValueError(f"spam_headers entries look like 'X-Spam-Flag: YES', not {entry!r}")
        pairs.append((header.strip(), prefix.strip()))
    return tuple(pairs)


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, not {value!r}")
    return value


def _string_list(value, name: str) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} must be a list of strings, not {value!r}")
    return [v.strip().lower() for v in value if v.strip()]


@dataclass(frozen=True)
class AttachmentPolicy:
    allowed_types: frozenset[str] = DEFAULT_ALLOWED_TYPES     # sniffed types; "image/*" allows a main type
    blocked_extensions: frozenset[str] = DEFAULT_BLOCKED_EXTENSIONS
    max_bytes: int = DEFAULT_MAX_ATTACHMENT_BYTES               # per attachment
    max_attachments: int = DEFAULT_MAX_ATTACHMENTS

    @classmethod
    def from_settings(cls, data: dict | None) -> AttachmentPolicy:
        """From `Mailbox.settings["attachment_policy"]`; missing keys keep the defaults.

        Keys: `allowed_types` (replaces the defaults), `extra_allowed_types` (adds
        to them), `blocked_extensions` (replaces), `max_bytes`, `max_attachments`.
        Raises ValueError on a malformed value (validate the settings when saving them).
        """
        if not data:
            return cls()
        if not isinstance(data, dict):
            raise ValueError(f"attachment_policy must be an object, not {data!r}")
        unknown = set(data) - {"allowed_types", "extra_allowed_types", "blocked_extensions", "max_bytes",
                               "max_attachments"}
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
        return (sniffed_type in self.allowed_types
                or f"{sniffed_type.split('/', 1)[0]}/*" in self.allowed_types)


def _global_max_message_bytes() -> int:
    try:
        from django.conf import settings

        return int(getattr(settings, "MAILROOM_MAX_MESSAGE_BYTES", DEFAULT_MAX_MESSAGE_BYTES))
    except Exception:  # Django not configured: a plain library call
        return DEFAULT_MAX_MESSAGE_BYTES


@dataclass(frozen=True)
class MailboxPolicy:
    allowed_recipients: tuple[str, ...] = ()   # lowercase; "" entries dropped; "@domain" allows a domain
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    loop_header: str = DEFAULT_LOOP_HEADER
    trusted_authserv_id: str = ""              # our own MTA's authserv-id in Authentication-Results
    attachments: AttachmentPolicy = field(default_factory=AttachmentPolicy)
    # (header, lowercase value prefix) pairs that mean "a spam filter flagged this".
    spam_headers: tuple[tuple[str, str], ...] = DEFAULT_SPAM_HEADERS

    @classmethod
    def from_settings(cls, settings: dict | None, *, allowed_recipients=(),
                      max_message_bytes: int | None = None) -> MailboxPolicy:
        """From a mailbox's settings JSON and its allowed recipients.

        Settings keys: `attachment_policy` (see AttachmentPolicy.from_settings),
        `max_message_bytes` (can only lower the global limit), `loop_header`,
        `trusted_authserv_id`, `spam_headers` (a list of "Header: value" strings;
        a header whose value starts with that value, case-insensitively, flags
        spam; replaces the SpamAssassin defaults). `max_message_bytes` defaults to
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
            allowed_recipients=tuple(_string_list(list(allowed_recipients or ()), "allowed_recipients")),
            max_message_bytes=limit,
            loop_header=loop_header,
            trusted_authserv_id=trusted.strip(),
            attachments=AttachmentPolicy.from_settings(settings.get("attachment_policy")),
        )

    @classmethod
    def from_mailbox(cls, mailbox, *, max_message_bytes: int | None = None) -> MailboxPolicy:
        """From an `intake.Mailbox` (its `settings` and `allowed_recipients`)."""
        return cls.from_settings(mailbox.settings, allowed_recipients=mailbox.allowed_recipients or (),
                                 max_message_bytes=max_message_bytes)


# -- rules ------------------------------------------------------------------------------------

def _recipient_allowed(address: str, allowed: tuple[str, ...]) -> bool:
    address = address.strip().lower()
    local, _, domain = address.rpartition("@")
    base = f"{local.split('+', 1)[0]}@{domain}"
    for entry in allowed:
        entry = entry.strip().lower()
        if entry.startswith("@"):
            if domain == entry[1:]:
                return True
        elif address == entry or base == entry:
            return True
    return False


def _extension(filename: str) -> str:
    return filename.rsplit(".", 1)[-1].strip().lower() if "." in filename else ""


def _loop_values(parsed: ParsedMessage, header: str) -> list[str]:
    if parsed.loop_header.lower() == header.lower():
        return parsed.loop_values
    message = getattr(parsed, "_message", None)   # parsed with another loop header name: look it up
    try:
        return [str(v) for v in (message.get_all(header) or [])] if message is not None else []
    except Exception:
        return []


def _daemon_sender(parsed: ParsedMessage) -> str:
    """The sender when it is a mail system (MAILER-DAEMON, postmaster), with or without a domain; else ""."""
    if parsed.sender:
        return parsed.sender if parsed.sender.rpartition("@")[0].lower() in DAEMON_LOCAL_PARTS else ""
    hint = (parsed.sender_hint or "").strip("<> ").lower()
    return hint if hint.split("@", 1)[0] in DAEMON_LOCAL_PARTS else ""


def spam_flagged(parsed: ParsedMessage, policy: MailboxPolicy | None = None) -> bool:
    """True when a header the mailbox trusts says a spam filter flagged the message."""
    policy = policy or MailboxPolicy()
    for header, prefix in policy.spam_headers:
        for value in _loop_values(parsed, header):
            if value.strip().lower().startswith(prefix):
                return True
    return False


def findings(parsed: ParsedMessage, policy: MailboxPolicy | None = None, *,
             envelope_recipients=()) -> list[Finding]:
    """Every rule that fires for `parsed`, in no particular order.

    `envelope_recipients`: RCPT TO addresses when the provider tells them (Mailgun's
    `recipient`, ...); they count like To/Cc/Delivered-To for `recipient_not_allowed`.
    """
    policy = policy or MailboxPolicy()
    out: list[Finding] = []
    attachments = parsed.attachments
    limits = policy.attachments

    # -- quarantine: attachment types
    for attachment in attachments:
        if attachment.size == 0 or attachment.origin == "encrypted":
            continue
        name = attachment.filename or "(unnamed)"
        extension = _extension(attachment.filename)
        if not limits.type_allowed(attachment.sniffed_type):
            out.append(Finding(QUARANTINED, ATTACHMENT_TYPE,
                               f"{name}: content is {attachment.sniffed_type} (declared {attachment.declared_type}),"
                               " which this mailbox does not accept"))
        elif extension and extension in limits.blocked_extensions:
            out.append(Finding(QUARANTINED, ATTACHMENT_TYPE, f"{name}: extension .{extension} is blocked"))

    # -- review
    if parsed.size > policy.max_message_bytes:
        out.append(Finding(AWAITING_REVIEW, TOO_LARGE,
                           f"message is {parsed.size} bytes; the limit is {policy.max_message_bytes}"))
    for attachment in attachments:
        if attachment.size > limits.max_bytes:
            out.append(Finding(AWAITING_REVIEW, TOO_LARGE,
                               f"{attachment.filename or '(unnamed)'} is {attachment.size} bytes;"
                               f" the limit is {limits.max_bytes}"))
    if len(attachments) > limits.max_attachments:
        out.append(Finding(AWAITING_REVIEW, TOO_MANY_ATTACHMENTS,
                           f"{len(attachments)} attachments; the limit is {limits.max_attachments}"))
    if parsed.too_complex:
        out.append(Finding(AWAITING_REVIEW, TOO_COMPLEX,
                           "MIME structure beyond the parser's limits; not every part was examined"))
    if parsed.encrypted:
        out.append(Finding(AWAITING_REVIEW, ENCRYPTED,
                           f"{'PGP' if parsed.encrypted == 'pgp' else 'S/MIME'} encrypted: a person must decide"))
    daemon_sender = _daemon_sender(parsed)
    if not parsed.sender and not (daemon_sender or parsed.content_type == "multipart/report"):
        out.append(Finding(AWAITING_REVIEW, MISSING_SENDER, "no usable address in From, Sender or Reply-To"))
    if policy.allowed_recipients:
        candidates = [*parsed.recipients, *parsed.delivered_to, *envelope_recipients]
        if not any(_recipient_allowed(a, policy.allowed_recipients) for a in candidates):
            shown = ", ".join(candidates[:5]) or "none"
            out.append(Finding(AWAITING_REVIEW, RECIPIENT_NOT_ALLOWED,
                               f"recipients ({shown}) are not among this mailbox's allowed recipients"))
    if not parsed.text.strip() and not any(a.size for a in attachments):
        out.append(Finding(AWAITING_REVIEW, EMPTY, "neither body text nor a non-empty attachment"))

    # -- suppression: loops and automatic mail
    loop_values = _loop_values(parsed, policy.loop_header)
    if loop_values:
        out.append(Finding(SUPPRESSED, OWN_MAIL_LOOP, f"{policy.loop_header}: {loop_values[0][:200]}"))
    if parsed.content_type == "multipart/report":
        out.append(Finding(SUPPRESSED, DELIVERY_REPORT, f"multipart/report; report-type={parsed.report_type or '?'}"))
    if daemon_sender:
        out.append(Finding(SUPPRESSED, MAILER_DAEMON, f"sender {daemon_sender[:200]}"))
    if parsed.return_path == "":
        out.append(Finding(SUPPRESSED, EMPTY_RETURN_PATH, "Return-Path: <>"))
    if parsed.auto_submitted is not None and parsed.auto_submitted != "no":
        out.append(Finding(SUPPRESSED, AUTO_SUBMITTED, f"Auto-Submitted: {parsed.auto_submitted[:200]}"))
    for header, value in (("X-Autoreply", parsed.x_autoreply), ("X-Autorespond", parsed.x_autorespond)):
        if value is not None and value.strip().lower() not in ("no", "false", "0"):
            out.append(Finding(SUPPRESSED, AUTOREPLY_HEADER, f"{header}: {value[:200]}"))
            break
    if parsed.precedence in ("bulk", "junk", "list"):
        out.append(Finding(SUPPRESSED, PRECEDENCE_BULK, f"Precedence: {parsed.precedence}"))
    return out


def _rank(finding: Finding) -> tuple[int, int]:
    state_rank = STATE_ORDER.index(finding.state) if finding.state in STATE_ORDER else len(STATE_ORDER)
    reasons = REASON_ORDER.get(finding.state, ())
    reason_rank = reasons.index(finding.reason_code) if finding.reason_code in reasons else len(reasons)
    return state_rank, reason_rank


def decide(found) -> Verdict:
    """The verdict for a list of findings: the highest by the precedence above, or ok."""
    ordered = tuple(sorted((f for f in found if f.state != OK), key=_rank))
    if not ordered:
        return Verdict(OK, "", "")
    first = ordered[0]
    return Verdict(first.state, first.reason_code, first.detail, ordered)


def validate(parsed: ParsedMessage, policy: MailboxPolicy | None = None, *, envelope_recipients=(),
             extra=()) -> Verdict:
    """The verdict for `parsed` under `policy` (defaults when None), with `extra` findings
    (scan results, ...) taken into account. Never raises on any ParsedMessage that
    `parse_message` returns."""
    return decide([*findings(parsed, policy, envelope_recipients=envelope_recipients), *extra])


def malware_finding(filename: str, signature: str) -> Finding:
    return Finding(QUARANTINED, MALWARE, f"{filename or '(unnamed)'}: {signature}")


def scanner_unavailable_finding(detail: str) -> Finding:
    """For the caller that gave up retrying the scanner: review, never pass unscanned."""
    return Finding(AWAITING_REVIEW, SCANNER_UNAVAILABLE, detail)


# -- authentication results (RFC 8601) --------------------------------------------------------

_RESINFO = re.compile(r'([A-Za-z0-9_.-]+)(?:\s*/\s*[0-9]+)?\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;"]+)')


def _without_comments(value: str) -> str:
    out, depth, quoted, escaped = [], 0, False, False
    for char in value:
        if escaped:
            escaped = False
            if depth == 0:
                out.append(char)
            continue
        if char == "\\":
            escaped = True
            if depth == 0:
                out.append(char)
            continue
        if quoted:
            out.append(char)
            if char == '"':
                quoted = False
            continue
        if char == "(":
            depth += 1
        elif char == ")" and depth:
            depth -= 1
        elif depth == 0:
            if char == '"':
                quoted = True
            out.append(char)
    return "".join(out)


def _split_semicolons(value: str) -> list[str]:
    parts, current, quoted = [], [], False
    for char in value:
        if char == '"':
            quoted = not quoted
        if char == ";" and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts]


def parse_authentication_results(value: str) -> tuple[str, list[tuple[str, str, dict[str, str]]]]:
    """(authserv-id, [(method, result, {ptype.property: value})]) of one header value."""
    segments = _split_semicolons(_without_comments(value[:16384]))
    head = segments[0].split()
    authserv_id = head[0].lower() if head else ""
    results = []
    for segment in segments[1:]:
        pairs = [(k.lower(), v.strip('"')) for k, v in _RESINFO.findall(segment)]
        if not pairs:
            continue
        (method, result), properties = pairs[0], dict(pairs[1:])
        results.append((method, result.lower(), properties))
    return authserv_id, results


def authentication_results(parsed: ParsedMessage, trusted_authserv_id: str) -> dict[str, str]:
    """SPF, DKIM, DMARC (and any other method) results our own MTA recorded.

    Only the first (topmost, i.e. most recently added) Authentication-Results
    whose authserv-id equals `trusted_authserv_id` (case-insensitive) is read;
    every other instance may have been written by the sender and is ignored.
    Empty dict when `trusted_authserv_id` is empty or no instance matches.

    Keys: the method ("spf", "dkim", "dmarc", ...) -> its result ("pass",
    "fail", ...), and "<method>.<ptype>.<property>" -> value for the result
    kept (e.g. "dkim.header.d", "spf.smtp.mailfrom", "dmarc.header.from").
    With several results for one method (several DKIM signatures) a "pass" is
    kept if there is one, else the first.
    """
    trusted = (trusted_authserv_id or "").strip().lower()
    if not trusted:
        return {}
    for value in parsed.authentication_results:
        try:
            authserv_id, results = parse_authentication_results(value)
        except Exception:
            continue
        if authserv_id != trusted:
            continue
        out: dict[str, str] = {}
        for method, result, properties in results:
            if method in out and not (result == "pass" and out[method] != "pass"):
                continue
            for key in [k for k in out if k.startswith(method + ".")]:
                del out[key]
            out[method] = result
            for key, prop in properties.items():
                if "." in key:
                    out[f"{method}.{key}"] = prop
        return out
    return {}


# -- threading --------------------------------------------------------------------------------

_TICKET_TOKEN = re.compile(r"\[#\s*([A-Za-z][A-Za-z0-9]{0,15}-[0-9]{1,12})\s*\]")


def thread_key(parsed: ParsedMessage) -> str:
    """sha256 hex (64 chars) of the thread's root Message-ID.

    Root: the first References id, else In-Reply-To, else the message's own
    Message-ID; a reply and the message it answers get the same key. Without any
    of them the message is a thread of its own: the key comes from the raw bytes.
    """
    return thread_key_of(parsed.message_id, parsed.in_reply_to, parsed.references, parsed.raw_sha256)


def thread_key_of(message_id: str, in_reply_to: str, references: list[str], raw_sha256: str) -> str:
    root = (references[0] if references else "") or in_reply_to or message_id
    if not root:
        root = "raw:" + (raw_sha256 or "")
    return hashlib.sha256(root.encode("utf-8", "surrogatepass")).hexdigest()


def subject_ticket_token(subject: str, prefix: str | None = None) -> str | None:
    """The first ticket token like "[#MR-1234]" in a subject, as "MR-1234"; None if there is none.

    With `prefix`, only tokens with that prefix (case-insensitive) count.
    """
    for match in _TICKET_TOKEN.finditer(subject or ""):
        token = match.group(1).upper()
        if prefix is None or token.split("-", 1)[0] == prefix.upper():
            return token
    return None

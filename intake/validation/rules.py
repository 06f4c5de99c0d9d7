"""The rules: which findings a parsed message raises, and the one that decides. Pure, no I/O.

    parsed = parse_message(raw, loop_header=policy.loop_header)
    verdict = validate(parsed, policy)                  # Verdict(state, reason_code, detail, findings)
    # after scanning the attachments (intake.scanning):
    verdict = validate(parsed, policy, extra=[malware_finding(name, signature)])

`findings()` lists every rule that fired; `validate()` returns the one that
decides (`decide()`), with all of them attached for display.

Precedence (first wins; within a state, in the order of the tuples below):

1. quarantined  — `malware`, `attachment_type`
2. awaiting_review — `too_large`, `too_many_attachments`, `too_complex`,
   `encrypted`, `encrypted_archive`, `missing_sender`, `recipient_not_allowed`, `empty`,
   `sender_rate_limited`, `empty_return_path`, then any other review reason the
   caller adds (e.g. `scanner_unavailable`)
3. suppressed — `own_mail_loop`, `delivery_report`, `mailer_daemon`,
   `calendar_reply`, `auto_submitted`, `autoreply_header`, `precedence_bulk`
4. ok

Suppression only on evidence, and the evidence named in the finding's detail
(the console shows it as the reason detail): a `mailer-daemon@`/`postmaster@`
sender is `mailer_daemon` only with bounce evidence (`intake.validation.bounces`:
report parts, DSN fields, bounce template sentences, no body text), e.g.
"sender MAILER-DAEMON@mx1.example and DSN fields (Final-Recipient, Status: 5.1.1)";
without it the message is a person's (postmaster is a mailbox people answer
from). An empty Return-Path alone is not automatic mail either: clients and
gateways send `<>` for a person's mail too, so when no other loop or noise rule
fired it sends the message to review (`empty_return_path`), never to
suppression. Meeting replies (iTIP REPLY, COUNTER, REFRESH, and the organizer's
CANCEL and DECLINECOUNTER, read by `intake.mime.calendar`) are `calendar_reply`
with the method and PARTSTAT; a meeting REQUEST or PUBLISH is a ticket.

Why: only `ok` ever leads to a ticket or an acknowledgment, so a message on
which any loop rule fired can never be acknowledged, whatever wins. Among the
other states, dangerous content comes first: a quarantined message must not be
released by a reviewer who was only told "too large", nor sit unseen among
suppressed noise. Review comes before suppression because suppression is the
one state nobody is asked to look at: when a message is both invalid and looks
automatic, a person sees it ("invalid mail is never dropped"); suppression is
chosen only when nothing else is wrong with the message.

The attachment policy these rules apply is described in `intake.validation.policy`.

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

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..mime import ParsedMessage
from ..mime.calendar import calendar_method
from ..vocabulary import ReasonCode
from .bounces import bounce_evidence
from .policy import MailboxPolicy

if TYPE_CHECKING:
    from ..mime import Attachment
    from .policy import AttachmentPolicy

OK = "ok"
AWAITING_REVIEW = "awaiting_review"
SUPPRESSED = "suppressed"
QUARANTINED = "quarantined"


STATE_ORDER = (QUARANTINED, AWAITING_REVIEW, SUPPRESSED)
REASON_ORDER = {
    QUARANTINED: (ReasonCode.MALWARE, ReasonCode.ATTACHMENT_TYPE),
    AWAITING_REVIEW: (
        ReasonCode.TOO_LARGE,
        ReasonCode.TOO_MANY_ATTACHMENTS,
        ReasonCode.TOO_COMPLEX,
        ReasonCode.ENCRYPTED,
        ReasonCode.ENCRYPTED_ARCHIVE,
        ReasonCode.MISSING_SENDER,
        ReasonCode.RECIPIENT_NOT_ALLOWED,
        ReasonCode.EMPTY,
        ReasonCode.SENDER_RATE_LIMITED,
        ReasonCode.EMPTY_RETURN_PATH,
    ),
    SUPPRESSED: (
        ReasonCode.OWN_MAIL_LOOP,
        ReasonCode.DELIVERY_REPORT,
        ReasonCode.MAILER_DAEMON,
        ReasonCode.CALENDAR_REPLY,
        ReasonCode.AUTO_SUBMITTED,
        ReasonCode.AUTOREPLY_HEADER,
        ReasonCode.PRECEDENCE_BULK,
    ),
}

DAEMON_LOCAL_PARTS = frozenset({"mailer-daemon", "postmaster"})
# Attachment.origin of the files listed from inside an archive or an Outlook .msg (intake.mime.containers).
CONTAINER_MEMBER_ORIGINS = frozenset({"archive", "outlook"})
# iTIP methods that answer or withdraw a meeting rather than ask for one (RFC 5546 §1.4).
CALENDAR_REPLY_METHODS = frozenset({"REPLY", "COUNTER", "REFRESH", "CANCEL", "DECLINECOUNTER"})


@dataclass(frozen=True)
class Finding:
    state: str
    reason_code: str
    detail: str = ""


@dataclass(frozen=True)
class Verdict:
    state: str  # "ok", "awaiting_review", "suppressed" or "quarantined"
    reason_code: str  # "" when ok
    detail: str = ""
    findings: tuple[Finding, ...] = ()  # every rule that fired, deciding one first

    @property
    def ok(self) -> bool:
        return self.state == OK


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
    message = parsed.email_message  # parsed with another loop header name: look it up
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


def findings(
    parsed: ParsedMessage, policy: MailboxPolicy | None = None, *, envelope_recipients: Iterable[str] = ()
) -> list[Finding]:
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
        problem = attachment_type_problem(attachment, limits)
        if problem:
            out.append(
                Finding(QUARANTINED, ReasonCode.ATTACHMENT_TYPE, f"{attachment.filename or '(unnamed)'}: {problem}")
            )
    # An encrypted archive (intake.mime.archives): its files cannot be judged nor scanned, a person decides.
    for attachment in attachments:
        if attachment.contents == "encrypted":
            out.append(
                Finding(
                    AWAITING_REVIEW,
                    ReasonCode.ENCRYPTED_ARCHIVE,
                    f"{attachment.filename or '(unnamed)'}: encrypted archive; its files cannot be checked",
                )
            )

    # -- review
    if parsed.size > policy.max_message_bytes:
        out.append(
            Finding(
                AWAITING_REVIEW,
                ReasonCode.TOO_LARGE,
                f"message is {parsed.size} bytes; the limit is {policy.max_message_bytes}",
            )
        )
    # The files inside an archive or a .msg are judged by type and scanned, but the holder is the one file kept
    # and sent: a zip of 60 PDFs is one attachment, and a log that unpacks past the size limit is no reason to ask.
    held = [a for a in attachments if a.origin not in CONTAINER_MEMBER_ORIGINS]
    for attachment in held:
        if attachment.size > limits.max_bytes:
            out.append(
                Finding(
                    AWAITING_REVIEW,
                    ReasonCode.TOO_LARGE,
                    f"{attachment.filename or '(unnamed)'} is {attachment.size} bytes; the limit is {limits.max_bytes}",
                )
            )
    if len(held) > limits.max_attachments:
        out.append(
            Finding(
                AWAITING_REVIEW,
                ReasonCode.TOO_MANY_ATTACHMENTS,
                f"{len(held)} attachments; the limit is {limits.max_attachments}",
            )
        )
    if parsed.too_complex:
        out.append(
            Finding(
                AWAITING_REVIEW,
                ReasonCode.TOO_COMPLEX,
                "MIME structure beyond the parser's limits; not every part was examined",
            )
        )
    if parsed.encrypted:
        out.append(
            Finding(
                AWAITING_REVIEW,
                ReasonCode.ENCRYPTED,
                f"{'PGP' if parsed.encrypted == 'pgp' else 'S/MIME'} encrypted: a person must decide",
            )
        )
    daemon_sender = _daemon_sender(parsed)
    if not parsed.sender and not (daemon_sender or parsed.content_type == "multipart/report"):
        out.append(Finding(AWAITING_REVIEW, ReasonCode.MISSING_SENDER, "no usable address in From, Sender or Reply-To"))
    if policy.allowed_recipients:
        candidates = [*parsed.recipients, *parsed.delivered_to, *envelope_recipients]
        if not any(_recipient_allowed(a, policy.allowed_recipients) for a in candidates):
            shown = ", ".join(candidates[:5]) or "none"
            out.append(
                Finding(
                    AWAITING_REVIEW,
                    ReasonCode.RECIPIENT_NOT_ALLOWED,
                    f"recipients ({shown}) are not among this mailbox's allowed recipients",
                )
            )
    if not parsed.text.strip() and not any(a.size for a in attachments):
        out.append(Finding(AWAITING_REVIEW, ReasonCode.EMPTY, "neither body text nor a non-empty attachment"))

    # -- suppression: loops and automatic mail
    loop_values = _loop_values(parsed, policy.loop_header)
    if loop_values:
        out.append(Finding(SUPPRESSED, ReasonCode.OWN_MAIL_LOOP, f"{policy.loop_header}: {loop_values[0][:200]}"))
    if parsed.content_type == "multipart/report":
        out.append(
            Finding(
                SUPPRESSED, ReasonCode.DELIVERY_REPORT, f"multipart/report; report-type={parsed.report_type or '?'}"
            )
        )
    if daemon_sender:
        evidence = bounce_evidence(parsed=parsed)
        if evidence:
            out.append(
                Finding(
                    SUPPRESSED,
                    ReasonCode.MAILER_DAEMON,
                    f"sender {daemon_sender[:120]} and {' and '.join(evidence[:3])}"[:300],
                )
            )
    calendar = calendar_method(parsed=parsed)
    if calendar.method in CALENDAR_REPLY_METHODS:
        # The attendee's answer; an organizer's CANCEL lists attendees whose PARTSTAT says nothing.
        answer = calendar.partstat if calendar.method in ("REPLY", "COUNTER") else ""
        partstat = f", PARTSTAT={answer}" if answer else ""
        out.append(
            Finding(
                SUPPRESSED, ReasonCode.CALENDAR_REPLY, f"iTIP METHOD:{calendar.method}{partstat} ({calendar.part_type})"
            )
        )
    if parsed.auto_submitted is not None and parsed.auto_submitted != "no":
        out.append(Finding(SUPPRESSED, ReasonCode.AUTO_SUBMITTED, f"Auto-Submitted: {parsed.auto_submitted[:200]}"))
    for header, value in (("X-Autoreply", parsed.x_autoreply), ("X-Autorespond", parsed.x_autorespond)):
        if value is not None and value.strip().lower() not in ("no", "false", "0"):
            out.append(Finding(SUPPRESSED, ReasonCode.AUTOREPLY_HEADER, f"{header}: {value[:200]}"))
            break
    if parsed.precedence in ("bulk", "junk", "list"):
        out.append(Finding(SUPPRESSED, ReasonCode.PRECEDENCE_BULK, f"Precedence: {parsed.precedence}"))
    if parsed.return_path == "" and not any(f.state == SUPPRESSED for f in out):
        # Bounces and auto-replies carry <> too, and are explained by the rule that fired for them.
        out.append(
            Finding(
                AWAITING_REVIEW,
                ReasonCode.EMPTY_RETURN_PATH,
                "Return-Path: <> but no other sign of automatic mail: a person decides",
            )
        )
    return out


def _rank(finding: Finding) -> tuple[int, int]:
    state_rank = STATE_ORDER.index(finding.state) if finding.state in STATE_ORDER else len(STATE_ORDER)
    reasons = REASON_ORDER.get(finding.state, ())
    reason_rank = reasons.index(finding.reason_code) if finding.reason_code in reasons else len(reasons)
    return state_rank, reason_rank


def decide(found: Iterable[Finding]) -> Verdict:
    """The verdict for a list of findings: the highest by the precedence above, or ok."""
    ordered = tuple(sorted((f for f in found if f.state != OK), key=_rank))
    if not ordered:
        return Verdict(OK, "", "")
    first = ordered[0]
    return Verdict(first.state, first.reason_code, first.detail, ordered)


def validate(
    parsed: ParsedMessage,
    policy: MailboxPolicy | None = None,
    *,
    envelope_recipients: Iterable[str] = (),
    extra: Iterable[Finding] = (),
) -> Verdict:
    """The verdict for `parsed` under `policy` (defaults when None), with `extra` findings
    (scan results, ...) taken into account. Never raises on any ParsedMessage that
    `parse_message` returns."""
    return decide([*findings(parsed, policy, envelope_recipients=envelope_recipients), *extra])


def attachment_type_problem(attachment: Attachment, limits: AttachmentPolicy) -> str | None:
    """Why the mailbox's attachment policy refuses this file's type, or None (also asked when a released
    message's files go to a desk: a refused file stays in Mailroom, listed on the ticket)."""
    if attachment.size == 0 or attachment.origin == "encrypted":
        return None
    extension = _extension(attachment.filename)
    if not limits.type_allowed(attachment.sniffed_type):
        return (
            f"content is {attachment.sniffed_type} (declared {attachment.declared_type}),"
            " which this mailbox does not accept"
        )
    if extension and extension in limits.blocked_extensions:
        return f"extension .{extension} is blocked"
    return None


def malware_finding(filename: str, signature: str) -> Finding:
    return Finding(QUARANTINED, ReasonCode.MALWARE, f"{filename or '(unnamed)'}: {signature}")


def scanner_unavailable_finding(detail: str) -> Finding:
    """For the caller that gave up retrying the scanner: review, never pass unscanned."""
    return Finding(AWAITING_REVIEW, ReasonCode.SCANNER_UNAVAILABLE, detail)

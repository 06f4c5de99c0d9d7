"""Normalize and validate one inbox event: the stage between intake and routing.

Parse the stored MIME, apply the mailbox's policy (validation, loop and noise
rules, sender rate limit, attachment types), scan attachments with clamd, and
record the outcome: `ready` for routing, or `awaiting_review` / `suppressed` /
`quarantined` with a reason. Nothing is ever deleted, and no exception leaves
this stage: a message we cannot read goes to review with a reason.

Besides the verdict, `InboxEvent.details` keeps what the acknowledgment is decided
on later (`ticketing.ack_policy.acknowledgment_skip_reason`): `spam_flagged`,
`spam_score` ({"score", "source", "threshold"}: the mailbox's `spam_score_threshold`
when judged; with `MAILROOM_RSPAMD_URL` set, rspamd's score when higher, `intake.spamcheck`)
and `automated` ({"reason": "list_mail" | "automated_notification",
"evidence"}), from `intake.validation`.
"""

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from . import archive, scanning, spamcheck
from .mime import ParsedMessage, iter_attachment_files, parse_message
from .models import InboxEvent, Mailbox
from .rawload import load_raw
from .sender_lists import sender_list_entry_for
from .services import transition_event, wait_event
from .validation import sender_lists
from .validation.authresults import (
    PROVIDERS_WITH_VERDICTS,
    aligned_method,
    authentication_results,
    domain_of,
    header_fields,
    provider_authentication_results,
)
from .validation.automation import automated_sender
from .validation.policy import MailboxPolicy
from .validation.rules import (
    AWAITING_REVIEW,
    SUPPRESSED,
    Finding,
    Verdict,
    malware_finding,
    scanner_unavailable_finding,
    spam_flagged,
    validate,
)
from .validation.spamscore import DEFAULT_SPAM_SCORE_THRESHOLD, spam_score
from .validation.threading import subject_ticket_token, thread_key
from .vocabulary import AuditKind, ReasonCode

logger = logging.getLogger(__name__)

State = InboxEvent.State
SENDER_RATE_LIMITED = ReasonCode.SENDER_RATE_LIMITED
# Over the limit, mail goes to review; a mailbox may opt into suppression with "action": "suppress".
DEFAULT_SENDER_LIMIT = {"count": 20, "seconds": 600, "action": "review"}
# The audit row of each verdict but `ok` (received -> ready is not audited: see transition_event).
VERDICT_AUDIT_KIND: dict[str, AuditKind] = {
    State.AWAITING_REVIEW: AuditKind.AWAITING_REVIEW,
    State.SUPPRESSED: AuditKind.SUPPRESSED,
    State.QUARANTINED: AuditKind.QUARANTINED,
}


@dataclass
class Outcome:
    """What normalization decided. `parsed` is there for routing when `state` is ready."""

    state: str
    reason_code: str = ""
    parsed: ParsedMessage | None = None


def policy_for(mailbox: Mailbox) -> MailboxPolicy:
    return MailboxPolicy.from_settings(
        {"loop_header": settings.MAILROOM_LOOP_HEADER, **(mailbox.settings or {})},
        allowed_recipients=mailbox.allowed_recipients or (),
    )


def _sender_over_limit(event: InboxEvent, sender: str) -> Finding | None:
    if not sender:
        return None
    limit = {**DEFAULT_SENDER_LIMIT, **((event.mailbox.settings or {}).get("sender_rate_limit") or {})}
    since = event.received_at - timedelta(seconds=int(limit["seconds"]))
    # An archive import's history is not a flood from the sender (intake.archive).
    earlier = InboxEvent.objects.filter(
        mailbox_id=event.mailbox_id, sender__iexact=sender, received_at__gte=since, pk__lt=event.pk, history=False
    ).count()
    if earlier >= int(limit["count"]):
        state = SUPPRESSED if limit.get("action") == "suppress" else AWAITING_REVIEW
        return Finding(
            state, SENDER_RATE_LIMITED, f"{earlier} earlier messages from this sender within {limit['seconds']} s"
        )
    return None


def _scan(event: InboxEvent, parsed: ParsedMessage) -> list[Finding] | None:
    """Malware findings, [] when clean, None when the scanner could not answer (try again later)."""
    if not parsed.attachments:
        return []
    client = scanning.scanner_from_setting(settings.MAILROOM_CLAMD, timeout=settings.MAILROOM_CLAMD_TIMEOUT)
    if client is None:
        logger.warning("event %s: %d attachments not scanned: MAILROOM_CLAMD=off", event.pk, len(parsed.attachments))
        return []
    found = []
    try:
        for attachment, file in iter_attachment_files(parsed, spool_threshold=settings.MAILROOM_SPOOL_THRESHOLD_BYTES):
            result = client.scan(file)
            if not result.clean:
                found.append(malware_finding(attachment.filename, result.signature or "unknown"))
    except scanning.ScanLimitExceeded as exc:
        return [scanner_unavailable_finding(f"too large for the scanner: {exc}")]
    except scanning.ScannerUnavailable as exc:
        logger.warning("event %s: scanner unavailable (%s)", event.pk, type(exc).__name__)
        return None
    return found


def _scan_verdict(parsed: ParsedMessage, findings: list[Finding]) -> str:
    """`details["attachment_scan"]`, a filter rule's `attachment_verdict`: none, clean, infected or unscanned."""
    if not parsed.attachments:
        return "none"
    reasons = {f.reason_code for f in findings}
    if ReasonCode.MALWARE in reasons:
        return "infected"
    if ReasonCode.SCANNER_UNAVAILABLE in reasons or settings.MAILROOM_CLAMD == "off":
        return "unscanned"
    return "clean"


def _rspamd(event: InboxEvent) -> spamcheck.RspamdResult | None:
    """rspamd's verdict when the platform configured one (MAILROOM_RSPAMD_URL); None when off, skipped or down."""
    client = spamcheck.rspamd_from_setting(settings.MAILROOM_RSPAMD_URL, timeout=settings.MAILROOM_RSPAMD_TIMEOUT)
    if client is None:
        return None
    try:
        return client.check(bytes(event.raw or b""), queue_id=f"mailroom-{event.pk}")
    except spamcheck.RspamdUnavailable as exc:
        logger.warning("event %s: rspamd unavailable (%s); judged on the headers' score only", event.pk, exc)
        return None
    finally:
        client.close()


def _spam_score(
    parsed: ParsedMessage, policy: MailboxPolicy | None, remote: spamcheck.RspamdResult | None
) -> dict[str, Any] | None:
    """The higher of the headers' score and rspamd's, with the threshold it is judged against."""
    threshold = policy.spam_score_threshold if policy is not None else DEFAULT_SPAM_SCORE_THRESHOLD
    score = spam_score(parsed=parsed)
    stored: dict[str, Any] | None = score.as_details(threshold) if score is not None else None
    if remote is not None and (stored is None or remote.score > stored["score"]):
        stored = {
            "score": remote.score,
            "source": "rspamd",
            "threshold": threshold,
            "action": remote.action,
            **({"required_score": remote.required_score} if remote.required_score is not None else {}),
        }
    return stored


def _details(
    parsed: ParsedMessage,
    verdict: Verdict,
    policy: MailboxPolicy | None,
    remote: spamcheck.RspamdResult | None = None,
) -> dict[str, Any]:
    details = {
        "attachments": [
            {
                "filename": a.filename,
                "declared_type": a.declared_type,
                "sniffed_type": a.sniffed_type,
                "size": a.size,
                "sha256": a.sha256,
                "inline": a.is_inline,
                **({"origin": a.origin} if a.origin else {}),
                **({"nested": True} if a.nested else {}),
                **({"contents": a.contents} if a.contents else {}),
            }
            for a in parsed.attachments[:200]
        ],
        "attachment_count": len(parsed.attachments),
        "defects": sorted(set(parsed.defects))[:50],
        "findings": [
            {"state": f.state, "reason": f.reason_code, "detail": f.detail[:300]} for f in verdict.findings[:20]
        ],
        "sender_source": parsed.sender_source,
        "body_source": parsed.body_source,
    }
    optional = {
        "signatures": parsed.signatures[:10],
        "encrypted": parsed.encrypted,
        "alternatives": parsed.alternatives[:10],
        "text_truncated": parsed.text_truncated,
        "smime_certs_only": parsed.smime_certs_only,
        "spam_flagged": policy is not None and spam_flagged(parsed, policy),
    }
    details.update({key: value for key, value in optional.items() if value})
    # Risk signals for the acknowledgment (ticketing.acknowledgments reads them from here): never the ticket's.
    score = _spam_score(parsed, policy, remote)
    if score is not None:
        details["spam_score"] = score
    automated = automated_sender(parsed=parsed)
    if automated is not None:
        details["automated"] = automated.as_details()
    if _is_reply(parsed):
        # Computed once and stored: every attempt at the comment sends the same text,
        # whatever a later version of the quote stripper would make of it.
        from .replytext import reply_text

        details["reply_text"] = reply_text(parsed)
    return details


def _is_reply(parsed: ParsedMessage) -> bool:
    return bool(parsed.in_reply_to or parsed.references or subject_ticket_token(parsed.subject))


def normalize(event: InboxEvent, actor: str) -> Outcome:
    """Decide what `event` is. Idempotent: an event already past `received` is re-parsed, not re-judged."""
    load_raw(event)  # when deferred: a large message a MiB at a time, one copy of it (intake.rawload)
    try:
        parsed = parse_message(bytes(event.raw or b""), loop_header=settings.MAILROOM_LOOP_HEADER)
    except Exception:  # parse_message promises not to raise; keep the promise here too
        logger.exception("event %s: parser failed", event.pk)
        parsed = None
    if event.state != State.RECEIVED:
        return Outcome(State.READY, parsed=parsed or ParsedMessage())
    if parsed is None:
        return _record(event, ParsedMessage(), Verdict(State.AWAITING_REVIEW, ReasonCode.UNPARSEABLE), actor)
    if archive.without_ticket(event):  # history kept without a ticket: stored, reconciled, never acknowledged
        return _record(event, parsed, Verdict(State.SUPPRESSED, ReasonCode.ARCHIVED), actor)

    try:
        policy = policy_for(event.mailbox)
    except ValueError as exc:
        verdict = Verdict(State.AWAITING_REVIEW, ReasonCode.MAILBOX_MISCONFIGURED, str(exc)[:300])
        return _record(event, parsed, verdict, actor)

    extra = []
    verdict = validate(parsed, policy)
    # Sender lists (intake.validation.sender_lists): a block suppresses, an allow skips the rate limit.
    listed = sender_list_entry_for(event, parsed.sender)
    if listed is not None and listed.kind == sender_lists.ALLOW and not _from_authenticated(event, parsed, policy):
        # Anyone can write an allowed address into From: an allow counts only for mail that proves it (a block
        # needs no proof: refusing a forgery costs nothing).
        listed = None
    # An archive import is a flood by design, and no one is replied to.
    if verdict.ok and not event.history and listed is None:
        # The limit holds back floods of would-be tickets; mail that a loop or noise rule
        # already set aside is explained better by that rule.
        rate = _sender_over_limit(event, parsed.sender)
        if rate:
            extra.append(rate)
            verdict = validate(parsed, policy, extra=extra)
    if verdict.state != State.QUARANTINED:
        scan_findings = _scan(event, parsed)
        if scan_findings is None:
            attempts = int((event.details or {}).get("scan_attempts", 0)) + 1
            if attempts < settings.MAILROOM_SCAN_ATTEMPTS:
                InboxEvent.objects.filter(pk=event.pk).update(
                    details={**(event.details or {}), "scan_attempts": attempts}
                )
                wait_event(event.pk, settings.MAILROOM_SCAN_RETRY_SECONDS * attempts)
                return Outcome("waiting", ReasonCode.SCANNER_UNAVAILABLE)
            scan_findings = [scanner_unavailable_finding(f"scanner unreachable after {attempts} attempts")]
        if scan_findings:
            verdict = validate(parsed, policy, extra=[*extra, *scan_findings])
        event.details = {**(event.details or {}), "attachment_scan": _scan_verdict(parsed, scan_findings)}
    if listed is not None and listed.kind == sender_lists.BLOCK:
        verdict = sender_lists.blocked_verdict(verdict, sender_lists.blocked_finding(listed))
    # Only mail about to become a ticket can be acknowledged: only it is worth a remote spam check.
    remote = _rspamd(event) if verdict.ok and not event.history else None
    return _record(event, parsed, verdict, actor, policy=policy, remote=remote)


def _from_authenticated(event: InboxEvent, parsed: ParsedMessage, policy: MailboxPolicy) -> bool:
    """A trusted pass aligned with the From domain: our own MTA's results, or the hosted provider's verdict."""
    from_domain = domain_of(parsed.sender or "")
    if aligned_method(authentication_results(parsed, policy.trusted_authserv_id), from_domain):
        return True
    provider = event.mailbox.provider
    if provider not in PROVIDERS_WITH_VERDICTS:
        return False
    fields = header_fields(bytes(event.raw or b""))
    return bool(aligned_method(provider_authentication_results(provider, fields, from_domain=from_domain), from_domain))


def _record(
    event: InboxEvent,
    parsed: ParsedMessage,
    verdict: Verdict,
    actor: str,
    policy: MailboxPolicy | None = None,
    remote: spamcheck.RspamdResult | None = None,
) -> Outcome:
    now = timezone.now()
    to_state = State.READY if verdict.ok else verdict.state
    auth = authentication_results(parsed, policy.trusted_authserv_id) if policy else {}
    details = {**(event.details or {}), **_details(parsed, verdict, policy, remote)}
    # One UPDATE on the hot path (ok: no audit row), plus the verdict's audit row otherwise.
    moved = transition_event(
        event.pk,
        [State.RECEIVED],
        to_state,
        actor=actor,
        now=now,
        kind=None if verdict.ok else VERDICT_AUDIT_KIND[verdict.state],
        reason_code=verdict.reason_code,
        reason_detail=verdict.detail,
        audit_detail={"reason": verdict.reason_code, "findings": [f.reason_code for f in verdict.findings]},
        extra={
            "message_id_header": parsed.message_id[:998],
            "sender": parsed.sender[:320],
            "subject": parsed.subject[:998],
            "thread_key": event.thread_key or thread_key(parsed),
            "auth_results": auth,
            "details": details,
            "retry_at": None,
        },
    )
    if moved:
        event.state, event.sender, event.subject = to_state, parsed.sender[:320], parsed.subject[:998]
        event.details, event.auth_results = details, auth  # what classification's facts read next
        event.thread_key = event.thread_key or thread_key(parsed)
        event.message_id_header = parsed.message_id[:998]
        if not verdict.ok:
            logger.info("event %s: %s/%s", event.pk, verdict.state, verdict.reason_code)
        return Outcome(to_state, verdict.reason_code, parsed)
    # Another worker judged it first: go on from what it decided.
    current = InboxEvent.objects.filter(pk=event.pk).values_list("state", flat=True).first()
    if current in (State.READY, State.WRITE_PENDING):
        event.state = current
        return Outcome(State.READY, parsed=parsed)
    return Outcome(current or event.state, verdict.reason_code, parsed)

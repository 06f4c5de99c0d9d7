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

Precedence (first wins; within a state, in the order of `rules.REASON_ORDER`):

1. quarantined  — `malware`, `attachment_type`
2. awaiting_review — `too_large`, `too_many_attachments`, `too_complex`,
   `encrypted`, `missing_sender`, `recipient_not_allowed`, `empty`,
   `sender_rate_limited`, `empty_return_path`, then any other review reason the
   caller adds (e.g. `scanner_unavailable`)
3. suppressed — `own_mail_loop`, `delivery_report`, `mailer_daemon`,
   `calendar_reply`, `auto_submitted`, `autoreply_header`, `precedence_bulk`
4. ok

Suppression only on evidence, named in the finding's detail (`rules`, `bounces`).
Two signals inform the acknowledgment, never the ticket: `automated_sender`
(list mail, product notifications) and `spam_score` (a filter's score against the
mailbox's `spam_score_threshold`); normalization stores both in `InboxEvent.details`.

Dangerous content first, review before suppression: `rules` says why.

The package, one concern per module (this module re-exports their API):

    policy        MailboxPolicy, AttachmentPolicy and their defaults (from `Mailbox.settings`)
    rules         Finding, Verdict, findings, decide, validate, spam_flagged, the precedence
    bounces       bounce_evidence: what makes a daemon sender's message a bounce
    automation    automated_sender: list mail and product notifications (VENDOR_HEADERS, ...)
    spamscore     spam_score: SpamAssassin / rspamd scores from the message's headers
    authresults   the Authentication-Results parser (RFC 8601) and the trusted results
    threading     thread keys and subject ticket tokens
"""

from .authresults import authentication_results, parse_authentication_results  # noqa: F401
from .automation import AUTOMATED_MAILERS, VENDOR_HEADER_PREFIXES, VENDOR_HEADERS, Automation, automated_sender  # noqa: F401
from .bounces import bounce_evidence  # noqa: F401
from .policy import (  # noqa: F401
    DEFAULT_ALLOWED_TYPES,
    DEFAULT_BLOCKED_EXTENSIONS,
    DEFAULT_MAX_ATTACHMENT_BYTES,
    DEFAULT_MAX_ATTACHMENTS,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_SPAM_HEADERS,
    AttachmentPolicy,
    MailboxPolicy,
)
from .rules import (  # noqa: F401
    AWAITING_REVIEW,
    CALENDAR_REPLY_METHODS,
    DAEMON_LOCAL_PARTS,
    OK,
    QUARANTINED,
    REASON_ORDER,
    STATE_ORDER,
    SUPPRESSED,
    Finding,
    Verdict,
    attachment_type_problem,
    decide,
    findings,
    malware_finding,
    scanner_unavailable_finding,
    spam_flagged,
    validate,
)
from .spamscore import DEFAULT_SPAM_SCORE_THRESHOLD, SpamScore, spam_score, spam_score_reached  # noqa: F401
from .threading import subject_ticket_token, thread_key, thread_key_of  # noqa: F401

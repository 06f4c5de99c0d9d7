"""The words Mailroom stores: audit kinds and reason codes, each with a human label.

Both are `TextChoices`, so a member *is* its stored string (`AuditKind.RECEIVED
== "received"`): the values below are what the database, the tests and outside
checks compare, and must not change. Add a member before writing a new word
anywhere; never build one by string formatting.

- `AuditKind`: `AuditEvent.kind` (`AuditEvent.Kind` is this class).
- `WebhookRejection`: why a webhook was refused (`intake.models.WebhookRejectionCount`).
- `ReasonCode`: `InboxEvent.reason_code`, the failure reasons of the destination
  and SMTP adapters (`ExternalCallError.reason`, also in `Intent.last_error_kind`),
  and the `reason` of a few audit rows. The label is the text the recovery queue
  shows (`reconciliation.selectors.reason_text`).

This module imports nothing from the apps, so `intake.validation` (pure
functions) can use it too.
"""

from enum import StrEnum

from django.db.models import TextChoices


class AuditKind(TextChoices):
    # intake: arrival and the stale-event sweep
    RECEIVED = "received", "Received"
    PROVIDER_METADATA = "provider_metadata", "Provider metadata kept"
    REQUEUED = "requeued", "Requeued by the stale-event sweep"
    POISON = "poison", "Failed as a poison message"
    # normalization's verdict (and routing's no_destination); the same words as the event states
    AWAITING_REVIEW = "awaiting_review", "Sent to review"
    SUPPRESSED = "suppressed", "Suppressed"
    QUARANTINED = "quarantined", "Quarantined"
    # ticketing: classification, threads, intents, acknowledgments
    CLASSIFIED = "classified", "Classified (route chosen)"
    FLAGGED = "flagged", "Flagged"
    INTENT_RETRY_WAIT = "intent_retry_wait", "Attempt failed; retry scheduled"
    INTENT_FAILED = "intent_failed", "Attempt failed for good"
    INTENT_UNKNOWN = "intent_unknown", "Attempt outcome unknown"
    INTENT_PENDING = "intent_pending", "Intent reopened"
    INTENT_HELD = "intent_held", "Intent held for investigation"
    TICKET_CREATED = "ticket_created", "Ticket created"
    COMMENT_ADDED = "comment_added", "Comment added"
    LINKED_COPY = "linked_copy", "Linked as a copy of another mailbox's event"
    ACKNOWLEDGED = "acknowledged", "Acknowledgment sent"
    ACKNOWLEDGMENT_SKIPPED = "acknowledgment_skipped", "Acknowledgment skipped"
    ACKNOWLEDGMENT_BOUNCED = "acknowledgment_bounced", "Acknowledgment bounced (the requester's address refused it)"
    FILES_ATTACHED = "files_attached", "Files attached to the ticket"
    FOLLOW_UP_PLANNED = "follow_up_planned", "Reply to a closed ticket: a follow-up ticket planned"
    REQUESTER_FROM_FORWARD = "requester_from_forward", "An agent's forward: the original sender is the requester"
    # operators (the recovery console)
    REPLAYED = "replayed", "Replayed"
    REPLAYED_AS_NEW_ACTION = "replayed_as_new_action", "Replayed as a new action"
    TICKET_CONFIRMED = "ticket_confirmed", "Existing ticket confirmed"
    ACKNOWLEDGMENT_HANDLED = "acknowledgment_handled", "Acknowledgment marked handled"
    CLOSED_NOT_A_REQUEST = "closed_not_a_request", "Closed as not a request"
    QUARANTINE_RELEASED = "quarantine_released", "Released from quarantine"
    ASSIGNED = "assigned", "Assigned"
    ESCALATION_SET = "escalation_set", "Escalation time set"
    BODY_VIEWED = "body_viewed", "Message body viewed"
    BODY_SEARCHED = "body_searched", "Message body searched by a routing rule's dry run"
    ATTACHMENT_DOWNLOADED = "attachment_downloaded", "Attachment downloaded"
    BULK_LOOKUP = "bulk_lookup", "Looked up for a bulk replay"
    REQUESTER_ENTERED = "requester_entered", "Requester address entered by an operator"
    BULK_JOB_APPLIED = "bulk_job_applied", "Handled by a bulk job over a filter"
    # retention (intake.retention)
    PURGED = "purged", "Message body purged by retention"
    LEGAL_HOLD_SET = "legal_hold_set", "Legal hold placed"
    LEGAL_HOLD_RELEASED = "legal_hold_released", "Legal hold released"


class WebhookRejection(TextChoices):
    """Why a webhook was refused: the `reason` label of `mailroom_webhook_rejections_total` (a fixed set)."""

    UNKNOWN_MAILBOX = "unknown_mailbox", "No such mailbox (or none of this provider): 404"
    NO_WEBHOOK = "no_webhook", "The mailbox's provider takes no webhooks: 404"
    TOO_LARGE = "too_large", "Body over MAILROOM_MAX_MESSAGE_BYTES: 413"
    BAD_SIGNATURE = "bad_signature", "Signature, token or timestamp refused: 401"
    NO_SECRET = "no_secret", "The mailbox's webhook secret cannot be resolved (fails closed): 401"
    EMPTY_BODY = "empty_body", "Empty raw webhook body: 400"
    UNPROCESSABLE = "unprocessable", "The provider's payload is unusable (permanent adapter error): 400"


class ReasonCode(TextChoices):
    # --- on an event: destination outcomes (ticketing) ----------------------------------
    CREDENTIALS = (
        "credentials",
        ("The destination refused our credentials (HTTP 401/403). Fix the destination, then replay."),
    )
    INVALID_FIELDS = (
        "invalid_fields",
        ("The destination rejected the ticket's fields (HTTP 400/422). Correct the route, then replay."),
    )
    RETRIES_EXHAUSTED = (
        "retries_exhausted",
        ("Temporary failures (rate limits, 5xx, refused connections) went on past the retry cap."),
    )
    CONFIGURATION = "configuration", "The destination is misconfigured (for example its base URL)."
    NOT_FOUND = "not_found", "The destination answered 'not found'."
    REJECTED = "rejected", "The destination rejected the request."
    CLAIM_EXPIRED = (
        "claim_expired",
        ("A worker stopped answering during an attempt: whether the ticket exists is unknown."),
    )
    TIMEOUT = "timeout", ("The destination did not answer in time after the request was sent: the outcome is unknown.")
    CONNECTION_LOST = "connection_lost", "The connection dropped after the request was sent: the outcome is unknown."
    SERVER_ERROR = "server_error", "The destination failed after the request was sent: the outcome is unknown."
    UNREADABLE_RESPONSE = "unreadable_response", "The destination's answer could not be read: the outcome is unknown."
    IDEMPOTENT_REQUEST_ERROR = (
        "idempotent_request_error",
        ("Our idempotency key was used with another body: a lookup must decide."),
    )
    OUTCOME_UNKNOWN = (
        "outcome_unknown",
        ("The destination offers neither idempotency nor a lookup: investigate before replaying."),
    )
    SEARCH_FOUND_NOTHING = (
        "search_found_nothing",
        (
            "The destination's search (which lags behind its writes) "
            "found no record after the settle delay: check the desk "
            "before replaying."
        ),
    )
    MULTIPLE_MATCHES = (
        "multiple_matches",
        ("The destination holds several records with our reference: decide which one is the ticket."),
    )
    NO_DESTINATION = "no_destination", "No destination: the tenant has no default and no rule matched."
    LOW_CONFIDENCE = (
        "low_confidence",
        ("The AI's proposal for the route was below the confidence the policy asks for: check the route, then replay."),
    )
    COPY_OF_UNRESOLVED = (
        "copy_of_unresolved",
        (
            "A copy of a message another mailbox of the tenant also received, "
            "whose event is not resolved: settle that one, then replay this."
        ),
    )
    POISON = "poison", "Handed to workers again and again without progress (poison message)."
    TICKET_CLOSED = (
        "ticket_closed",
        (
            "The ticket this reply belongs to is closed in the desk, and the "
            "destination's closed-ticket policy is review: decide, then replay."
        ),
    )
    # --- on an event: validation and normalization (intake) -------------------------------
    MALWARE = "malware", "An attachment matched a malware signature."
    ATTACHMENT_TYPE = "attachment_type", "An attachment's type or extension is not allowed."
    TOO_LARGE = "too_large", "The message is larger than the mailbox allows."
    TOO_MANY_ATTACHMENTS = "too_many_attachments", "The message has more attachments than the mailbox allows."
    TOO_COMPLEX = "too_complex", "The message is nested too deeply or has too many parts to analyse."
    MISSING_SENDER = "missing_sender", "The message has no usable sender address."
    RECIPIENT_NOT_ALLOWED = (
        "recipient_not_allowed",
        ("The message was not addressed to an allowed recipient of this mailbox."),
    )
    EMPTY = "empty", "The message has neither text nor attachments."
    SCANNER_UNAVAILABLE = "scanner_unavailable", "The malware scanner could not be reached."
    ENCRYPTED = "encrypted", ("The message is encrypted (PGP or S/MIME): a person must decide what to do with it.")
    ENCRYPTED_ARCHIVE = (
        "encrypted_archive",
        ("An attached archive is encrypted, so its files cannot be checked: a person must decide."),
    )
    SENDER_RATE_LIMITED = (
        "sender_rate_limited",
        ("More messages from this sender than the mailbox allows in its window (a flood?)."),
    )
    UNPARSEABLE = "unparseable", "The message could not be parsed."
    MAILBOX_MISCONFIGURED = "mailbox_misconfigured", "The mailbox's settings are invalid: fix them, then replay."
    # --- on an event: suppression rules (intake); no ticket wanted, an operator can still replay
    OWN_MAIL_LOOP = "own_mail_loop", "Our own mail came back (loop header)."
    DELIVERY_REPORT = "delivery_report", "A delivery report (bounce or read receipt)."
    MAILER_DAEMON = (
        "mailer_daemon",
        ("A mail system's report: a MAILER-DAEMON or postmaster sender with bounce evidence (the detail names it)."),
    )
    EMPTY_RETURN_PATH = (
        "empty_return_path",
        ("Sent with an empty Return-Path, as automatic mail is, but with no other sign of it: a person decides."),
    )
    AUTO_SUBMITTED = "auto_submitted", "Marked Auto-Submitted (an automatic reply or notification)."
    AUTOREPLY_HEADER = "autoreply_header", "Marked as an automatic reply (X-Autoreply / X-Autorespond)."
    PRECEDENCE_BULK = "precedence_bulk", "Bulk or mailing-list mail (Precedence: bulk/list/junk)."
    CALENDAR_REPLY = (
        "calendar_reply",
        ("A calendar client's meeting reply (accepted, declined, counter-proposal or cancellation): no request in it."),
    )
    # --- on an event: operator decisions (reconciliation) ---------------------------------
    NOT_A_REQUEST = "not_a_request", "Closed by a reviewer as not-a-request."
    # --- transient failures: retried, so they reach an event only as retries_exhausted ----
    CONNECTION = "connection", "The destination could not be reached (refused, DNS, TLS): nothing was sent."
    RATE_LIMITED = "rate_limited", "The destination asked us to slow down (HTTP 429)."
    UNAVAILABLE = "unavailable", "The destination was unavailable (HTTP 503)."
    CONFLICT = "conflict", "The destination reported a conflict (HTTP 409)."
    SMTP_UNAVAILABLE = "smtp_unavailable", "The mail server refused or could not be reached: nothing was sent."
    SMTP_TIMEOUT = "smtp_timeout", "The mail server did not answer in time: whether the email went out is unknown."
    # --- on an event: a later attempt failed for good after an earlier attempt's outcome was unknown
    # (ticketing.intents.record_failure asks the destination before calling it a failure)
    ASKING_AFTER_UNKNOWN = (
        "asking_after_unknown",
        (
            "A later attempt failed for good, but an earlier attempt's "
            "outcome is unknown: the destination is asked by our "
            "reference before it counts as a failure (not yet answered)."
        ),
    )
    FAILED_AFTER_UNKNOWN = (
        "failed_after_unknown",
        (
            "A later attempt failed for good, but an earlier attempt's "
            "outcome is unknown and the destination cannot be asked: "
            "check the desk before replaying."
        ),
    )
    # --- in audit rows only -----------------------------------------------------------------
    # why an intent left `unknown` for `pending` (intent_pending)
    IDEMPOTENCY_KEY_RETAINED = (
        "idempotency_key_retained",
        ("The destination still keeps our idempotency key: a retry is answered with the original."),
    )
    LOOKUP_FOUND_NOTHING = "lookup_found_nothing", "A lookup by external reference found no record: safe to retry."
    UPSERT_RETRY_SAFE = (
        "upsert_retry_safe",
        ("The destination inserts or updates on our key: a retry updates the one record."),
    )
    FILES_LOOKED_UP_FIRST = (
        "files_looked_up_first",
        ("Each file whose upload's answer was lost is looked up on the record before it is sent again."),
    )
    # `Intent.last_error_kind` of an unknown intent a reviewer replaced by a new action
    SUPERSEDED = "superseded", "Replaced by a new action a reviewer approved."
    # why no acknowledgment was sent (acknowledgment_skipped)
    ACK_DISABLED = "disabled", "The mailbox does not acknowledge."
    NO_SENDER = "no_sender", "The message has no sender to answer."
    SPAM_FLAGGED = "spam_flagged", "A trusted spam header flagged the message."
    NOREPLY_SENDER = "noreply_sender", "The sender is a no-reply or bounce address."
    LIST_MAIL = "list_mail", "Mailing-list or bulk mail (List-Id, List-Unsubscribe with Precedence)."
    AUTOMATED_NOTIFICATION = (
        "automated_notification",
        (
            "A notification from an automated system (an issue tracker's, "
            "a monitoring system's or a CI service's header)."
        ),
    )
    SPAM_SCORE = "spam_score", "A trusted spam score is at or above the mailbox's threshold."
    ADDRESS_NOT_DELIVERABLE = (
        "address_not_deliverable",
        ("The address is internationalised (RFC 6532) and the mail server does not take SMTPUTF8: nothing was sent."),
    )
    ADDRESS_BOUNCED = (
        "address_bounced",
        ("An earlier acknowledgment to this address bounced: none is sent to it until the mark expires."),
    )
    DMARC_FAIL = "dmarc_fail", "The sender's domain failed DMARC (our own mail server's or the provider's verdict)."
    INVALID_SENDER = "invalid_sender", "The sender address is not valid."
    UNAUTHENTICATED_SENDER = (
        "unauthenticated_sender",
        (
            "No trusted SPF, DKIM or DMARC result shows that the From "
            "address is the sender's (a forged From gets no email)."
        ),
    )
    DESK_ACKNOWLEDGES = (
        "desk_acknowledges",
        (
            "The destination's help desk acknowledges the requester itself "
            "(one acknowledgment, with the desk's ticket number)."
        ),
    )
    ACK_RATE_LIMITED = "ack_rate_limited", "The tenant has sent as many acknowledgments this hour as it may."
    ACK_DOMAIN_RATE_LIMITED = (
        "ack_domain_rate_limited",
        ("As many acknowledgments went to the sender's domain this hour as one domain may get."),
    )
    # Filters (issue 25): block lists, rule actions, archive import.
    SENDER_BLOCKED = "sender_blocked", "The sender or its domain is on a block list of the tenant or the mailbox."
    RULE_SUPPRESSED = "rule_suppressed", "A filter rule suppressed the message (the rule and its reason are shown)."
    MARKED_SPAM = "marked_spam", "A filter rule marked the message as spam: ticket in the spam queue, no reply."
    ARCHIVED = "archived", ("Imported as history by an archive import: stored and reconciled, never acknowledged.")
    ACK_TEMPLATE_FAILED = (
        "ack_template_failed",
        ("The mailbox's acknowledgment template could not be rendered within its limits: no acknowledgment was sent."),
    )


class MailboxAuditKind(TextChoices):
    """`MailboxAudit.kind`: what happened to a mailbox's connection, never an event's (those are `AuditKind`)."""

    TOKENS_CONNECTED = "tokens_connected", "OAuth tokens connected by an admin (consent flow)"
    REFRESH_TOKEN_ROTATED = "refresh_token_rotated", "The provider rotated the refresh token: the new one was stored"
    CREDENTIALS_EXPIRING = "credentials_expiring", "The admins were told the credentials expire soon"
    CREDENTIALS_REVOKED = "credentials_revoked", "The provider refused the credentials (revoked or expired)"
    LINK_FAILING = "link_failing", "Polling failed (the mailbox is failing)"
    LINK_DOWN = "link_down", "Polling kept failing (the mailbox is down)"
    LINK_RECOVERED = "link_recovered", "Polling works again (the mailbox recovered)"
    QUIET_ALARM = "quiet_alarm", "The mailbox has been silent for longer than its traffic suggests"
    QUIET_CLEARED = "quiet_cleared", "Mail arrives again after a quiet alarm"
    ARCHIVE_IMPORT_STARTED = "archive_import_started", "Archive import started"
    ARCHIVE_IMPORT_FINISHED = "archive_import_finished", "Archive import finished: the mailbox is live"


class SystemActor(StrEnum):
    """The `actor` of what Mailroom did by itself (audit rows, `paused_by`): one name per part, stored as is."""

    SWEEP = "system:sweep"  # the stale-event and expired-claim sweeps
    POLL = "system:poll"  # a mailbox poll (an archive import's start and end)
    BOUNCES = "system:bounces"  # a bounce of our own acknowledgment tied to its address
    ACKNOWLEDGMENTS = "system:acknowledgments"  # an acknowledgment planned or skipped
    BREAKER = "system:breaker"  # the circuit breaker pausing a destination
    RECONCILE = "system:reconcile"  # reconciliation, and the unknown-outcome lookups it runs
    DRILL = "system:drill"  # a drill's scratch destination
    MAILBOX_HEALTH = "system:mailbox-health"  # a mailbox's connection state (intake.mailbox_health)
    CREDENTIAL_WARNINGS = "system:credential-warnings"  # the admins told that credentials expire soon
    MANAGE_PY = "system:manage.py"  # a management command run from a shell


def actor_words(actor: str) -> str:
    """Who an audit row or a lease names, as a person reads it: `user:olga` -> "olga",
    `worker:vm:24553` -> "worker on vm, process 24553", `system:sweep` -> "Mailroom (sweep)",
    `provider:raw` -> "mail provider (raw)". Anything else is returned as stored."""
    role, _, rest = actor.partition(":")
    if not rest:
        return actor
    if role == "user":
        return rest
    if role == "system":
        return f"Mailroom ({rest})"
    if role == "provider":
        return f"mail provider ({rest})"
    host, _, pid = rest.rpartition(":")
    if pid.isdigit() and host:
        return f"{role} on {host}, process {pid}"
    if role == "worker":
        return f"worker {rest}"
    return actor

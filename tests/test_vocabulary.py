"""The stored vocabulary: audit kinds and reason codes are enums, their stored words never change.

Pure: no database.
"""

import ast

from intake import validation
from intake.models import AuditEvent, MailboxAudit
from intake.vocabulary import AuditKind, MailboxAuditKind, ReasonCode
from reconciliation import selectors
from tests.support.source import app_modules

# The words as stored today: tests, the console and outside checks compare them. Never rename one.
STORED_AUDIT_KINDS = {
    "received",
    "provider_metadata",
    "requeued",
    "poison",
    "awaiting_review",
    "suppressed",
    "quarantined",
    "classified",
    "flagged",
    "intent_retry_wait",
    "intent_failed",
    "intent_unknown",
    "intent_pending",
    "intent_held",
    "ticket_created",
    "comment_added",
    "linked_copy",
    "acknowledged",
    "acknowledgment_skipped",
    "replayed",
    "replayed_as_new_action",
    "ticket_confirmed",
    "acknowledgment_handled",
    "closed_not_a_request",
    "quarantine_released",
    "assigned",
    "escalation_set",
    "body_viewed",
    "attachment_downloaded",
    "bulk_lookup",
    "purged",
    "legal_hold_set",
    "legal_hold_released",
    "body_searched",
    "files_attached",
    "follow_up_planned",
    "requester_from_forward",
    "requester_entered",
    "bulk_job_applied",
    "acknowledgment_bounced",
}
EVENT_REASON_CODES = {
    "credentials",
    "invalid_fields",
    "retries_exhausted",
    "configuration",
    "not_found",
    "rejected",
    "claim_expired",
    "timeout",
    "connection_lost",
    "server_error",
    "unreadable_response",
    "idempotent_request_error",
    "outcome_unknown",
    "no_destination",
    "low_confidence",
    "poison",
    "malware",
    "attachment_type",
    "too_large",
    "too_many_attachments",
    "too_complex",
    "missing_sender",
    "recipient_not_allowed",
    "empty",
    "scanner_unavailable",
    "encrypted",
    "sender_rate_limited",
    "unparseable",
    "mailbox_misconfigured",
    "own_mail_loop",
    "delivery_report",
    "mailer_daemon",
    "empty_return_path",
    "auto_submitted",
    "autoreply_header",
    "precedence_bulk",
    "not_a_request",
    "ticket_closed",
    "calendar_reply",
    "encrypted_archive",
    "sender_blocked",
    "rule_suppressed",
    "archived",
}
STORED_MAILBOX_AUDIT_KINDS = {
    "tokens_connected",
    "refresh_token_rotated",
    "credentials_expiring",
    "credentials_revoked",
    "link_failing",
    "link_down",
    "link_recovered",
    "quiet_alarm",
    "quiet_cleared",
    "archive_import_started",
    "archive_import_finished",
}
# Functions whose `kind` (second positional argument, or keyword) is an audit kind.
KIND_TAKERS = {"record_audit": None, "transition_event": None}  # both take `kind` by keyword only


def test_the_stored_words_are_unchanged():
    assert set(AuditKind.values) == STORED_AUDIT_KINDS
    assert EVENT_REASON_CODES <= set(ReasonCode.values)
    assert AuditEvent.Kind is AuditKind
    assert set(MailboxAuditKind.values) == STORED_MAILBOX_AUDIT_KINDS
    assert MailboxAudit.Kind is MailboxAuditKind


def test_every_word_has_a_human_label():
    for member in [*AuditKind, *ReasonCode]:
        assert member.label and member.label != member.value, member


def test_the_queue_explains_every_reason_code_with_its_label():
    for code in ReasonCode:
        assert selectors.reason_text(code) == code.label
    assert selectors.reason_text(selectors.ACKNOWLEDGMENT_HELD)  # the one pseudo-code
    assert selectors.reason_text("") == "" and selectors.reason_text("no-such-code") == ""


def test_validation_reason_codes_are_the_enum():
    for codes in validation.REASON_ORDER.values():
        for code in codes:
            assert isinstance(code, ReasonCode), code
    # One name per word: validation names ReasonCode's members, it keeps no aliases of its own.
    aliases = [name for name in dir(validation) if name in ReasonCode.__members__]
    assert not aliases, aliases


def test_attempt_kinds_are_audit_kinds():
    assert all(isinstance(kind, AuditKind) for kind in selectors.ATTEMPT_KINDS)


def _kind_argument(call: ast.Call):
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    if name not in KIND_TAKERS:
        return None
    for keyword in call.keywords:
        if keyword.arg == "kind":
            return keyword.value
    position = KIND_TAKERS[name]
    if position is not None and len(call.args) > position:
        return call.args[position]
    return None


def test_no_audit_kind_is_a_literal_or_built_by_formatting():
    """Every kind handed to record_audit / transition_event names an AuditKind (or a mapping of them)."""
    bad = []
    for relative, path in app_modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                kind = _kind_argument(node)
                if isinstance(kind, (ast.Constant, ast.JoinedStr, ast.BinOp)) and not (
                    isinstance(kind, ast.Constant) and kind.value is None
                ):
                    bad.append(f"{relative}:{node.lineno}: {ast.unparse(kind)}")
                elif isinstance(kind, ast.Call):  # "...".format(...), str(...)
                    bad.append(f"{relative}:{node.lineno}: {ast.unparse(kind)}")
    assert not bad, "audit kinds must be AuditKind members:\n" + "\n".join(bad)


# The modules whose calls return an `Outcome` (ticketing.outcomes): what the tasks, drills and tests read.
OUTCOME_MODULES = (
    "ticketing/services.py",
    "ticketing/copies.py",
    "ticketing/execution.py",
    "ticketing/bulkhead.py",
    "ticketing/batch.py",
    "ticketing/attachments.py",
    "ticketing/acknowledgments.py",
    "ticketing/tasks.py",
    "ticketing/intents/core.py",
    "reconciliation/drills/scenarios.py",
)


def _outcome_literals(tree: ast.AST) -> list[ast.Constant]:
    """String constants spelling an outcome word where an outcome is produced: a return value (a wait's word
    included), an assignment to something named `outcome(s)`, or a comparison with what a call returned."""
    from ticketing.outcomes import Outcome

    words = {o.value for o in Outcome}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and node.value is not None:
            scope = [node.value]
        elif isinstance(node, ast.Assign) and any("outcome" in ast.unparse(t) for t in node.targets):
            scope = [node.value]
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):
            scope = node.comparators
        else:
            continue
        for part in scope:
            found += [c for c in ast.walk(part) if isinstance(c, ast.Constant) and c.value in words]
    return found


def test_no_outcome_is_a_bare_string():
    """The pipeline's outcomes are `Outcome` members, as audit kinds are AuditKind members."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    bad = []
    for relative in OUTCOME_MODULES:
        for constant in _outcome_literals(ast.parse((root / relative).read_text(encoding="utf-8"))):
            bad.append(f"{relative}:{constant.lineno}: {constant.value!r}")
    assert not bad, "outcomes must be Outcome members (ticketing.outcomes):\n" + "\n".join(bad)


def test_the_outcome_check_sees_a_planted_literal():
    planted = ast.parse(
        'def f(x):\n    if x:\n        return "done"\n    outcome = "busy"\n    return wait(x, 1, "paused")\n'
    )
    assert sorted(c.value for c in _outcome_literals(planted)) == ["busy", "done", "paused"]


def test_mailroom_signs_as_a_system_actor_member():
    """Every `system:` actor is a SystemActor member, so one part never signs under two names."""
    from intake.vocabulary import SystemActor

    bad = []
    for relative, path in app_modules():
        if relative.endswith("intake/vocabulary.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("system:"):
                bad.append(f"{relative}:{node.lineno}: {node.value!r}")
    assert not bad, "system actors must be SystemActor members:\n" + "\n".join(bad)
    assert all(actor.value.startswith("system:") for actor in SystemActor)

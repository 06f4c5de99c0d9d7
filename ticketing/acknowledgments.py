"""Telling the requester we have their request: one email per ticket, only once the mapping exists.

The acknowledgment is its own `notify_requester` intent with its own key, so a
task run twice sends one email. It carries `Auto-Submitted: auto-replied` and
our loop header, so our own mail coming back is recognised and suppressed.

Who is acknowledged (no backscatter, no relay) is `ticketing.ack_policy`; the intent is planned in the
transaction that stores the mapping (`ticketing.intents.followups`); this module sends it.
"""

import logging
import smtplib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.core.mail.backends.base import BaseEmailBackend

from intake.failures import AmbiguousOutcome, TransientError
from intake.models import InboxEvent
from intake.vocabulary import ReasonCode

from . import ack_transport, ack_wording, intents, numbers
from .ack_policy import sender_authentication
from .bounce_reports import ACK_MESSAGE_ID_DOMAIN
from .destinations.rest_templates import TemplateProblem
from .intents import batch as intents_batch
from .models import Intent, TicketMapping
from .outcomes import Outcome

if TYPE_CHECKING:
    from .intents.core import AttemptError

    class ComposedMessage(EmailMessage):
        """What `_compose` makes: an EmailMessage that carries its `wording` (for the audit row)."""

        wording: dict[str, Any]


logger = logging.getLogger(__name__)


def message_id(intent: Intent) -> str:
    """The acknowledgment's Message-ID, the same on every attempt (a resend is the same message, which the
    recipient's mail system can tell): its local part ends with `.<key[:16]>`, as `bounces` reads it."""
    key = intent.idempotency_key
    return f"<ack.{key[16:40]}.{key[:16]}@{ACK_MESSAGE_ID_DOMAIN}>"


def _compose(event: InboxEvent, mapping: TicketMapping, intent: Intent, token: str) -> "ComposedMessage":
    # Only an authenticated sender's own subject is echoed: for anyone else (`ack_policy` "always") it could be
    # text a stranger chose, sent on from the tenant's address. The words: the tenant's template for the
    # requester's language, or the built-in text (ticketing.ack_wording); raises TemplateProblem.
    words = ack_wording.wording(
        event=event,
        token=token,
        echo_subject=sender_authentication(event).authenticated,
        sla_hours=(mapping.destination.settings or {}).get("sla_hours"),
        planned_at=intent.created_at,
    )
    subject, body = words.subject, words.body
    headers = {
        "Auto-Submitted": "auto-replied",
        settings.MAILROOM_LOOP_HEADER: settings.MAILROOM_INSTANCE_ID,
        "Message-ID": message_id(intent),
    }
    if event.message_id_header:
        headers["In-Reply-To"] = f"<{event.message_id_header}>"
        headers["References"] = f"<{event.message_id_header}>"
    message = cast(  # a plain EmailMessage at run time: `wording` is set on it just below
        "ComposedMessage",
        EmailMessage(
            subject=f"[#{token}] {subject}",
            body=body,
            from_email=event.mailbox.address,
            to=[event.sender],
            headers=headers,
        ),
    )
    message.wording = words.detail  # which template and language, for the audit row
    return message


def send(intent_id: int, worker: str) -> str:
    """One attempt at the acknowledgment of `intent_id`; safe to run twice. A group of one (`send_group`)."""
    return _attempt([intent_id], worker)[intent_id]


def send_group(intent_ids: list[int], *, worker: str) -> dict[str, int]:
    """One attempt at each acknowledgment of a group (the relay publishes them in groups): {outcome: count}.

    Set-based where it is common, per intent where it is rare: the group's intents, events, mappings and
    ticket numbers in two SELECTs, one guarded claim (`intents.batch.claim_acknowledgments`), one SMTP
    connection for every message, and the sent ones recorded in one transaction
    (`intents.batch.record_acknowledgments_sent`). A template problem, an address that cannot be written to
    and a failed delivery keep their own transitions. Safe to run twice: the claim lets one worker send each.
    """
    outcomes = _attempt(intent_ids, worker)
    tally: dict[str, int] = {}
    seen: set[int] = set()
    for intent_id in intent_ids:
        outcome = Outcome.BUSY if intent_id in seen else outcomes[intent_id]  # listed twice: the first attempt has it
        seen.add(intent_id)
        tally[outcome] = tally.get(outcome, 0) + 1
    return tally


@dataclass
class _Attempt:
    intent: Intent
    mapping: TicketMapping
    token: str
    message: "ComposedMessage | None" = None  # set by _compose before the attempt joins `composed`


def _attempt(intent_ids: list[int], worker: str) -> dict[int, str]:
    """The attempts of `intent_ids` (each once), {intent id: outcome}."""
    ids = list(dict.fromkeys(intent_ids))
    found = {
        intent.pk: intent
        for intent in Intent.objects.select_related("destination", "inbox_event__mailbox")
        .defer("inbox_event__raw")
        .filter(pk__in=ids, action=Intent.Action.NOTIFY_REQUESTER)
    }
    mappings = (
        {
            mapping.inbox_event_id: mapping
            for mapping in numbers.with_numbers(
                TicketMapping.objects.select_related("destination").filter(
                    inbox_event_id__in={intent.inbox_event_id for intent in found.values()},
                    action=Intent.Action.CREATE_TICKET,
                )
            )
        }
        if found
        else {}
    )
    outcomes: dict[int, str] = {}
    ready: dict[int, _Attempt] = {}
    for intent_id in ids:
        intent = found.get(intent_id)
        mapping = mappings.get(intent.inbox_event_id) if intent is not None else None
        if intent is None:
            outcomes[intent_id] = Outcome.MISSING
        elif mapping is None or intent.inbox_event.state != InboxEvent.State.COMPLETED:
            outcomes[intent_id] = Outcome.NO_TICKET  # never acknowledge what is not a ticket
        else:
            ready[intent_id] = _Attempt(intent, mapping, numbers.format_number(mapping.ticket_number or mapping.pk))
    claimed_at = time.monotonic()
    claimed = intents_batch.claim_acknowledgments(list(ready), worker=worker)
    composed: list[_Attempt] = []
    for intent_id, attempt in ready.items():
        if intent_id not in claimed:
            outcomes[intent_id] = Outcome.BUSY
            continue
        try:
            attempt.message = _compose(attempt.intent.inbox_event, attempt.mapping, attempt.intent, attempt.token)
        except TemplateProblem as exc:
            # A template past its limits (stored before the save check, or limits lowered since): nothing is sent.
            outcomes[intent_id] = (
                _not_sent(attempt.intent, worker, ReasonCode.ACK_TEMPLATE_FAILED, detail={"problem": str(exc)[:300]})
                or Outcome.TEMPLATE_FAILED
            )
            continue
        composed.append(attempt)
    results = _deliver_all(
        # Every attempt in `composed` has its message (composed just before it was appended).
        [cast("ComposedMessage", attempt.message) for attempt in composed],
        deadline=_delivery_deadline(claimed_at),
    )
    # The sent ones first, in one transaction: the window in which an accepted message is not yet recorded
    # (the worker killed here: its intents expire to unknown, then held for a person) is kept short.
    recorded = intents_batch.record_acknowledgments_sent(
        [
            intents_batch.SentAcknowledgment(
                intent_id=attempt.intent.pk,
                inbox_event_id=attempt.intent.inbox_event_id,
                # A composed attempt's message (see above).
                message_id=cast("ComposedMessage", attempt.message).extra_headers["Message-ID"],
                detail={"token": attempt.token, **cast("ComposedMessage", attempt.message).wording},
            )
            for attempt, result in zip(composed, results, strict=True)
            if result == ack_transport.SENT
        ],
        worker=worker,
    )
    for attempt, result in zip(composed, results, strict=True):
        intent = attempt.intent
        if result == ack_transport.SENT:
            outcomes[intent.pk] = Outcome.SENT if intent.pk in recorded else Outcome.CLAIM_LOST
            if intent.pk in recorded:
                logger.info("acknowledged event %s (ticket %s)", intent.inbox_event_id, attempt.token)
        elif result == ack_transport.NOT_DELIVERABLE:
            # An internationalised local part and a relay without SMTPUTF8: no form of the address exists to
            # send to (never an encoded-word one), now or on a retry on this relay.
            outcomes[intent.pk] = (
                _not_sent(intent, worker, ReasonCode.ADDRESS_NOT_DELIVERABLE) or Outcome.NOT_DELIVERABLE
            )
        elif result is None:
            outcomes[intent.pk] = Outcome.ERROR  # left in_flight: its claim expires to unknown, as a crash would
        else:
            # deliver answers only SENT or NOT_DELIVERABLE (both above): any other result is a failure.
            failure = cast("AttemptError", result)
            outcomes[intent.pk] = intents.record_failure(intent, exc=failure, worker=worker) or Outcome.CLAIM_LOST
    return outcomes


def _not_sent(intent: Intent, worker: str, reason: str, detail: dict[str, Any] | None = None) -> str:
    """The intent ended without an email (`reason`): '' when recorded, else "claim_lost"."""
    if not intents.record_acknowledgment_not_sent(intent, worker=worker, reason=reason, detail=detail):
        return Outcome.CLAIM_LOST
    logger.info("event %s: acknowledgment not sent (%s)", intent.inbox_event_id, reason)
    return ""


def _delivery_deadline(claimed_at: float) -> float:
    """When a group stops starting deliveries: well before its claim runs out (a message under way may take a
    few SMTP timeouts: MAIL, RCPT, DATA), so `expire` never takes an intent whose message is being sent."""
    claim = cast(int, settings.MAILROOM_CLAIM_SECONDS)  # an env.int setting
    return claimed_at + max(claim - 3 * cast(float, settings.MAILROOM_SMTP_TIMEOUT), claim / 2)  # an env.float


def _failure(exc: OSError) -> TransientError | AmbiguousOutcome:
    """What a failed delivery says about its message (smtplib's errors are OSErrors): refused or lost before
    it was accepted, safe to send again; a timeout, perhaps accepted."""
    if not isinstance(exc, ConnectionRefusedError) and "timed out" in str(exc):
        return AmbiguousOutcome(ReasonCode.SMTP_TIMEOUT, type(exc).__name__)
    return TransientError(ReasonCode.SMTP_UNAVAILABLE, type(exc).__name__)


def _session_goes_on(connection: BaseEmailBackend, exc: OSError) -> bool:
    """After a failed delivery: did the relay answer (a refused sender, recipient or message, then RSET by
    smtplib) on a connection still open, so the next message may use it?"""
    answered = isinstance(exc, (smtplib.SMTPResponseException, smtplib.SMTPRecipientsRefused))
    return answered and getattr(getattr(connection, "connection", None), "sock", None) is not None


def _deliver_all(messages: list[EmailMessage], *, deadline: float) -> "list[str | AttemptError | None]":
    """Each message in order on one SMTP connection: `ack_transport.SENT` or `NOT_DELIVERABLE`, the failure
    that decides its intent's next state, or None (an unexpected error: left as a crash would leave it).

    Never a message twice: once the connection is lost (or the claim's time is nearly up) the rest are not
    attempted, each a transient failure, retried by a later attempt."""
    if not messages:
        return []
    try:
        connection = get_connection(timeout=settings.MAILROOM_SMTP_TIMEOUT)
        connection.open()
    except OSError as exc:  # refused or unreachable before anything was sent
        return [_failure(exc)] * len(messages)
    results: list[str | AttemptError | None] = []
    stopped = ""
    try:
        for message in messages:
            if not stopped and time.monotonic() > deadline:
                stopped = "the group's claim is nearly up"
            if stopped:
                results.append(TransientError(ReasonCode.SMTP_UNAVAILABLE, f"not attempted: {stopped}"))
                continue
            message.connection = connection
            try:
                results.append(ack_transport.deliver(connection=connection, message=message))
            except OSError as exc:
                results.append(_failure(exc))
                if not _session_goes_on(connection, exc):
                    stopped = f"the connection was lost ({type(exc).__name__})"
            except Exception:
                logger.exception("acknowledgment delivery failed unexpectedly")
                results.append(None)
                stopped = "an earlier message failed unexpectedly"
    finally:
        try:
            connection.close()
        except OSError:  # every message was accepted or refused already; QUIT changes nothing
            logger.info("closing the SMTP connection failed", exc_info=True)
    return results

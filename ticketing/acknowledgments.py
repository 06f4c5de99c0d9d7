"""Telling the requester we have their request: one email per ticket, only once the mapping exists.

The acknowledgment is its own `notify_requester` intent with its own key, so a
task run twice sends one email. It carries `Auto-Submitted: auto-replied` and
our loop header, so our own mail coming back is recognised and suppressed.

No backscatter, no relay: the ticket is made for every accepted message, but it
is only acknowledged when a person is likely to be on the other end and the
address is provably theirs (`acknowledgment_skip_reason`):

- the sender must be authenticated (`sender_authentication`): a trusted
  Authentication-Results (the mailbox's `trusted_authserv_id`, stored by
  normalization) or the hosted provider's own verdict (Gmail, Graph, SES,
  Mailgun: `intake.validation.authresults`) shows a DMARC pass for the From
  domain, or an SPF/DKIM pass for a domain aligned with it. A forged From gets
  nothing. The mailbox setting `ack_policy` may say `"never"`, or `"always"` (a
  closed system whose MTA writes no results), which is honoured only when the
  platform allows it (`MAILROOM_ACK_ALLOW_UNAUTHENTICATED`); an unauthenticated
  sender is then acknowledged without their subject echoed back;
- the sender must be a person: not flagged or scored as spam by a trusted filter
  (`details["spam_flagged"]`, `details["spam_score"]` at or above the mailbox's
  `spam_score_threshold`), not a no-reply or bounce address (`_is_noreply`: the word
  in any `-`/`_` segment, `gmail-noreply@`, `jira-noreply@`, `bounce+...@`), not list
  mail or a product's notification (`details["automated"]`, from
  `intake.validation.automated_sender`: List-Id, List-Unsubscribe with Precedence or
  List-Unsubscribe-Post, the vendor headers of Jira, GitHub, GitLab, Zabbix, cron, ...,
  `*-notifications@` senders). Such mail still becomes a ticket;
- at most `MAILROOM_ACK_PER_HOUR` acknowledgments per tenant and
  `MAILROOM_ACK_PER_DOMAIN_PER_HOUR` per recipient domain in any hour
  (`Tenant.settings` `ack_per_hour` / `ack_per_domain_per_hour` override them),
  counted over the `notify_requester` intents planned (`AcknowledgmentBudget`).
  Workers planning at the same moment each see the others' committed intents
  only, so the caps can be overrun by at most one per concurrent worker.

A skipped acknowledgment is audited (`acknowledgment_skipped`, with the reason)
in the transaction that stores the mapping, so it is written exactly once.
"""
import logging
import re
import smtplib
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.db.models import BinaryField, Subquery, Value
from django.db.models.functions import Coalesce, Substr
from django.utils import timezone

from intake.failures import AmbiguousOutcome, TransientError
from intake.mime.addresses import is_valid_address
from intake.models import AuditEvent, InboxEvent, Tenant
from intake.services import enqueue_outbox, record_audit
from intake.validation.authresults import (
    MAX_FIELDS_BLOCK,
    PROVIDERS_WITH_VERDICTS,
    aligned_method,
    domain_of,
    header_fields,
    provider_authentication_results,
)
from intake.validation.spamscore import spam_score_reached
from intake.vocabulary import AuditKind, ReasonCode

from . import ack_templates, ack_transport, ack_wording, bounces, intents, numbers
from .bounce_reports import ACK_MESSAGE_ID_DOMAIN
from .intents import batch as intents_batch
from .models import Intent, TicketMapping

logger = logging.getLogger(__name__)



# Local parts that no person reads: automated senders and bounce addresses. Postmaster stays here although a
# person may write from it (validation makes a ticket of such mail): an acknowledgment to a mail system's
# address is the backscatter this module exists to prevent, and a postmaster knows the ticket exists anyway.
NOREPLY_LOCAL_PARTS = frozenset({
    "noreply", "no-reply", "no_reply", "no.reply", "donotreply", "do-not-reply", "do_not_reply", "do.not.reply",
    "dontreply", "dont-reply", "mailer-daemon", "mailerdaemon", "postmaster", "bounce", "bounces",
})
NOREPLY_PREFIXES = ("noreply", "no-reply", "no_reply", "donotreply", "do-not-reply", "do_not_reply",
                    "bounce-", "bounces-", "bounce.", "bounces.")   # bounce-mc.us5_1234.5678-jane=acme.test@...
# The no-reply word as one `-`/`_`-separated segment anywhere: gmail-noreply@, jira-noreply@,
# notifications-noreply@, alerts_donotreply@. A dot before it is a person's name ("jane.noreply@").
NOREPLY_SEGMENT = re.compile(r"(?:^|[-_])(?:no[-_.]?reply|do[-_.]?not[-_.]?reply|dont[-_.]?reply)(?:$|[-_.])")
SKIP_AUDIT_KIND = AuditKind.ACKNOWLEDGMENT_SKIPPED

# `Mailbox.settings["ack_policy"]`: who is acknowledged. Anything else reads as the default.
ACK_AUTHENTICATED = "authenticated"   # only senders whose From domain is authenticated (the default)
ACK_ALWAYS = "always"                 # every sender (only where MAILROOM_ACK_ALLOW_UNAUTHENTICATED is on)
ACK_NEVER = "never"                   # nobody (as `"acknowledge": false`)
ACK_POLICIES = (ACK_AUTHENTICATED, ACK_ALWAYS, ACK_NEVER)
# SES's receipt verdict (the SNS notification, kept in the provider_metadata audit row) as a DMARC result.
SES_DMARC_VERDICTS = {"PASS": "pass", "FAIL": "fail"}
ONE_HOUR = timedelta(hours=1)


def _is_noreply(address: str) -> bool:
    local = address.rpartition("@")[0].strip().strip('"').lower()
    base = local.split("+", 1)[0]  # bounces+1234=x@..., noreply+tag@...
    return (local in NOREPLY_LOCAL_PARTS or base in NOREPLY_LOCAL_PARTS or local.startswith(NOREPLY_PREFIXES)
            or NOREPLY_SEGMENT.search(base) is not None)


def ack_policy(mailbox) -> str:
    """The mailbox's `ack_policy`, as it is applied (an unknown value, or `always` not allowed: authenticated)."""
    mailbox_settings = mailbox.settings or {}
    if not mailbox_settings.get("acknowledge", True):
        return ACK_NEVER
    policy = mailbox_settings.get("ack_policy", ACK_AUTHENTICATED)
    if policy == ACK_ALWAYS and not settings.MAILROOM_ACK_ALLOW_UNAUTHENTICATED:
        return ACK_AUTHENTICATED
    return policy if policy in ACK_POLICIES else ACK_AUTHENTICATED


@dataclass(frozen=True)
class SenderAuthentication:
    """Whether the From address of an event is believed to be the sender's own."""

    method: str = ""      # "dmarc", "dkim" or "spf": what authenticated the From domain; "" when nothing did
    source: str = ""      # whose results: "mailbox" (its trusted authserv-id) or "provider:<name>"
    dmarc_failed: bool = False   # a trusted source said DMARC fail

    @property
    def authenticated(self) -> bool:
        return bool(self.method)


def _message_head(event: InboxEvent) -> bytes:
    """The start of the stored message (its header block): read from the database only as far as needed."""
    if event.pk is None or "raw" not in event.get_deferred_fields():
        return bytes(event.raw or b"")[:MAX_FIELDS_BLOCK]
    head = InboxEvent.objects.filter(pk=event.pk).annotate(
        head=Substr("raw", 1, MAX_FIELDS_BLOCK, output_field=BinaryField())).values_list("head", flat=True).first()
    return bytes(head or b"")


def _ses_receipt_results(event: InboxEvent) -> dict[str, str]:
    """SES's DMARC verdict from the SNS receipt (kept by the webhook as provider metadata)."""
    if event.pk is None:
        return {}
    metadata = AuditEvent.objects.filter(inbox_event_id=event.pk, kind=AuditKind.PROVIDER_METADATA).values_list(
        "detail", flat=True).first() or {}
    verdict = SES_DMARC_VERDICTS.get(str(metadata.get("dmarcVerdict", "")).upper())
    return {"dmarc": verdict} if verdict else {}


def sender_authentication(event: InboxEvent) -> SenderAuthentication:
    """What the trusted results say about the event's From domain.

    Sources, each trusted for its own reason: `event.auth_results` (the mailbox's own MTA,
    `trusted_authserv_id`), and for a Gmail, Graph, SES or Mailgun mailbox the provider's
    verdict in the stored message (and SES's receipt). A sender taken from Sender or
    Reply-To (the From header held no address) is never authenticated: DMARC speaks for From.
    """
    sender = (event.sender or "").strip()
    from_domain = domain_of(sender) if "@" in sender else ""
    sources: list[tuple[str, dict]] = [("mailbox", event.auth_results or {})]
    provider = event.mailbox.provider
    if provider in PROVIDERS_WITH_VERDICTS:
        fields = header_fields(_message_head(event))
        sources.append((f"provider:{provider}",
                        provider_authentication_results(provider, fields, from_domain=from_domain)))
    if provider == "ses":
        sources.append(("provider:ses", _ses_receipt_results(event)))
    dmarc_failed = any(results.get("dmarc") == "fail" for _, results in sources)
    if (event.details or {}).get("sender_source", "from") != "from":
        return SenderAuthentication(dmarc_failed=dmarc_failed)
    for source, results in sources:
        method = aligned_method(results, from_domain)
        if method:
            return SenderAuthentication(method=method, source=source, dmarc_failed=dmarc_failed)
    return SenderAuthentication(dmarc_failed=dmarc_failed)


def acknowledgment_skip_reason(event: InboxEvent) -> str | None:
    """Why `event` must not be acknowledged, or None when it may be (the hourly caps aside: `plan`).

    Reads the event as normalization stored it: `sender`, `details["spam_flagged"]`
    (a trusted spam header said so), `details["spam_score"]` (a trusted score and the
    threshold it was judged against), `details["automated"]` (list mail or a product's
    notification, with its reason), `details["sender_source"]`, `auth_results` (only
    our own MTA's Authentication-Results, see `intake.validation.authentication_results`)
    and, for a hosted provider's mailbox, that provider's verdict (`sender_authentication`).
    Order: disabled, no sender, spam flag, spam score, no-reply address, list or
    automated mail, then what the authentication says.
    """
    if getattr(event, "history", False):  # imported by an archive import (intake.archive): long answered
        return ReasonCode.ARCHIVED
    policy = ack_policy(event.mailbox)
    if policy == ACK_NEVER:
        return ReasonCode.ACK_DISABLED
    if (getattr(event, "route", None) or {}).get("action") == "mark_spam":  # a filter rule (classification)
        return ReasonCode.MARKED_SPAM
    sender = (event.sender or "").strip()
    if not sender:
        return ReasonCode.NO_SENDER
    details = event.details or {}
    if details.get("spam_flagged") is True:
        return ReasonCode.SPAM_FLAGGED
    if spam_score_reached(details):
        return ReasonCode.SPAM_SCORE
    if _is_noreply(sender):
        return ReasonCode.NOREPLY_SENDER
    automated = details.get("automated")
    if isinstance(automated, dict) and automated.get("reason") in (ReasonCode.LIST_MAIL,
                                                                   ReasonCode.AUTOMATED_NOTIFICATION):
        return ReasonCode(automated["reason"])
    authentication = sender_authentication(event)
    if authentication.dmarc_failed:
        return ReasonCode.DMARC_FAIL
    if not is_valid_address(sender):
        return ReasonCode.INVALID_SENDER
    if policy != ACK_ALWAYS and not authentication.authenticated:
        return ReasonCode.UNAUTHENTICATED_SENDER
    if bounces.is_marked_undeliverable(tenant_id=event.tenant_id, address=sender):
        return ReasonCode.ADDRESS_BOUNCED
    return None


def wants_acknowledgment(event: InboxEvent) -> bool:
    return acknowledgment_skip_reason(event) is None


@dataclass
class AcknowledgmentBudget:
    """The hourly caps: acknowledgments per tenant and per recipient domain, over the intents planned.

    Counted from the database once per tenant (and domain), then kept up to date in memory,
    so a batch that plans several acknowledgments in one transaction counts its own too.
    """

    now: datetime = field(default_factory=timezone.now)
    _tenants: dict = field(default_factory=dict)      # tenant id -> Tenant (its settings)
    _planned: dict = field(default_factory=dict)      # tenant id -> count this hour
    _by_domain: dict = field(default_factory=dict)    # (tenant id, domain) -> count this hour

    def _recent(self, tenant_id: int):
        since = self.now - ONE_HOUR
        # Intents are numbered as they are made: the newest one older than the hour bounds the scan to the
        # last hour's intents (walked back along the primary key), however large the table has grown.
        older = Intent.objects.filter(created_at__lt=since).order_by("-pk").values("pk")[:1]
        return Intent.objects.filter(pk__gt=Coalesce(Subquery(older), Value(0)), created_at__gte=since,
                                     action=Intent.Action.NOTIFY_REQUESTER, inbox_event__tenant_id=tenant_id)

    def limits(self, tenant_id: int) -> tuple[int, int]:
        """(per tenant, per recipient domain) in any hour, for `tenant_id`."""
        if tenant_id not in self._tenants:
            self._tenants[tenant_id] = Tenant.objects.only("settings").filter(pk=tenant_id).first() or Tenant()
        tenant = self._tenants[tenant_id]
        return (tenant.int_setting("ack_per_hour", settings.MAILROOM_ACK_PER_HOUR),
                tenant.int_setting("ack_per_domain_per_hour", settings.MAILROOM_ACK_PER_DOMAIN_PER_HOUR))

    def refusal(self, event: InboxEvent) -> tuple[str, int] | None:
        """(reason, limit) when acknowledging `event` would pass a cap; else None, and the event is counted."""
        tenant_id = event.tenant_id
        domain = domain_of(event.sender)
        per_tenant, per_domain = self.limits(tenant_id)
        if tenant_id not in self._planned:
            self._planned[tenant_id] = self._recent(tenant_id).count()
        if self._planned[tenant_id] >= per_tenant:
            return ReasonCode.ACK_RATE_LIMITED, per_tenant
        key = (tenant_id, domain)
        if key not in self._by_domain:
            self._by_domain[key] = self._recent(tenant_id).filter(inbox_event__sender__iendswith="@" + domain).count()
        if self._by_domain[key] >= per_domain:
            return ReasonCode.ACK_DOMAIN_RATE_LIMITED, per_domain
        self._planned[tenant_id] += 1
        self._by_domain[key] += 1
        return None


def skip_audit_detail(event: InboxEvent, budget: AcknowledgmentBudget) -> dict | None:
    """None when `event` is to be acknowledged (and counted against `budget`); else the skip's audit detail."""
    reason = acknowledgment_skip_reason(event)
    if reason is not None:
        return {"reason": reason}
    refused = budget.refusal(event)
    if refused is not None:
        reason, limit = refused
        return {"reason": reason, "limit_per_hour": limit}
    return None


def mailroom_acknowledges(destination) -> bool:
    """Does Mailroom acknowledge tickets made on `destination`? Its `acknowledge` setting, else not where the
    desk mails the requester itself (one acknowledgment, with one ticket number)."""
    from .destinations import adapter_class

    chosen = (destination.settings or {}).get("acknowledge")
    if isinstance(chosen, bool):
        return chosen
    try:
        return not adapter_class(destination.kind).capabilities.acknowledges_requester
    except LookupError:
        return True


def plan(event: InboxEvent, destination) -> Intent | None:
    """Inside the transaction that stores the ticket mapping: the intent and its outbox row,
    or the audit row saying why there is none."""
    # As stored: the caller's copy may predate normalization's sender, details and auth results.
    stored = InboxEvent.objects.select_related("mailbox").defer("raw").filter(pk=event.pk).first() or event
    skipped = ({"reason": ReasonCode.DESK_ACKNOWLEDGES} if not mailroom_acknowledges(destination)
               else skip_audit_detail(stored, AcknowledgmentBudget()))
    if skipped is not None:
        # Planned once (the mapping just inserted is unique per event), so audited once.
        record_audit(event.pk, SKIP_AUDIT_KIND, actor="system:acknowledgments", detail=skipped)
        logger.info("event %s: no acknowledgment (%s)", event.pk, skipped["reason"])
        return None
    # Planned once: the mapping just inserted in this transaction is unique per event.
    intent = intents.create_intent(event, Intent.Action.NOTIFY_REQUESTER, destination)
    enqueue_outbox(intents.NOTIFY_TOPIC, {"intent_id": intent.pk})
    return intent


def message_id(intent: Intent) -> str:
    """The acknowledgment's Message-ID, the same on every attempt (a resend is the same message, which the
    recipient's mail system can tell): its local part ends with `.<key[:16]>`, as `bounces` reads it."""
    key = intent.idempotency_key
    return f"<ack.{key[16:40]}.{key[:16]}@{ACK_MESSAGE_ID_DOMAIN}>"


def _compose(event: InboxEvent, mapping: TicketMapping, intent: Intent, token: str) -> EmailMessage:
    # Only an authenticated sender's own subject is echoed: for anyone else (`ack_policy` "always") it could be
    # text a stranger chose, sent on from the tenant's address. The words: the tenant's template for the
    # requester's language, or the built-in text (ticketing.ack_wording); raises TemplateProblem.
    words = ack_wording.wording(event=event, token=token, echo_subject=sender_authentication(event).authenticated,
                                sla_hours=(mapping.destination.settings or {}).get("sla_hours"),
                                planned_at=intent.created_at)
    subject, body = words.subject, words.body
    headers = {
        "Auto-Submitted": "auto-replied",
        settings.MAILROOM_LOOP_HEADER: settings.MAILROOM_INSTANCE_ID,
        "Message-ID": message_id(intent),
    }
    if event.message_id_header:
        headers["In-Reply-To"] = f"<{event.message_id_header}>"
        headers["References"] = f"<{event.message_id_header}>"
    message = EmailMessage(subject=f"[#{token}] {subject}", body=body, from_email=event.mailbox.address,
                           to=[event.sender], headers=headers)
    message.wording = words.detail   # which template and language, for the audit row
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
        outcome = "busy" if intent_id in seen else outcomes[intent_id]   # listed twice: the first attempt has it
        seen.add(intent_id)
        tally[outcome] = tally.get(outcome, 0) + 1
    return tally


@dataclass
class _Attempt:
    intent: Intent
    mapping: TicketMapping
    token: str
    message: EmailMessage | None = None


def _attempt(intent_ids: list[int], worker: str) -> dict[int, str]:
    """The attempts of `intent_ids` (each once), {intent id: outcome}."""
    ids = list(dict.fromkeys(intent_ids))
    found = {intent.pk: intent for intent in Intent.objects.select_related("destination", "inbox_event__mailbox")
             .defer("inbox_event__raw").filter(pk__in=ids, action=Intent.Action.NOTIFY_REQUESTER)}
    mappings = {mapping.inbox_event_id: mapping for mapping in numbers.with_numbers(
        TicketMapping.objects.select_related("destination").filter(
            inbox_event_id__in={intent.inbox_event_id for intent in found.values()},
            action=Intent.Action.CREATE_TICKET))} if found else {}
    outcomes: dict[int, str] = {}
    ready: dict[int, _Attempt] = {}
    for intent_id in ids:
        intent = found.get(intent_id)
        mapping = mappings.get(intent.inbox_event_id) if intent is not None else None
        if intent is None:
            outcomes[intent_id] = "missing"
        elif mapping is None or intent.inbox_event.state != InboxEvent.State.COMPLETED:
            outcomes[intent_id] = "no_ticket"  # never acknowledge what is not a ticket
        else:
            ready[intent_id] = _Attempt(intent, mapping, numbers.format_number(mapping.ticket_number or mapping.pk))
    claimed_at = time.monotonic()
    claimed = intents_batch.claim_acknowledgments(list(ready), worker=worker)
    composed: list[_Attempt] = []
    for intent_id, attempt in ready.items():
        if intent_id not in claimed:
            outcomes[intent_id] = "busy"
            continue
        try:
            attempt.message = _compose(attempt.intent.inbox_event, attempt.mapping, attempt.intent, attempt.token)
        except ack_templates.TemplateProblem as exc:
            # A template past its limits (stored before the save check, or limits lowered since): nothing is sent.
            outcomes[intent_id] = _not_sent(attempt.intent, worker, ReasonCode.ACK_TEMPLATE_FAILED,
                                            detail={"problem": str(exc)[:300]}) or "template_failed"
            continue
        composed.append(attempt)
    results = _deliver_all([attempt.message for attempt in composed], deadline=_delivery_deadline(claimed_at))
    # The sent ones first, in one transaction: the window in which an accepted message is not yet recorded
    # (the worker killed here: its intents expire to unknown, then held for a person) is kept short.
    recorded = intents_batch.record_acknowledgments_sent([intents_batch.SentAcknowledgment(
        intent_id=attempt.intent.pk, inbox_event_id=attempt.intent.inbox_event_id,
        message_id=attempt.message.extra_headers["Message-ID"],
        detail={"token": attempt.token, **attempt.message.wording})
        for attempt, result in zip(composed, results, strict=True) if result == ack_transport.SENT], worker=worker)
    for attempt, result in zip(composed, results, strict=True):
        intent = attempt.intent
        if result == ack_transport.SENT:
            outcomes[intent.pk] = "sent" if intent.pk in recorded else "claim_lost"
            if intent.pk in recorded:
                logger.info("acknowledged event %s (ticket %s)", intent.inbox_event_id, attempt.token)
        elif result == ack_transport.NOT_DELIVERABLE:
            # An internationalised local part and a relay without SMTPUTF8: no form of the address exists to
            # send to (never an encoded-word one), now or on a retry on this relay.
            outcomes[intent.pk] = _not_sent(intent, worker, ReasonCode.ADDRESS_NOT_DELIVERABLE) or "not_deliverable"
        elif result is None:
            outcomes[intent.pk] = "error"   # left in_flight: its claim expires to unknown, as a crash would
        else:
            outcomes[intent.pk] = intents.record_failure(intent, result, worker) or "claim_lost"
    return outcomes


def _not_sent(intent: Intent, worker: str, reason: str, detail: dict | None = None) -> str:
    """The intent ended without an email (`reason`): '' when recorded, else "claim_lost"."""
    if not intents.record_acknowledgment_not_sent(intent, worker=worker, reason=reason, detail=detail):
        return "claim_lost"
    logger.info("event %s: acknowledgment not sent (%s)", intent.inbox_event_id, reason)
    return ""


def _delivery_deadline(claimed_at: float) -> float:
    """When a group stops starting deliveries: well before its claim runs out (a message under way may take a
    few SMTP timeouts: MAIL, RCPT, DATA), so `expire` never takes an intent whose message is being sent."""
    claim = settings.MAILROOM_CLAIM_SECONDS
    return claimed_at + max(claim - 3 * settings.MAILROOM_SMTP_TIMEOUT, claim / 2)


def _failure(exc: OSError) -> TransientError | AmbiguousOutcome:
    """What a failed delivery says about its message (smtplib's errors are OSErrors): refused or lost before
    it was accepted, safe to send again; a timeout, perhaps accepted."""
    if not isinstance(exc, ConnectionRefusedError) and "timed out" in str(exc):
        return AmbiguousOutcome(ReasonCode.SMTP_TIMEOUT, type(exc).__name__)
    return TransientError(ReasonCode.SMTP_UNAVAILABLE, type(exc).__name__)


def _session_goes_on(connection, exc: OSError) -> bool:
    """After a failed delivery: did the relay answer (a refused sender, recipient or message, then RSET by
    smtplib) on a connection still open, so the next message may use it?"""
    answered = isinstance(exc, (smtplib.SMTPResponseException, smtplib.SMTPRecipientsRefused))
    return answered and getattr(getattr(connection, "connection", None), "sock", None) is not None


def _deliver_all(messages: list[EmailMessage], *, deadline: float) -> list:
    """Each message in order on one SMTP connection: `ack_transport.SENT` or `NOT_DELIVERABLE`, the failure
    that decides its intent's next state, or None (an unexpected error: left as a crash would leave it).

    Never a message twice: once the connection is lost (or the claim's time is nearly up) the rest are not
    attempted, each a transient failure, retried by a later attempt."""
    if not messages:
        return []
    try:
        connection = get_connection(timeout=settings.MAILROOM_SMTP_TIMEOUT)
        connection.open()
    except OSError as exc:   # refused or unreachable before anything was sent
        return [_failure(exc)] * len(messages)
    results: list = []
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
        except OSError:   # every message was accepted or refused already; QUIT changes nothing
            logger.info("closing the SMTP connection failed", exc_info=True)
    return results

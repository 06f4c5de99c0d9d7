"""Who is acknowledged: the rules that keep acknowledgments from becoming backscatter or a relay.

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
  `spam_score_threshold`), not a no-reply or bounce address (`is_noreply`: the word
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

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import BinaryField, Subquery, Value
from django.db.models.functions import Coalesce, Substr
from django.utils import timezone

from intake.mime.addresses import is_valid_address
from intake.models import AuditEvent, InboxEvent, Tenant
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

from . import bounces
from .destinations import adapter_class
from .models import Intent

# Local parts that no person reads: automated senders and bounce addresses. Postmaster stays here although a
# person may write from it (validation makes a ticket of such mail): an acknowledgment to a mail system's
# address is the backscatter this module exists to prevent, and a postmaster knows the ticket exists anyway.
NOREPLY_LOCAL_PARTS = frozenset(
    {
        "noreply",
        "no-reply",
        "no_reply",
        "no.reply",
        "donotreply",
        "do-not-reply",
        "do_not_reply",
        "do.not.reply",
        "dontreply",
        "dont-reply",
        "mailer-daemon",
        "mailerdaemon",
        "postmaster",
        "bounce",
        "bounces",
    }
)
NOREPLY_PREFIXES = (
    "noreply",
    "no-reply",
    "no_reply",
    "donotreply",
    "do-not-reply",
    "do_not_reply",
    "bounce-",
    "bounces-",
    "bounce.",
    "bounces.",
)  # bounce-mc.us5_1234.5678-jane=acme.test@...
# The no-reply word as one `-`/`_`-separated segment anywhere: gmail-noreply@, jira-noreply@,
# notifications-noreply@, alerts_donotreply@. A dot before it is a person's name ("jane.noreply@").
NOREPLY_SEGMENT = re.compile(r"(?:^|[-_])(?:no[-_.]?reply|do[-_.]?not[-_.]?reply|dont[-_.]?reply)(?:$|[-_.])")
SKIP_AUDIT_KIND = AuditKind.ACKNOWLEDGMENT_SKIPPED

# `Mailbox.settings["ack_policy"]`: who is acknowledged. Anything else reads as the default.
ACK_AUTHENTICATED = "authenticated"  # only senders whose From domain is authenticated (the default)
ACK_ALWAYS = "always"  # every sender (only where MAILROOM_ACK_ALLOW_UNAUTHENTICATED is on)
ACK_NEVER = "never"  # nobody (as `"acknowledge": false`)
ACK_POLICIES = (ACK_AUTHENTICATED, ACK_ALWAYS, ACK_NEVER)
# SES's receipt verdict (the SNS notification, kept in the provider_metadata audit row) as a DMARC result.
SES_DMARC_VERDICTS = {"PASS": "pass", "FAIL": "fail"}
ONE_HOUR = timedelta(hours=1)


def is_noreply(address: str) -> bool:
    local = address.rpartition("@")[0].strip().strip('"').lower()
    base = local.split("+", 1)[0]  # bounces+1234=x@..., noreply+tag@...
    return (
        local in NOREPLY_LOCAL_PARTS
        or base in NOREPLY_LOCAL_PARTS
        or local.startswith(NOREPLY_PREFIXES)
        or NOREPLY_SEGMENT.search(base) is not None
    )


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

    method: str = ""  # "dmarc", "dkim" or "spf": what authenticated the From domain; "" when nothing did
    source: str = ""  # whose results: "mailbox" (its trusted authserv-id) or "provider:<name>"
    dmarc_failed: bool = False  # a trusted source said DMARC fail

    @property
    def authenticated(self) -> bool:
        return bool(self.method)


def _message_head(event: InboxEvent) -> bytes:
    """The start of the stored message (its header block): read from the database only as far as needed."""
    if event.pk is None or "raw" not in event.get_deferred_fields():
        return bytes(event.raw or b"")[:MAX_FIELDS_BLOCK]
    head = (
        InboxEvent.objects.filter(pk=event.pk)
        .annotate(head=Substr("raw", 1, MAX_FIELDS_BLOCK, output_field=BinaryField()))
        .values_list("head", flat=True)
        .first()
    )
    return bytes(head or b"")


def _ses_receipt_results(event: InboxEvent) -> dict[str, str]:
    """SES's DMARC verdict from the SNS receipt (kept by the webhook as provider metadata)."""
    if event.pk is None:
        return {}
    metadata = (
        AuditEvent.objects.filter(inbox_event_id=event.pk, kind=AuditKind.PROVIDER_METADATA)
        .values_list("detail", flat=True)
        .first()
        or {}
    )
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
        sources.append(
            (f"provider:{provider}", provider_authentication_results(provider, fields, from_domain=from_domain))
        )
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
    if is_noreply(sender):
        return ReasonCode.NOREPLY_SENDER
    automated = details.get("automated")
    if isinstance(automated, dict) and automated.get("reason") in (
        ReasonCode.LIST_MAIL,
        ReasonCode.AUTOMATED_NOTIFICATION,
    ):
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
    _tenants: dict = field(default_factory=dict)  # tenant id -> Tenant (its settings)
    _planned: dict = field(default_factory=dict)  # tenant id -> count this hour
    _by_domain: dict = field(default_factory=dict)  # (tenant id, domain) -> count this hour

    def _recent(self, tenant_id: int):
        since = self.now - ONE_HOUR
        # Intents are numbered as they are made: the newest one older than the hour bounds the scan to the
        # last hour's intents (walked back along the primary key), however large the table has grown.
        older = Intent.objects.filter(created_at__lt=since).order_by("-pk").values("pk")[:1]
        return Intent.objects.filter(
            pk__gt=Coalesce(Subquery(older), Value(0)),
            created_at__gte=since,
            action=Intent.Action.NOTIFY_REQUESTER,
            inbox_event__tenant_id=tenant_id,
        )

    def limits(self, tenant_id: int) -> tuple[int, int]:
        """(per tenant, per recipient domain) in any hour, for `tenant_id`."""
        if tenant_id not in self._tenants:
            self._tenants[tenant_id] = Tenant.objects.only("settings").filter(pk=tenant_id).first() or Tenant()
        tenant = self._tenants[tenant_id]
        return (
            tenant.int_setting("ack_per_hour", settings.MAILROOM_ACK_PER_HOUR),
            tenant.int_setting("ack_per_domain_per_hour", settings.MAILROOM_ACK_PER_DOMAIN_PER_HOUR),
        )

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
    chosen = (destination.settings or {}).get("acknowledge")
    if isinstance(chosen, bool):
        return chosen
    try:
        return not adapter_class(destination.kind).capabilities.acknowledges_requester
    except LookupError:
        return True

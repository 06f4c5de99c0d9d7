"""Bounces of our own acknowledgments, tied to the ticket they answered.

A DSN or a mailer-daemon's bounce stays `suppressed` (intake decides that: `delivery_report`,
`mailer_daemon`). When it reports on an acknowledgment Mailroom sent (`bounce_reports.read_report`: the
acknowledgment's Message-ID, which `intents.batch.record_acknowledgments_sent` keeps as the intent's `result_ref`),
`tie` writes, in one transaction:

- an `acknowledgment_bounced` audit row on the ORIGINAL ticket's event (the bounce event, the DSN's
  Status and Action, the diagnostic's first line with addresses cut to their domain, the recipient's
  domain; never the address);
- on the bounce event's `details["acknowledgment_bounce"]`, which ticket it was tied to: written with a
  guarded UPDATE under the row's lock, it is also what makes a redelivered or re-run bounce tie once;
- for a failure for good (5.x.x, or a failed Action without a status), an `UndeliverableAddress` mark on
  the requester's address for `MAILROOM_BOUNCE_MARK_DAYS`: `acknowledgment_skip_reason` then skips
  (`address_bounced`) while it lasts; the hourly retention sweep (`intake.retention`) deletes it after. A
  delay (4.x.x) is recorded on the ticket and marks nothing.

Only an acknowledgment of the bounce's own tenant is tied: a bounce never reaches another tenant's rows.
"""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import BinaryField
from django.db.models.functions import Substr
from django.utils import timezone

from intake.models import InboxEvent
from intake.services import record_audit
from intake.vocabulary import AuditKind, ReasonCode, SystemActor

from . import numbers
from .bounce_reports import MAX_BOUNCE_BYTES, BounceReport, read_report
from .models import Intent, TicketMapping, UndeliverableAddress

logger = logging.getLogger(__name__)

ACTOR = SystemActor.BOUNCES
TIE_KEY = "acknowledgment_bounce"  # on the bounce event's details: the ticket it was tied to
BOUNCE_REASONS = frozenset({ReasonCode.DELIVERY_REPORT, ReasonCode.MAILER_DAEMON})
KEY_PREFIX_CHARS = 16  # `_compose`: the Message-ID's local part ends with ".<key[:16]>"


def normalized_address(address: str) -> str:
    return (address or "").strip().strip("<>").strip().lower()


def is_marked_undeliverable(*, tenant_id: int, address: str, now: datetime | None = None) -> bool:
    """Does an unexpired bounce mark say no acknowledgment should go to `address`?"""
    address = normalized_address(address)
    return (
        bool(address)
        and UndeliverableAddress.objects.filter(
            tenant_id=tenant_id, address=address, expires_at__gt=now or timezone.now()
        ).exists()
    )


def acknowledgment_of(*, tenant_id: int, message_id: str) -> Intent | None:
    """The acknowledgment intent that sent `message_id` (bracketed), if it is one of `tenant_id`'s."""
    local = message_id.strip("<>").rpartition("@")[0]
    key_prefix = local.rpartition(".")[2]
    if len(key_prefix) != KEY_PREFIX_CHARS:
        return None
    return (
        Intent.objects.select_related("inbox_event")
        .filter(
            idempotency_key__startswith=key_prefix,
            action=Intent.Action.NOTIFY_REQUESTER,
            result_ref__iexact=message_id,
            inbox_event__tenant_id=tenant_id,
        )
        .defer("inbox_event__raw")
        .first()
    )


def _ticket_token(event_id: int) -> str:
    mapping = TicketMapping.objects.filter(inbox_event_id=event_id, action=Intent.Action.CREATE_TICKET).first()
    return numbers.format_number(numbers.number_of(mapping)) if mapping else ""


def tie(*, event: InboxEvent, state: str, reason_code: str) -> int | None:
    """After normalization left `event` in `state` for `reason_code`: a bounce (suppressed, `BOUNCE_REASONS`)
    is tied to the acknowledgment it reports on; anything else is left alone (one cheap comparison).

    Returns the original event's id when this call tied it; None when it is not a bounce of ours, or it
    was tied before (by an earlier run, or a concurrent one)."""
    if state != InboxEvent.State.SUPPRESSED or reason_code not in BOUNCE_REASONS:
        return None
    head = (
        InboxEvent.objects.filter(pk=event.pk)
        .annotate(  # as far as the report reads, not a returned body
            head=Substr("raw", 1, MAX_BOUNCE_BYTES, output_field=BinaryField())
        )
        .values_list("head", flat=True)
        .first()
    )
    report = read_report(bytes(head or b""))
    intent = next(
        filter(
            None,
            (acknowledgment_of(tenant_id=event.tenant_id, message_id=message_id) for message_id in report.message_ids),
        ),
        None,
    )
    if intent is None:
        return None
    original = intent.inbox_event
    now = timezone.now()
    with transaction.atomic():
        if not _claim_tie(event.pk, original_id=original.pk, report=report, now=now):
            return None
        marked_until = _mark(original, report, bounce_id=event.pk, now=now) if report.permanent else None
        record_audit(
            original.pk,
            kind=AuditKind.ACKNOWLEDGMENT_BOUNCED,
            actor=ACTOR,
            at=now,
            detail={
                "bounce_event": event.pk,
                "intent": intent.pk,
                "status": report.status,
                "action": report.action,
                "diagnostic": report.diagnostic,
                "recipient_domain": _domain(original.sender, report),
                **({"marked_until": marked_until.isoformat()} if marked_until else {}),
            },
        )
    logger.info(
        "event %s: bounce of the acknowledgment of event %s (%s %s)%s",
        event.pk,
        original.pk,
        report.action or "?",
        report.status or "-",
        "; address marked" if marked_until else "",
    )
    return original.pk


def _domain(sender: str, report: BounceReport) -> str:
    return normalized_address(sender).rpartition("@")[2] or report.recipient_domain


def _claim_tie(bounce_id: int, *, original_id: int, report: BounceReport, now) -> bool:
    """The guard: the bounce event's row, locked, gets `details[TIE_KEY]` only if it has none yet."""
    details = InboxEvent.objects.select_for_update().filter(pk=bounce_id).values_list("details", flat=True).first()
    if details is None or TIE_KEY in details:
        return False
    tied = {
        "event": original_id,
        "ticket": _ticket_token(original_id),
        "status": report.status,
        "action": report.action,
        "at": now.isoformat(),
    }
    return bool(
        InboxEvent.objects.filter(pk=bounce_id)
        .exclude(details__has_key=TIE_KEY)
        .update(details={**details, TIE_KEY: tied})
    )


def _mark(original: InboxEvent, report: BounceReport, *, bounce_id: int, now) -> datetime | None:
    """The requester's address: no acknowledgment until the returned time (a later bounce moves it on)."""
    address = normalized_address(original.sender)
    if not address:
        return None
    expires = now + timedelta(days=settings.MAILROOM_BOUNCE_MARK_DAYS)
    UndeliverableAddress.objects.bulk_create(
        [
            UndeliverableAddress(
                tenant_id=original.tenant_id,
                address=address[:320],
                status=report.status[:20],
                reason=report.diagnostic[:200],
                bounced_event_id=bounce_id,
                expires_at=expires,
                created_at=now,
            )
        ],
        update_conflicts=True,
        unique_fields=["tenant", "address"],
        update_fields=["status", "reason", "bounced_event", "expires_at", "created_at"],
    )
    return expires

"""Escalation that acts: overdue items of the recovery queue are emailed about, and each tenant gets a
daily digest of its open items. Run by beat (`reconciliation.tasks`).

An item is overdue once its `escalate_at` has passed (set on entering the queue by
`intake.escalation`, per reason, or by an operator). `send_escalations` emails its owner, or, while
it is unassigned, the tenant's members in the `operator` group: once per item per escalation (an
operator who sets a new `escalate_at` starts a new one). `send_daily_digests` emails each tenant's
operators the open items: counts by reason, the oldest age, links. Each email is a `Notification`
row (`ticketing.notifications.send_once`, unique key), so a repeated or concurrent beat run sends
nothing twice. The text names the item, its reason, age, mailbox and masked sender, and links to the
console: never the message body or subject, never a full address.
"""

import logging

from django.conf import settings
from django.db.models import Count, Exists, Min, OuterRef
from django.utils import timezone
from django.utils.timesince import timesince

from intake.logging import mask_address
from intake.models import InboxEvent, Tenant
from intake.selectors import drill_tenants
from ticketing import notifications
from ticketing.models import Notification

from .. import selectors

logger = logging.getLogger(__name__)

OPERATOR_GROUP = selectors.ESCALATION_GROUP
DIGEST_ITEM_LINKS = 10


def item_url(event_id: int) -> str:
    return f"{settings.MAILROOM_PUBLIC_URL}/admin/reconciliation/recoveryitem/{event_id}/change/"


def queue_url() -> str:
    return f"{settings.MAILROOM_PUBLIC_URL}/admin/reconciliation/recoveryitem/"


def tenant_operators(tenant_id: int) -> list:
    return list(selectors.escalation_operators(tenant_id).distinct().order_by("pk"))


def escalation_recipients(event: InboxEvent) -> list:
    owner = event.owner
    if owner is not None and owner.is_active and owner.email:
        return [owner]
    return tenant_operators(event.tenant_id)


def _reason(event: InboxEvent) -> str:
    code = event.reason_code or "held_intent"
    text = selectors.reason_text(event.reason_code)
    return f"{code} — {text}" if text else code


def overdue_items(now=None):
    """Items whose escalation time has passed and for which no escalation email went out since."""
    now = now or timezone.now()
    emailed = Notification.objects.filter(
        kind=Notification.Kind.ESCALATION, inbox_event=OuterRef("pk"), escalation_at=OuterRef("escalate_at")
    )
    # Not a drill's items (reconciliation.drills): synthetic, and nobody is to be woken for them.
    return (
        selectors.recovery_queue()
        .filter(escalate_at__lte=now)
        .exclude(Exists(emailed))
        .exclude(tenant_id__in=drill_tenants())
        .select_related("tenant", "owner", "mailbox")
        .order_by("escalate_at", "pk")
    )


def send_escalations(now=None, limit: int = 500) -> int:
    """Email each overdue item's owner (or its tenant's operators) once. Returns how many emails went out."""
    now = now or timezone.now()
    sent = 0
    for event in overdue_items(now)[:limit]:
        key = f"escalation:{event.pk}:{event.escalate_at.isoformat()}"
        recipients = escalation_recipients(event)
        if not recipients:
            logger.warning(
                "item %s is overdue but tenant %s has no operator with an email address", event.pk, event.tenant.slug
            )
            continue
        age = timesince(event.received_at, now)
        subject = f"[Mailroom] item #{event.pk} is overdue ({event.reason_code or event.state}, {age})"
        body = "\n".join(
            [
                f"Item #{event.pk} of tenant {event.tenant.slug} is overdue in the Mailroom recovery queue.",
                "",
                f"Reason: {_reason(event)}",
                f"State: {event.state}",
                f"Age: {age} (received {event.received_at:%Y-%m-%d %H:%M} UTC)",
                f"Escalated at: {event.escalate_at:%Y-%m-%d %H:%M} UTC",
                f"Mailbox: {event.mailbox.slug}",
                f"Sender: {mask_address(event.sender) or '—'}",
                f"Owner: {event.owner.get_username() if event.owner_id else 'unassigned'}",
                "",
                f"Open it: {item_url(event.pk)}",
            ]
        )
        try:
            if notifications.send_once(
                key,
                Notification.Kind.ESCALATION,
                event.tenant_id,
                recipients,
                subject,
                mask_address(body),
                inbox_event_id=event.pk,
                escalation_at=event.escalate_at,
            ):
                sent += 1
        except Exception:  # one unreachable mail server must not stop the rest; the next run tries again
            logger.exception("escalation email for item %s failed", event.pk)
    return sent


def digest_of(tenant: Tenant, now=None) -> dict | None:
    """What the tenant's digest says: counts by reason, the oldest, the overdue, the first items. None if empty."""
    now = now or timezone.now()
    queue = selectors.recovery_queue().filter(tenant=tenant)
    totals = queue.order_by().aggregate(
        open=Count("pk"), oldest=Min("received_at"), overdue=Count("pk", filter=selectors.overdue_q(now))
    )
    if not totals["open"]:
        return None
    by_reason = {
        row["reason_code"] or "held_intent": row["n"]
        for row in queue.order_by().values("reason_code").annotate(n=Count("pk"))
    }
    first = list(queue.values_list("pk", "reason_code", "received_at")[:DIGEST_ITEM_LINKS])
    return {
        "open": totals["open"],
        "overdue": totals["overdue"],
        "oldest": totals["oldest"],
        "by_reason": dict(sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))),
        "first": first,
    }


def send_daily_digests(now=None) -> int:
    """One digest per tenant with open items per (UTC) day, to its operators. Returns how many went out."""
    now = now or timezone.now()
    sent = 0
    for tenant in Tenant.objects.filter(is_drill=False).order_by("pk"):
        key = f"digest:{tenant.pk}:{now.date().isoformat()}"
        if notifications.already_sent(key):
            continue
        digest = digest_of(tenant, now)
        recipients = tenant_operators(tenant.pk) if digest else []
        if not recipients:
            continue
        subject = f"[Mailroom] {tenant.slug}: {digest['open']} open item(s) in the recovery queue"
        lines = [
            f"Recovery queue of tenant {tenant.slug} on {now:%Y-%m-%d}:",
            "",
            f"Open items: {digest['open']} (overdue: {digest['overdue']})",
            f"Oldest: {timesince(digest['oldest'], now)} (received {digest['oldest']:%Y-%m-%d %H:%M} UTC)",
            "",
            "By reason:",
            *(f"  {code}: {n}" for code, n in digest["by_reason"].items()),
            "",
            "First items (overdue first, then oldest):",
            *(
                f"  #{pk} {code or 'held_intent'}, {timesince(received, now)}: {item_url(pk)}"
                for pk, code, received in digest["first"]
            ),
            "",
            f"The queue: {queue_url()}",
        ]
        try:
            if notifications.send_once(
                key, Notification.Kind.DIGEST, tenant.pk, recipients, subject, mask_address("\n".join(lines))
            ):
                sent += 1
        except Exception:
            logger.exception("daily digest for tenant %s failed", tenant.slug)
    return sent

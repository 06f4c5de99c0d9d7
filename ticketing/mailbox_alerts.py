"""Emails to a tenant's admins about its mailboxes' connections: one per transition (intake.mailbox_health).

Intake may not import ticketing, so intake writes the facts (`MailboxAudit` rows, and an outbox row
`mailbox.alert` in the same transaction) and this module tells people: `send_pending` reads the transition rows of
the last day that no `Notification` has answered yet and sends each through `notifications.send_once` under the
key `mailbox-link:<audit id>`, so a row is emailed exactly once however many runs see it. It runs right after the
transition (the outbox row's task, `ticketing.tasks.send_mailbox_alerts`) and from the beat
(`ticketing.tasks.check_mailbox_health`), which catches anything the first run could not send.

What is emailed: down, and recovered after down (the pair the admins need); failing, and recovered after
failing, only with `MAILROOM_MAILBOX_ALERT_FAILING` on (a single failed poll is often nothing). Quiet alarms
and their clearing are emailed (kind `quiet_mailbox`). A drill tenant's mailboxes are never emailed about.
The text names the tenant and mailbox by slug, never the mailbox's address, a body or a secret.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from intake.logging import mask_address
from intake.models import MailboxAudit

from . import notifications
from .breaker import ADMIN_GROUP
from .models import Notification

logger = logging.getLogger(__name__)

Kind = MailboxAudit.Kind
LINK_KINDS = (Kind.LINK_FAILING, Kind.LINK_DOWN, Kind.LINK_RECOVERED)
QUIET_KINDS = (Kind.QUIET_ALARM, Kind.QUIET_CLEARED)
WINDOW = timedelta(hours=24)  # older transitions are history, not news
HEADLINES = {
    Kind.LINK_FAILING: "is failing",
    Kind.LINK_DOWN: "is down",
    Kind.LINK_RECOVERED: "recovered",
    Kind.QUIET_ALARM: "has been unusually quiet",
    Kind.QUIET_CLEARED: "receives mail again",
}


def key_for(audit: MailboxAudit) -> str:
    return f"mailbox-link:{audit.pk}"


def is_emailed(audit: MailboxAudit) -> bool:
    failing_too = bool(getattr(settings, "MAILROOM_MAILBOX_ALERT_FAILING", False))
    if audit.kind == Kind.LINK_FAILING:
        return failing_too
    if audit.kind == Kind.LINK_RECOVERED:
        return failing_too or (audit.detail or {}).get("from") == "down"
    return audit.kind in (Kind.LINK_DOWN, *QUIET_KINDS)


def tenant_admins(tenant_id: int) -> list:
    return list(
        get_user_model()
        .objects.filter(mailroom_tenants=tenant_id, is_active=True, groups__name=ADMIN_GROUP)
        .exclude(email="")
        .distinct()
        .order_by("pk")
    )


def send_pending(*, audit_ids=None, now=None) -> int:
    """Email every transition row not yet emailed (only `audit_ids`, if given). Returns how many were sent."""
    now = now or timezone.now()
    rows = (
        MailboxAudit.objects.filter(kind__in=(*LINK_KINDS, *QUIET_KINDS), at__gte=now - WINDOW)
        .exclude(mailbox__tenant__is_drill=True)
        .select_related("mailbox", "tenant")
        .order_by("pk")
    )
    if audit_ids is not None:
        rows = rows.filter(pk__in=list(audit_ids))
    rows = [audit for audit in rows if is_emailed(audit)]
    done = set(Notification.objects.filter(key__in=[key_for(a) for a in rows]).values_list("key", flat=True))
    sent, admins = 0, {}
    for audit in rows:
        if key_for(audit) in done:
            continue
        if audit.tenant_id not in admins:
            admins[audit.tenant_id] = tenant_admins(audit.tenant_id)
        subject, body = compose(audit)
        kind = Notification.Kind.QUIET_MAILBOX if audit.kind in QUIET_KINDS else Notification.Kind.MAILBOX_HEALTH
        try:
            sent += notifications.send_once(
                key_for(audit),
                kind,
                audit.tenant_id,
                admins[audit.tenant_id],
                subject,
                body,
                mailbox_id=audit.mailbox_id,
            )
        except Exception:  # the row stays unanswered: the beat's next run tries again
            logger.exception(
                "could not email the admins of tenant %s about mailbox %s", audit.tenant_id, audit.mailbox_id
            )
    return sent


def compose(audit: MailboxAudit) -> tuple[str, str]:
    mailbox, tenant, detail = audit.mailbox, audit.tenant, audit.detail or {}
    name = f"{tenant.slug}/{mailbox.slug}"
    lines = [
        f"Mailbox {mailbox.slug} of tenant {tenant.slug} {HEADLINES[audit.kind]}.",
        f"When: {audit.at:%Y-%m-%d %H:%M} UTC",
    ]
    if audit.kind in LINK_KINDS:
        lines.append(f"Failed polls in a row: {detail.get('failures', 0)}")
        if detail.get("error"):
            lines.append(f"Last error: {mask_address(str(detail['error']))}")
        if mailbox.last_success_at:
            lines.append(f"Last successful poll: {mailbox.last_success_at:%Y-%m-%d %H:%M} UTC")
    if audit.kind == Kind.LINK_DOWN:
        lines += [
            "",
            "Mail waits at the provider and is fetched once the mailbox works again; none is lost.",
            "If the credentials were refused, fix them, then reset the mailbox's health.",
        ]
    if audit.kind == Kind.QUIET_ALARM:
        lines.append(
            f"No message for more than {detail.get('threshold_hours')} hours, longer than its traffic "
            "of the last days suggests. The mail may be going elsewhere (a changed MX, a forwarding rule)."
        )
    lines += ["", f"{settings.MAILROOM_PUBLIC_URL}/admin/intake/mailbox/{mailbox.pk}/change/"]
    return f"[Mailroom] mailbox {name} {HEADLINES[audit.kind]}", "\n".join(lines)

"""Emails to a tenant's admins a week before a mailbox's OAuth credentials expire (beat: ticketing.tasks.
warn_expiring_credentials). Once per expiry: the Notification key carries the expiry, and `oauth_warned_at` is
set with a MailboxAudit CREDENTIALS_EXPIRING in the same transaction; a new consent clears it (a new expiry)."""

import logging

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from intake.models import Mailbox, MailboxAudit
from intake.oauth_consent.selectors import mailboxes_to_warn
from intake.vocabulary import SystemActor

from . import notifications
from .breaker import ADMIN_GROUP
from .models import Notification

logger = logging.getLogger(__name__)
ACTOR = SystemActor.CREDENTIAL_WARNINGS


def tenant_admins(tenant_id: int) -> list:
    return list(
        get_user_model()
        .objects.filter(mailroom_tenants=tenant_id, is_active=True, groups__name=ADMIN_GROUP)
        .exclude(email="")
        .distinct()
        .order_by("pk")
    )


def warn_expiring_credentials(*, now=None) -> int:
    """Email the admins of every mailbox whose credentials expire within a week; returns how many were sent."""
    now = now or timezone.now()
    sent = 0
    for mailbox in mailboxes_to_warn(now=now):
        if mailbox.tenant.is_drill:
            continue
        try:
            sent += warn_one(mailbox=mailbox, now=now)
        except Exception:  # one tenant's mail server must not keep the others from being told
            logger.exception("credential warning for mailbox %s failed", mailbox.slug)
    return sent


def warn_one(*, mailbox: Mailbox, now) -> bool:
    expires = mailbox.oauth_expires_at
    link = settings.MAILROOM_PUBLIC_URL + reverse("admin:intake_mailbox_change", args=[mailbox.pk])
    subject = f"[Mailroom] mailbox {mailbox.tenant.slug}/{mailbox.slug}: credentials expire {expires:%Y-%m-%d}"
    body = "\n".join(
        [
            f"The OAuth credentials of mailbox {mailbox.slug} (tenant {mailbox.tenant.slug}) expire on "
            f"{expires:%Y-%m-%d %H:%M} UTC.",
            "After that Mailroom cannot fetch its mail until an admin connects it again.",
            "",
            "Open the mailbox in the console and press Connect:",
            link,
        ]
    )
    admins = tenant_admins(mailbox.tenant_id)
    with transaction.atomic():
        if not notifications.send_once(
            f"credentials:{mailbox.pk}:{expires.isoformat()}",
            Notification.Kind.CREDENTIALS,
            mailbox.tenant_id,
            admins,
            subject,
            body,
            mailbox_id=mailbox.pk,
        ):
            return False
        Mailbox.objects.filter(pk=mailbox.pk).update(oauth_warned_at=now)
        MailboxAudit.objects.create(
            mailbox=mailbox,
            tenant_id=mailbox.tenant_id,
            kind=MailboxAudit.Kind.CREDENTIALS_EXPIRING,
            actor=ACTOR,
            at=now,
            detail={"expires_at": expires.isoformat(), "recipients": [u.get_username() for u in admins]},
        )
    return True

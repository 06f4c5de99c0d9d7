"""Reads: mailboxes whose credentials need an admin (expired, expiring soon, or refused by the provider), for the
mailbox page, the dashboard and the recovery queue's header, and for the expiry emails (ticketing)."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from intake.models import Mailbox

WARN_DAYS = 7  # the admins are told a week ahead

EXPIRED, EXPIRING, REFUSED = "expired", "expiring", "refused"
WORDS = {
    EXPIRED: "credentials expired",
    EXPIRING: "credentials expire soon",
    REFUSED: "credentials refused by the provider (revoked or expired): polling stopped",
}


@dataclass(frozen=True)
class CredentialsProblem:
    mailbox: Mailbox
    kind: str
    expires_at: datetime | None

    @property
    def words(self) -> str:
        return WORDS[self.kind]


def credentials_state(mailbox: Mailbox, *, now=None) -> str:
    """ "refused", "expired", "expiring" or "" for one mailbox (the mailbox page)."""
    now = now or timezone.now()
    if mailbox.health == Mailbox.Health.CREDENTIALS_INVALID:
        return REFUSED
    if mailbox.oauth_expires_at is None:
        return ""
    if mailbox.oauth_expires_at <= now:
        return EXPIRED
    return EXPIRING if mailbox.oauth_expires_at <= now + timedelta(days=WARN_DAYS) else ""


def mailboxes_needing_credentials(*, tenant_ids, now=None, limit: int = 50) -> list[CredentialsProblem]:
    """The mailboxes of `tenant_ids` (ids or a values("pk") queryset) with a credentials problem, refused first,
    then by expiry; at most `limit` (a banner, not a report)."""
    now = now or timezone.now()
    soon = now + timedelta(days=WARN_DAYS)
    rows = (
        Mailbox.objects.filter(tenant__in=tenant_ids)
        .filter(Q(health=Mailbox.Health.CREDENTIALS_INVALID) | Q(oauth_expires_at__lte=soon))
        .select_related("tenant")
        .order_by("oauth_expires_at", "slug")[:limit]
    )
    problems = [CredentialsProblem(m, credentials_state(m, now=now), m.oauth_expires_at) for m in rows]
    return sorted(problems, key=lambda p: p.kind != REFUSED)


def mailboxes_to_warn(*, now=None) -> list[Mailbox]:
    """Connected mailboxes whose credentials expire within WARN_DAYS and whose admins were not told of this
    expiry (a new consent clears `oauth_warned_at`)."""
    now = now or timezone.now()
    return list(
        Mailbox.objects.filter(
            oauth_expires_at__gt=now,
            oauth_expires_at__lte=now + timedelta(days=WARN_DAYS),
            oauth_warned_at__isnull=True,
        )
        .select_related("tenant")
        .order_by("oauth_expires_at", "pk")[:500]
    )

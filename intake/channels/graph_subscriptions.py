"""Push subscriptions held at the provider: Graph change notifications (and Gmail's `users.watch`).

A subscription expires at the provider (Graph: at most 10080 minutes for
messages; Gmail watch: 7 days), so beat calls `renew_due_subscriptions()`
regularly; it creates what is missing and renews what expires within the
renewal margin. One `ProviderSubscription` row per mailbox and provider records
what the provider holds.

Graph: `POST /subscriptions` (changeType "created", resource
`users/<user>/mailFolders('<folder>')/messages`, notificationUrl and
lifecycleNotificationUrl = `settings["notification_url"]`, clientState = the
secret of `webhook_secret_ref`). Graph validates the notification URL during that
POST (the webhook answers the `validationToken`). Renewal is
`PATCH /subscriptions/{id}`; a 404 (the subscription is gone) creates a new one.
Gmail: `users.watch` on `settings["push_topic"]`, called again daily.

Mailboxes without `notification_url` (Graph) or `push_topic` (Gmail) are
polled only and skipped here, as are mailboxes whose credentials were refused
(`health = credentials_invalid`); a refusal found here sets that health too.
Two runs never work on the same mailbox at once (a transaction-level advisory lock).
"""

import logging
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ..failures import ExternalCallError, PermanentError, TransientError
from ..http import json_or_empty
from ..models import Mailbox, ProviderSubscription
from ..providers.graph import GraphProvider
from ..secrets import SecretUnavailable, resolve_secret

log = logging.getLogger(__name__)

DEFAULT_SUBSCRIPTION_MINUTES = 4230
MAX_SUBSCRIPTION_MINUTES = 10080
MAX_CLIENT_STATE_CHARS = 128
GMAIL_RENEW_MARGIN = timedelta(days=6)  # Gmail asks for a watch call at least once a day; it lasts 7 days
LOCK_NAMESPACE = 0x6D726F6F  # "mroo": this module's advisory locks


def subscription_minutes(mailbox: Mailbox) -> int:
    minutes = int((mailbox.settings or {}).get("subscription_minutes") or DEFAULT_SUBSCRIPTION_MINUTES)
    return max(45, min(MAX_SUBSCRIPTION_MINUTES, minutes))


def graph_renew_margin(mailbox: Mailbox) -> timedelta:
    """Renew when less than this is left: half the lifetime, at most a day."""
    return timedelta(minutes=min(24 * 60, subscription_minutes(mailbox) // 2))


def ensure_graph_subscription(
    mailbox: Mailbox, now: datetime | None = None, *, force: bool = False
) -> tuple[str, ProviderSubscription | None]:
    """Create or renew the mailbox's Graph subscription when missing or due.

    Returns (what happened: "created" | "renewed" | "current" | "busy", the row).
    Raises the failure kinds of `intake.failures`.
    """
    now = now or timezone.now()
    settings = mailbox.settings or {}
    notification_url = settings.get("notification_url")
    if not notification_url:
        raise PermanentError("configuration", "graph subscriptions need settings.notification_url")
    try:
        client_state = resolve_secret(mailbox.webhook_secret_ref, tenant=mailbox.tenant, owner=mailbox)
    except SecretUnavailable as exc:
        raise PermanentError("configuration", f"no clientState secret: {exc}") from None
    if not client_state or len(client_state) > MAX_CLIENT_STATE_CHARS:
        raise PermanentError("configuration", f"clientState must be 1 to {MAX_CLIENT_STATE_CHARS} characters")
    provider = GraphProvider(mailbox)
    expires_at = now + timedelta(minutes=subscription_minutes(mailbox))
    expiration = expires_at.strftime("%Y-%m-%dT%H:%M:%S.0000000Z")
    with transaction.atomic():
        if not _try_lock(mailbox.pk):
            return "busy", None
        current = ProviderSubscription.objects.filter(mailbox=mailbox, provider="graph").first()
        if current and not force and current.expires_at - graph_renew_margin(mailbox) > now:
            return "current", current
        if current and current.external_id:
            response = provider.client.request(
                "PATCH",
                f"/subscriptions/{current.external_id}",
                json_body={"expirationDateTime": expiration},
                handle=(404,),
            )
            if response.status_code != 404:
                current.expires_at = _expiry(response, expires_at)
                current.renewed_at = now
                current.save(update_fields=["expires_at", "renewed_at"])
                log.info("graph: renewed the subscription of mailbox %s until %s", mailbox.slug, current.expires_at)
                return "renewed", current
            log.warning("graph: the subscription of mailbox %s is gone at Graph; creating another", mailbox.slug)
        response = provider.client.request(
            "POST",
            "/subscriptions",
            json_body={
                "changeType": "created",
                "notificationUrl": notification_url,
                "lifecycleNotificationUrl": notification_url,
                "resource": provider.resource,
                "expirationDateTime": expiration,
                "clientState": client_state,
                "latestSupportedTlsVersion": "v1_2",
            },
        )
        body = json_or_empty(response)
        if not body.get("id"):
            raise TransientError("unreadable_response", "graph subscription without an id")
        row, _ = ProviderSubscription.objects.update_or_create(
            mailbox=mailbox,
            provider="graph",
            defaults={
                "external_id": str(body["id"]),
                "resource": str(body.get("resource") or provider.resource)[:500],
                "expires_at": _expiry(response, expires_at),
                "created_at": now,
                "renewed_at": None,
            },
        )
        log.info("graph: created a subscription for mailbox %s until %s", mailbox.slug, row.expires_at)
        return "created", row


def ensure_gmail_watch(
    mailbox: Mailbox, now: datetime | None = None, *, force: bool = False
) -> tuple[str, ProviderSubscription | None]:
    """Call `users.watch` when the mailbox's watch is missing or older than a day."""
    from ..providers.gmail import GmailProvider

    now = now or timezone.now()
    with transaction.atomic():
        if not _try_lock(mailbox.pk):
            return "busy", None
        current = ProviderSubscription.objects.filter(mailbox=mailbox, provider="gmail").first()
        if current and not force and current.expires_at - GMAIL_RENEW_MARGIN > now:
            return "current", current
        provider = GmailProvider(mailbox)
        _history_id, expires_at = provider.watch()
        row, created = ProviderSubscription.objects.update_or_create(
            mailbox=mailbox,
            provider="gmail",
            defaults={
                "external_id": str(mailbox.settings.get("push_topic"))[:300],
                "resource": provider.label_id,
                "expires_at": expires_at,
                **({"created_at": now} if current is None else {"renewed_at": now}),
            },
        )
        log.info("gmail: watch of mailbox %s runs until %s", mailbox.slug, expires_at)
        return ("created" if created else "renewed"), row


def renew_due_subscriptions(now: datetime | None = None) -> dict:
    """Beat entry: create missing and renew expiring subscriptions of every push mailbox."""
    now = now or timezone.now()
    counts = {"created": 0, "renewed": 0, "current": 0, "busy": 0, "failed": 0}
    mailboxes = (
        Mailbox.objects.filter(provider__in=["graph", "gmail"])
        .exclude(health=Mailbox.Health.CREDENTIALS_INVALID)
        .order_by("pk")
    )
    for mailbox in mailboxes:
        settings = mailbox.settings or {}
        if mailbox.provider == "graph" and not settings.get("notification_url"):
            continue
        if mailbox.provider == "gmail" and not settings.get("push_topic"):
            continue
        ensure = ensure_graph_subscription if mailbox.provider == "graph" else ensure_gmail_watch
        try:
            outcome, _ = ensure(mailbox, now)
        except ExternalCallError as exc:
            counts["failed"] += 1
            log.warning(
                "%s: subscription of mailbox %s not renewed: %s (%s)",
                mailbox.provider,
                mailbox.slug,
                exc.reason,
                exc.detail,
            )
            if isinstance(exc, PermanentError) and exc.reason == "credentials":
                Mailbox.objects.filter(pk=mailbox.pk).exclude(health=Mailbox.Health.CREDENTIALS_INVALID).update(
                    health=Mailbox.Health.CREDENTIALS_INVALID, health_detail=str(exc)[:500]
                )
            continue
        counts[outcome] += 1
    if counts["created"] or counts["renewed"] or counts["failed"]:
        log.info("subscriptions: %s", counts)
    return counts


def _try_lock(mailbox_id: int) -> bool:
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [LOCK_NAMESPACE, mailbox_id])
        return bool(cursor.fetchone()[0])


def _expiry(response, default: datetime) -> datetime:
    value = json_or_empty(response).get("expirationDateTime")
    parsed = parse_datetime(str(value)) if value else None
    if parsed is None:
        return default
    if timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed, UTC)
    return parsed

"""Reads of the intake app."""
import time

from django.db.models import QuerySet

from .models import Mailbox, Switch, Tenant

# Webhooks look their mailbox up on every request; a few seconds of staleness (a changed
# secret reference takes effect within MAILBOX_CACHE_SECONDS) buys a query per request.
MAILBOX_CACHE_SECONDS = 5.0
_mailbox_cache: dict[str, tuple[float, Mailbox | None]] = {}


def mailbox_by_slug(slug: str) -> Mailbox | None:
    now = time.monotonic()
    cached = _mailbox_cache.get(slug)
    if cached is not None and cached[0] > now:
        return cached[1]
    mailbox = Mailbox.objects.filter(slug=slug).select_related("tenant").only(
        "pk", "tenant_id", "slug", "provider", "webhook_secret_ref", "settings", "paused", "tenant__slug"
    ).first()
    if mailbox is not None:  # an unknown slug is not cached: a new mailbox answers at once
        if len(_mailbox_cache) > 1000:
            _mailbox_cache.clear()
        _mailbox_cache[slug] = (now + MAILBOX_CACHE_SECONDS, mailbox)
    return mailbox


def forget_cached_mailboxes() -> None:
    _mailbox_cache.clear()


def global_pause_on() -> bool:
    return Switch.objects.filter(name=Switch.GLOBAL_PAUSE, on=True).exists()


def visible_tenants(user) -> QuerySet:
    """The tenants a user may see: the ones they are a member of (a superuser sees every tenant)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return Tenant.objects.none()
    if user.is_superuser:
        return Tenant.objects.all()
    return Tenant.objects.filter(members=user)


def readiness_problems() -> list[str]:
    """What keeps this process from serving: an unreachable database or broker ([] when ready)."""
    from django.db import connection

    from config.celery import app

    problems = []
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        problems.append(f"database: {type(exc).__name__}")
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:
        problems.append(f"broker: {type(exc).__name__}")
    return problems

"""Reads of the intake app."""

import time

from django.db.models import Q, QuerySet

from .models import AuditEvent, InboxEvent, Mailbox, Switch, Tenant
from .vocabulary import AuditKind

# Webhooks look their mailbox up on every request; a few seconds of staleness (a changed
# secret reference takes effect within MAILBOX_CACHE_SECONDS) buys a query per request.
MAILBOX_CACHE_SECONDS = 5.0
_mailbox_cache: dict[str, tuple[float, Mailbox | None]] = {}


def mailbox_by_slug(slug: str) -> Mailbox | None:
    now = time.monotonic()
    cached = _mailbox_cache.get(slug)
    if cached is not None and cached[0] > now:
        return cached[1]
    mailbox = (
        Mailbox.objects.filter(slug=slug)
        .select_related("tenant")
        .only("pk", "tenant_id", "slug", "provider", "webhook_secret_ref", "settings", "paused", "tenant__slug")
        .first()
    )
    if mailbox is not None:  # an unknown slug is not cached: a new mailbox answers at once
        if len(_mailbox_cache) > 1000:
            _mailbox_cache.clear()
        _mailbox_cache[slug] = (now + MAILBOX_CACHE_SECONDS, mailbox)
    return mailbox


def forget_cached_mailboxes() -> None:
    _mailbox_cache.clear()


def global_pause_on() -> bool:
    return Switch.objects.filter(name=Switch.GLOBAL_PAUSE, on=True).exists()


# A tenant's own pause (its admins set it; every mailbox and destination of the tenant waits) is a
# Switch row named after the tenant, so it needs no schema of its own.
TENANT_PAUSE_PREFIX = "tenant-pause-"


def tenant_pause_name(tenant_id: int) -> str:
    return f"{TENANT_PAUSE_PREFIX}{int(tenant_id)}"


def tenant_pause_on(tenant_id: int, cache: dict | None = None) -> bool:
    """Whether the tenant's pause is on; read once per task group when `cache` is given."""
    key = ("tenant_pause", tenant_id)
    if cache is not None and key in cache:
        return cache[key]
    on = Switch.objects.filter(name=tenant_pause_name(tenant_id), on=True).exists()
    if cache is not None:
        cache[key] = on
    return on


def paused_tenant_ids() -> set[int]:
    """The tenants whose own pause is on."""
    names = Switch.objects.filter(name__startswith=TENANT_PAUSE_PREFIX, on=True).values_list("name", flat=True)
    return {int(name[len(TENANT_PAUSE_PREFIX) :]) for name in names if name[len(TENANT_PAUSE_PREFIX) :].isdigit()}


# --- drill tenants (reconciliation.drills): their rows are the drill's own, out of every live path ---------


def drill_tenants() -> QuerySet:
    """The drill tenants' ids, as a subquery (`.exclude(tenant_id__in=drill_tenants())`)."""
    return Tenant.objects.filter(is_drill=True).values("pk")


def drill_events() -> QuerySet:
    """The drill tenants' event ids, as a subquery: a NOT IN that locks nothing (no join under FOR UPDATE)."""
    return InboxEvent.objects.filter(tenant_id__in=drill_tenants()).values("pk")


def drill_outbox() -> Q:
    """The outbox rows that announce a drill's events (`.exclude(drill_outbox())`); they carry no tenant."""
    ids = list(drill_events().values_list("pk", flat=True))
    return Q(payload__inbox_event_id__in=ids) if ids else Q(pk__in=[])


def drill_event_ids(event_ids) -> set[int]:
    """Those of `event_ids` that belong to a drill tenant."""
    ids = set(event_ids)
    return set(drill_events().filter(pk__in=ids).values_list("pk", flat=True)) if ids else set()


def quarantine_unreleased(event_id: int) -> bool:
    """Whether the event was ever quarantined and no security user released it since (the audit trail says).

    Such an event is judged again (validation and the malware scan) before it may go anywhere: a close
    or a replay is never a way out of quarantine.
    """
    latest = (
        AuditEvent.objects.filter(
            inbox_event_id=event_id, kind__in=(AuditKind.QUARANTINED, AuditKind.QUARANTINE_RELEASED)
        )
        .order_by("-pk")
        .values_list("kind", flat=True)
        .first()
    )
    return latest == AuditKind.QUARANTINED


def visible_tenants(user) -> QuerySet:
    """The tenants a user may see: the ones they are a member of (a superuser sees every tenant)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return Tenant.objects.none()
    if user.is_superuser:
        return Tenant.objects.all()
    return Tenant.objects.filter(members=user)

"""Reads of the intake app."""
from django.db.models import QuerySet

from .models import Mailbox, Switch, Tenant


def mailbox_by_slug(slug: str) -> Mailbox | None:
    return Mailbox.objects.filter(slug=slug).only(
        "pk", "tenant_id", "slug", "provider", "webhook_secret_ref", "paused"
    ).first()


def global_pause_on() -> bool:
    return Switch.objects.filter(name=Switch.GLOBAL_PAUSE, on=True).exists()


def visible_tenants(user) -> QuerySet:
    """The tenants a user may see: the ones they are a member of (a superuser sees every tenant)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return Tenant.objects.none()
    if user.is_superuser:
        return Tenant.objects.all()
    return Tenant.objects.filter(members=user)

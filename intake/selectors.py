"""Reads of the intake app."""
from .models import Mailbox, Switch


def mailbox_by_slug(slug: str) -> Mailbox | None:
    return Mailbox.objects.filter(slug=slug).only(
        "pk", "tenant_id", "slug", "provider", "webhook_secret_ref", "paused"
    ).first()


def global_pause_on() -> bool:
    return Switch.objects.filter(name=Switch.GLOBAL_PAUSE, on=True).exists()

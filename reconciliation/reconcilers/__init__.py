"""The reconcilers: bounded, resumable, idempotent passes that compare what should agree.

    provider     provider listing ↔ inbox events      missing_from_inbox (repaired: ingested)
    unmapped     inbox events ↔ mappings              unmapped (in the recovery queue until settled)
    destination  destination records ↔ mappings       orphan_in_destination (adopted when unambiguous),
                                                      ticket_missing
    outbox       unpublished outbox rows              outbox_stuck

Each pass of one reconciler over one scope (a mailbox slug, `destination:<tenant>/<slug>`, or
`(all)`) records a `ReconciliationRun` and its `Finding`s (`reconciliation.models`). `reconcile()`
runs them all (or those of one mailbox / destination): `manage.py reconcile` and the beat task
`reconciliation.tasks.reconcile`. Settings (all optional): MAILROOM_RECONCILE_WINDOW_DAYS (3),
MAILROOM_RECONCILE_GRACE_SECONDS (600), MAILROOM_RECONCILE_LIMIT (2000 per reconciler and scope and
pass), MAILROOM_UNMAPPED_AFTER_MINUTES (15; per tenant `Tenant.settings["unmapped_after_minutes"]`),
MAILROOM_OUTBOX_STUCK_SECONDS (300).
"""

from django.utils import timezone

from intake.models import Mailbox
from intake.selectors import drill_tenants
from ticketing.models import Destination

from . import (
    destination as destination_reconciler,
    outbox as outbox_reconciler,
    provider as provider_reconciler,
    unmapped as unmapped_reconciler,
)
from .base import ALL, Summary, pass_lock

__all__ = ["ALL", "Summary", "reconcile", "select"]


def select(mailbox: str | None = None, destination: str | None = None):
    """(mailboxes, destinations, whole) for the options: a mailbox slug; a destination `slug` or `tenant/slug`.

    Never a drill tenant's (reconciliation.drills): its FakeDesk lived only as long as the drill."""
    boxes = Mailbox.objects.select_related("tenant").exclude(tenant_id__in=drill_tenants())
    targets = Destination.objects.select_related("tenant").exclude(tenant_id__in=drill_tenants())
    if mailbox is None and destination is None:
        return list(boxes.order_by("slug")), list(targets.order_by("tenant__slug", "slug")), True
    mailboxes = list(boxes.filter(slug=mailbox)) if mailbox else []
    destinations = []
    if destination:
        tenant, _, slug = destination.rpartition("/")
        rows = targets.filter(slug=slug)
        destinations = list((rows.filter(tenant__slug=tenant) if tenant else rows).order_by("tenant__slug"))
    return mailboxes, destinations, False


def reconcile(mailbox: str | None = None, destination: str | None = None, now=None) -> list[Summary]:
    """One pass now: per mailbox provider + unmapped, per destination, then the outbox (unscoped runs only).

    Returns one `Summary` per reconciler and scope. A pass already running elsewhere makes this one
    return a single skipped summary (passes are safe together, but one at a time costs less).
    """
    now = now or timezone.now()
    mailboxes, destinations, whole = select(mailbox, destination)
    summaries: list[Summary] = []
    with pass_lock() as acquired:
        if not acquired:
            return [Summary("reconcile", ALL, skipped="another reconciliation pass is running")]
        for box in mailboxes:
            provider_reconciler.reconcile_mailbox(box, summaries, now)
            unmapped_reconciler.reconcile_mailbox(box, summaries, now)
        for target in destinations:
            destination_reconciler.reconcile_destination(target, summaries, now)
        if whole:
            outbox_reconciler.reconcile_outbox(summaries, now)
    return summaries

"""Discard a drill's scratch tenant and every row the drill made in it, in one transaction.

After a run (unless `manage.py drill --keep`), and for a kept one later (`manage.py drill --discard SLUG`), so
the operator finds no trace of it: not in the recovery queue, the pauses, the admin's filters or /metrics. The
printed table and the JSON report are the run's evidence.

The records are evidence everywhere else, so their foreign keys PROTECT them (an event from its audit rows,
intents and mappings; a tenant from its mailboxes, destinations and events) and the rows go leaves first; a
tenant's, mailbox's or destination's own configuration and bookkeeping (verified domains, routing policy,
cursors, leases, the breaker's attempts) CASCADE and go with it. So a model added later that points at a drill
row stops the discard only if its key PROTECTs (or RESTRICTs): the whole discard fails and rolls back
(ProtectedError) instead of leaving half a tenant. One whose key CASCADEs is deleted with that row, unnoticed
and uncounted here, and a SET_NULL one stays behind unlinked: a new model that is evidence takes PROTECT and a
`drop` line below. Only a tenant marked `is_drill` (set by the drill alone) is ever discarded.
"""

import logging

from django.db import transaction
from django.db.models import Q

from intake.models import (
    AuditEvent,
    InboxEvent,
    Mailbox,
    OutboxMessage,
    SecretResolution,
    Switch,
    Tenant,
)
from intake.selectors import tenant_pause_name
from ticketing.models import (
    CopiedMessage,
    Destination,
    Intent,
    Notification,
    RoutingRule,
    Ticket,
    TicketComment,
    TicketMapping,
)

from ..models import Finding, ReconciliationRun
from ..reconcilers.destination import scope_of

logger = logging.getLogger(__name__)


class NotADrillTenant(Exception):
    """Asked to discard a tenant that does not exist or was not made by the drill."""


def _among(field: str, ids: list) -> Q:
    return Q(**{f"{field}__in": ids}) if ids else Q(pk__in=[])


def drill_outbox_rows(*, event_ids: list[int], intent_ids: list[int], mailbox_ids: list[int]) -> Q:
    """The outbox rows that announce these events, intents or mailboxes (outbox rows carry no tenant)."""
    return (
        _among("payload__inbox_event_id", event_ids)
        | _among("payload__intent_id", intent_ids)
        | _among("payload__mailbox_id", mailbox_ids)
    )


def discard(*, slug: str) -> dict[str, int]:
    """Delete drill tenant `slug` and everything in it; {model label: rows deleted}. NotADrillTenant otherwise."""
    with transaction.atomic():
        tenant = Tenant.objects.select_for_update().filter(slug=slug).first()
        if tenant is None or not tenant.is_drill:
            raise NotADrillTenant(f"{slug!r} is not a drill's scratch tenant" if tenant else f"no tenant {slug!r}")
        deleted: dict[str, int] = {}

        def drop(queryset) -> None:
            _, per_model = queryset.delete()
            for label, count in per_model.items():
                if count:
                    deleted[label] = deleted.get(label, 0) + count

        mailboxes = list(Mailbox.objects.filter(tenant=tenant))
        destinations = list(Destination.objects.filter(tenant=tenant).select_related("tenant"))
        mailbox_ids, destination_ids = [m.pk for m in mailboxes], [d.pk for d in destinations]
        event_ids = list(InboxEvent.objects.filter(tenant=tenant).values_list("pk", flat=True))
        intent_ids = list(
            Intent.objects.filter(
                _among("inbox_event_id", event_ids) | _among("destination_id", destination_ids)
            ).values_list("pk", flat=True)
        )
        scopes = [m.slug for m in mailboxes] + [scope_of(d) for d in destinations]

        drop(
            OutboxMessage.objects.filter(
                drill_outbox_rows(event_ids=event_ids, intent_ids=intent_ids, mailbox_ids=mailbox_ids)
            )
        )
        drop(
            Finding.objects.filter(
                Q(tenant=tenant) | _among("inbox_event_id", event_ids) | _among("run__scope", scopes)
            )
        )
        drop(ReconciliationRun.objects.filter(_among("scope", scopes)))
        drop(
            Notification.objects.filter(
                Q(tenant=tenant) | _among("inbox_event_id", event_ids) | _among("destination_id", destination_ids)
            )
        )
        drop(
            TicketMapping.objects.filter(
                _among("inbox_event_id", event_ids) | _among("destination_id", destination_ids)
            )
        )
        drop(Intent.objects.filter(_among("pk", intent_ids)))
        drop(TicketComment.objects.filter(_among("ticket__destination_id", destination_ids)))
        drop(Ticket.objects.filter(_among("destination_id", destination_ids)))
        drop(CopiedMessage.objects.filter(Q(tenant=tenant) | _among("primary_id", event_ids)))
        drop(AuditEvent.objects.filter(_among("inbox_event_id", event_ids)))
        InboxEvent.objects.filter(_among("pk", event_ids), copy_of__isnull=False).update(copy_of=None)
        drop(InboxEvent.objects.filter(_among("pk", event_ids)))
        drop(SecretResolution.objects.filter(tenant=tenant))
        drop(Switch.objects.filter(name=tenant_pause_name(tenant.pk)))
        drop(RoutingRule.objects.filter(tenant=tenant))
        drop(Destination.objects.filter(_among("pk", destination_ids)))  # and the breaker's attempts (CASCADE)
        drop(Mailbox.objects.filter(_among("pk", mailbox_ids)))  # cursors, leases, nonces, subscriptions, schedule
        drop(Tenant.objects.filter(pk=tenant.pk))  # its routing policy and verified domains (CASCADE)
    logger.info("drill tenant %s discarded: %d rows", slug, sum(deleted.values()))
    return deleted

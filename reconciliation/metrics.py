"""`GET /metrics` (the README's runbook, a contract): Prometheus text, read from the database at each scrape.

Every number comes from the database when Prometheus asks, through a custom collector, so any web
process answers the same (no per-process state, no prometheus multiprocess directory). Each query is
one cheap indexed read: counts by state (`inbox_event_state_updated`, `intent_due`), the recovery
queue's UNION (`reconciliation.selectors.recovery_queue`), the open events (small), the outbox's
unpublished head (`outbox_unpublished`), and the small tables of counters, destinations and runs.

Access: `Authorization: Bearer <MAILROOM_METRICS_TOKEN>`. Without the setting the endpoint does not
exist (404); a missing or wrong token is a 404 too, so the URL reveals nothing to a stranger.

    mailroom_events{state}                       events per state (every state, zeros included)
    mailroom_intents{state}                      intents per state
    mailroom_recovery_queue_items                items in the recovery queue
    mailroom_recovery_queue_oldest_seconds       age of its oldest item (received_at), 0 when empty
    mailroom_oldest_unmapped_seconds             age of the oldest open event (received/ready/write_pending)
                                                 without a ticket mapping, 0 when none
    mailroom_outbox_lag_seconds                  age of the oldest unpublished outbox row, 0 when none
    mailroom_webhook_rejections_total{provider,reason}   refused webhooks (intake.WebhookRejectionCount)
    mailroom_destination_paused{destination}     1 paused, 0 not; destination = "<tenant>/<slug>"
    mailroom_last_reconciliation_timestamp_seconds{kind,scope}   last finished ReconciliationRun per
                                                 (kind, scope); no samples while that model does not exist
    mailroom_mailbox_*{tenant,mailbox}           per-mailbox link health (reconciliation.mailbox_metrics)

A drill's scratch tenant (`Tenant.is_drill`, reconciliation.drills) is in no series: the drill's events, intents,
queue items, outbox rows, destinations and reconciliation scopes are left out, so running `manage.py drill`
(with `--keep` too) moves no gauge an alert watches.
"""

import hmac

from django.apps import apps
from django.conf import settings
from django.core.exceptions import FieldError
from django.db import DatabaseError
from django.db.models import Count, Exists, Max, Min, OuterRef
from django.http import Http404, HttpResponse
from django.urls import path
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from intake.models import InboxEvent, Mailbox, OutboxMessage, WebhookRejectionCount
from intake.selectors import drill_events, drill_outbox, drill_tenants
from ticketing.models import Destination, Intent, TicketMapping

from .mailbox_metrics import MailboxCollector
from .selectors import recovery_queue


def _age(now, then) -> float:
    return max(0.0, (now - then).total_seconds()) if then else 0.0


def _by_state(model, states, drill) -> dict:
    """Counts per state without the drill's rows: all of them (the state index alone) less the drill's (a few,
    through their own index), so the scrape of a big table stays as cheap as before drills were left out.
    Two reads, so a drill row deleted between them could take one too many: never below zero."""
    counts = dict.fromkeys(states, 0)
    for queryset, sign in ((drill, -1), (model.objects.all(), 1)):
        for row in queryset.order_by().values("state").annotate(n=Count("pk")):
            counts[row["state"]] = counts.get(row["state"], 0) + sign * row["n"]
    return {state: max(0, n) for state, n in counts.items()}


class MailroomCollector:
    def describe(self):
        return []  # nothing read at registration: the database is read at scrape only

    def collect(self):
        now = timezone.now()

        events = GaugeMetricFamily("mailroom_events", "Inbox events by state.", labels=["state"])
        drill_rows = InboxEvent.objects.filter(tenant_id__in=drill_tenants())
        for state, n in _by_state(InboxEvent, InboxEvent.State.values, drill_rows).items():
            events.add_metric([state], n)
        yield events

        intents = GaugeMetricFamily("mailroom_intents", "Intents by state.", labels=["state"])
        drill_intents = Intent.objects.filter(inbox_event_id__in=drill_events())
        for state, n in _by_state(Intent, Intent.State.values, drill_intents).items():
            intents.add_metric([state], n)
        yield intents

        queue = (
            recovery_queue()
            .exclude(tenant_id__in=drill_tenants())
            .order_by()
            .aggregate(n=Count("pk"), oldest=Min("received_at"))
        )
        yield GaugeMetricFamily("mailroom_recovery_queue_items", "Items in the recovery queue.", value=queue["n"])
        yield GaugeMetricFamily(
            "mailroom_recovery_queue_oldest_seconds",
            "Age of the oldest recovery queue item (0 when empty).",
            value=_age(now, queue["oldest"]),
        )

        oldest_unmapped = (
            InboxEvent.objects.filter(state__in=InboxEvent.OPEN_STATES)
            .exclude(tenant_id__in=drill_tenants())
            .exclude(Exists(TicketMapping.objects.filter(inbox_event=OuterRef("pk"))))
            .order_by()
            .aggregate(oldest=Min("received_at"))["oldest"]
        )
        yield GaugeMetricFamily(
            "mailroom_oldest_unmapped_seconds",
            "Age of the oldest open event without a ticket mapping (0 when none).",
            value=_age(now, oldest_unmapped),
        )

        head = (
            OutboxMessage.objects.filter(published_at__isnull=True)
            .exclude(drill_outbox())
            .order_by("pk")
            .values_list("created_at", flat=True)
            .first()
        )
        yield GaugeMetricFamily(
            "mailroom_outbox_lag_seconds",
            "Age of the oldest unpublished outbox row (0 when none).",
            value=_age(now, head),
        )

        rejections = CounterMetricFamily(
            "mailroom_webhook_rejections", "Webhooks refused, by provider and reason.", labels=["provider", "reason"]
        )
        for provider, reason, count in WebhookRejectionCount.objects.order_by("provider", "reason").values_list(
            "provider", "reason", "count"
        ):
            rejections.add_metric([provider, reason], count)
        yield rejections

        paused = GaugeMetricFamily(
            "mailroom_destination_paused", "1 when the destination is paused.", labels=["destination"]
        )
        for tenant, slug, is_paused in (
            Destination.objects.exclude(tenant_id__in=drill_tenants())
            .order_by("tenant__slug", "slug")
            .values_list("tenant__slug", "slug", "paused")
        ):
            paused.add_metric([f"{tenant}/{slug}"], 1 if is_paused else 0)
        yield paused

        runs = GaugeMetricFamily(
            "mailroom_last_reconciliation_timestamp_seconds",
            "When the last reconciliation run of each kind and scope finished (Unix time).",
            labels=["kind", "scope"],
        )
        for kind, scope, finished in _last_reconciliations():
            runs.add_metric([kind, scope], finished.timestamp())
        yield runs


def _last_reconciliations():
    """(kind, scope, finished_at) of the last finished run per (kind, scope); none while the model is absent."""
    try:
        model = apps.get_model("reconciliation", "ReconciliationRun")
    except LookupError:
        return []
    try:
        rows = list(
            model.objects.filter(finished_at__isnull=False)
            .order_by("kind", "scope")
            .values("kind", "scope")
            .annotate(last=Max("finished_at"))
        )
    except (FieldError, DatabaseError):  # fields or table not there yet (a deploy in progress)
        return []
    drill = _drill_scopes()
    return [(str(row["kind"]), str(row["scope"] or ""), row["last"]) for row in rows if row["scope"] not in drill]


def _drill_scopes() -> set[str]:
    """The reconciliation scopes of drill tenants: their mailboxes' slugs and their destinations' scopes."""
    from .reconcilers.destination import scope_of

    boxes = Mailbox.objects.filter(tenant_id__in=drill_tenants()).values_list("slug", flat=True)
    targets = Destination.objects.filter(tenant_id__in=drill_tenants()).select_related("tenant")
    return {*boxes, *(scope_of(target) for target in targets)}


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(MailroomCollector())
REGISTRY.register(MailboxCollector())  # per-mailbox series (reconciliation.mailbox_metrics)


def _authorized(request) -> bool:
    token = settings.MAILROOM_METRICS_TOKEN
    if not token:
        return False
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@require_GET
def metrics_view(request):
    if not _authorized(request):
        raise Http404("not found")
    response = HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response


# Included by config/urls.py at "metrics".
urlpatterns = [path("", metrics_view, name="metrics")]

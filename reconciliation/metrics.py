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

from intake.models import InboxEvent, OutboxMessage, WebhookRejectionCount
from ticketing.models import Destination, Intent, TicketMapping

from .selectors import recovery_queue


def _age(now, then) -> float:
    return max(0.0, (now - then).total_seconds()) if then else 0.0


def _by_state(model, states) -> dict:
    counts = dict.fromkeys(states, 0)
    for row in model.objects.order_by().values("state").annotate(n=Count("pk")):
        counts[row["state"]] = row["n"]
    return counts


class MailroomCollector:
    def describe(self):
        return []  # nothing read at registration: the database is read at scrape only

    def collect(self):
        now = timezone.now()

        events = GaugeMetricFamily("mailroom_events", "Inbox events by state.", labels=["state"])
        for state, n in _by_state(InboxEvent, InboxEvent.State.values).items():
            events.add_metric([state], n)
        yield events

        intents = GaugeMetricFamily("mailroom_intents", "Intents by state.", labels=["state"])
        for state, n in _by_state(Intent, Intent.State.values).items():
            intents.add_metric([state], n)
        yield intents

        queue = recovery_queue().order_by().aggregate(n=Count("pk"), oldest=Min("received_at"))
        yield GaugeMetricFamily("mailroom_recovery_queue_items", "Items in the recovery queue.", value=queue["n"])
        yield GaugeMetricFamily("mailroom_recovery_queue_oldest_seconds",
                                "Age of the oldest recovery queue item (0 when empty).",
                                value=_age(now, queue["oldest"]))

        oldest_unmapped = (InboxEvent.objects.filter(state__in=InboxEvent.OPEN_STATES)
                           .exclude(Exists(TicketMapping.objects.filter(inbox_event=OuterRef("pk"))))
                           .order_by().aggregate(oldest=Min("received_at"))["oldest"])
        yield GaugeMetricFamily("mailroom_oldest_unmapped_seconds",
                                "Age of the oldest open event without a ticket mapping (0 when none).",
                                value=_age(now, oldest_unmapped))

        head = (OutboxMessage.objects.filter(published_at__isnull=True).order_by("pk")
                .values_list("created_at", flat=True).first())
        yield GaugeMetricFamily("mailroom_outbox_lag_seconds",
                                "Age of the oldest unpublished outbox row (0 when none).", value=_age(now, head))

        rejections = CounterMetricFamily("mailroom_webhook_rejections", "Webhooks refused, by provider and reason.",
                                         labels=["provider", "reason"])
        for provider, reason, count in WebhookRejectionCount.objects.order_by(
                "provider", "reason").values_list("provider", "reason", "count"):
            rejections.add_metric([provider, reason], count)
        yield rejections

        paused = GaugeMetricFamily("mailroom_destination_paused", "1 when the destination is paused.",
                                   labels=["destination"])
        for tenant, slug, is_paused in Destination.objects.order_by("tenant__slug", "slug").values_list(
                "tenant__slug", "slug", "paused"):
            paused.add_metric([f"{tenant}/{slug}"], 1 if is_paused else 0)
        yield paused

        runs = GaugeMetricFamily("mailroom_last_reconciliation_timestamp_seconds",
                                 "When the last reconciliation run of each kind and scope finished (Unix time).",
                                 labels=["kind", "scope"])
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
        rows = list(model.objects.filter(finished_at__isnull=False).order_by("kind", "scope")
                    .values("kind", "scope").annotate(last=Max("finished_at")))
    except (FieldError, DatabaseError):  # fields or table not there yet (a deploy in progress)
        return []
    return [(str(row["kind"]), str(row["scope"] or ""), row["last"]) for row in rows]


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(MailroomCollector())


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

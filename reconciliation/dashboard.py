"""Reads for the operators' dashboard: backlog, throughput, failures, last reconciliations.

Everything is scoped to the user's tenants (`visible_tenants`) and bounded: the backlog reads only
non-terminal states (index `inbox_event_state_updated`), throughput reads a window of `received_at`
per mailbox (index `inbox_event_mailbox_received`) and of `updated_at` per state, and every series is
aggregated in the database (`TruncHour`/`TruncDay`), never loaded row by row. Every query is portable
ORM (no DISTINCT ON, no PostgreSQL-only function): the embedded default (SQLite) shows the same page.

"Completed" in a bucket means an event in state `completed` whose last change (`updated_at`) falls in
it: the moment it completed, unless something touched it since.
"""

from datetime import timedelta

from django.apps import apps
from django.db.models import Count, Min, OuterRef, Subquery
from django.db.models.functions import TruncDay, TruncHour
from django.utils import timezone

from intake.models import InboxEvent
from intake.selectors import visible_tenants
from ticketing.models import Intent

from .selectors import queue_summary, tenants_without_escalation_recipients, visible_mailboxes

BACKLOG_STATES = (*InboxEvent.OPEN_STATES, *InboxEvent.RECOVERY_STATES)
# Intents whose last_error_kind is a failure still standing (a retry wait is one too, for now).
FAILING_INTENT_STATES = (Intent.State.RETRY_WAIT, Intent.State.FAILED, Intent.State.UNKNOWN, Intent.State.HELD)
HOURS, DAYS = 24, 30


def _events(user):
    return InboxEvent.objects.filter(tenant__in=visible_tenants(user).values("pk")).order_by()


def backlog_by_state(user) -> list[tuple[str, int]]:
    """Events in every non-terminal state now, in pipeline order (zeros included)."""
    counts = dict(_events(user).filter(state__in=BACKLOG_STATES).values_list("state").annotate(n=Count("pk")))
    return [(str(state), counts.get(state, 0)) for state in BACKLOG_STATES]


def oldest(user) -> dict:
    """The oldest open item of the recovery queue (as on the queue page) and the oldest event still in the pipeline."""
    queue = queue_summary(user)
    in_pipeline = _events(user).filter(state__in=InboxEvent.OPEN_STATES).aggregate(at=Min("received_at"))["at"]
    now = timezone.now()
    return {
        "queue_open": queue["open"],
        "queue_overdue": queue["overdue"],
        "queue_oldest_at": queue["oldest_received_at"],
        "queue_oldest_age": queue["oldest_age"],
        "pipeline_oldest_at": in_pipeline,
        "pipeline_oldest_age": (now - in_pipeline) if in_pipeline else None,
    }


def _buckets(now, unit: str) -> list:
    if unit == "hour":
        start = now.replace(minute=0, second=0, microsecond=0)
        return [start - timedelta(hours=n) for n in range(HOURS - 1, -1, -1)]
    start = timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0)
    return [start - timedelta(days=n) for n in range(DAYS - 1, -1, -1)]


def _series(queryset, field: str, trunc, buckets) -> list[int]:
    rows = (
        queryset.filter(**{f"{field}__gte": buckets[0]})
        .annotate(bucket=trunc(field))
        .values("bucket")
        .annotate(n=Count("pk"))
        .values_list("bucket", "n")
    )
    counts = dict(rows)
    return [counts.get(b, 0) for b in buckets]


def throughput(user, unit: str, now=None) -> dict:
    """Events received and completed per hour (last 24 h) or per day (last 30 days), oldest bucket first."""
    now = now or timezone.now()
    buckets = _buckets(now, unit)
    trunc = TruncHour if unit == "hour" else TruncDay
    received = InboxEvent.objects.filter(mailbox__in=visible_mailboxes(user).values("pk")).order_by()
    completed = _events(user).filter(state=InboxEvent.State.COMPLETED)
    fmt = "%H:00" if unit == "hour" else "%m-%d"
    return {
        "labels": [timezone.localtime(b).strftime(fmt) for b in buckets],
        "received": _series(received, "received_at", trunc, buckets),
        "completed": _series(completed, "updated_at", trunc, buckets),
        "since": buckets[0],
    }


def failures(user, since) -> dict:
    """Failures since `since` by kind: reason codes of events in a recovery state (by their last change),
    and `last_error_kind` of intents still failing (by creation); most frequent first."""
    events = (
        _events(user)
        .filter(state__in=InboxEvent.RECOVERY_STATES, updated_at__gte=since)
        .exclude(reason_code="")
        .values_list("reason_code")
        .annotate(n=Count("pk"))
    )
    intents = (
        Intent.objects.filter(
            inbox_event__tenant__in=visible_tenants(user).values("pk"),
            state__in=FAILING_INTENT_STATES,
            created_at__gte=since,
        )
        .exclude(last_error_kind="")
        .order_by()
        .values_list("last_error_kind")
        .annotate(n=Count("pk"))
    )
    return {
        "events": sorted(events, key=lambda r: (-r[1], r[0])),
        "intents": sorted(intents, key=lambda r: (-r[1], r[0])),
    }


def run_model():
    """`ReconciliationRun`, or None while the model does not exist yet."""
    try:
        return apps.get_model("reconciliation", "ReconciliationRun")
    except LookupError:
        return None


def last_reconciliations(user) -> list[dict] | None:
    """Per visible mailbox, its last reconciliation run (None: never); None when no run model exists."""
    model = run_model()
    if model is None:
        return None
    # The latest run per mailbox as a correlated subquery (one probe of index `reconciliation_run_scope` per
    # mailbox), not DISTINCT ON: the same answer on PostgreSQL and SQLite. Ties on started_at: the later row.
    latest = model.objects.filter(scope=OuterRef("slug")).order_by("-started_at", "-pk").values("pk")[:1]
    mailboxes = list(visible_mailboxes(user).annotate(last_run_id=Subquery(latest)).order_by("tenant__slug", "slug"))
    runs = model.objects.in_bulk([m.last_run_id for m in mailboxes if m.last_run_id is not None])
    return [{"mailbox": m, "run": runs.get(m.last_run_id)} for m in mailboxes]


def dashboard(user, now=None) -> dict:
    now = now or timezone.now()
    hourly, daily = throughput(user, "hour", now), throughput(user, "day", now)
    return {
        "backlog": backlog_by_state(user),
        "oldest": oldest(user),
        "hourly": hourly,
        "daily": daily,
        "failures_24h": failures(user, hourly["since"]),
        "failures_30d": failures(user, daily["since"]),
        "reconciliations": last_reconciliations(user),
        # Tenants whose escalations reach nobody (no operator with an email address): a warning on top.
        "unreachable_tenants": tenants_without_escalation_recipients(user),
    }

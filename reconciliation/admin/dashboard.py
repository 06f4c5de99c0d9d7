"""The dashboard page (`<queue>/dashboard/`, on RecoveryItemAdmin's URLs): backlog, throughput, failures, runs.

Reads come from `reconciliation.dashboard`, tenant-scoped like the queue; the plots are inline SVG
drawn by `reconciliation.charts`.
"""

from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.urls import reverse

from .. import charts, dashboard as reads


def dashboard_view(model_admin, request):
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    data = reads.dashboard(request.user)
    hourly, daily = data["hourly"], data["daily"]
    series = lambda t: [("received", t["received"]), ("completed", t["completed"])]  # noqa: E731
    plots = {
        "backlog": charts.hbar_chart("Backlog by state (now)", data["backlog"]),
        "hourly": charts.bar_chart("Events per hour, last 24 h (UTC)", hourly["labels"], series(hourly), label_every=3),
        "daily": charts.bar_chart("Events per day, last 30 days", daily["labels"], series(daily), label_every=5),
        "events_24h": charts.hbar_chart("Events needing a person by reason, last 24 h", data["failures_24h"]["events"]),
        "intents_24h": charts.hbar_chart("Intent failures by kind, last 24 h", data["failures_24h"]["intents"]),
        "events_30d": charts.hbar_chart(
            "Events needing a person by reason, last 30 days", data["failures_30d"]["events"]
        ),
        "intents_30d": charts.hbar_chart("Intent failures by kind, last 30 days", data["failures_30d"]["intents"]),
    }
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": "Dashboard",
        **data,
        "plots": plots,
        "queue_url": reverse("admin:reconciliation_recoveryitem_changelist"),
        "backlog_total": sum(n for _, n in data["backlog"]),
    }
    return TemplateResponse(request, "admin/reconciliation/dashboard.html", context)

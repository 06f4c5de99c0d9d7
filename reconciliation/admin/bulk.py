"""Bulk work over the queue's filter, run as a background job: the preview, the job page and its status.

`bulk/?<the queue's querystring>` shows how many items the filter matches and a sample, narrows it by
sender, subject and age, and starts a job for the confirmed count; `bulk/<id>/` shows its progress
(reconciliation/bulk.js polls `bulk/<id>/status/`), its counts and the skipped or failed items with
their reasons, and cancels it. Every write goes through `reconciliation.services` (permission, tenant,
audit); this module only renders.
"""

from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_POST

from intake.selectors import visible_tenants

from .. import selectors, services
from ..models import BulkJob
from ..services import bulk_jobs

PREVIEW = "admin/reconciliation/recoveryitem/bulk_preview.html"
JOB = "admin/reconciliation/recoveryitem/bulk_job.html"
# The queue's own filters, kept as they are, and the ones this page adds.
QUEUE_PARAMS = ("reason", "reason_code", "state", "mailbox", "owner", "tenant", "q")
NARROW_PARAMS = ("sender", "subject", "older_than_hours")


class NarrowForm(forms.Form):
    sender = forms.CharField(required=False, max_length=bulk_jobs.TEXT_LIMIT, label="Sender contains")
    subject = forms.CharField(required=False, max_length=bulk_jobs.TEXT_LIMIT, label="Subject contains")
    older_than_hours = forms.FloatField(required=False, min_value=0, label="Older than (hours)")


class StartForm(forms.Form):
    action = forms.ChoiceField(widget=forms.RadioSelect)
    reason = forms.CharField(
        required=False, max_length=500, label="Reason", help_text="Required to close; recorded on every item"
    )
    assignee = forms.ModelChoiceField(
        queryset=get_user_model()._default_manager.none(),
        required=False,
        label="Assign to",
        help_text="Only for “Assign”",
    )
    expected_count = forms.IntegerField(widget=forms.HiddenInput, min_value=0)

    def __init__(self, *args, user, **kwargs):
        # Prefixed: the queue's filter travels in the same POST, and it has a "reason" of its own.
        super().__init__(*args, prefix="job", **kwargs)
        self.fields["action"].choices = [
            (value, label) for value, label in BulkJob.Action.choices if not bulk_jobs.permission_problem(user, value)
        ]
        ids = set()
        for tenant_id in visible_tenants(user).values_list("pk", flat=True):
            ids.update(services.assignable_users(tenant_id).values_list("pk", flat=True))
        model = get_user_model()
        self.fields["assignee"].queryset = model._default_manager.filter(pk__in=ids).order_by(model.USERNAME_FIELD)


def bulk_urls(model_admin) -> list:
    """The bulk pages' URL patterns, included by RecoveryItemAdmin.get_urls."""
    wrap = model_admin.admin_site.admin_view
    return [
        path(
            "bulk/", wrap(lambda request: preview_view(model_admin, request)), name="reconciliation_recoveryitem_bulk"
        ),
        path(
            "bulk/<int:job_id>/",
            wrap(lambda request, job_id: job_view(model_admin, request, job_id)),
            name="reconciliation_recoveryitem_bulk_job",
        ),
        path("bulk/<int:job_id>/status/", wrap(status_view), name="reconciliation_recoveryitem_bulk_status"),
        path(
            "bulk/<int:job_id>/cancel/", wrap(require_POST(cancel_view)), name="reconciliation_recoveryitem_bulk_cancel"
        ),
    ]


def _filters(params) -> dict:
    return {key: params.get(key, "") for key in (*QUEUE_PARAMS, *NARROW_PARAMS) if params.get(key, "")}


FILTER_NAMES = {
    "reason": "reason",
    "state": "state",
    "owner": "owner",
    "q": "search",
    "sender": "sender contains",
    "subject": "subject contains",
    "older_than_hours": "older than (hours)",
    "received_before": "received before",
}


def _described(user, filters: dict) -> list[str]:
    """The filter in words, with mailbox and tenant by slug."""
    words = []
    if filters.get("tenant"):
        tenants = {str(t.pk): t.slug for t in visible_tenants(user)}
        words.append(f"tenant: {tenants.get(str(filters['tenant']), 'not one of yours')}")
    if filters.get("mailbox"):
        mailboxes = {str(m.pk): m.slug for m in selectors.visible_mailboxes(user)}
        words.append(f"mailbox: {mailboxes.get(str(filters['mailbox']), 'not one of yours')}")
    if filters.get("reason_code") and not filters.get("reason"):
        words.append(f"reason: {filters['reason_code']}")
    words += [f"{name}: {filters[key]}" for key, name in FILTER_NAMES.items() if filters.get(key) not in (None, "")]
    return words


def preview_view(model_admin, request):
    if not request.user.has_perm(services.PERM_VIEW_QUEUE):
        raise PermissionDenied
    params = request.POST if request.method == "POST" else request.GET
    filters = _filters(params)
    narrow = NarrowForm(params)
    start = StartForm(request.POST or None, user=request.user)
    if narrow.is_valid():
        filters.update({k: str(v) for k, v in narrow.cleaned_data.items() if v not in (None, "")})
    error = ""
    try:
        count, sample = services.preview_bulk(request.user, filters=filters)
    except services.ActionRefused as exc:
        count, sample, error = 0, [], str(exc)
    if request.method == "POST" and not error and start.is_valid():
        data = start.cleaned_data
        try:
            job = services.do_start_bulk_job(
                request.user,
                filters=filters,
                action=data["action"],
                reason=data["reason"],
                assignee=data["assignee"] if data["action"] == BulkJob.Action.ASSIGN else None,
                expected_count=data["expected_count"],
            )
        except (services.ActionRefused, PermissionDenied) as exc:
            messages.error(request, str(exc))
        else:
            messages.success(
                request, f"Bulk job #{job.pk} started: {job.get_action_display().lower()} for {job.total} item(s)."
            )
            return redirect("admin:reconciliation_recoveryitem_bulk_job", job_id=job.pk)
    if request.method != "POST":
        start = StartForm(initial={"expected_count": count, "action": BulkJob.Action.CLOSE}, user=request.user)
    queue_query = urlencode({k: v for k, v in filters.items() if k in QUEUE_PARAMS})
    queue_url = reverse("admin:reconciliation_recoveryitem_changelist") + (f"?{queue_query}" if queue_query else "")
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": "Act on matching items",
        "count": count,
        "sample": sample,
        "sample_size": bulk_jobs.SAMPLE_SIZE,
        "error": error,
        "filters": filters,
        "described": _described(request.user, filters),
        "narrow": narrow,
        "form": start,
        "queue_hidden": [(k, v) for k, v in filters.items() if k in QUEUE_PARAMS],
        "all_hidden": list(filters.items()),
        "queue_url": queue_url,
        "reason_text": selectors.reason_text(filters.get("reason") or filters.get("reason_code", "")),
        "recent_jobs": list(services.visible_jobs(request.user).order_by("-created_at")[:5]),
        "can_act": bool(start.fields["action"].choices),
    }
    return TemplateResponse(request, PREVIEW, context)


def _job(request, job_id) -> BulkJob:
    try:
        return services.visible_jobs(request.user).get(pk=job_id)
    except BulkJob.DoesNotExist:
        raise Http404("no such bulk job") from None


def job_view(model_admin, request, job_id):
    job = _job(request, job_id)
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": f"Bulk job #{job.pk}",
        "job": job,
        "open": job.state in bulk_jobs.OPEN_STATES,
        "described": _described(request.user, job.filters),
        "status_url": reverse("admin:reconciliation_recoveryitem_bulk_status", args=[job.pk]),
        "cancel_url": reverse("admin:reconciliation_recoveryitem_bulk_cancel", args=[job.pk]),
        "queue_url": reverse("admin:reconciliation_recoveryitem_changelist"),
    }
    return TemplateResponse(request, JOB, context)


def status_view(request, job_id):
    job = _job(request, job_id)
    return JsonResponse(
        {
            "state": job.state,
            "state_label": job.get_state_display(),
            "total": job.total,
            "done": job.done,
            "succeeded": job.succeeded,
            "skipped": job.skipped,
            "failed": job.failed,
            "open": job.state in bulk_jobs.OPEN_STATES,
        }
    )


def cancel_view(request, job_id):
    _job(request, job_id)
    if services.do_cancel_bulk_job(request.user, job_id):
        messages.success(request, f"Bulk job #{job_id} cancelled: what it did stays done, the rest is left as it was.")
    else:
        messages.warning(request, f"Bulk job #{job_id} had already finished.")
    return redirect("admin:reconciliation_recoveryitem_bulk_job", job_id=job_id)

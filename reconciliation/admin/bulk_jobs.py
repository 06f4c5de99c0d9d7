"""The list of bulk jobs (`BulkJobAdmin`): read-only; each row opens the job's own page (`bulk/<id>/`).

A user sees the jobs `services.visible_jobs` gives them (their own; a superuser all). Jobs are started from
the queue's "Act on all N matching items…" link, never here.
"""

from django.contrib import admin
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.html import format_html

from .. import services, times
from ..models import BulkJob
from .access import QueueViewOnlyMixin


@admin.register(BulkJob)
class BulkJobAdmin(QueueViewOnlyMixin, admin.ModelAdmin):
    list_display = ("job", "action", "state", "progress", "started_by", "started")
    list_filter = ("state", "action")
    ordering = ("-pk",)

    def get_queryset(self, request):
        return services.visible_jobs(request.user).select_related("started_by")

    def change_view(self, request, object_id, form_url="", extra_context=None):
        job = self.get_object(request, object_id)
        if job is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        return redirect(reverse("admin:reconciliation_recoveryitem_bulk_job", args=[job.pk]))

    @admin.display(description="job", ordering="pk")
    def job(self, obj):
        url = reverse("admin:reconciliation_recoveryitem_bulk_job", args=[obj.pk])
        return format_html('<a href="{}">Bulk job #{}</a>', url, obj.pk)

    @admin.display(description="progress")
    def progress(self, obj):
        return f"{obj.done} of {obj.total} ({obj.succeeded} done, {obj.skipped} skipped, {obj.failed} failed)"

    @admin.display(description="started", ordering="created_at")
    def started(self, obj):
        return times.when(obj.started_at or obj.created_at)

"""Read-only pages of the reconcilers' records: runs and findings (the open ones are what a person decides).

A finding held for a person (`orphan_in_destination` not adopted, `ticket_missing`) stays open here
with `detail["held"]` saying why; an open `unmapped` finding also puts its event in the recovery
queue. Users see their tenants' findings and the runs of their mailboxes and destinations.
"""

from django.contrib import admin
from django.db.models import Q

from intake.selectors import visible_tenants

from .. import selectors
from ..models import Finding, ReconciliationRun


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ReconciliationRun)
class ReconciliationRunAdmin(ReadOnly):
    list_display = ("kind", "scope", "started_at", "finished_at", "scanned", "findings", "repaired", "error")
    list_filter = ("kind",)
    search_fields = ("scope",)
    ordering = ("-started_at", "-pk")

    def get_queryset(self, request):
        rows = super().get_queryset(request)
        if request.user.is_superuser:
            return rows
        mailboxes = selectors.visible_mailboxes(request.user).values_list("slug", flat=True)
        destinations = [f"destination:{d.tenant.slug}/{d.slug}" for d in selectors.visible_destinations(request.user)]
        return rows.filter(Q(scope__in=list(mailboxes)) | Q(scope__in=destinations))


class OpenFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "open"

    def lookups(self, request, model_admin):
        return (("yes", "open"), ("no", "resolved"))

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(resolved_at__isnull=True)
        if self.value() == "no":
            return queryset.filter(resolved_at__isnull=False)
        return queryset


@admin.register(Finding)
class FindingAdmin(ReadOnly):
    list_display = ("kind", "object", "tenant", "inbox_event", "first_seen", "last_seen", "resolved_at", "resolution")
    list_filter = (OpenFilter, "kind")
    search_fields = ("object", "resolution")
    ordering = ("-first_seen", "-pk")
    raw_id_fields = ("run", "inbox_event")

    def get_queryset(self, request):
        rows = super().get_queryset(request).select_related("tenant")
        if request.user.is_superuser:
            return rows
        return rows.filter(tenant__in=visible_tenants(request.user).values("pk"))

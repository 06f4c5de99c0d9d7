from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from .logging import mask_address
from .models import AuditEvent, InboxEvent, Mailbox, OutboxMessage, PollCursor, Tenant


class ReadOnlyAdminMixin:
    """Records that are evidence: nobody edits or deletes them from the admin."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name")
    search_fields = ("slug", "name")
    filter_horizontal = ("members",)


@admin.register(Mailbox)
class MailboxAdmin(admin.ModelAdmin):
    list_display = ("slug", "tenant", "address", "provider", "poll_enabled", "paused")
    list_filter = ("provider", "poll_enabled", "paused", "tenant")
    search_fields = ("slug", "address")


@admin.register(PollCursor)
class PollCursorAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("mailbox", "value", "updated_at")


class AuditEventInline(admin.TabularInline):
    model = AuditEvent
    fields = ("at", "kind", "actor", "detail")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("at", "id")

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(InboxEvent)
class InboxEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "state", "mailbox", "masked_sender", "subject", "received_at", "ticket_link", "reason_code")
    list_filter = ("state", "reason_code", "source", "mailbox", "tenant")
    search_fields = ("=id", "provider_message_id", "message_id_header", "subject", "sender")
    date_hierarchy = "received_at"
    ordering = ("-received_at",)
    list_select_related = ("mailbox",)
    exclude = ("raw",)  # bodies need their own permission (see the recovery queue)
    inlines = [AuditEventInline]

    @admin.display(description="sender")
    def masked_sender(self, obj):
        return mask_address(obj.sender)

    @admin.display(description="ticket")
    def ticket_link(self, obj):
        mapping = next(iter(obj.mappings.all()), None)
        if mapping is None:
            return "—"
        url = mapping.ticket_url or reverse("admin:ticketing_ticketmapping_change", args=[mapping.pk])
        return format_html('<a href="{}">{} #{}</a>', url, mapping.destination.slug, mapping.ticket_id)

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("mappings__destination")


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "topic", "payload", "created_at", "published_at", "attempts")
    list_filter = ("topic", ("published_at", admin.EmptyFieldListFilter))


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("at", "inbox_event", "kind", "actor")
    list_filter = ("kind",)
    search_fields = ("=inbox_event__id", "actor", "kind")
    ordering = ("-at",)

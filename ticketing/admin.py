from django.contrib import admin

from intake.admin import ReadOnlyAdminMixin, TenantScopedAdminMixin

from . import numbers
from .models import (
    CopiedMessage,
    DestinationAttempt,
    Intent,
    Notification,
    ThreadLease,
    Ticket,
    TicketComment,
    TicketMapping,
)


@admin.register(DestinationAttempt)
class DestinationAttemptAdmin(TenantScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """What the circuit breaker counts (ticketing.breaker)."""
    tenant_path = "destination__tenant"
    list_display = ("at", "destination", "ok", "reason")
    list_filter = ("ok", "reason")


@admin.register(Notification)
class NotificationAdmin(TenantScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Emails sent to staff (escalations, digests, the breaker), once each."""
    list_display = ("sent_at", "kind", "tenant", "inbox_event", "destination", "subject")
    list_filter = ("kind",)
    search_fields = ("=inbox_event__id", "key")


@admin.register(Intent)
class IntentAdmin(TenantScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    tenant_path = "inbox_event__tenant"
    list_display = ("id", "inbox_event", "action", "action_version", "destination", "state", "attempts",
                    "next_attempt_at", "last_error_kind", "result_ref", "created_at")
    list_filter = ("state", "action", "last_error_kind", ("destination", admin.RelatedOnlyFieldListFilter))
    search_fields = ("=inbox_event__id", "idempotency_key", "external_ref", "result_ref")
    ordering = ("-created_at",)


@admin.register(TicketMapping)
class TicketMappingAdmin(TenantScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    tenant_path = "inbox_event__tenant"
    list_display = ("inbox_event", "action", "number", "destination", "ticket_id", "ticket_url", "created_at")
    list_filter = ("action", ("destination", admin.RelatedOnlyFieldListFilter))
    search_fields = ("=inbox_event__id", "ticket_id")

    def get_queryset(self, request):
        return numbers.with_numbers(super().get_queryset(request))

    @admin.display(description="ticket", ordering="ticket_number")
    def number(self, mapping):
        return numbers.format_number(mapping.ticket_number) if mapping.ticket_number else "-"

    def get_search_results(self, request, queryset, search_term):
        """`MR-n` finds ticket n's mappings (its create, its comments, its copies); anything else as usual."""
        number = numbers.parse_number(search_term)
        if number is not None:
            return numbers.tickets_of_number(queryset, number), False
        return super().get_search_results(request, queryset, search_term)


@admin.register(CopiedMessage)
class CopiedMessageAdmin(TenantScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """One message delivered to several mailboxes: which event makes its ticket (`ticketing.copies`)."""
    list_display = ("primary", "tenant", "fingerprint", "created_at")
    search_fields = ("=primary__id", "fingerprint")


@admin.register(ThreadLease)
class ThreadLeaseAdmin(TenantScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    tenant_path = "mailbox__tenant"
    list_display = ("mailbox", "thread_key", "owner", "token", "expires_at")


class TicketCommentInline(admin.TabularInline):
    model = TicketComment
    fields = ("created_at", "author", "body")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Ticket)
class TicketAdmin(TenantScopedAdminMixin, admin.ModelAdmin):
    tenant_path = "destination__tenant"
    inlines = [TicketCommentInline]
    list_display = ("number", "destination", "subject", "status", "created_at")
    list_filter = ("status", ("destination", admin.RelatedOnlyFieldListFilter))
    search_fields = ("subject", "external_ref")
    search_help_text = "Subject, reference, or a ticket number such as MR-12."
    readonly_fields = ("number", "destination", "idempotency_key", "external_ref", "requester", "created_at")

    def get_queryset(self, request):
        return super().get_queryset(request).with_numbers()

    @admin.display(description="ticket", ordering="mapping_number")
    def number(self, ticket):
        return str(ticket)  # "MR-n": the number its acknowledgment named (ticketing.numbers)

    def get_search_results(self, request, queryset, search_term):
        """`MR-n` (or `#MR-n`, `[#MR-n]`) finds ticket n; anything else searches subject and reference."""
        number = numbers.parse_number(search_term)
        if number is not None:
            return numbers.builtin_tickets_of_number(queryset, number), False
        return super().get_search_results(request, queryset, search_term)

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(TicketComment)
class TicketCommentAdmin(TenantScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    tenant_path = "ticket__destination__tenant"
    list_display = ("__str__", "ticket", "created_at")
    search_fields = ("external_ref",)
    exclude = ("body",)  # bodies are customer text: read them on the ticket


from . import destination_admin, routing_admin  # noqa: E402,F401  (register Destination, RoutingPolicy, RoutingRule)

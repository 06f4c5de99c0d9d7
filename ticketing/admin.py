from django import forms
from django.contrib import admin
from django.utils.html import format_html_join

from intake.admin_forms import LinesField
from intake.admin_mixins import ReadOnlyAdminMixin, TenantScopedAdminMixin
from intake.vocabulary import actor_words

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
    UndeliverableAddress,
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
    list_display = (
        "id",
        "inbox_event",
        "action",
        "action_version",
        "destination",
        "state",
        "attempts",
        "next_attempt_at",
        "last_error_kind",
        "result_ref",
        "created_at",
    )
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
    list_display = ("mailbox", "thread_key", "holder", "token", "expires_at")

    @admin.display(description="holder", ordering="owner")
    def holder(self, lease):
        """`worker:vm:24553` (or `vm:24553`, ticketing.services) as "worker on vm, process 24553"."""
        host_and_pid = lease.owner.count(":") == 1 and lease.owner.rpartition(":")[2].isdigit()
        return actor_words(f"worker:{lease.owner}" if host_and_pid else lease.owner)


class TicketCommentInline(admin.TabularInline):
    model = TicketComment
    fields = ("created_at", "author", "body")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


class TicketForm(forms.ModelForm):
    tags = LinesField(help_text="One tag per line.")

    class Meta:
        model = Ticket
        fields = "__all__"


@admin.register(Ticket)
class TicketAdmin(TenantScopedAdminMixin, admin.ModelAdmin):
    tenant_path = "destination__tenant"
    inlines = [TicketCommentInline]
    form = TicketForm
    list_display = ("number", "destination", "subject", "status", "tag_chips", "created_at")
    list_filter = ("status", ("destination", admin.RelatedOnlyFieldListFilter))
    search_fields = ("subject", "external_ref")
    search_help_text = "Subject, reference, or a ticket number such as MR-12."
    readonly_fields = ("number", "destination", "idempotency_key", "external_ref", "requester", "created_at")

    class Media:
        css = {"all": ("reconciliation/forms.css",)}  # the tag chips: classes, no inline style (the CSP)

    def get_queryset(self, request):
        return super().get_queryset(request).with_numbers()

    @admin.display(description="tags")
    def tag_chips(self, ticket):
        tags = ticket.tags if isinstance(ticket.tags, list) else []
        if not tags:
            return "-"
        return format_html_join("", '<span class="tag-chip">{}</span>', ((str(tag),) for tag in tags))

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


@admin.register(UndeliverableAddress)
class UndeliverableAddressAdmin(TenantScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Addresses that bounced an acknowledgment for good (ticketing.bounces): none is sent to them until the
    mark expires. Written by the bounce only; it expires by itself."""

    list_display = ("address", "tenant", "status", "reason", "bounced_event", "expires_at", "created_at")
    list_filter = ("status",)
    search_fields = ("address", "=bounced_event__id")
    ordering = ("-created_at",)


# Registered there: Destination, RoutingPolicy, RoutingRule, AcknowledgmentTemplate and BusinessHours.
from . import ack_admin, destination_admin, routing_admin  # noqa: E402,F401

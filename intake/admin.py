from django.contrib import admin, messages
from django.http import Http404
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from . import retention
from .logging import mask_address
from .models import (
    AuditEvent,
    InboxEvent,
    Mailbox,
    OutboxMessage,
    PollCursor,
    ProviderSubscription,
    SecretResolution,
    Tenant,
    WebhookNonce,
    WebhookRejectionCount,
)
from .secrets import allowed_forms, platform_refs
from .selectors import visible_tenants


class ReadOnlyAdminMixin:
    """Records that are evidence: nobody edits or deletes them from the admin."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class TenantScopedAdminMixin:
    """A user sees only the tenants they are a member of (a superuser sees all): in lists, filters,
    search, form choices and by URL (another tenant's object is a 404, not a redirect).

    `tenant_path` is the lookup from the model to its Tenant ("pk" for Tenant itself).
    """

    tenant_path = "tenant"

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        return queryset.filter(**{f"{self.tenant_path}__in": visible_tenants(request.user).values("pk")})

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        model = db_field.related_model
        if not request.user.is_superuser:
            tenants = visible_tenants(request.user).values("pk")
            if model is Tenant:
                kwargs["queryset"] = Tenant.objects.filter(pk__in=tenants)
            elif any(f.name == "tenant" for f in model._meta.fields):
                kwargs["queryset"] = model._default_manager.filter(tenant__in=tenants)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def _get_obj_does_not_exist_redirect(self, request, opts, object_id):
        raise Http404(f"no {opts.verbose_name} {object_id}")


class PlatformSecretsForSuperusersMixin:
    """Only a superuser may point a row at a platform secret (MAILROOM_PLATFORM_SECRET_REFS); tenant staff
    may keep one already there. The model's clean() refuses whatever is outside the tenant's scope."""

    secret_ref_fields = ()

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        if request.user.is_superuser:
            return form
        fields = self.secret_ref_fields

        class TenantSecretsOnly(form):
            def clean(self):
                data = super().clean()
                tenant = data.get("tenant") or getattr(self.instance, "tenant", None)
                for name in fields:
                    ref = data.get(name)
                    if ref and ref in platform_refs() and ref != getattr(self.instance, name):
                        self.add_error(name, "Only a superuser may use a platform secret reference. "
                                             f"Allowed: {allowed_forms(tenant)}.")
                return data

        return TenantSecretsOnly


@admin.register(Tenant)
class TenantAdmin(TenantScopedAdminMixin, admin.ModelAdmin):
    tenant_path = "pk"
    list_display = ("slug", "name")
    search_fields = ("slug", "name")
    filter_horizontal = ("members",)


@admin.register(Mailbox)
class MailboxAdmin(PlatformSecretsForSuperusersMixin, TenantScopedAdminMixin, admin.ModelAdmin):
    secret_ref_fields = ("webhook_secret_ref", "credentials_ref")
    list_display = ("slug", "tenant", "address", "provider", "poll_enabled", "paused", "health_status",
                    "last_polled_at")
    list_filter = ("provider", "poll_enabled", "paused", "health", ("tenant", admin.RelatedOnlyFieldListFilter))
    search_fields = ("slug", "address")
    readonly_fields = ("health_status", "health_detail", "last_polled_at", "poll_backoff_until")
    exclude = ("health",)
    actions = ("poll_now", "reset_health")

    _HEALTH_COLOURS = {"ok": "#1a7f37", "backoff": "#9a6700", "credentials_invalid": "#cf222e"}

    @admin.display(description="health", ordering="health")
    def health_status(self, obj):
        label = obj.get_health_display()
        if obj.health == Mailbox.Health.BACKOFF and obj.poll_backoff_until:
            label = f"{label} until {obj.poll_backoff_until:%Y-%m-%d %H:%M:%S}"
        if obj.health == Mailbox.Health.CREDENTIALS_INVALID:
            label = f"{label}: polling stopped"
        return format_html('<span style="color:{}" title="{}">{}</span>',
                           self._HEALTH_COLOURS.get(obj.health, "inherit"), obj.health_detail, label)

    @admin.action(description="Poll now (queued; runs even while backing off)")
    def poll_now(self, request, queryset):
        from . import polling, schedules

        queued, refused = [], []
        for mailbox in queryset:
            if not schedules.provider_polls(mailbox.provider):
                refused.append(f"{mailbox.slug} (provider {mailbox.provider} does not poll)")
            elif mailbox.health == Mailbox.Health.CREDENTIALS_INVALID:
                refused.append(f"{mailbox.slug} (credentials invalid: fix them, then reset health)")
            else:
                polling.request_poll(mailbox.pk, trigger=polling.MANUAL)
                queued.append(mailbox.slug)
        if queued:
            self.message_user(request, f"Poll queued for {', '.join(queued)}.", messages.SUCCESS)
        if refused:
            self.message_user(request, f"Not polled: {'; '.join(refused)}.", messages.WARNING)

    @admin.action(description="Reset health (poll again after fixing credentials or settings)")
    def reset_health(self, request, queryset):
        from . import polling

        count = polling.reset_health(queryset.values_list("pk", flat=True))
        self.message_user(request, f"Health reset for {count} mailbox(es).", messages.SUCCESS)

    def save_model(self, request, obj, form, change):
        # New credentials or settings deserve a new attempt: a refused login is not held against them.
        if change and obj.health == Mailbox.Health.CREDENTIALS_INVALID:
            stored = Mailbox.objects.filter(pk=obj.pk).values("credentials_ref", "settings").first() or {}
            if (stored.get("credentials_ref"), stored.get("settings")) != (obj.credentials_ref, obj.settings):
                obj.health, obj.health_detail, obj.poll_backoff_until = Mailbox.Health.OK, "", None
        super().save_model(request, obj, form, change)


@admin.register(PollCursor)
class PollCursorAdmin(TenantScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    tenant_path = "mailbox__tenant"
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
class InboxEventAdmin(TenantScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "state", "mailbox", "masked_sender", "subject", "received_at", "ticket_link", "reason_code",
                    "message_id_reused", "console_link")
    # `state` lists suppressed mail too (which the recovery queue does not): from the console
    # page an operator can replay what a rule set aside.
    list_filter = ("state", "reason_code", "message_id_reused", "source", ("mailbox", admin.RelatedOnlyFieldListFilter),
                   ("tenant", admin.RelatedOnlyFieldListFilter))
    search_fields = ("=id", "provider_message_id", "message_id_header", "subject", "sender")
    date_hierarchy = "received_at"
    ordering = ("-received_at",)
    list_select_related = ("mailbox",)
    exclude = ("raw", "copy_of")  # bodies need their own permission (see the recovery queue)
    readonly_fields = ("ticket_link", "message_copies", "body_status")
    inlines = [AuditEventInline]
    actions = ["place_legal_hold", "release_legal_hold"]

    @admin.display(description="body")
    def body_status(self, obj):
        if obj.purged_at:
            return f"purged by retention on {obj.purged_at:%Y-%m-%d %H:%M} UTC"
        return f"stored ({obj.size} bytes){' — under legal hold' if obj.legal_hold else ''}"

    def has_legal_hold_permission(self, request):
        return request.user.has_perm("intake.set_legal_hold")

    def _legal_hold(self, request, queryset, on: bool):
        changed = sum(retention.set_legal_hold(pk, on, actor=request.user.get_username())
                      for pk in queryset.values_list("pk", flat=True))
        self.message_user(request, f"Legal hold {'placed on' if on else 'released from'} {changed} event(s).",
                          messages.SUCCESS)

    @admin.action(description="Place a legal hold (retention keeps the body)", permissions=["legal_hold"])
    def place_legal_hold(self, request, queryset):
        self._legal_hold(request, queryset, True)

    @admin.action(description="Release the legal hold", permissions=["legal_hold"])
    def release_legal_hold(self, request, queryset):
        self._legal_hold(request, queryset, False)

    @admin.display(description="sender")
    def masked_sender(self, obj):
        return mask_address(obj.sender)

    @admin.display(description="console")
    def console_link(self, obj):
        url = reverse("admin:reconciliation_recoveryitem_change", args=[obj.pk])
        return format_html('<a href="{}">inspect / replay</a>', url)

    @admin.display(description="ticket")
    def ticket_link(self, obj):
        mapping = next(iter(obj.mappings.all()), None)
        if mapping is None:
            return "—"
        url = mapping.ticket_url or reverse("admin:ticketing_ticketmapping_change", args=[mapping.pk])
        return format_html('<a href="{}">{} #{}</a>', url, mapping.destination.slug, mapping.ticket_id)

    @admin.display(description="copies in other mailboxes")
    def message_copies(self, obj):
        """The same message delivered to another mailbox of the tenant: the event it follows, or its copies."""
        def link(event):
            url = reverse("admin:intake_inboxevent_change", args=[event.pk])
            return format_html('<a href="{}" class="message-copy">event #{}</a> ({}, {})', url, event.pk,
                               event.mailbox.slug, event.state)
        if obj.copy_of_id:
            return format_html("copy of {}", link(InboxEvent.objects.select_related("mailbox").get(pk=obj.copy_of_id)))
        copies = list(obj.copies.select_related("mailbox").order_by("pk")[:50])
        if not copies:
            return "—"
        return format_html("primary of {}", format_html_join(", ", "{}", ((link(c),) for c in copies)))

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("mappings__destination")


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "topic", "payload", "created_at", "published_at", "attempts")
    list_filter = ("topic", ("published_at", admin.EmptyFieldListFilter))

    # Outbox rows belong to no tenant: only superusers see them.
    def has_view_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_module_permission(self, request):
        return request.user.is_superuser


@admin.register(WebhookRejectionCount)
class WebhookRejectionCountAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """`mailroom_webhook_rejections_total`: refusals belong to no tenant (an unknown mailbox has none)."""

    list_display = ("provider", "reason", "count", "last_at")
    list_filter = ("provider", "reason")

    def has_view_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_module_permission(self, request):
        return request.user.is_superuser


@admin.register(AuditEvent)
class AuditEventAdmin(TenantScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    tenant_path = "inbox_event__tenant"
    list_display = ("at", "inbox_event", "kind", "actor")
    list_filter = ("kind",)
    search_fields = ("=inbox_event__id", "actor", "kind")
    ordering = ("-at",)


@admin.register(ProviderSubscription)
class ProviderSubscriptionAdmin(TenantScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    tenant_path = "mailbox__tenant"
    list_display = ("mailbox", "provider", "external_id", "expires_at", "renewed_at")
    list_filter = ("provider",)


@admin.register(WebhookNonce)
class WebhookNonceAdmin(TenantScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    tenant_path = "mailbox__tenant"
    list_display = ("provider", "mailbox", "seen_at")
    list_filter = ("provider",)


@admin.register(SecretResolution)
class SecretResolutionAdmin(TenantScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("at", "ref", "owner", "tenant", "outcome", "fresh")
    list_filter = ("outcome", "fresh")
    search_fields = ("ref", "owner")
    ordering = ("-at",)

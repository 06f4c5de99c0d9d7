from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from . import retention
from .admin_forms import MailboxForm, secret_warnings
from .admin_mixins import PlatformSecretsForSuperusersMixin, ReadOnlyAdminMixin, TenantScopedAdminMixin
from .logging import mask_address
from .models import (
    AuditEvent,
    InboxEvent,
    Mailbox,
    MailboxAudit,
    OutboxMessage,
    PollCursor,
    ProviderSubscription,
    SecretResolution,
    Tenant,
    VerifiedDomain,
    WebhookNonce,
    WebhookRejectionCount,
)
from .oauth_consent.admin import ConsentAdminMixin  # the consent flow's URLs and panel
from .selectors import visible_tenants


class SuperusersEditDomainsMixin:
    """Verified domains are the platform's word on who owns a domain: only a superuser adds, changes or
    removes one (the model grants no add/change/delete permission to give); tenant staff who may see their
    mailboxes see their tenants' domains."""

    def has_add_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_view_permission(self, request, obj=None):
        user = request.user
        return user.is_superuser or user.has_perm("intake.view_verifieddomain") or user.has_perm("intake.view_mailbox")


class VerifiedDomainInline(SuperusersEditDomainsMixin, admin.TabularInline):
    model = VerifiedDomain
    fields = ("domain", "verified_by", "created_at")
    readonly_fields = ("verified_by", "created_at")
    extra = 0


@admin.register(Tenant)
class TenantAdmin(TenantScopedAdminMixin, admin.ModelAdmin):
    tenant_path = "pk"
    list_display = ("slug", "name", "domains")
    search_fields = ("slug", "name", "verified_domains__domain")
    filter_horizontal = ("members",)
    inlines = [VerifiedDomainInline]

    @admin.display(description="verified domains")
    def domains(self, obj):
        return ", ".join(d.domain for d in obj.verified_domains.all()) or "—"

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("verified_domains")

    def save_formset(self, request, form, formset, change):
        if formset.model is VerifiedDomain:
            for row in formset.save(commit=False):
                row.verified_by = row.verified_by or request.user.get_username()
                row.save()
            for row in formset.deleted_objects:
                row.delete()
            return
        super().save_formset(request, form, formset, change)


@admin.register(VerifiedDomain)
class VerifiedDomainAdmin(SuperusersEditDomainsMixin, TenantScopedAdminMixin, admin.ModelAdmin):
    list_display = ("domain", "tenant", "verified_by", "created_at")
    list_filter = (("tenant", admin.RelatedOnlyFieldListFilter),)
    search_fields = ("domain",)
    readonly_fields = ("verified_by", "created_at")

    def save_model(self, request, obj, form, change):
        obj.verified_by = obj.verified_by or request.user.get_username()
        super().save_model(request, obj, form, change)


@admin.register(Mailbox)
class MailboxAdmin(ConsentAdminMixin, PlatformSecretsForSuperusersMixin, TenantScopedAdminMixin, admin.ModelAdmin):
    form = MailboxForm  # settings checked key by key per provider; allowed recipients one per line
    list_display = (
        "slug",
        "tenant",
        "address",
        "provider",
        "poll_enabled",
        "paused",
        "health_status",
        "link_status",
        "last_success_at",
        "last_polled_at",
    )
    list_filter = (
        "provider",
        "poll_enabled",
        "paused",
        "health",
        "link_state",
        ("tenant", admin.RelatedOnlyFieldListFilter),
    )
    search_fields = ("slug", "address")
    # `paused` is turned on the pause page, which asks why and audits it (reconciliation.services.pauses).
    readonly_fields = (
        "paused",
        "health_status",
        "health_detail",
        "last_polled_at",
        "poll_backoff_until",
        # the link state moves only through intake.mailbox_health
        "link_status",
        "link_state_since",
        "poll_failures",
        "poll_errors_total",
        "last_success_at",
        "quiet_alarm_since",
        "archive_done_at",
    )  # set by the poll that ends an archive import (intake.archive)
    exclude = ("health", "link_state")
    actions = ("poll_now", "reset_health")

    class Media:
        css = {"all": ("intake/admin.css",)}  # the health colours: a class, no inline style (the CSP)

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if db_field.name in ("address", "allowed_recipients") and field is not None:
            # Both parts literal: the model's text is escaped already (literal_help), this one here.
            field.help_text = format_html(
                "{}{}", format_html("{} ", field.help_text) if field.help_text else "", self._domains_help(request)
            )
        return field

    @staticmethod
    def _domains_help(request) -> str:
        """The verified domains the user's tenants may use (intake.domains); addresses are unique platform-wide."""
        tenants = Tenant.objects.all() if request.user.is_superuser else visible_tenants(request.user)
        owned = {}
        for domain in VerifiedDomain.objects.filter(tenant__in=tenants).select_related("tenant")[:200]:
            owned.setdefault(domain.tenant.slug, []).append(domain.domain)
        listed = "; ".join(f"{slug}: {', '.join(domains)}" for slug, domains in sorted(owned.items()))
        return (
            f"Only the tenant's verified domains ({listed or 'none yet: a superuser verifies them'}); an "
            f"address (ignoring case and +tags) belongs to one mailbox only."
        )

    @admin.display(description="health", ordering="health")
    def health_status(self, obj):
        label = obj.get_health_display()
        if obj.health == Mailbox.Health.BACKOFF and obj.poll_backoff_until:
            label = f"{label} until {obj.poll_backoff_until:%Y-%m-%d %H:%M:%S}"
        if obj.health == Mailbox.Health.CREDENTIALS_INVALID:
            label = f"{label}: polling stopped"
        return format_html(
            '<span class="mailbox-health mailbox-health-{}" title="{}">{}</span>', obj.health, obj.health_detail, label
        )

    @admin.display(description="connection", ordering="link_state")
    def link_status(self, obj):
        label = obj.get_link_state_display()
        if obj.link_state_since:
            label = f"{label} since {obj.link_state_since:%Y-%m-%d %H:%M}"
        if obj.poll_failures:
            label = f"{label} ({obj.poll_failures} failed in a row)"
        if obj.quiet_alarm_since:
            label = f"{label}; quiet since {obj.quiet_alarm_since:%Y-%m-%d %H:%M}"
        return format_html('<span class="mailbox-link mailbox-link-{}">{}</span>', obj.link_state, label)

    @admin.action(description="Poll now (queued; runs even while backing off)")
    def poll_now(self, request, queryset):
        from .channels import polling, schedules

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
        from .channels import polling

        count = polling.reset_health(queryset.values_list("pk", flat=True))
        self.message_user(request, f"Health reset for {count} mailbox(es).", messages.SUCCESS)

    def save_model(self, request, obj, form, change):
        # New credentials or settings deserve a new attempt: a refused login is not held against them.
        if change and obj.health == Mailbox.Health.CREDENTIALS_INVALID:
            stored = Mailbox.objects.filter(pk=obj.pk).values("credentials_ref", "settings").first() or {}
            if (stored.get("credentials_ref"), stored.get("settings")) != (obj.credentials_ref, obj.settings):
                obj.health, obj.health_detail, obj.poll_backoff_until = Mailbox.Health.OK, "", None
        from . import archive

        import_wanted = archive.form_request(obj, form.changed_data)  # written and audited by its service
        super().save_model(request, obj, form, change)
        if import_wanted:
            archive.start_archive_import(
                mailbox=obj,
                before=import_wanted[0],
                tickets=import_wanted[1],
                actor=f"user:{request.user.get_username()}",
                user=request.user,
            )
            self.message_user(
                request,
                f"Archive import of mail before {import_wanted[0]:%Y-%m-%d %H:%M} started: the next polls import it.",
                messages.SUCCESS,
            )
        for warning in secret_warnings(obj, ("webhook_secret_ref", "credentials_ref")):
            self.message_user(request, warning, messages.WARNING)


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
    list_display = (
        "id",
        "state",
        "mailbox",
        "masked_sender",
        "subject",
        "received_at",
        "ticket_link",
        "reason_code",
        "message_id_reused",
        "console_link",
    )
    # `state` lists suppressed mail too (which the recovery queue does not): from the console
    # page an operator can replay what a rule set aside.
    list_filter = (
        "state",
        "reason_code",
        "message_id_reused",
        "source",
        ("mailbox", admin.RelatedOnlyFieldListFilter),
        ("tenant", admin.RelatedOnlyFieldListFilter),
    )
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
        changed = sum(
            retention.set_legal_hold(pk, on, actor=request.user.get_username())
            for pk in queryset.values_list("pk", flat=True)
        )
        self.message_user(
            request, f"Legal hold {'placed on' if on else 'released from'} {changed} event(s).", messages.SUCCESS
        )

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
            return format_html(
                '<a href="{}" class="message-copy">event #{}</a> ({}, {})',
                url,
                event.pk,
                event.mailbox.slug,
                event.state,
            )

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
    # A read-only page shows the model's help texts as HTML: "mailbox:<id>" would lose its placeholder.
    fields = readonly_fields = ("at", "ref", "owner_of", "tenant", "outcome", "fresh")

    @admin.display(description="owner")
    def owner_of(self, obj):
        return obj.owner or "-"

    list_filter = ("outcome", "fresh")
    search_fields = ("ref", "owner")
    ordering = ("-at",)


@admin.register(MailboxAudit)
class MailboxAuditAdmin(TenantScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """A mailbox's connection history (tokens, health transitions, quiet alarms, archive imports): evidence."""

    list_display = ("at", "mailbox", "kind", "actor")
    fields = readonly_fields = ("at", "mailbox", "tenant", "kind", "actor", "detail")
    list_filter = ("kind",)
    search_fields = ("mailbox__slug",)
    ordering = ("-at",)


from . import sender_list_admin  # noqa: E402,F401  (registers SenderListEntry: the sender block/allow lists)

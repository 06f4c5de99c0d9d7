"""The recovery queue (`RecoveryItemAdmin`): the list and its bulk actions; the item page (`item`) and the body
views (`body`) are mixed in.

Every write goes through `reconciliation.services` (permission, tenant, audit);
this module only renders and maps refusals to messages. URLs: the changelist,
`dashboard/`, and those of the mixins (`<pk>/change/`, `<pk>/act/<action>/`,
`<pk>/body/`, `<pk>/attachment/<index>/`).
"""
from django.contrib import admin, messages
from django.http import Http404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince

from intake.logging import mask_address
from intake.models import InboxEvent
from ticketing.models import Intent

from .. import selectors, services
from ..models import RecoveryItem
from .body import BodyViewsMixin
from .bulk import bulk_urls
from .dashboard import dashboard_view
from .filters import MailboxFilter, OwnerFilter, ReasonFilter, StateFilter, TenantFilter
from .item import ItemPageMixin


@admin.register(RecoveryItem)
class RecoveryItemAdmin(ItemPageMixin, BodyViewsMixin, admin.ModelAdmin):
    list_display = ("item", "state_badge", "reason", "mailbox", "masked_sender", "short_subject", "first_seen",
                    "latest_attempt", "attempts", "destination_ref", "owner_name", "escalation", "age")
    list_display_links = ("item",)
    list_filter = (ReasonFilter, StateFilter, MailboxFilter, OwnerFilter, TenantFilter)
    search_fields = ("subject",)  # the box; get_search_results decides what matches
    search_help_text = "Sender, subject, Message-ID, ticket number (MR-12) or the desk's ticket id"
    ordering = ("received_at", "pk")
    list_per_page = 50
    show_facets = admin.ShowFacets.NEVER
    actions = ("assign_to_me", "bulk_replay")
    detail_template = "admin/reconciliation/recoveryitem/detail.html"

    # --- permissions: view and actions only; nobody adds, edits or deletes through the queue
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(services.PERM_VIEW_QUEUE)

    def has_module_permission(self, request):
        return self.has_view_permission(request)

    def has_assign_permission(self, request):
        return request.user.has_perm(services.PERM_ASSIGN)

    def has_replay_permission(self, request):
        return request.user.has_perm(services.PERM_REPLAY) and request.user.has_perm(services.PERM_CONFIRM)

    # --- the list
    def get_queryset(self, request):
        queue = selectors.recovery_queue_for(request.user, model=RecoveryItem)
        return selectors.with_queue_columns(queue).select_related("mailbox", "owner", "tenant")

    def get_ordering(self, request):
        return list(selectors.QUEUE_ORDER)  # overdue items first, then oldest first

    def get_search_results(self, request, queryset, search_term):
        return selectors.search_queue(queryset, search_term), False

    def changelist_view(self, request, extra_context=None):
        extra = {
            "summary": selectors.queue_summary(request.user),
            "pauses": selectors.pause_status(request.user),
            "bulk_cap": services.bulk_replay_cap(),
            "pauses_url": reverse("admin:reconciliation_pauseswitch_changelist")
            if request.user.has_perm("reconciliation.view_pauseswitch") else "",
            "dashboard_url": reverse("admin:reconciliation_dashboard"),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra)

    @admin.display(description="item", ordering="pk")
    def item(self, obj):
        if obj.escalate_at and obj.escalate_at <= timezone.now():
            return format_html('#{} <strong class="overdue" title="escalated at {}">overdue</strong>', obj.pk,
                               _when(obj.escalate_at))
        return f"#{obj.pk}"

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj):
        if obj.intent_state == Intent.State.HELD or (obj.has_held_intent and obj.state not in
                                                     InboxEvent.RECOVERY_STATES):
            return format_html("{} <small>(intent held)</small>", obj.state)
        return obj.state

    @admin.display(description="reason", ordering="reason_code")
    def reason(self, obj):
        code = obj.reason_code
        if not code and obj.held_action == Intent.Action.NOTIFY_REQUESTER:
            code = selectors.ACKNOWLEDGMENT_HELD
        text = selectors.reason_text(code) or obj.reason_detail[:200]
        return format_html('<strong>{}</strong><br><small>{}</small>', code or "—", text)

    @admin.display(description="sender")
    def masked_sender(self, obj):
        return mask_address(obj.sender)

    @admin.display(description="subject")
    def short_subject(self, obj):
        subject = obj.subject or "(no subject)"
        return subject if len(subject) <= 80 else subject[:79] + "…"

    @admin.display(description="first seen", ordering="received_at")
    def first_seen(self, obj):
        return _when(obj.received_at)

    @admin.display(description="latest attempt", ordering="latest_attempt_at")
    def latest_attempt(self, obj):
        return _when(obj.latest_attempt_at)

    @admin.display(description="escalate at", ordering="escalate_at")
    def escalation(self, obj):
        return _when(obj.escalate_at)

    @admin.display(description="attempts", ordering="attempt_count")
    def attempts(self, obj):
        return obj.attempt_count

    @admin.display(description="destination")
    def destination_ref(self, obj):
        if not obj.destination_slug:
            return "—"
        ref = obj.result_ref or obj.external_ref or ""
        short = ref if len(ref) <= 22 else ref[:21] + "…"
        return format_html('{} v{} <small>{}</small><br><small title="{}">{}</small>', obj.destination_slug,
                           obj.intent_version, obj.intent_state or "", ref, short)

    @admin.display(description="owner", ordering="owner__username")
    def owner_name(self, obj):
        return obj.owner.get_username() if obj.owner_id else "—"

    @admin.display(description="age", ordering="-received_at")
    def age(self, obj):
        return timesince(obj.received_at, timezone.now())

    # --- changelist actions
    @admin.action(description="Assign selected items to me", permissions=["assign"])
    def assign_to_me(self, request, queryset):
        ids = list(queryset.values_list("pk", flat=True))
        for event_id in ids:
            services.do_assign_to_me(request.user, event_id)
        self.message_user(request, f"Assigned {len(ids)} item(s) to you.", messages.SUCCESS)

    @admin.action(description="Replay selected items (looks each one up first)", permissions=["replay"])
    def bulk_replay(self, request, queryset):
        ids = list(queryset.values_list("pk", flat=True))
        try:
            if request.POST.get("confirmed") == "yes":
                items = services.do_bulk_replay(request.user, ids)
            else:
                items = services.do_bulk_replay_preview(request.user, ids)
        except services.ActionRefused as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return None
        except InboxEvent.DoesNotExist:
            raise Http404("no such item") from None
        if request.POST.get("confirmed") == "yes":
            summary = "; ".join(f"#{i.event_id}: {i.outcome}" for i in items)
            self.message_user(request, f"Bulk replay done — {summary}", messages.SUCCESS)
            return None
        context = {
            **self.admin_site.each_context(request), "opts": self.opts, "title": "Confirm bulk replay",
            "items": items, "ids": ids, "cap": services.bulk_replay_cap(),
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            "actionable": [i for i in items if i.plan != "skip"],
        }
        return TemplateResponse(request, "admin/reconciliation/recoveryitem/bulk_replay_confirm.html", context)

    # --- the extra pages
    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("dashboard/", wrap(self.dashboard_view), name="reconciliation_dashboard"),
            path("<int:pk>/act/<slug:action>/", wrap(self.action_view), name="reconciliation_recoveryitem_act"),
            path("<int:pk>/body/", wrap(self.body_view), name="reconciliation_recoveryitem_body"),
            path("<int:pk>/attachment/<int:index>/", wrap(self.attachment_view),
                 name="reconciliation_recoveryitem_attachment"),
            *bulk_urls(self),
        ] + super().get_urls()

    def dashboard_view(self, request):
        return dashboard_view(self, request)


def _when(value) -> str:
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M") if value else "—"

"""The recovery queue (`RecoveryItemAdmin`): the list and its bulk actions; the item page (`item`) and the body
views (`body`) are mixed in.

Every write goes through `reconciliation.services` (permission, tenant, audit);
this module only renders and maps refusals to messages. URLs: the changelist,
`dashboard/`, and those of the mixins (`<pk>/change/`, `<pk>/act/<action>/`,
`<pk>/body/`, `<pk>/attachment/<index>/`).
"""

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.http import Http404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from intake.logging import mask_address
from intake.models import InboxEvent
from ticketing.models import Intent

from .. import selectors, services, times
from ..models import RecoveryItem
from .access import QueueViewOnlyMixin
from .body import BodyViewsMixin
from .bulk import bulk_urls
from .dashboard import dashboard_view
from .filters import MailboxFilter, OwnerFilter, ReasonFilter, StateFilter, TenantFilter
from .item import ItemPageMixin

LIST_DEFERRED = ("raw", "details", "auth_results", "route", "route_override")
# Query parameters that leave the list the whole queue: its order and page.
UNFILTERING_PARAMS = {"o", "p"}


class QueueChangeList(ChangeList):
    """Django's list, with the whole queue's count ("11 results (55 total)") from the head's grouped read
    (`selectors.queue_overview`, set on the request by changelist_view) instead of another count query."""

    def get_results(self, request):
        super().get_results(request)
        overview = getattr(request, "queue_overview", None)
        if overview is not None:
            self.full_result_count = overview["open"]
            self.show_full_result_count = True
            self.show_admin_actions = bool(self.full_result_count)


@admin.register(RecoveryItem)
class RecoveryItemAdmin(QueueViewOnlyMixin, ItemPageMixin, BodyViewsMixin, admin.ModelAdmin):
    # What fits a 1400 px screen beside the filters (reconciliation/queue.css; cards below 1100 px); first
    # seen, latest attempt, attempts and the destination reference are on the item page.
    list_display = (
        "item",
        "age",
        "state_reason",
        "short_subject",
        "masked_sender",
        "mailbox_slug",
        "owner_name",
        "escalation",
    )
    list_display_links = ("item",)
    list_filter = (ReasonFilter, StateFilter, MailboxFilter, OwnerFilter, TenantFilter)
    search_fields = ("subject",)  # the box; get_search_results decides what matches
    search_help_text = "Sender, subject, Message-ID, ticket number (MR-12) or the desk's ticket id"
    ordering = ("received_at", "pk")
    list_per_page = 50
    show_facets = admin.ShowFacets.NEVER
    show_full_result_count = False  # QueueChangeList takes the total from the head's read: no second count
    actions = ("assign_to_me", "bulk_replay")
    detail_template = "admin/reconciliation/recoveryitem/detail.html"

    # --- permissions: viewing (QueueViewOnlyMixin) and the actions' own
    def has_assign_permission(self, request):
        return request.user.has_perm(services.PERM_ASSIGN)

    def has_replay_permission(self, request):
        return request.user.has_perm(services.PERM_REPLAY) and request.user.has_perm(services.PERM_CONFIRM)

    # --- the list
    def get_queryset(self, request):
        queue = selectors.recovery_queue_for(request.user, model=RecoveryItem)
        # Not the stored message nor its parse details: a page of 50 would carry megabytes it never shows.
        return selectors.with_queue_list_columns(queue).select_related("mailbox", "owner").defer(*LIST_DEFERRED)

    def get_changelist(self, request, **kwargs):
        return QueueChangeList

    def get_paginator(self, request, queryset, per_page, orphans=0, allow_empty_first_page=True):
        paginator = super().get_paginator(request, queryset, per_page, orphans, allow_empty_first_page)
        overview = getattr(request, "queue_overview", None)
        if overview is not None and not set(request.GET) - UNFILTERING_PARAMS:
            paginator.count = overview["open"]  # the whole queue: the head has just counted it
        return paginator

    def get_ordering(self, request):
        return list(selectors.QUEUE_ORDER)  # overdue items first, then oldest first

    def get_search_results(self, request, queryset, search_term):
        return selectors.search_queue(queryset, search_term), False

    def changelist_view(self, request, extra_context=None):
        # One grouped read gives the head's counts and the reason filter's choices (ReasonFilter reads it here).
        request.queue_overview = overview = selectors.queue_overview(request.user)
        extra = {
            "summary": overview,
            "pauses": selectors.pause_status(request.user),
            "unreachable_tenants": selectors.tenants_without_escalation_recipients(request.user),
            "bulk_cap": services.bulk_replay_cap(),
            "pauses_url": reverse("admin:reconciliation_pauseswitch_changelist")
            if request.user.has_perm("reconciliation.view_pauseswitch")
            else "",
            "dashboard_url": reverse("admin:reconciliation_dashboard"),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra)

    @admin.display(description="item", ordering="pk")
    def item(self, obj):
        if _overdue(obj):
            return format_html(
                '#{} <span class="overdue-mark" title="overdue since {}">overdue</span>',
                obj.pk,
                times.absolute(obj.escalate_at),
            )
        return f"#{obj.pk}"

    @admin.display(description="age", ordering="-received_at")
    def age(self, obj):
        return format_html(
            '<span title="received {}">{}</span>', times.absolute(obj.received_at), times.relative(obj.received_at)
        )

    @admin.display(description="state and reason", ordering="state")
    def state_reason(self, obj):
        state = obj.state
        if obj.intent_state == Intent.State.HELD or (
            obj.has_held_intent and obj.state not in InboxEvent.RECOVERY_STATES
        ):
            state = f"{obj.state} (intent held)"
        code = obj.reason_code
        if not code and obj.held_action == Intent.Action.NOTIFY_REQUESTER:
            code = selectors.ACKNOWLEDGMENT_HELD
        sentence = selectors.reason_text(code) or obj.reason_detail[:300]
        short = selectors.reason_label(code) or ("Intent held" if obj.has_held_intent else "—")
        return format_html(
            '<span class="state state-{}">{}</span><span class="reason reason-{}" title="{}">{}</span>',
            obj.state,
            state,
            code or "none",
            sentence or short,
            short,
        )

    @admin.display(description="subject")
    def short_subject(self, obj):
        subject = obj.subject or "(no subject)"
        return format_html('<span class="cut" title="{}">{}</span>', subject, subject)

    @admin.display(description="sender")
    def masked_sender(self, obj):
        sender = mask_address(obj.sender) or "—"
        return format_html('<span class="cut" title="{}">{}</span>', sender, sender)

    @admin.display(description="mailbox", ordering="mailbox__slug")
    def mailbox_slug(self, obj):
        return format_html('<span class="cut" title="{}">{}</span>', obj.mailbox.slug, obj.mailbox.slug)

    @admin.display(description="owner", ordering="owner__username")
    def owner_name(self, obj):
        if not obj.owner_id:
            return "—"
        return format_html('<span class="cut" title="{}">{}</span>', obj.owner.get_username(), obj.owner.get_username())

    @admin.display(description="escalation", ordering="escalate_at")
    def escalation(self, obj):
        if not obj.escalate_at:
            return "—"
        if _overdue(obj):
            return format_html(
                '<span class="overdue" title="overdue: escalated {}">{}</span>',
                times.relative(obj.escalate_at),
                times.absolute(obj.escalate_at),
            )
        return format_html(
            '<span title="{}">{}</span>', times.relative(obj.escalate_at), times.absolute(obj.escalate_at)
        )

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
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Confirm bulk replay",
            "items": items,
            "ids": ids,
            "cap": services.bulk_replay_cap(),
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
            path(
                "<int:pk>/attachment/<int:index>/",
                wrap(self.attachment_view),
                name="reconciliation_recoveryitem_attachment",
            ),
            *bulk_urls(self),
        ] + super().get_urls()

    def dashboard_view(self, request):
        return dashboard_view(self, request)


def _overdue(obj) -> bool:
    return bool(obj.escalate_at and obj.escalate_at <= timezone.now())

"""The recovery queue (`RecoveryItemAdmin`): the list, its bulk actions, and each item's page and actions.

Every write goes through `reconciliation.services` (permission, tenant, audit);
this module only renders, validates forms and maps refusals to messages, 403s
and 404s. URLs: the changelist, `<pk>/change/` (the item page),
`<pk>/act/<action>/`, `<pk>/body/`, `<pk>/attachment/<index>/`.
"""
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince

from intake.logging import mask_address
from intake.models import InboxEvent
from intake.vocabulary import AuditKind
from ticketing import selectors as ticketing_selectors
from ticketing.models import Destination, Intent
from ticketing.replay import REPLAYABLE_EVENT_STATES

from .. import selectors, services
from ..models import RecoveryItem
from ..rendering import route_lines, timeline_rows
from .dashboard import dashboard_view
from .filters import MailboxFilter, OwnerFilter, ReasonFilter, StateFilter, TenantFilter
from .forms import AssignForm, CloseForm, ConfirmForm, EscalationForm, ReleaseForm, ReplayNewForm, RouteForm

# A replay of an item whose earlier attempt had an unknown outcome asks the destination first (ticketing.replay).
LINKED_MESSAGE = ("The destination already had this ticket (found by our reference): the item is linked to it "
                  "and complete; nothing was sent again.")
REJUDGED_MESSAGE = ("It was quarantined and never released: sent back to validation and the malware scan, "
                    "which decide again.")


@admin.register(RecoveryItem)
class RecoveryItemAdmin(admin.ModelAdmin):
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

    # --- the item page and its actions
    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("dashboard/", wrap(self.dashboard_view), name="reconciliation_dashboard"),
            path("<int:pk>/act/<slug:action>/", wrap(self.action_view), name="reconciliation_recoveryitem_act"),
            path("<int:pk>/body/", wrap(self.body_view), name="reconciliation_recoveryitem_body"),
            path("<int:pk>/attachment/<int:index>/", wrap(self.attachment_view),
                 name="reconciliation_recoveryitem_attachment"),
        ] + super().get_urls()

    def dashboard_view(self, request):
        return dashboard_view(self, request)

    def _event_or_404(self, request, object_id) -> InboxEvent:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if not str(object_id).isdigit():
            raise Http404("no such item")
        try:
            return services.visible_event(request.user, int(object_id))
        except InboxEvent.DoesNotExist:
            raise Http404("no such item") from None

    def change_view(self, request, object_id, form_url="", extra_context=None):
        event = self._event_or_404(request, object_id)
        return self._detail(request, event)

    def history_view(self, request, object_id, extra_context=None):
        event = self._event_or_404(request, object_id)
        return redirect(reverse("admin:reconciliation_recoveryitem_change", args=[event.pk]))

    def _detail(self, request, event, forms_override=None):
        user = request.user
        can = {
            "assign": user.has_perm(services.PERM_ASSIGN),
            "replay": user.has_perm(services.PERM_REPLAY),
            "replay_new": user.has_perm(services.PERM_REPLAY) and user.has_perm(services.PERM_REPLAY_NEW),
            "confirm": user.has_perm(services.PERM_CONFIRM),
            "close": services.may_close(user, event),  # a quarantined item: security only
            "release": user.has_perm(services.PERM_RELEASE),
            "body": user.has_perm(services.PERM_VIEW_BODY),
        }
        intents = list(selectors.event_intents(event.pk))
        current = ticketing_selectors.current_intent(event.pk)
        stuck_ack = ticketing_selectors.stuck_acknowledgment(event.pk) if event.state == InboxEvent.State.COMPLETED \
            else None
        in_queue = selectors.recovery_queue_for(user).filter(pk=event.pk).exists()
        replayable = event.state in REPLAYABLE_EVENT_STATES
        route = event.route_override or {}
        proposal = services.stored_proposal(event)
        if proposal and not route:  # the correction form starts from the AI proposal
            route = proposal["fields"]
        initial_route = {"destination": route.get("destination_id") or (current.destination_id if current else None),
                         "queue": route.get("queue", ""), "priority": route.get("priority", ""),
                         "request_type": route.get("request_type", "")}
        bound = forms_override or {}
        action_forms = {
            "assign": bound.get("assign") or AssignForm(event=event, initial={"assignee": event.owner_id}),
            "escalate": bound.get("escalate") or EscalationForm(initial={"escalate_at": event.escalate_at}),
            "correct": bound.get("correct") or RouteForm(event=event, initial=initial_route),
            "replay_new": bound.get("replay_new") or ReplayNewForm(event=event, initial=initial_route),
            "confirm": bound.get("confirm") or ConfirmForm(event=event),
            "close": bound.get("close") or CloseForm(),
            "release": bound.get("release") or ReleaseForm(),
        }
        pauses = selectors.pause_status(user)
        tenant_paused = any(t.pk == event.tenant_id for t in pauses["tenants"])
        destination_names = {d.pk: d.slug for d in ticketing_selectors.tenant_destinations(event.tenant_id)}
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts, "title": f"Item #{event.pk}", "event": event, "can": can,
            "reason_text": selectors.reason_text(event.reason_code), "age": timesince(event.received_at),
            "timeline": timeline_rows(selectors.event_timeline(event.pk), kind_labels=dict(AuditKind.choices),
                                      rule_names=selectors.rule_names(event.tenant_id),
                                      destination_names=destination_names),
            "override_lines": route_lines(event.route_override, selectors.rule_names(event.tenant_id),
                                          destination_names),
            "intents": intents, "current_intent": current,
            "mappings": list(selectors.event_mappings(event.pk)), "in_queue": in_queue,
            "replayable": replayable, "forms": action_forms, "stuck_ack": stuck_ack, "proposal": proposal,
            "destination_name": destination_names,
            "paused_here": pauses["global"] or event.mailbox.paused or tenant_paused,
            "tenant_paused": tenant_paused,
            "pauses": pauses,
            "queue_url": reverse("admin:reconciliation_recoveryitem_changelist"),
        }
        context["urls"] = {name: reverse("admin:reconciliation_recoveryitem_act", args=[event.pk, name])
                           for name in self.ACTIONS}
        context["body_url"] = reverse("admin:reconciliation_recoveryitem_body", args=[event.pk])
        status = 400 if forms_override else 200
        return TemplateResponse(request, self.detail_template, context, status=status)

    ACTIONS = ("assign_me", "assign", "escalate", "replay", "correct", "replay_new", "confirm", "close", "release",
               "ack_handled", "accept_proposal")

    def action_view(self, request, pk, action):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if action not in self.ACTIONS:
            raise Http404("no such action")
        event = self._event_or_404(request, pk)
        try:
            outcome = getattr(self, f"_act_{action}")(request, event)
        except services.ActionRefused as exc:
            messages.error(request, f"Not done: {exc}")
        except (InboxEvent.DoesNotExist, Destination.DoesNotExist):
            raise Http404("no such item") from None
        else:
            if isinstance(outcome, _InvalidForm):
                messages.error(request, "Please correct the errors below.")
                return self._detail(request, event, forms_override={outcome.name: outcome.form})
            messages.success(request, outcome)
        return redirect(reverse("admin:reconciliation_recoveryitem_change", args=[event.pk]))

    # Each returns the success message, or _InvalidForm; services raise PermissionDenied (403) or ActionRefused.
    def _act_assign_me(self, request, event):
        services.do_assign_to_me(request.user, event.pk)
        return "Assigned to you."

    def _act_assign(self, request, event):
        form = AssignForm(request.POST, event=event)
        if not form.is_valid():
            return _InvalidForm("assign", form)
        assignee = form.cleaned_data["assignee"]
        services.do_assign(request.user, event.pk, assignee)
        return f"Assigned to {assignee.get_username()}." if assignee else "Unassigned."

    def _act_escalate(self, request, event):
        form = EscalationForm(request.POST)
        if not form.is_valid():
            return _InvalidForm("escalate", form)
        services.do_set_escalation(request.user, event.pk, form.cleaned_data["escalate_at"])
        return "Escalation time saved." if form.cleaned_data["escalate_at"] else "Escalation time cleared."

    def _act_replay(self, request, event):
        outcome = services.do_replay(request.user, event.pk)
        if outcome == "rejudged":
            return REJUDGED_MESSAGE
        if outcome == "linked":
            return LINKED_MESSAGE
        return f"Replayed with its original idempotency key ({outcome})."

    def _act_correct(self, request, event):
        form = RouteForm(request.POST, event=event)
        if not form.is_valid():
            return _InvalidForm("correct", form)
        outcome = services.do_correct_and_replay(request.user, event.pk, **form.route())
        if outcome == "rejudged":
            return f"Route corrected to {form.cleaned_data['destination'].slug}. {REJUDGED_MESSAGE}"
        if outcome == "linked":
            return LINKED_MESSAGE
        return f"Route corrected to {form.cleaned_data['destination'].slug} and replayed with the original " \
               f"idempotency key ({outcome})."

    def _act_accept_proposal(self, request, event):
        outcome = services.do_accept_proposal(request.user, event.pk)
        return f"AI proposal accepted and replayed with the original idempotency key ({outcome})."

    def _act_replay_new(self, request, event):
        form = ReplayNewForm(request.POST, event=event)
        if not form.is_valid():
            return _InvalidForm("replay_new", form)
        intent = services.do_replay_as_new_action(request.user, event.pk, reason=form.cleaned_data["reason"],
                                                  **form.route())
        return f"Replayed as new action version {intent.action_version} with its own key; your approval is recorded."

    def _act_confirm(self, request, event):
        form = ConfirmForm(request.POST, event=event)
        if not form.is_valid():
            return _InvalidForm("confirm", form)
        data = form.cleaned_data
        services.do_confirm_existing_ticket(request.user, event.pk, ticket_id=data["ticket_id"],
                                            ticket_url=data["ticket_url"],
                                            destination_id=data["destination"].pk if data["destination"] else None)
        return f"Ticket {data['ticket_id']} confirmed: the item is complete, with no call to the destination."

    def _act_ack_handled(self, request, event):
        services.do_settle_acknowledgment(request.user, event.pk, note=request.POST.get("note", ""))
        return "Acknowledgment marked as handled: no email is sent."

    def _act_close(self, request, event):
        form = CloseForm(request.POST)
        if not form.is_valid():
            return _InvalidForm("close", form)
        services.do_close_not_a_request(request.user, event.pk, reason=form.cleaned_data["reason"])
        return "Closed as not-a-request."

    def _act_release(self, request, event):
        form = ReleaseForm(request.POST)
        if not form.is_valid():
            return _InvalidForm("release", form)
        services.do_release_quarantine(request.user, event.pk, note=form.cleaned_data["note"])
        return "Released from quarantine: back in the pipeline."

    def body_view(self, request, pk):
        event = self._event_or_404(request, pk)
        body = services.do_view_message_body(request.user, event.pk)  # PermissionDenied -> 403; audited
        context = {**self.admin_site.each_context(request), "opts": self.opts,
                   "title": f"Item #{event.pk}: message body", "event": event, "body": body,
                   "detail_url": reverse("admin:reconciliation_recoveryitem_change", args=[event.pk])}
        response = TemplateResponse(request, "admin/reconciliation/recoveryitem/body.html", context)
        response["Cache-Control"] = "no-store"
        return response

    def attachment_view(self, request, pk, index):
        event = self._event_or_404(request, pk)
        try:
            attachment, payload = services.do_download_attachment(request.user, event.pk, index)
        except services.ActionRefused:
            raise Http404("no such attachment") from None
        response = HttpResponse(payload, content_type="application/octet-stream")
        response["Content-Disposition"] = services.attachment_content_disposition(attachment.filename,
                                                                                  index=int(index))
        response["X-Content-Type-Options"] = "nosniff"
        response["Cache-Control"] = "no-store"
        return response


def _when(value) -> str:
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M") if value else "—"


class _InvalidForm:
    def __init__(self, name, form):
        self.name, self.form = name, form

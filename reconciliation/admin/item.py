"""The recovery item's page and its actions (`ItemPageMixin`, mixed into `RecoveryItemAdmin`).

URLs: `<pk>/change/` (the item page) and `<pk>/act/<action>/`. Every write goes
through `reconciliation.services`; this module validates forms and maps
refusals to messages, 403s and 404s.
"""
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.timesince import timesince

from intake.models import InboxEvent
from intake.vocabulary import AuditKind
from ticketing import selectors as ticketing_selectors
from ticketing.models import Destination
from ticketing.replay import REPLAYABLE_EVENT_STATES

from .. import selectors, services
from ..rendering import route_lines, timeline_rows
from .forms import AssignForm, CloseForm, ConfirmForm, EscalationForm, ReleaseForm, ReplayNewForm, RouteForm

# A replay of an item whose earlier attempt had an unknown outcome asks the destination first (ticketing.replay).
LINKED_MESSAGE = ("The destination already had this ticket (found by our reference): the item is linked to it "
                  "and complete; nothing was sent again.")
REJUDGED_MESSAGE = ("It was quarantined and never released: sent back to validation and the malware scan, "
                    "which decide again.")


class InvalidForm:
    """An action's bound form that did not validate: the item page is shown again with its errors."""

    def __init__(self, name, form):
        self.name, self.form = name, form


class ItemPageMixin:
    """The item page and its actions; expects a ModelAdmin with `has_view_permission` and `detail_template`."""

    def event_or_404(self, request, object_id) -> InboxEvent:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if not str(object_id).isdigit():
            raise Http404("no such item")
        try:
            return services.visible_event(request.user, int(object_id))
        except InboxEvent.DoesNotExist:
            raise Http404("no such item") from None

    def change_view(self, request, object_id, form_url="", extra_context=None):
        event = self.event_or_404(request, object_id)
        return self._detail(request, event)

    def history_view(self, request, object_id, extra_context=None):
        event = self.event_or_404(request, object_id)
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
        event = self.event_or_404(request, pk)
        try:
            outcome = getattr(self, f"_act_{action}")(request, event)
        except services.ActionRefused as exc:
            messages.error(request, f"Not done: {exc}")
        except (InboxEvent.DoesNotExist, Destination.DoesNotExist):
            raise Http404("no such item") from None
        else:
            if isinstance(outcome, InvalidForm):
                messages.error(request, "Please correct the errors below.")
                return self._detail(request, event, forms_override={outcome.name: outcome.form})
            messages.success(request, outcome)
        return redirect(reverse("admin:reconciliation_recoveryitem_change", args=[event.pk]))

    # Each returns the success message, or InvalidForm; services raise PermissionDenied (403) or ActionRefused.
    def _act_assign_me(self, request, event):
        services.do_assign_to_me(request.user, event.pk)
        return "Assigned to you."

    def _act_assign(self, request, event):
        form = AssignForm(request.POST, event=event)
        if not form.is_valid():
            return InvalidForm("assign", form)
        assignee = form.cleaned_data["assignee"]
        services.do_assign(request.user, event.pk, assignee)
        return f"Assigned to {assignee.get_username()}." if assignee else "Unassigned."

    def _act_escalate(self, request, event):
        form = EscalationForm(request.POST)
        if not form.is_valid():
            return InvalidForm("escalate", form)
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
            return InvalidForm("correct", form)
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
            return InvalidForm("replay_new", form)
        intent = services.do_replay_as_new_action(request.user, event.pk, reason=form.cleaned_data["reason"],
                                                  **form.route())
        return f"Replayed as new action version {intent.action_version} with its own key; your approval is recorded."

    def _act_confirm(self, request, event):
        form = ConfirmForm(request.POST, event=event)
        if not form.is_valid():
            return InvalidForm("confirm", form)
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
            return InvalidForm("close", form)
        services.do_close_not_a_request(request.user, event.pk, reason=form.cleaned_data["reason"])
        return "Closed as not-a-request."

    def _act_release(self, request, event):
        form = ReleaseForm(request.POST)
        if not form.is_valid():
            return InvalidForm("release", form)
        services.do_release_quarantine(request.user, event.pk, note=form.cleaned_data["note"])
        return "Released from quarantine: back in the pipeline."


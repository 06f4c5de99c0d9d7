"""The recovery item's page and its actions (`ItemPageMixin`, mixed into `RecoveryItemAdmin`).

URLs: `<pk>/change/` (the item page) and `<pk>/act/<action>/`. Every write goes
through `reconciliation.services`; this module validates forms and maps
refusals to messages, 403s and 404s. Each action's message names what it changed
(the route before and after, the previous owner or time); an invalid form names
the form and its fields, and the page shows the errors at the form (status 400).
"""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.timesince import timesince

from intake.models import InboxEvent
from intake.vocabulary import AuditKind
from ticketing import people, selectors as ticketing_selectors
from ticketing.models import Destination
from ticketing.replay import REPLAYABLE_EVENT_STATES

from .. import selectors, services, times
from ..rendering import corrected_by, effective_route, route_changes, route_lines, timeline_rows
from ..services.escalation import escalation_recipients
from .forms import (
    AssignForm,
    CloseForm,
    ConfirmForm,
    EscalationForm,
    ReleaseForm,
    ReplayNewForm,
    RequesterForm,
    RouteForm,
)

# A replay of an item whose earlier attempt had an unknown outcome asks the destination first (ticketing.replay).
LINKED_MESSAGE = (
    "The destination already had this ticket (found by our reference): the item is linked to it "
    "and complete; nothing was sent again."
)
REJUDGED_MESSAGE = (
    "It was quarantined and never released: sent back to validation and the malware scan, which decide again."
)
FORM_TITLES = {
    "assign": "Assign to a user",
    "escalate": "Escalation time",
    "correct": "Correct the route and replay",
    "replay_new": "Replay as a new action",
    "confirm": "Confirm an existing ticket",
    "close": "Close as not-a-request",
    "release": "Release from quarantine",
    "requester": "Requester",
}


class InvalidForm:
    """An action's bound form that did not validate: the item page is shown again with its errors."""

    def __init__(self, name, form):
        self.name, self.form = name, form


def form_errors_words(name: str, form) -> str:
    """ "Not done — Correct the route and replay: destination: Select a valid choice." """
    parts = []
    for field, errors in form.errors.items():
        words = " ".join(str(e) for e in errors)
        if field == "__all__":
            parts.append(words)
        else:
            label = form.fields[field].label if field in form.fields else None
            parts.append(f"{(label or field.replace('_', ' ')).lower()}: {words}")
    return f"Not done — {FORM_TITLES.get(name, name)}: {'; '.join(parts)} (see the form below)."


def route_now(
    event: InboxEvent,
    destination_names: dict | None = None,
    rule_names: dict | None = None,
    *,
    intent=False,
    audits=None,
) -> list:
    """The route the item's next attempt uses, field by field with its origin (`rendering.effective_route`).
    The page passes what it already read (`intent`: its current intent or None; `audits`: its timeline)."""
    if destination_names is None:
        destination_names = {d.pk: d.slug for d in ticketing_selectors.tenant_destinations(event.tenant_id)}
    if intent is False:
        intent = ticketing_selectors.current_intent(event.pk)
    default = ticketing_selectors.default_destination(event.tenant_id)
    return effective_route(
        event.route,
        event.route_override,
        intent_destination_id=intent.destination_id if intent else None,
        default_destination_id=default.pk if default else None,
        corrected_by_name=corrected_by(audits if audits is not None else selectors.event_timeline(event.pk)),
        rule_names=rule_names if rule_names is not None else selectors.rule_names(event.tenant_id),
        destination_names=destination_names,
    )


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
        stuck_ack = (
            ticketing_selectors.stuck_acknowledgment(event.pk) if event.state == InboxEvent.State.COMPLETED else None
        )
        in_queue = selectors.recovery_queue_for(user).filter(pk=event.pk).exists()
        replayable = event.state in REPLAYABLE_EVENT_STATES
        destination_names = {d.pk: d.slug for d in ticketing_selectors.tenant_destinations(event.tenant_id)}
        rule_names = selectors.rule_names(event.tenant_id)
        audits = list(selectors.event_timeline(event.pk))
        effective = route_now(event, destination_names, rule_names, intent=current, audits=audits)
        route = event.route_override or {}
        proposal = services.stored_proposal(event)
        if proposal and not route:  # the correction form starts from the AI proposal
            route = proposal["fields"]
        # No destination preselected: empty keeps the current one, so only a pick the operator makes counts as one.
        initial_route = {
            "destination": route.get("destination_id"),
            "queue": route.get("queue", ""),
            "priority": route.get("priority", ""),
            "request_type": route.get("request_type", ""),
        }
        keep = effective[0].value if effective[0].value != "—" else ""
        bound = forms_override or {}
        action_forms = {
            "assign": bound.get("assign") or AssignForm(event=event, initial={"assignee": event.owner_id}),
            "escalate": bound.get("escalate") or EscalationForm(initial={"escalate_at": event.escalate_at}),
            "correct": bound.get("correct") or RouteForm(event=event, initial=initial_route, current_destination=keep),
            "replay_new": bound.get("replay_new") or ReplayNewForm(event=event, initial=initial_route),
            "confirm": bound.get("confirm") or ConfirmForm(event=event),
            "close": bound.get("close") or CloseForm(),
            "release": bound.get("release") or ReleaseForm(),
            "requester": bound.get("requester") or RequesterForm(event=event),
        }
        pauses = selectors.pause_status(user)
        tenant_paused = any(t.pk == event.tenant_id for t in pauses["tenants"])
        now = timezone.now()
        overdue = bool(in_queue and event.escalate_at and event.escalate_at <= now)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Item #{event.pk}",
            "event": event,
            "can": can,
            "reason_text": selectors.reason_text(event.reason_code),
            "age": timesince(event.received_at),
            "timeline": timeline_rows(
                audits, kind_labels=dict(AuditKind.choices), rule_names=rule_names, destination_names=destination_names
            ),
            "override_lines": route_lines(event.route_override, rule_names, destination_names),
            "effective_route": effective,
            "intents": intents,
            "current_intent": current,
            "mappings": list(selectors.event_mappings(event.pk)),
            "in_queue": in_queue,
            "replayable": replayable,
            "forms": action_forms,
            "stuck_ack": stuck_ack,
            "proposal": proposal,
            "destination_name": destination_names,
            "paused_here": pauses["global"] or event.mailbox.paused or tenant_paused,
            "tenant_paused": tenant_paused,
            "pauses": pauses,
            "overdue": timesince(event.escalate_at, now, depth=1) if overdue else "",
            "nobody_escalated": in_queue and not escalation_recipients(event),
            "needs_requester": replayable and people.lacks_requester(event),
            "entered_requester": (event.details or {}).get(people.REQUESTER_ENTERED)
            if people.entered_requester(event)
            else None,
            "queue_url": reverse("admin:reconciliation_recoveryitem_changelist"),
        }
        context["urls"] = {
            name: reverse("admin:reconciliation_recoveryitem_act", args=[event.pk, name]) for name in self.ACTIONS
        }
        context["body_url"] = reverse("admin:reconciliation_recoveryitem_body", args=[event.pk])
        status = 400 if forms_override else 200
        return TemplateResponse(request, self.detail_template, context, status=status)

    ACTIONS = (
        "assign_me",
        "assign",
        "escalate",
        "replay",
        "correct",
        "replay_new",
        "confirm",
        "close",
        "release",
        "ack_handled",
        "accept_proposal",
        "enter_requester",
    )

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
                messages.error(request, form_errors_words(outcome.name, outcome.form))
                return self._detail(request, event, forms_override={outcome.name: outcome.form})
            messages.success(request, outcome)
        return redirect(reverse("admin:reconciliation_recoveryitem_change", args=[event.pk]))

    # --- what an action did, in words ----------------------------------------------------------

    def _sent(self, request, event_id: int, outcome: str) -> str:
        """What a replay's outcome means now: the ticket, if a worker already wrote it, or what happens next."""
        if outcome == "rejudged":
            return REJUDGED_MESSAGE
        if outcome == "linked":
            return LINKED_MESSAGE
        if outcome == "acknowledgment_reopened":
            return "The acknowledgment is sent again, with its original Message-ID."
        mappings = list(selectors.event_mappings(event_id))
        if mappings and services.visible_event(request.user, event_id).state == InboxEvent.State.COMPLETED:
            m = mappings[-1]
            number = f"MR-{m.ticket_number}" if getattr(m, "ticket_number", None) else f"#{m.ticket_id}"
            return f"Replayed: ticket created ({m.destination.slug} {number})."
        if outcome == "rerouted":
            return "Replayed: back to routing (it had no intent yet); a worker makes the ticket next."
        return "Replayed with its original idempotency key: a worker sends it next."

    def _corrected(self, request, event, outcome: str, before: list) -> str:
        """ "Route corrected: priority normal → high; destination kept (desk). Replayed: …" """
        if outcome == "linked":
            return (
                f"{LINKED_MESSAGE} The corrected route was not stored: that ticket keeps its first fields "
                "(correct them in the desk)."
            )
        after = route_now(services.visible_event(request.user, event.pk))
        return f"Route corrected: {route_changes(before, after)}. {self._sent(request, event.pk, outcome)}"

    # Each returns the success message, or InvalidForm; services raise PermissionDenied (403) or ActionRefused.
    def _act_assign_me(self, request, event):
        services.do_assign_to_me(request.user, event.pk)
        return f"Assigned to you, {request.user.get_username()} (was: {self._owner(event)})."

    @staticmethod
    def _owner(event) -> str:
        return event.owner.get_username() if event.owner_id else "nobody"

    def _act_assign(self, request, event):
        form = AssignForm(request.POST, event=event)
        if not form.is_valid():
            return InvalidForm("assign", form)
        assignee = form.cleaned_data["assignee"]
        services.do_assign(request.user, event.pk, assignee)
        if assignee is None:
            return f"Unassigned (was: {self._owner(event)})."
        return f"Assigned to {assignee.get_username()} (was: {self._owner(event)})."

    def _act_escalate(self, request, event):
        form = EscalationForm(request.POST)
        if not form.is_valid():
            return InvalidForm("escalate", form)
        new = form.cleaned_data["escalate_at"]
        services.do_set_escalation(request.user, event.pk, new)
        was = times.absolute(event.escalate_at) if event.escalate_at else "not set"
        if new is None:
            return f"Escalation cleared (was: {was})."
        return f"Escalation set to {times.when(new)}. Was: {was}."

    def _act_replay(self, request, event):
        outcome = services.do_replay(request.user, event.pk)
        return self._sent(request, event.pk, outcome)

    def _act_correct(self, request, event):
        form = RouteForm(request.POST, event=event)
        if not form.is_valid():
            return InvalidForm("correct", form)
        before = route_now(event)
        outcome = services.do_correct_and_replay(request.user, event.pk, **form.route())
        return self._corrected(request, event, outcome, before)

    def _act_accept_proposal(self, request, event):
        before = route_now(event)
        outcome = services.do_accept_proposal(request.user, event.pk)
        return f"AI proposal accepted. {self._corrected(request, event, outcome, before)}"

    def _act_replay_new(self, request, event):
        form = ReplayNewForm(request.POST, event=event)
        if not form.is_valid():
            return InvalidForm("replay_new", form)
        before = route_now(event)
        intent = services.do_replay_as_new_action(
            request.user, event.pk, reason=form.cleaned_data["reason"], **form.route()
        )
        after = route_now(services.visible_event(request.user, event.pk))
        return (
            f"Replayed as new action version {intent.action_version} with its own key "
            f"({route_changes(before, after)}); your approval is recorded."
        )

    def _act_enter_requester(self, request, event):
        form = RequesterForm(request.POST, event=event)
        if not form.is_valid():
            return InvalidForm("requester", form)
        was = people.entered_requester(event) or "none"
        address = services.do_enter_requester(request.user, event.pk, address=form.cleaned_data["address"])
        said = f"Requester set to {address} (was: {was})."
        if request.POST.get("then") != "replay":
            return f"{said} Replay it to make the ticket for them."
        messages.success(request, said)  # kept even if the replay is refused
        return self._sent(request, event.pk, services.do_replay(request.user, event.pk))

    def _act_confirm(self, request, event):
        form = ConfirmForm(request.POST, event=event)
        if not form.is_valid():
            return InvalidForm("confirm", form)
        data = form.cleaned_data
        services.do_confirm_existing_ticket(
            request.user,
            event.pk,
            ticket_id=data["ticket_id"],
            ticket_url=data["ticket_url"],
            destination_id=data["destination"].pk if data["destination"] else None,
        )
        return f"Ticket {data['ticket_id']} confirmed: the item is complete, with no call to the destination."

    def _act_ack_handled(self, request, event):
        services.do_settle_acknowledgment(request.user, event.pk, note=request.POST.get("note", ""))
        return "Acknowledgment marked as handled: no email is sent."

    def _act_close(self, request, event):
        form = CloseForm(request.POST)
        if not form.is_valid():
            return InvalidForm("close", form)
        services.do_close_not_a_request(request.user, event.pk, reason=form.cleaned_data["reason"])
        return f"Closed as not-a-request (was: {event.state}); the reason is kept and shown."

    def _act_release(self, request, event):
        form = ReleaseForm(request.POST)
        if not form.is_valid():
            return InvalidForm("release", form)
        services.do_release_quarantine(request.user, event.pk, note=form.cleaned_data["note"])
        return "Released from quarantine: back in the pipeline."

"""The forms of an item's actions: assign, escalate, correct the route, new action, confirm, close, release,
the requester of mail without a usable sender.

Destination choices are the item's tenant's destinations only. An empty destination keeps the current one
(the service does the same when none is given).
"""

from django import forms

from ticketing.models import RoutingPolicy
from ticketing.selectors import tenant_destinations

from ..services import ASSIGNEE_RULE, ActionRefused, assignable_users, requester_address

PRIORITIES = [("", "—"), ("low", "low"), ("normal", "normal"), ("high", "high"), ("urgent", "urgent")]
REQUEST_TYPES = [
    ("", "—"),
    ("question", "question"),
    ("incident", "incident"),
    ("problem", "problem"),
    ("task", "task"),
]


class AssignForm(forms.Form):
    """The choices are the item's assignable users (`services.assignable_users`); any other id, existing or
    not, gets one and the same error."""

    assignee = forms.ModelChoiceField(
        queryset=None,
        required=False,
        empty_label="(unassigned)",
        error_messages={"invalid_choice": f"Not an assignable user: {ASSIGNEE_RULE}."},
    )

    def __init__(self, *args, event=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["assignee"].queryset = assignable_users(event.tenant_id)


class EscalationForm(forms.Form):
    # Minute precision: a value with seconds would make the browser's step base fall between minutes, so that
    # it refuses every whole-minute time a person picks.
    escalate_at = forms.DateTimeField(
        required=False,
        help_text="UTC; empty clears it",
        widget=forms.DateTimeInput(format="%Y-%m-%dT%H:%M", attrs={"type": "datetime-local", "step": 60}),
    )


class RouteForm(forms.Form):
    destination = forms.ModelChoiceField(
        queryset=None,
        required=False,
        empty_label="(keep the current one)",
        help_text="empty: the destination stays as it is",
    )
    queue = forms.CharField(required=False, max_length=100, help_text="queue or group (a Zendesk group id)")
    priority = forms.ChoiceField(choices=PRIORITIES, required=False)
    request_type = forms.ChoiceField(choices=REQUEST_TYPES, required=False)

    def __init__(self, *args, event=None, current_destination: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["destination"].queryset = tenant_destinations(event.tenant_id)
        if current_destination:
            self.fields["destination"].empty_label = f"(keep: {current_destination})"
        policy = RoutingPolicy.objects.filter(tenant_id=event.tenant_id).first()
        known = {value for value, _ in REQUEST_TYPES}
        extra = [(v, v) for v in (policy.request_types if policy else []) if v not in known]
        self.fields["request_type"].choices = REQUEST_TYPES + extra  # the tenant's vocabulary too

    def route(self) -> dict:
        data = self.cleaned_data
        destination = data.get("destination")
        return {
            "destination_id": destination.pk if destination else None,
            "queue": data.get("queue") or "",
            "priority": data.get("priority") or "",
            "request_type": data.get("request_type") or "",
        }


class ReplayNewForm(RouteForm):
    reason = forms.CharField(
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="why the original key must not be reused (recorded with your approval)",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["destination"].help_text = "empty: where the previous version went"


class ConfirmForm(forms.Form):
    ticket_id = forms.CharField(
        max_length=200,
        help_text="the desk's ticket id; for the built-in store, the "
        "ticket's number as the ticket list shows it (MR-12)",
    )
    ticket_url = forms.URLField(required=False, max_length=500, assume_scheme="https")
    destination = forms.ModelChoiceField(
        queryset=None, required=False, help_text="where the ticket is (default: where the intent went)"
    )

    def __init__(self, *args, event=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["destination"].queryset = tenant_destinations(event.tenant_id)


class CloseForm(forms.Form):
    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))


class ReleaseForm(forms.Form):
    note = forms.CharField(max_length=500, required=False)


class RequesterForm(forms.Form):
    """Checked as the service checks it (`requester_address`: syntax, one address, not one of the tenant's
    own), so the reason shows at the field; the service checks again."""

    address = forms.CharField(
        max_length=320,
        label="Requester's email address",
        widget=forms.TextInput(attrs={"autocomplete": "off", "inputmode": "email", "placeholder": "name@example.com"}),
        help_text="whom the ticket is for: the message names no usable sender",
    )

    def __init__(self, *args, event=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.tenant_id = event.tenant_id

    def clean_address(self):
        try:
            return requester_address(self.tenant_id, self.cleaned_data["address"])
        except ActionRefused as exc:
            raise forms.ValidationError(str(exc)) from None

"""The routing console: each tenant's `RoutingPolicy` (vocabulary, defaults, AI switch) and its
`RoutingRule` list (readable conditions, order, enable/disable, hits, dry run).

Registered from `ticketing.admin`. Tenant isolation is `TenantScopedAdminMixin`'s; the dry run
(`ticketing.dry_run.run_dry_run`) writes nothing but, for a rule that reads bodies, its audit rows (and
needs the body permission).
"""

import json

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from intake.admin_mixins import TenantScopedAdminMixin
from intake.logging import mask_address

from . import dry_run as dry_runs
from .classification.conditions import KEYS, canonical_conditions, validate_conditions
from .classification.rules import action_errors, clean_tags
from .models import PRIORITIES, RoutingPolicy, RoutingRule

PRIORITY_CHOICES = [("", "—")] + [(p, p) for p in PRIORITIES]


# --- conditions, readably ------------------------------------------------------------------------


def _addresses(value) -> str:
    values = value if isinstance(value, list) else [value]
    shown = [f"domain {v[1:]}" if isinstance(v, str) and v.startswith("@") else str(v) for v in values]
    return shown[0] if len(shown) == 1 else "one of " + ", ".join(shown)


def _condition(key: str, value) -> str:
    if key in ("recipient", "sender"):
        return f"{key} is {_addresses(value)}"
    if key in ("subject_regex", "body_regex"):
        return f"{key.split('_')[0]} matches /{value}/"
    if key == "keywords" and isinstance(value, list):
        return "subject or body contains " + (
            f"“{value[0]}”" if len(value) == 1 else "any of " + ", ".join(f"“{v}”" for v in value)
        )
    if key == "has_attachment_type":
        return f"has an attachment of type {value}"
    if key == "auth" and isinstance(value, dict):
        return " AND ".join(f"{method.upper()} is {result}" for method, result in value.items())
    if key == "is_reply" and isinstance(value, bool):
        return "is a reply" if value else "is not a reply"
    if key == "header" and isinstance(value, list):
        return " AND ".join(_header_test(t) for t in value)
    if key == "spam_score" and isinstance(value, dict):
        return f"spam score {_OP_WORDS.get(value.get('op'), value.get('op'))} {value.get('value')}"
    if key == "attachment_verdict":
        return "attachments are " + (" or ".join(value) if isinstance(value, list) else str(value))
    return f"{key} = {json.dumps(value)}"


_OP_WORDS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "equals": "is", "regex": "matches"}


def _header_test(test) -> str:
    if not isinstance(test, dict):
        return json.dumps(test)
    name, op = test.get("name"), test.get("op")
    if op == "exists":
        return f"header {name} {'exists' if test.get('value', True) else 'is absent'}"
    value = f"/{test.get('value')}/" if op == "regex" else json.dumps(test.get("value"), ensure_ascii=False)
    return f"header {name} {_OP_WORDS.get(op, op)} {value}"


def describe_conditions(conditions) -> str:
    """{"recipient": "support@acme.test", "subject_regex": "^urgent"} ->
    'recipient is support@acme.test AND subject matches /^urgent/' (keys: ticketing.classification.conditions).
    """
    if not conditions:
        return "every message"
    conditions = canonical_conditions(conditions)
    if not isinstance(conditions, dict):
        return json.dumps(conditions)
    order = {key: i for i, key in enumerate(KEYS)}  # jsonb keeps no key order: show them in a fixed one
    keys = sorted(conditions, key=lambda k: (order.get(k, len(order)), str(k)))
    return " AND ".join(_condition(str(key), conditions[key]) for key in keys)


# --- forms ---------------------------------------------------------------------------------------


class SlugListField(forms.CharField):
    """A list of slugs typed as 'billing, it-support'."""

    def prepare_value(self, value):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return value
        if isinstance(value, (list, tuple)):
            return ", ".join(str(v) for v in value)
        return value

    def to_python(self, value):
        if isinstance(value, (list, tuple)):
            items = [str(v).strip() for v in value]
        else:
            items = [v.strip() for v in (super().to_python(value) or "").replace("\n", ",").split(",")]
        result = []
        for item in items:
            if item and item not in result:
                result.append(item)
        return result

    def validate(self, value):
        super().validate(value)
        bad = [v for v in value if not _is_slug(v)]
        if bad:
            raise forms.ValidationError(f"Not a slug (letters, digits, - and _ only): {', '.join(bad)}")


def _is_slug(value: str) -> bool:
    from django.core.validators import validate_slug

    try:
        validate_slug(value)
    except forms.ValidationError:
        return False
    return True


class RoutingPolicyForm(forms.ModelForm):
    queues = SlugListField(required=False, help_text="comma-separated slugs")
    request_types = SlugListField(required=False, help_text="comma-separated slugs")
    sensitive_request_types = SlugListField(required=False, help_text="a subset of the request types")
    default_priority = forms.ChoiceField(choices=[(p, p) for p in PRIORITIES], initial="normal")
    ai_min_confidence = forms.FloatField(min_value=0, max_value=1, initial=0.7, label="AI minimum confidence")

    class Meta:
        model = RoutingPolicy
        fields = (
            "queues",
            "request_types",
            "sensitive_request_types",
            "default_queue",
            "default_priority",
            "default_request_type",
            "ai_enabled",
            "ai_min_confidence",
            "one_ticket_per_message",
        )

    def clean(self):
        data = super().clean()
        queues, types = data.get("queues") or [], data.get("request_types") or []
        if data.get("default_queue") and data["default_queue"] not in queues:
            self.add_error("default_queue", f"'{data['default_queue']}' is not one of the queues.")
        if data.get("default_request_type") and data["default_request_type"] not in types:
            self.add_error("default_request_type", f"'{data['default_request_type']}' is not one of the request types.")
        unknown = [t for t in data.get("sensitive_request_types") or [] if t not in types]
        if unknown:
            self.add_error("sensitive_request_types", f"Not request types: {', '.join(unknown)}.")
        return data


class RoutingRuleForm(forms.ModelForm):
    priority = forms.ChoiceField(choices=PRIORITY_CHOICES, required=False)
    tags = forms.CharField(required=False, help_text="comma-separated: the ticket gets them (tag, mark_spam)")
    action = forms.ChoiceField(choices=RoutingRule.Action.choices, required=False, initial=RoutingRule.Action.ROUTE)

    class Meta:
        model = RoutingRule
        fields = (
            "tenant",
            "mailbox",
            "name",
            "position",
            "enabled",
            "conditions",
            "action",
            "destination",
            "queue",
            "priority",
            "request_type",
            "assignee",
            "sensitive",
            "tags",
            "suppress_reason",
            "stop_processing",
        )
        help_texts = {
            "conditions": 'JSON, every key must hold, for example {"recipient": "support@acme.test", '
            '"subject_regex": "^urgent"}. Keys: recipient, sender (address, @domain or a list), '
            "subject_regex, body_regex, keywords (list), has_attachment_type, "
            'auth ({"dmarc": "pass"}), is_reply (true/false), header (a test '
            '{"name": "X-Spam-Score", "op": "gt", "value": 8}, or a list of them; ops exists, equals, '
            "regex, gt (>), ge (>=), lt (<), le (<=)), spam_score "
            '({"op": "gt", "value": 8}), spam_flagged, attachment_verdict (clean, infected, '
            "unscanned, none). {} matches every message.",
        }

    def clean_conditions(self):
        conditions = self.cleaned_data.get("conditions")
        if conditions in (None, ""):
            conditions = {}
        if not isinstance(conditions, dict):
            raise forms.ValidationError("Conditions must be a JSON object ({...}).")
        conditions = canonical_conditions(conditions)
        errors = validate_conditions(conditions)
        if errors:
            raise forms.ValidationError(errors)
        return conditions

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk and not self.is_bound:
            self.initial["tags"] = ", ".join(self.instance.tags or [])

    def clean_action(self):
        return self.cleaned_data.get("action") or RoutingRule.Action.ROUTE  # a form without the field: route

    def clean_tags(self):
        return clean_tags(self.cleaned_data.get("tags") or "")

    def clean(self):
        data = super().clean()
        # Filter actions (ticketing.classification.rules): tag needs tags, suppress a reason, and so on.
        fields = {name: data.get(name) for name in ("destination", "queue", "priority", "request_type", "assignee")}
        for name, message in action_errors(
            action=data.get("action"),
            tags=data.get("tags"),
            suppress_reason=data.get("suppress_reason", ""),
            fields=fields,
        ).items():
            self.add_error(name, message)
        tenant = data.get("tenant") or (self.instance.tenant if self.instance.tenant_id else None)
        if tenant is None:
            return data
        for name in ("mailbox", "destination"):
            related = data.get(name)
            if related is not None and related.tenant_id != tenant.pk:
                self.add_error(name, f"This {name} belongs to another tenant.")
        policy = RoutingPolicy.objects.filter(tenant=tenant).first()
        queues = policy.queues if policy else []
        types = policy.request_types if policy else []
        if data.get("queue") and data["queue"] not in queues:
            self.add_error(
                "queue",
                f"'{data['queue']}' is not a queue of {tenant.slug}'s routing policy "
                f"({', '.join(queues) or 'none defined'}).",
            )
        if data.get("request_type") and data["request_type"] not in types:
            self.add_error(
                "request_type",
                f"'{data['request_type']}' is not a request type of {tenant.slug}'s "
                f"routing policy ({', '.join(types) or 'none defined'}).",
            )
        if data.get("priority") and data["priority"] not in PRIORITIES:
            self.add_error("priority", f"Priority must be one of {', '.join(PRIORITIES)}.")
        return data


# --- admins --------------------------------------------------------------------------------------


@admin.register(RoutingPolicy)
class RoutingPolicyAdmin(TenantScopedAdminMixin, admin.ModelAdmin):
    form = RoutingPolicyForm
    list_display = (
        "tenant",
        "queue_list",
        "request_type_list",
        "default_queue",
        "default_priority",
        "default_request_type",
        "ai_enabled",
        "ai_min_confidence",
        "one_ticket_per_message",
    )
    list_filter = ("ai_enabled", "one_ticket_per_message")
    search_fields = ("tenant__slug", "tenant__name")
    readonly_fields = ("tenant",)

    # One per tenant, made with it (ticketing.apps): never added or deleted here.
    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="queues")
    def queue_list(self, obj):
        return ", ".join(obj.queues or []) or "—"

    @admin.display(description="request types")
    def request_type_list(self, obj):
        return ", ".join(obj.request_types or []) or "—"


@admin.register(RoutingRule)
class RoutingRuleAdmin(TenantScopedAdminMixin, admin.ModelAdmin):
    form = RoutingRuleForm
    list_display = (
        "position",
        "name",
        "tenant",
        "mailbox",
        "enabled",
        "readable_conditions",
        "sets",
        "stop_processing",
        "hits",
        "last_hit_at",
        "dry_run_link",
    )
    list_display_links = ("name",)
    list_editable = ("position",)
    list_filter = (
        "enabled",
        ("tenant", admin.RelatedOnlyFieldListFilter),
        ("mailbox", admin.RelatedOnlyFieldListFilter),
    )
    search_fields = ("name", "queue", "request_type", "assignee")
    ordering = ("tenant", "position", "pk")
    readonly_fields = ("readable_conditions", "hits", "last_hit_at", "dry_run_link")
    actions = ("enable", "disable", "move_up", "move_down", "dry_run")
    fieldsets = (
        (None, {"fields": ("tenant", "mailbox", "name", "position", "enabled", "stop_processing")}),
        ("When", {"fields": ("conditions", "readable_conditions")}),
        ("Then", {"fields": ("action", "tags", "suppress_reason")}),
        ("Then set", {"fields": ("destination", "queue", "priority", "request_type", "assignee", "sensitive")}),
        ("Use", {"fields": ("hits", "last_hit_at", "dry_run_link")}),
    )

    @admin.display(description="conditions")
    def readable_conditions(self, obj):
        return describe_conditions(obj.conditions) if obj and obj.pk else "—"

    @admin.display(description="sets")
    def sets(self, obj):
        parts = [
            f"{name}={getattr(obj, name)}"
            for name in ("queue", "priority", "request_type", "assignee")
            if getattr(obj, name)
        ]
        if obj.destination_id:
            parts.insert(0, f"destination={obj.destination.slug}")
        if obj.sensitive:
            parts.append("sensitive")
        if obj.action and obj.action != RoutingRule.Action.ROUTE:
            parts.insert(0, obj.action + (f" ({obj.suppress_reason})" if obj.suppress_reason else ""))
        if obj.tags:
            parts.append("tags=" + ", ".join(obj.tags))
        return ", ".join(parts) or "—"

    @admin.display(description="dry run")
    def dry_run_link(self, obj):
        if not obj or not obj.pk:
            return "—"
        url = reverse("admin:ticketing_routingrule_dry_run", args=[obj.pk])
        return format_html(
            '<a class="dry-run-link" href="{}?days={}">test against the last {} days</a>',
            url,
            dry_runs.DEFAULT_DAYS,
            dry_runs.DEFAULT_DAYS,
        )

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("tenant", "mailbox", "destination")

    # --- actions
    @admin.action(description="Enable selected rules", permissions=["change"])
    def enable(self, request, queryset):
        count = queryset.update(enabled=True)
        self.message_user(request, f"Enabled {count} rule(s).", messages.SUCCESS)

    @admin.action(description="Disable selected rules", permissions=["change"])
    def disable(self, request, queryset):
        count = queryset.update(enabled=False)
        self.message_user(request, f"Disabled {count} rule(s).", messages.SUCCESS)

    def _move(self, request, queryset, upward: bool):
        """Swap each selected rule with its neighbour in its tenant's order, then renumber 10, 20, ..."""
        selected = set(queryset.values_list("pk", flat=True))
        moved = 0
        for tenant_id in set(queryset.values_list("tenant_id", flat=True)):
            order = list(RoutingRule.objects.filter(tenant_id=tenant_id).order_by("position", "pk"))
            indexes = range(len(order)) if upward else range(len(order) - 1, -1, -1)
            for i in indexes:
                j = i - 1 if upward else i + 1
                if order[i].pk in selected and 0 <= j < len(order) and order[j].pk not in selected:
                    order[i], order[j] = order[j], order[i]
                    moved += 1
            for number, rule in enumerate(order, start=1):
                if rule.position != number * 10:
                    RoutingRule.objects.filter(pk=rule.pk).update(position=number * 10)
        self.message_user(request, f"Moved {moved} rule(s) {'up' if upward else 'down'}.", messages.SUCCESS)

    @admin.action(description="Move selected rules up", permissions=["change"])
    def move_up(self, request, queryset):
        self._move(request, queryset, upward=True)

    @admin.action(description="Move selected rules down", permissions=["change"])
    def move_down(self, request, queryset):
        self._move(request, queryset, upward=False)

    @admin.action(description="Dry run: test the selected rule against the last 7 days (writes nothing)")
    def dry_run(self, request, queryset):
        rules = list(queryset[:2])
        if len(rules) != 1:
            self.message_user(request, "Select exactly one rule for a dry run.", messages.WARNING)
            return None
        return redirect(reverse("admin:ticketing_routingrule_dry_run", args=[rules[0].pk]))

    # --- the dry run page
    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("<int:pk>/dry-run/", wrap(self.dry_run_view), name="ticketing_routingrule_dry_run"),
        ] + super().get_urls()

    def dry_run_view(self, request, pk):
        if not self.has_view_permission(request):
            raise PermissionDenied
        rule = self.get_queryset(request).filter(pk=pk).first()
        if rule is None:
            raise Http404(f"no routing rule {pk}")
        requested = request.GET.get("days", dry_runs.DEFAULT_DAYS)
        days = dry_runs.clamp_days(requested)
        if str(requested) != str(days):
            self.message_user(
                request, f"Days must be a whole number from 1 to {dry_runs.MAX_DAYS}: using {days}.", messages.WARNING
            )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Dry run of “{rule.name}”",
            "rule": rule,
            "conditions": describe_conditions(rule.conditions),
            "max_days": dry_runs.MAX_DAYS,
            "max_events": dry_runs.MAX_EVENTS,
            "days": days,
            "rule_url": reverse("admin:ticketing_routingrule_change", args=[rule.pk]),
        }
        try:
            result = dry_runs.run_dry_run(user=request.user, rule=rule, days=days)
        except PermissionDenied as exc:  # a body condition without the body permission: say why, run nothing
            context.update(result=None, denied=str(exc))
            return TemplateResponse(request, "admin/ticketing/routingrule/dry_run.html", context, status=403)
        for match in result.matches:
            match.sender = mask_address(match.event.sender)
            match.event_url = reverse("admin:intake_inboxevent_change", args=[match.event.pk])
        context["result"] = result
        return TemplateResponse(request, "admin/ticketing/routingrule/dry_run.html", context)

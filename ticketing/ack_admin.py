"""The admin of acknowledgment templates and business hours (registered from `ticketing.admin`).

Tenant isolation is `TenantScopedAdminMixin`'s in lists, choices and URLs; saving goes through
`ticketing.ack_services`, which refuses another tenant's rows and mailboxes whatever the form sent. The
change page of a template shows a preview (sample values, the "answer by" of a request received now) and
whether its mailboxes acknowledge at all (the mailbox setting `acknowledge`, on the mailbox's page).
"""

import json

from django import forms
from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from intake.admin_mixins import TenantScopedAdminMixin
from intake.models import Mailbox

from . import ack_policy, ack_services, ack_templates, business_hours
from .ack_models import AcknowledgmentTemplate, BusinessHours

PLACEHOLDER_HELP = (
    "Placeholders: "
    + ", ".join("{{ " + name + " }}" for name in ack_templates.PLACEHOLDERS)
    + f". Filters: {', '.join(ack_templates.ALLOWED_FILTERS)}; tags: if, comment. "
    "No loops, no attribute access."
)


def _switch(mailbox: Mailbox) -> str:
    policy = ack_policy.ack_policy(mailbox)
    return "off" if policy == ack_policy.ACK_NEVER else f"on ({policy} senders)"


@admin.register(AcknowledgmentTemplate)
class AcknowledgmentTemplateAdmin(TenantScopedAdminMixin, admin.ModelAdmin):
    list_display = ("__str__", "tenant", "mailbox", "language_shown", "subject", "updated_by", "updated_at")
    list_filter = ("language", ("tenant", admin.RelatedOnlyFieldListFilter))
    search_fields = ("subject", "mailbox__address")
    fields = (
        "tenant",
        "mailbox",
        "language",
        "subject",
        "body",
        "acknowledgments",
        "preview",
        "updated_by",
        "updated_at",
    )
    readonly_fields = ("acknowledgments", "preview", "updated_by", "updated_at")

    class Media:
        css = {"all": ("ticketing/ack_admin.css",)}

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        if "body" in form.base_fields:
            form.base_fields["body"].help_text = PLACEHOLDER_HELP
        if "subject" in form.base_fields:
            form.base_fields["subject"].widget.attrs["class"] = "vTextField ack-subject"
        return form

    @admin.display(description="language", ordering="language")
    def language_shown(self, template):
        return template.language or "any (fallback)"

    @admin.display(description="acknowledgments")
    def acknowledgments(self, template):
        if template.pk is None:
            return "-"
        mailboxes = [template.mailbox] if template.mailbox_id else list(template.tenant.mailboxes.all()[:50])
        rows = (
            (mailbox.address, "ack-off" if _switch(mailbox) == "off" else "ack-on", _switch(mailbox))
            for mailbox in mailboxes
        )
        return format_html_join(", ", '{}: <span class="{}">{}</span>', rows) or "no mailboxes"

    @admin.display(description="preview")
    def preview(self, template):
        if template.pk is None:
            return "Saved templates are previewed here."
        shown = ack_services.preview(template=template)
        if shown["problem"]:
            return format_html('<span class="ack-preview-problem">Nothing would be sent: {}</span>', shown["problem"])
        answer = shown["answer_by"] or "no response time set (business hours)"
        return format_html(
            '<pre class="ack-preview"><span class="ack-preview-subject">Subject: {}</span>\n\n{}</pre>'
            "<p>For a request received now: answer by {}.</p>",
            shown["subject"],
            shown["body"],
            answer,
        )

    def save_model(self, request, obj, form, change):
        ack_services.save_template(actor=request.user, template=obj)


class WeeklyHoursField(forms.CharField):
    """The week typed as people write it, one day a line: "mon 09:00-17:00", "tue 09:00-12:00, 13:00-17:00"
    (a day not written is closed); stored as {"mon": [["09:00", "17:00"]], ...}."""

    widget = forms.Textarea(attrs={"rows": 7, "cols": 40})

    def prepare_value(self, value):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return value
        if not isinstance(value, dict):
            return value
        return "\n".join(
            f"{day} " + ", ".join(f"{start}-{end}" for start, end in value[day])
            for day in business_hours.DAYS
            if value.get(day)
        )

    def to_python(self, value):
        weekly = {}
        for number, line in enumerate((super().to_python(value) or "").splitlines(), start=1):
            day, _, spans = line.strip().partition(" ")
            if not day:
                continue
            pairs = [span.strip().split("-") for span in spans.split(",") if span.strip()]
            if day.lower() not in business_hours.DAYS or not pairs or any(len(pair) != 2 for pair in pairs):
                raise forms.ValidationError(f'Line {number}: write a day and its hours, e.g. "mon 09:00-17:00".')
            weekly[day.lower()] = [[start.strip(), end.strip()] for start, end in pairs]
        return weekly


class BusinessHoursForm(forms.ModelForm):
    weekly = WeeklyHoursField(
        required=False,
        label="weekly hours",
        help_text=(
            'One day a line: "mon 09:00-17:00", "tue 09:00-12:00, 13:00-17:00" (mon ... sun); a day not written is '
            "closed."
        ),
    )

    class Meta:
        model = BusinessHours
        fields = "__all__"


@admin.register(BusinessHours)
class BusinessHoursAdmin(TenantScopedAdminMixin, admin.ModelAdmin):
    form = BusinessHoursForm
    list_display = (
        "__str__",
        "tenant",
        "mailbox",
        "timezone",
        "hours_shown",
        "holidays_country",
        "holidays_subdivision",
        "response_hours",
    )
    list_filter = (("tenant", admin.RelatedOnlyFieldListFilter),)
    fields = (
        "tenant",
        "mailbox",
        "timezone",
        "weekly",
        "holidays_country",
        "holidays_subdivision",
        "response_hours",
        "next_answer",
        "updated_by",
        "updated_at",
    )
    readonly_fields = ("next_answer", "updated_by", "updated_at")

    @admin.display(description="hours")
    def hours_shown(self, row):
        return business_hours.describe(row.weekly, row.timezone)

    @admin.display(description="a request received now")
    def next_answer(self, row):
        if row.pk is None:
            return "-"
        kept = ack_templates.promise(row, start=timezone.now())
        return f"answered by {kept.answer_by}" if kept.answer_by else "no promise (no response time)"

    def save_model(self, request, obj, form, change):
        ack_services.save_business_hours(actor=request.user, hours=obj)

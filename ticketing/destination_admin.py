"""The destination's admin page: settings checked field by field against its kind, the secret rule
(intake.secret_policy, through PlatformSecretsForSuperusersMixin), and a "test connection" action that proves
the credentials and settings without writing anything (a platform reference not bound to the row is refused by
`resolve_secret` before anything is sent).

Each kind declares what it reads (`DestinationAdapter.SETTINGS`, `ticketing.destinations.settings`);
an unknown name is refused, so a typo is caught when it is typed, not when the first email fails.
"""

from django import forms
from django.contrib import admin, messages
from django.utils.html import format_html_join

from intake.admin_forms import secret_warnings
from intake.admin_mixins import PlatformSecretsForSuperusersMixin, TenantScopedAdminMixin

from . import audit
from .destinations import adapter_class, configuration_errors, connection_report
from .models import Destination


class DestinationForm(forms.ModelForm):
    # The secret rule (intake.secret_policy): someone who is not a superuser and moves base_url to another host
    # types the credentials reference again, so that credentials go there on purpose.
    confirm_credentials_ref = forms.CharField(
        required=False,
        max_length=300,
        label="Confirm credentials reference",
        help_text="Needed when base_url moves to another host (superusers excepted): the credentials reference "
        "again, as above.",
    )

    class Meta:
        model = Destination
        fields = "__all__"

    def clean(self):
        data = super().clean()
        confirmation = data.get("confirm_credentials_ref")
        if confirmation and confirmation != data.get("credentials_ref"):
            self.add_error("confirm_credentials_ref", "This does not match the credentials reference.")
        if not data.get("kind"):
            return data
        problems = configuration_errors(
            data["kind"], data.get("base_url"), data.get("credentials_ref"), data.get("settings")
        )
        for field, problem_list in problems.items():
            if field not in self.errors:  # a field the form already refused keeps its own message
                for message in problem_list:
                    self.add_error(field, message)
        return data


def settings_reference(kind: str) -> list[tuple[str, str]]:
    """(name, help) of every setting a kind reads, for the form's help text."""
    try:
        spec = adapter_class(kind).SETTINGS
    except LookupError:
        return []
    return [(name, getattr(setting, "help", "") or type(setting).__name__.lower()) for name, setting in spec.items()]


@admin.register(Destination)
class DestinationAdmin(PlatformSecretsForSuperusersMixin, TenantScopedAdminMixin, admin.ModelAdmin):
    form = DestinationForm
    list_display = ("slug", "tenant", "kind", "base_url", "is_default", "paused", "paused_by", "paused_reason")
    list_filter = ("kind", "is_default", "paused", ("tenant", admin.RelatedOnlyFieldListFilter))
    search_fields = ("slug", "base_url")
    # paused_*: written by the pause switch and the breaker
    # paused too: turned on the pause page, which asks why (reconciliation.services.pauses)
    readonly_fields = ("paused", "paused_by", "paused_at", "paused_reason", "known_settings")
    actions = ("test_connection",)

    @admin.display(description="Settings this kind reads")
    def known_settings(self, obj):
        rows = settings_reference(obj.kind if obj else Destination.Kind.BUILTIN)
        return format_html_join("", "<div><code>{}</code> — {}</div>", rows) if rows else "-"

    def save_model(self, request, obj, form, change):
        old_url = Destination.objects.filter(pk=obj.pk).values_list("base_url", flat=True).first() if change else ""
        super().save_model(request, obj, form, change)
        if change:
            audit.base_url_changed(request.user, obj, old_url or "")
        for warning in secret_warnings(obj, ("credentials_ref",)):
            self.message_user(request, warning, messages.WARNING)

    @admin.action(description="Test connection (reads only: nothing is written)", permissions=("change",))
    def test_connection(self, request, queryset):
        for destination in queryset.order_by("tenant__slug", "slug"):
            # The status and our reason, never the answer's body (ticketing.destinations.connection_report).
            report = connection_report(destination)
            level = messages.SUCCESS if report.ok else messages.ERROR if report.tested else messages.WARNING
            self.message_user(request, f"{destination}: {report.text}", level)

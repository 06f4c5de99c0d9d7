"""REST API tokens in the console: each user lists, issues and revokes their own (a superuser: anyone's).

Issuing and revoking go through `reconciliation.services.api_tokens` (who may, the audit row). A new token is
shown once, on the page that answers the form (`no-store`, never in a session, a message or a log); the list
shows its prefix only.
"""

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from .. import services
from ..models import ApiToken
from ..services.api_tokens import hash_token
from ..times import absolute, when

NEVER = "never"


class IssueTokenForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        required=True,
        label="Name",
        help_text="What the token is for (a script, a job): shown in the list, never the token.",
    )
    expires = forms.ChoiceField(
        label="Expires after",
        initial="30",
        choices=[(str(days) if days else NEVER, label) for days, label in services.EXPIRY_CHOICES],
    )

    def __init__(self, *args, actor, **kwargs):
        super().__init__(*args, **kwargs)
        if actor.is_superuser:  # only a superuser issues for someone else (the service says so too)
            self.fields["owner"] = forms.ModelChoiceField(
                queryset=get_user_model()._default_manager.filter(is_active=True).order_by("username"),
                initial=actor.pk,
                label="For user",
                help_text="The token acts with this user's permissions.",
            )

    def expires_in_days(self) -> int | None:
        value = self.cleaned_data["expires"]
        return None if value == NEVER else int(value)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix_shown", "name", "user", "created_at", "expiry", "last_used_at", "revoke_link")
    search_fields = ("prefix", "name", "user__username")
    fields = readonly_fields = ("user", "prefix", "name", "created_at", "expiry", "last_used_at")
    actions = None

    class Media:
        css = {"all": ("reconciliation/forms.css",)}

    def get_queryset(self, request):
        return services.visible_tokens(request.user)

    # Every console user manages their own tokens: no model permission is needed for that.
    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request, obj=None):
        return self.has_module_permission(request) and (obj is None or services.may_revoke(request.user, obj))

    def has_add_permission(self, request):
        return self.has_module_permission(request)

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # revoked through the service (revoke_view), which checks who may

    @admin.display(description="token")
    def prefix_shown(self, token):
        return f"{token.prefix}…"

    @admin.display(description="expires", ordering="expires_at")
    def expiry(self, token):
        if token.expires_at is None:
            return "never"
        return f"{'expired' if services.is_expired(token) else 'expires'} {when(token.expires_at)}"

    @admin.display(description="")
    def revoke_link(self, token):
        url = reverse("admin:reconciliation_apitoken_revoke", args=[token.pk])
        return format_html('<a href="{}" class="revoke-token">Revoke</a>', url)

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("<int:token_id>/revoke/", wrap(self.revoke_view), name="reconciliation_apitoken_revoke"),
            *super().get_urls(),
        ]

    def add_view(self, request, form_url="", extra_context=None):
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = IssueTokenForm(request.POST or None, actor=request.user)
        if request.method == "POST" and form.is_valid():
            owner = form.cleaned_data.get("owner") or request.user
            try:
                token = services.do_issue_api_token(
                    request.user, owner=owner, name=form.cleaned_data["name"], expires_in_days=form.expires_in_days()
                )
            except ValidationError as exc:
                form.add_error(None, exc)
            else:
                row = ApiToken.objects.get(key_hash=hash_token(token))
                response = TemplateResponse(
                    request,
                    "admin/reconciliation/apitoken/created.html",
                    {
                        **self._context(request, "API token created"),
                        "token": token,
                        "row": row,
                        "expires": absolute(row.expires_at) if row.expires_at else NEVER,
                    },
                )
                response["Cache-Control"] = "no-store"  # the token is on this page only
                return response
        return TemplateResponse(
            request, "admin/reconciliation/apitoken/add.html", {**self._context(request, "New API token"), "form": form}
        )

    def revoke_view(self, request, token_id):
        try:
            token = services.visible_tokens(request.user).get(pk=token_id)
        except ApiToken.DoesNotExist:
            raise Http404("no such token") from None
        if request.method == "POST":
            services.do_revoke_api_token(request.user, token_id=token.pk)
            messages.success(
                request,
                f"API token {token.prefix}… ({token.name or 'no name'}) of {token.user} "
                f"revoked: the API refuses it from now on.",
            )
            return redirect(reverse("admin:reconciliation_apitoken_changelist"))
        return TemplateResponse(
            request,
            "admin/reconciliation/apitoken/revoke.html",
            {**self._context(request, "Revoke API token"), "token": token},
        )

    def _context(self, request, title):
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "changelist_url": reverse("admin:reconciliation_apitoken_changelist"),
        }

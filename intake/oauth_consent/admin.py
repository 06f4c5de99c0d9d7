"""The consent flow on the mailbox's admin page: its URLs, and an "OAuth connection" panel (granted scopes,
expiry, who connected it, the Connect button) instead of the raw oauth_* fields, which only the flow writes."""

from django import forms
from django.contrib import messages
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.utils.safestring import mark_safe

from . import views
from .endpoints import endpoints_for, supports_consent
from .selectors import credentials_state

STATE_WORDS = {
    "refused": "The provider refused this mailbox's credentials (revoked or expired): polling stopped.",
    "expired": "This mailbox's OAuth credentials expired.",
    "expiring": "This mailbox's OAuth credentials expire within a week.",
}
OAUTH_FIELDS = ("oauth_scopes", "oauth_expires_at", "oauth_connected_at", "oauth_connected_by", "oauth_warned_at")


def _unique(names) -> list:
    return list(dict.fromkeys(names))


class ConsentAdminMixin:
    def get_urls(self):
        wrap = self.admin_site.admin_view

        def connect(request, object_id):
            return views.connect_view(self, request, object_id)

        def callback(request):
            return views.callback_view(self, request)

        return [
            path("oauth/callback/", wrap(callback), name="intake_mailbox_oauth_callback"),
            path("<path:object_id>/connect/", wrap(connect), name="intake_mailbox_connect"),
        ] + super().get_urls()

    def get_exclude(self, request, obj=None):
        return _unique([*(super().get_exclude(request, obj) or ()), *OAUTH_FIELDS])

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        if obj is not None and supports_consent(obj):
            fields.append("oauth_connection")
        return _unique(name for name in fields if name not in OAUTH_FIELDS)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # The panel sits at the foot of a long form: a problem is also said on top.
        obj = self.get_object(request, object_id) if request.method == "GET" else None
        if obj is not None and supports_consent(obj) and (state := credentials_state(obj)):
            self.message_user(
                request, f"{STATE_WORDS[state]} Use Connect in the OAuth connection panel below.", messages.WARNING
            )
        return super().change_view(request, object_id, form_url, extra_context)

    @property
    def media(self):
        return super().media + forms.Media(css={"all": ("intake/consent.css",)})

    def oauth_connection(self, obj):
        context = {
            "mailbox": obj,
            "ends": endpoints_for(obj),
            "state": credentials_state(obj),
            "connect_url": reverse("admin:intake_mailbox_connect", args=[obj.pk]),
            "scopes": obj.oauth_scopes.split(),
        }
        return mark_safe(render_to_string("admin/intake/mailbox/oauth_connection.html", context))  # noqa: S308

    oauth_connection.short_description = "OAuth connection"

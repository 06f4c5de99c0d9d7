"""Who may call what: the console's permissions (reconciliation.services.roles), checked per endpoint.

Reads of events, intents, mappings and the queue need the queue's view permission (every role has it)
or the model's own view permission; configuration follows the model permissions the `mailroom-admin`
role grants (view, add, change, delete). Tenant scoping is the querysets' job (selectors): another
tenant's object is a 404.
"""

from django.conf import settings
from rest_framework.permissions import BasePermission

from ..services import PERM_VIEW_QUEUE


class SchemaAccess(BasePermission):
    """/api/schema/ and /api/docs/: open where MAILROOM_PUBLIC_API_SCHEMA is on (development by default);
    otherwise (production) only a signed-in user: an API token, or a console session in the browser."""

    def has_permission(self, request, view):
        user = request.user
        return settings.MAILROOM_PUBLIC_API_SCHEMA or bool(user and user.is_authenticated and user.is_active)


class CanReadEvents(BasePermission):
    model_perm = "intake.view_inboxevent"

    def has_permission(self, request, view):
        user = request.user
        return bool(
            user
            and user.is_authenticated
            and user.is_active
            and (user.has_perm(PERM_VIEW_QUEUE) or user.has_perm(getattr(view, "model_perm", None) or self.model_perm))
        )


class ModelPerms(BasePermission):
    """The model's Django permissions by method: GET view, POST add, PUT/PATCH change, DELETE delete."""

    ACTIONS = {
        "GET": "view",
        "HEAD": "view",
        "OPTIONS": "view",
        "POST": "add",
        "PUT": "change",
        "PATCH": "change",
        "DELETE": "delete",
    }

    def has_permission(self, request, view):
        user = request.user
        if not (user and user.is_authenticated and user.is_active):
            return False
        method = request.method.lower()
        if method not in view.http_method_names or not hasattr(view, method):
            return True  # answered 405 by the view
        opts = view.queryset.model._meta
        action = self.ACTIONS.get(request.method)
        return bool(action and user.has_perm(f"{opts.app_label}.{action}_{opts.model_name}"))

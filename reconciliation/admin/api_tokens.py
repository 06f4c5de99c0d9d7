"""REST API tokens: listed by prefix (the token itself is never stored) and revoked by deleting them."""
from django.contrib import admin

from ..models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "created_at", "last_used_at")
    search_fields = ("prefix", "user__username")
    readonly_fields = ("user", "prefix", "key_hash", "created_at", "last_used_at")

    def has_add_permission(self, request):
        return False  # `manage.py api_token <username>` makes them

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser  # revoking a token; no role grants deletes in reconciliation

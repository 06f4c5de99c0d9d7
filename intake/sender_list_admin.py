"""The sender block/allow lists in the console: each tenant's entries (mailbox empty: every mailbox of the
tenant) and each mailbox's. Registered from `intake.admin`.

Entries are added (through `intake.sender_lists.add_sender_list_entry`, which checks the tenant and the
pattern) and removed, never edited: an entry is one decision, made by someone on a day.
"""

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied, ValidationError

from .admin_mixins import TenantScopedAdminMixin
from .models import SenderListEntry
from .sender_lists import add_sender_list_entry, remove_sender_list_entry


class SenderListEntryForm(forms.ModelForm):
    class Meta:
        model = SenderListEntry
        fields = ("tenant", "mailbox", "kind", "pattern", "note")
        help_texts = {
            "pattern": "an address (jane@example.com) or a domain (@example.com, which covers its subdomains); "
            "a mailbox's list wins over the tenant's, and the most specific entry over the others",
        }

    def __init__(self, *args, actor=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.actor = actor

    def clean(self):
        data = super().clean()
        if self.errors or self.actor is None:
            return data
        try:  # the service checks and saves in one go; save_model hands back what it made
            self.instance = add_sender_list_entry(
                tenant=data["tenant"],
                mailbox=data.get("mailbox"),
                kind=data["kind"],
                pattern=data["pattern"],
                actor=self.actor,
                note=data.get("note", ""),
            )
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                self.add_error(field if field in self.fields else None, messages)
        except PermissionDenied as exc:
            self.add_error(None, str(exc))
        return data

    def _post_clean(self):
        pass  # the service validated and saved the row (unique constraints included)


@admin.register(SenderListEntry)
class SenderListEntryAdmin(TenantScopedAdminMixin, admin.ModelAdmin):
    form = SenderListEntryForm
    list_display = ("pattern", "kind", "tenant", "list_scope", "note", "created_by", "created_at")
    list_filter = ("kind", ("tenant", admin.RelatedOnlyFieldListFilter), ("mailbox", admin.RelatedOnlyFieldListFilter))
    search_fields = ("pattern", "note")
    ordering = ("tenant", "mailbox", "pattern")

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("tenant", "mailbox")

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)

        class WithActor(form):
            def __init__(self, *args, **inner):
                super().__init__(*args, actor=request.user if obj is None else None, **inner)

        return WithActor

    def get_readonly_fields(self, request, obj=None):
        return ("tenant", "mailbox", "kind", "pattern", "note", "created_by", "created_at") if obj else ()

    def has_change_permission(self, request, obj=None):
        return False if obj is not None else super().has_change_permission(request, obj)

    def save_model(self, request, obj, form, change):
        pass  # saved by add_sender_list_entry in the form's clean

    def delete_model(self, request, obj):
        remove_sender_list_entry(entry=obj, actor=request.user)

    def delete_queryset(self, request, queryset):
        for entry in queryset:
            remove_sender_list_entry(entry=entry, actor=request.user)

    @admin.display(description="list", ordering="mailbox")
    def list_scope(self, obj):
        return f"mailbox {obj.mailbox.slug}" if obj.mailbox_id else "every mailbox of the tenant"

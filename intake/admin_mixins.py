"""The admin mixins every app's ModelAdmin shares: tenant scoping, evidence that nobody edits, and the secret
rule on forms. Apart from intake.admin so that each admin module can import them without importing the
registrations of another."""

from django.http import Http404
from django.utils.html import escape
from django.utils.safestring import SafeData

from . import secret_policy
from .models import Tenant
from .selectors import visible_tenants


class ReadOnlyAdminMixin:
    """Records that are evidence: nobody edits or deletes them from the admin."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class TenantScopedAdminMixin:
    """A user sees only the tenants they are a member of (a superuser sees all): in lists, filters,
    search, form choices and by URL (another tenant's object is a 404, not a redirect).

    `tenant_path` is the lookup from the model to its Tenant ("pk" for Tenant itself).
    """

    tenant_path = "tenant"

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        return queryset.filter(**{f"{self.tenant_path}__in": visible_tenants(request.user).values("pk")})

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        model = db_field.related_model
        if not request.user.is_superuser:
            tenants = visible_tenants(request.user).values("pk")
            if model is Tenant:
                kwargs["queryset"] = Tenant.objects.filter(pk__in=tenants)
            elif any(f.name == "tenant" for f in model._meta.fields):
                kwargs["queryset"] = model._default_manager.filter(tenant__in=tenants)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def _get_obj_does_not_exist_redirect(self, request, opts, object_id):
        raise Http404(f"no {opts.verbose_name} {object_id}")

    # The admin renders help texts as HTML: "<TENANT>" in a placeholder would vanish as a tag.
    def formfield_for_dbfield(self, db_field, request, **kwargs):
        return literal_help(super().formfield_for_dbfield(db_field, request, **kwargs))

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        for field in form.base_fields.values():
            literal_help(field)
        return form


def literal_help(field):
    """`field` with its help text escaped, once (a text marked safe is the author's HTML and stays)."""
    if field is not None and field.help_text and not isinstance(field.help_text, SafeData):
        field.help_text = escape(field.help_text)
    return field


class PlatformSecretsForSuperusersMixin:
    """The secret rule (intake.secret_policy) on the admin form: only a superuser may point a row at a platform
    secret or change where a row holding one sends it. A reference field `<name>` may have a form field
    `confirm_<name>`: typed in and equal to it, the reference counts as entered again (a base_url move).
    The model's clean() refuses whatever is outside the row's scope (intake.secrets)."""

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        actor = request.user

        class SecretRules(form):
            def clean(self):
                data = super().clean()
                holder = secret_policy.holder_for(self.instance)
                changes = {name: data[name] for name in (*holder.ref_fields, *holder.guarded_fields) if name in data}
                reentered = [
                    name
                    for name in holder.ref_fields
                    if data.get(f"confirm_{name}") and data.get(f"confirm_{name}") == data.get(name)
                ]
                try:
                    secret_policy.check_secret_change(
                        actor=actor,
                        row=self.instance,
                        before=secret_policy.stored_values(self.instance),
                        changes=changes,
                        reentered=reentered,
                    )
                except secret_policy.SecretChangeRefused as refused:
                    for name, messages in refused.message_dict.items():
                        for message in messages:
                            self.add_error(name if name in self.fields else None, message)
                return data

        return SecretRules

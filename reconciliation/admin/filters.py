"""The recovery queue's list filters: reason, state, mailbox, owner, tenant.

Every choice comes from what the user may see (their tenants, those tenants'
mailboxes, the reason codes in their queue).
"""

from django.contrib import admin

from intake.models import InboxEvent

from .. import selectors


class ReasonFilter(admin.SimpleListFilter):
    title = "reason"
    parameter_name = "reason"

    def lookups(self, request, model_admin):
        # The queue page has read them already with its head (RecoveryItemAdmin.changelist_view).
        overview = getattr(request, "queue_overview", None)
        codes = overview["reason_codes"] if overview else selectors.queue_reason_codes(request.user)
        return [(code, selectors.reason_label(code)) for code in codes]

    def queryset(self, request, queryset):
        return queryset.filter(reason_code=self.value()) if self.value() else queryset


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [(s, s) for s in InboxEvent.RECOVERY_STATES] + [("held", "intent held")]

    def queryset(self, request, queryset):
        if self.value() == "held":
            return queryset.filter(has_held_intent=True)
        if self.value() in InboxEvent.RECOVERY_STATES:
            return queryset.filter(state=self.value())
        return queryset


class _VisibleChoiceFilter(admin.SimpleListFilter):
    """Filter by one of the objects the user may see (their tenants, or those tenants' mailboxes)."""

    field = ""

    def choices_for(self, user):
        """Subclasses of _VisibleChoiceFilter must provide this method: the queryset of objects `user` may see
        (with a `slug`), whose pks are the filter's choices for `field`."""
        raise NotImplementedError

    def lookups(self, request, model_admin):
        return [(str(o.pk), o.slug) for o in self.choices_for(request.user).order_by("slug")]

    def queryset(self, request, queryset):
        return queryset.filter(**{self.field: self.value()}) if (self.value() or "").isdigit() else queryset


class MailboxFilter(_VisibleChoiceFilter):
    title = "mailbox"
    parameter_name = field = "mailbox"

    def choices_for(self, user):
        return selectors.visible_mailboxes(user)


class OwnerFilter(admin.SimpleListFilter):
    title = "owner"
    parameter_name = "owner"

    def lookups(self, request, model_admin):
        return [("mine", "mine"), ("unassigned", "unassigned")]

    def queryset(self, request, queryset):
        if self.value() == "mine":
            return queryset.filter(owner=request.user)
        if self.value() == "unassigned":
            return queryset.filter(owner__isnull=True)
        return queryset


class TenantFilter(_VisibleChoiceFilter):
    title = "tenant"
    parameter_name = field = "tenant"

    def choices_for(self, user):
        return selectors.visible_tenants(user)

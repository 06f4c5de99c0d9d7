"""The pause page (`PauseSwitchAdmin`): the global pause, each visible tenant's pause, every visible mailbox and
destination, each with its switch.

Turning a switch goes through `reconciliation.services` (permission, tenant,
log); a resume reports how many waiting events it released. The global switch is shown to everyone who
sees the page, and offered only to superusers (the service refuses anyone else).
"""

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from intake.models import Mailbox, Switch, Tenant
from ticketing.models import Destination

from .. import selectors, services
from ..models import PauseSwitch


@admin.register(PauseSwitch)
class PauseSwitchAdmin(admin.ModelAdmin):
    """One page: the global pause, every visible mailbox and destination, each with its switch."""

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm("reconciliation.view_pauseswitch") or self.has_change_permission(request)

    def has_change_permission(self, request, obj=None):
        return request.user.has_perm(services.PERM_PAUSE)

    def has_module_permission(self, request):
        return self.has_view_permission(request)

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [path("", wrap(self.changelist_view), name="reconciliation_pauseswitch_changelist")]

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            return self._toggle(request)
        user = request.user
        switch = Switch.objects.filter(name=Switch.GLOBAL_PAUSE).first()
        waiting = selectors.waiting_counts(user)
        mailboxes = list(selectors.visible_mailboxes(user).order_by("tenant__slug", "slug"))
        for mailbox in mailboxes:
            mailbox.waiting = waiting.get(mailbox.pk, 0)
        tenants = services.tenant_pauses(user)
        # Who paused each paused thing, when and why (the LogEntry the pause services write).
        paused = [
            row
            for row in (switch, *(t.pause_switch for t in tenants if t.paused), *(m for m in mailboxes if m.paused))
            if row is not None and getattr(row, "pk", None)
        ]
        records = services.pause_records(paused)
        for row in paused:
            row.pause_record = records.get((type(row), str(row.pk)))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Pauses",
            "global_on": bool(switch and switch.on),
            "switch": switch,
            "can_global": services.may_set_global_pause(user),
            "can_change": self.has_change_permission(request),
            "tenants": tenants,
            "mailboxes": mailboxes,
            "destinations": list(selectors.visible_destinations(user).order_by("tenant__slug", "slug")),
            "waiting_total": sum(waiting.values()),
        }
        return TemplateResponse(request, "admin/reconciliation/pauseswitch/pauses.html", context)

    def _toggle(self, request):
        target, paused = request.POST.get("target"), request.POST.get("paused") == "1"
        object_id = request.POST.get("id") or ""
        reason = request.POST.get("reason", "")
        back = redirect(reverse("admin:reconciliation_pauseswitch_changelist"))
        try:
            if target == "global":
                released = services.do_set_global_pause(request.user, paused, reason=reason)
                label = "Global pause"
            elif target == "tenant" and object_id.isdigit():
                released = services.do_set_tenant_pause(request.user, int(object_id), paused, reason=reason)
                label = "Tenant pause"
            elif target == "mailbox" and object_id.isdigit():
                released = services.do_set_mailbox_pause(request.user, int(object_id), paused, reason=reason)
                label = "Mailbox"
            elif target == "destination" and object_id.isdigit():
                released = services.do_set_destination_pause(request.user, int(object_id), paused, reason=reason)
                label = "Destination"
            else:
                raise Http404("no such switch")
        except (Tenant.DoesNotExist, Mailbox.DoesNotExist, Destination.DoesNotExist):
            raise Http404("no such switch") from None
        except ValidationError as refused:
            messages.error(request, f"Nothing paused. {' '.join(refused.messages)}")
            return back
        state = (
            f"on: no destination writes; intake still stores mail (reason: {' '.join(reason.split())})"
            if paused
            else f"off: {released} waiting event(s) released"
        )
        messages.success(request, f"{label} {state}.")
        return back

"""Pauses: the global switch (the platform's), a tenant's own pause, and one mailbox or destination.

A pause keeps intake storing mail while workers make no destination writes; a
resume drains the backlog at once (`intake.services.release_waiting_events`).

- The global pause stops every tenant: only the platform operator (a superuser) sets or lifts it.
- A tenant's pause (`intake.selectors.tenant_pause_name`, a `Switch` row) stops every mailbox and
  destination of that one tenant; its admins (`PERM_PAUSE`, a member of the tenant) set and lift it.
  Processing honours it wherever it honours a mailbox pause.

The circuit breaker (`ticketing.breaker`) pauses a destination by itself; only a
person resumes one, here, which clears the breaker's reason and record.
Each change is logged in the admin's LogEntry (same transaction) and the log.
"""
import logging

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from intake.models import Mailbox, Switch, Tenant
from intake.selectors import global_pause_on, paused_tenant_ids, tenant_pause_name, visible_tenants
from intake.services import release_waiting_events
from ticketing import breaker
from ticketing.models import Destination

from .. import selectors
from .access import actor_name, require
from .roles import PERM_PAUSE

logger = logging.getLogger(__name__)

GLOBAL_PAUSE_REFUSED = ("the global pause stops every tenant: only the platform operator (a superuser) sets or "
                        "lifts it; pause your own tenant instead")


def _log_change(user, obj, message: str) -> None:
    LogEntry.objects.create(
        user_id=user.pk, content_type=ContentType.objects.get_for_model(obj, for_concrete_model=False),
        object_id=str(obj.pk), object_repr=str(obj)[:200], action_flag=CHANGE, change_message=message)


def _release(mailboxes) -> int:
    """Drain the backlog of `mailboxes` (a Mailbox queryset; those paused themselves or by their tenant wait on),
    unless the global pause is on."""
    if global_pause_on():
        return 0
    running = mailboxes.filter(paused=False).exclude(tenant_id__in=paused_tenant_ids())
    return sum(release_waiting_events(mailbox_id=m) for m in running.order_by("pk").values_list("pk", flat=True))


def _set_switch(user, name: str, on: bool, label: str) -> bool:
    """Set one Switch row, log the change (same transaction); returns what it was."""
    with transaction.atomic():
        switch, _ = Switch.objects.select_for_update().get_or_create(name=name)
        was = switch.on
        switch.on, switch.changed_by, switch.changed_at = bool(on), actor_name(user), timezone.now()
        switch.save(update_fields=["on", "changed_by", "changed_at"])
        _log_change(user, switch, f"{label} {'on' if on else 'off'} (was {'on' if was else 'off'})")
    return was


def may_set_global_pause(user) -> bool:
    return user is not None and user.is_active and user.is_superuser


def do_set_global_pause(user, on: bool) -> int:
    """Turn the global pause on or off (superusers only). Off drains every waiting event. Returns how many
    were released."""
    if not may_set_global_pause(user):
        raise PermissionDenied(GLOBAL_PAUSE_REFUSED)
    _set_switch(user, Switch.GLOBAL_PAUSE, on, "global pause")
    logger.warning("global pause %s by %s", "on" if on else "off", actor_name(user))
    if on:
        return 0
    return _release(Mailbox.objects.all())


def do_set_tenant_pause(user, tenant_id: int, paused: bool) -> int:
    """Pause or resume every mailbox and destination of one of the user's tenants; a resume drains its backlog.

    Tenant.DoesNotExist (a 404) for a tenant the user is not a member of.
    """
    require(user, PERM_PAUSE)
    tenant = visible_tenants(user).get(pk=tenant_id)
    _set_switch(user, tenant_pause_name(tenant.pk), paused, f"tenant {tenant.slug} pause")
    logger.warning("tenant %s %s by %s", tenant.slug, "paused" if paused else "resumed", actor_name(user))
    if paused:
        return 0
    return _release(Mailbox.objects.filter(tenant_id=tenant.pk))


def tenant_pauses(user) -> list[Tenant]:
    """The user's tenants, each with `paused` and its switch (`pause_switch`: who, when; None if never set)."""
    tenants = list(visible_tenants(user).order_by("slug"))
    switches = {s.name: s for s in Switch.objects.filter(name__in=[tenant_pause_name(t.pk) for t in tenants])}
    for tenant in tenants:
        tenant.pause_switch = switches.get(tenant_pause_name(tenant.pk))
        tenant.paused = bool(tenant.pause_switch and tenant.pause_switch.on)
    return tenants


def do_set_mailbox_pause(user, mailbox_id: int, paused: bool) -> int:
    """Pause or resume one mailbox of the user's tenants; a resume drains its backlog."""
    require(user, PERM_PAUSE)
    mailbox = selectors.visible_mailboxes(user).get(pk=mailbox_id)
    with transaction.atomic():
        Mailbox.objects.filter(pk=mailbox.pk).update(paused=bool(paused))
        _log_change(user, mailbox, f"mailbox {'paused' if paused else 'resumed'}")
    logger.warning("mailbox %s %s by %s", mailbox.slug, "paused" if paused else "resumed", actor_name(user))
    return 0 if paused else _release(Mailbox.objects.filter(pk=mailbox.pk))


def do_set_destination_pause(user, destination_id: int, paused: bool) -> int:
    """Pause or resume one destination of the user's tenants; a resume drains its tenant's backlog."""
    require(user, PERM_PAUSE)
    destination = selectors.visible_destinations(user).get(pk=destination_id)
    with transaction.atomic():
        if paused:  # a person's pause: who and when (a pause already on keeps its own record)
            Destination.objects.filter(pk=destination.pk, paused=False).update(
                paused=True, paused_by=actor_name(user), paused_reason="paused by a person", paused_at=timezone.now())
        else:
            Destination.objects.filter(pk=destination.pk).update(paused=False)
            breaker.resumed(destination.pk)  # clears the reason; intents that waited on it are due now
        _log_change(user, destination, f"destination {'paused' if paused else 'resumed'}")
    logger.warning("destination %s %s by %s", destination, "paused" if paused else "resumed", actor_name(user))
    if paused:
        return 0
    return _release(Mailbox.objects.filter(tenant_id=destination.tenant_id))

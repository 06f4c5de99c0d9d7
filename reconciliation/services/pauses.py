"""Pauses: the global switch (the platform's), a tenant's own pause, and one mailbox or destination.

A pause keeps intake storing mail while workers make no destination writes; a
resume drains the backlog at once (`intake.services.release_waiting_events`).

- The global pause stops every tenant: only the platform operator (a superuser) sets or lifts it.
- A tenant's pause (`intake.selectors.tenant_pause_name`, a `Switch` row) stops every mailbox and
  destination of that one tenant; its admins (`PERM_PAUSE`, a member of the tenant) set and lift it.
  Processing honours it wherever it honours a mailbox pause.

The circuit breaker (`ticketing.breaker`) pauses a destination by itself; only a
person resumes one, here, which clears the breaker's reason and record.
Every pause by a person has a reason (`reason=`, keyword-only, required when pausing): it is written into
the admin's LogEntry (same transaction; "mailbox paused; reason: desk migration") and the log, and the pause
page shows it next to the paused thing (`pause_records`). A destination keeps it in `paused_reason` too.
"""

import logging
from dataclasses import dataclass

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied, ValidationError
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

GLOBAL_PAUSE_REFUSED = (
    "the global pause stops every tenant: only the platform operator (a superuser) sets or "
    "lifts it; pause your own tenant instead"
)
REASON_NEEDED = "Say why you pause it (for example: desk migration); the others read it on the pause page."
REASON_MARK = "; reason: "
MAX_REASON_CHARS = 300


def pause_reason(paused: bool, reason: str) -> str:
    """The reason as recorded ("" for a resume); ValidationError when a pause comes without one."""
    reason = " ".join(str(reason or "").split())[:MAX_REASON_CHARS]
    if paused and not reason:
        raise ValidationError({"reason": REASON_NEEDED})
    return reason if paused else ""


def with_reason(message: str, reason: str) -> str:
    return f"{message}{REASON_MARK}{reason}" if reason else message


def _log_change(user, obj, message: str) -> None:
    LogEntry.objects.create(
        user_id=user.pk,
        content_type=ContentType.objects.get_for_model(obj, for_concrete_model=False),
        object_id=str(obj.pk),
        object_repr=str(obj)[:200],
        action_flag=CHANGE,
        change_message=message,
    )


def _release(mailboxes) -> int:
    """Drain the backlog of `mailboxes` (a Mailbox queryset; those paused themselves or by their tenant wait on),
    unless the global pause is on."""
    if global_pause_on():
        return 0
    running = mailboxes.filter(paused=False).exclude(tenant_id__in=paused_tenant_ids())
    return sum(release_waiting_events(mailbox_id=m) for m in running.order_by("pk").values_list("pk", flat=True))


def _set_switch(user, name: str, on: bool, label: str, reason: str = "") -> bool:
    """Set one Switch row, log the change and its reason (same transaction); returns what it was."""
    with transaction.atomic():
        switch, _ = Switch.objects.select_for_update().get_or_create(name=name)
        was = switch.on
        switch.on, switch.changed_by, switch.changed_at = bool(on), actor_name(user), timezone.now()
        switch.save(update_fields=["on", "changed_by", "changed_at"])
        change = f"{label} {'on' if on else 'off'} (was {'on' if was else 'off'})"
        _log_change(user, switch, with_reason(change, reason))
    return was


def may_set_global_pause(user) -> bool:
    return user is not None and user.is_active and user.is_superuser


def do_set_global_pause(user, on: bool, *, reason: str = "") -> int:
    """Turn the global pause on (with a `reason`) or off (superusers only). Off drains every waiting event.
    Returns how many were released."""
    if not may_set_global_pause(user):
        raise PermissionDenied(GLOBAL_PAUSE_REFUSED)
    reason = pause_reason(on, reason)
    _set_switch(user, Switch.GLOBAL_PAUSE, on, "global pause", reason)
    logger.warning("global pause %s by %s", "on" if on else "off", actor_name(user))
    if on:
        return 0
    return _release(Mailbox.objects.all())


def do_set_tenant_pause(user, tenant_id: int, paused: bool, *, reason: str = "") -> int:
    """Pause (with a `reason`) or resume every mailbox and destination of one of the user's tenants; a resume
    drains its backlog.

    Tenant.DoesNotExist (a 404) for a tenant the user is not a member of.
    """
    require(user, PERM_PAUSE)
    tenant = visible_tenants(user).get(pk=tenant_id)
    reason = pause_reason(paused, reason)
    _set_switch(user, tenant_pause_name(tenant.pk), paused, f"tenant {tenant.slug} pause", reason)
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


def do_set_mailbox_pause(user, mailbox_id: int, paused: bool, *, reason: str = "") -> int:
    """Pause (with a `reason`) or resume one mailbox of the user's tenants; a resume drains its backlog."""
    require(user, PERM_PAUSE)
    mailbox = selectors.visible_mailboxes(user).get(pk=mailbox_id)
    reason = pause_reason(paused, reason)
    with transaction.atomic():
        Mailbox.objects.filter(pk=mailbox.pk).update(paused=bool(paused))
        _log_change(user, mailbox, with_reason(f"mailbox {'paused' if paused else 'resumed'}", reason))
    logger.warning("mailbox %s %s by %s", mailbox.slug, "paused" if paused else "resumed", actor_name(user))
    return 0 if paused else _release(Mailbox.objects.filter(pk=mailbox.pk))


def do_set_destination_pause(user, destination_id: int, paused: bool, *, reason: str = "") -> int:
    """Pause (with a `reason`) or resume one destination of the user's tenants; a resume drains its tenant's
    backlog."""
    require(user, PERM_PAUSE)
    destination = selectors.visible_destinations(user).get(pk=destination_id)
    reason = pause_reason(paused, reason)
    with transaction.atomic():
        if paused:  # a person's pause: who, when and why (a pause already on keeps its own record)
            Destination.objects.filter(pk=destination.pk, paused=False).update(
                paused=True, paused_by=actor_name(user), paused_reason=reason, paused_at=timezone.now()
            )
        else:
            Destination.objects.filter(pk=destination.pk).update(paused=False)
            breaker.resumed(destination.pk)  # clears the reason; intents that waited on it are due now
        _log_change(user, destination, with_reason(f"destination {'paused' if paused else 'resumed'}", reason))
    logger.warning("destination %s %s by %s", destination, "paused" if paused else "resumed", actor_name(user))
    if paused:
        return 0
    return _release(Mailbox.objects.filter(tenant_id=destination.tenant_id))


@dataclass(frozen=True)
class PauseRecord:
    """Who paused a thing, when and why, as the pause page shows it."""

    by: str
    at: object
    reason: str


def pause_records(objects) -> dict:
    """{(model, pk): PauseRecord} of the latest logged change of each of `objects` (Switch rows, mailboxes,
    destinations), read from the LogEntry rows the services above write. One query per model."""
    records: dict = {}
    by_model: dict = {}
    for obj in objects:
        by_model.setdefault(type(obj), []).append(str(obj.pk))
    for model, ids in by_model.items():
        content_type = ContentType.objects.get_for_model(model, for_concrete_model=False)
        entries = (
            LogEntry.objects.filter(content_type=content_type, object_id__in=ids, action_flag=CHANGE)
            .select_related("user")
            .order_by("object_id", "-action_time", "-pk")
            .distinct("object_id")
        )
        for entry in entries:
            _, _, reason = entry.change_message.partition(REASON_MARK)
            records[(model, entry.object_id)] = PauseRecord(
                by=entry.user.get_username() if entry.user else "", at=entry.action_time, reason=reason
            )
    return records

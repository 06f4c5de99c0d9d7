"""Pauses: the global switch, and one mailbox or destination of the user's tenants.

A pause keeps intake storing mail while workers make no destination writes; a
resume drains the backlog at once (`intake.services.release_waiting_events`).
The circuit breaker (`ticketing.breaker`) pauses a destination by itself; only a
person resumes one, here, which clears the breaker's reason and record.
Each change is logged in the admin's LogEntry and the log.
"""
import logging

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.utils import timezone

from intake.models import Mailbox, Switch
from intake.selectors import global_pause_on
from intake.services import release_waiting_events
from ticketing import breaker
from ticketing.models import Destination

from .. import selectors
from .access import actor_name, require
from .roles import PERM_GLOBAL_PAUSE, PERM_PAUSE

logger = logging.getLogger(__name__)


def _log_change(user, obj, message: str) -> None:
    LogEntry.objects.create(
        user_id=user.pk, content_type=ContentType.objects.get_for_model(obj, for_concrete_model=False),
        object_id=str(obj.pk), object_repr=str(obj)[:200], action_flag=CHANGE, change_message=message)


def _release(mailbox_ids) -> int:
    """Drain the backlog of the given mailboxes (those not paused themselves), unless the global pause is on."""
    if global_pause_on():
        return 0
    return sum(release_waiting_events(mailbox_id=m) for m in mailbox_ids)


def do_set_global_pause(user, on: bool) -> int:
    """Turn the global pause on or off. Off drains every waiting event. Returns how many were released."""
    require(user, PERM_GLOBAL_PAUSE)
    now = timezone.now()
    with transaction.atomic():
        switch, _ = Switch.objects.select_for_update().get_or_create(name=Switch.GLOBAL_PAUSE)
        was = switch.on
        switch.on, switch.changed_by, switch.changed_at = bool(on), actor_name(user), now
        switch.save(update_fields=["on", "changed_by", "changed_at"])
        _log_change(user, switch, f"global pause {'on' if on else 'off'} (was {'on' if was else 'off'})")
    logger.warning("global pause %s by %s", "on" if on else "off", actor_name(user))
    if on:
        return 0
    return _release(Mailbox.objects.filter(paused=False).order_by("pk").values_list("pk", flat=True))


def do_set_mailbox_pause(user, mailbox_id: int, paused: bool) -> int:
    """Pause or resume one mailbox of the user's tenants; a resume drains its backlog."""
    require(user, PERM_PAUSE)
    mailbox = selectors.visible_mailboxes(user).get(pk=mailbox_id)
    with transaction.atomic():
        Mailbox.objects.filter(pk=mailbox.pk).update(paused=bool(paused))
        _log_change(user, mailbox, f"mailbox {'paused' if paused else 'resumed'}")
    logger.warning("mailbox %s %s by %s", mailbox.slug, "paused" if paused else "resumed", actor_name(user))
    return 0 if paused else _release([mailbox.pk])


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
    return _release(Mailbox.objects.filter(tenant_id=destination.tenant_id, paused=False)
                    .order_by("pk").values_list("pk", flat=True))

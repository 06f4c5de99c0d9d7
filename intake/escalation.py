"""When an item of the recovery queue escalates: the default `InboxEvent.escalate_at` on entering it.

`intake.services.transition_event` (the one door for event states) sets it when an event moves into
a recovery state from outside one; an operator may change it later (`do_set_escalation`). The hours
come from `MAILROOM_ESCALATE_AFTER_HOURS`, overridden per tenant by `Tenant.settings
["escalate_after_hours"]` (a number for every item, or a dict with the same keys). Acting on it is
reconciliation's (`reconciliation.services.escalation`); intake only computes the time.
"""

from datetime import timedelta

from django.conf import settings
from django.db.models import Case, F, Value, When

from .models import InboxEvent, Tenant


def _hours(table: dict, state: str, reason_code: str):
    for key in (f"{state}/{reason_code}", reason_code, state, "default"):
        value = table.get(key) if key else None
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return value
    return None


def escalate_after_hours(tenant, state: str, reason_code: str) -> float:
    """The hours an item in `state`/`reason_code` of `tenant` (or None) may wait; the tenant's word first."""
    override = (getattr(tenant, "settings", None) or {}).get("escalate_after_hours") if tenant else None
    if isinstance(override, int | float) and not isinstance(override, bool) and override > 0:
        return override
    if isinstance(override, dict) and (hours := _hours(override, state, reason_code)):
        return hours
    return _hours(getattr(settings, "MAILROOM_ESCALATE_AFTER_HOURS", {}) or {}, state, reason_code) or 24


def entering_recovery(event_id: int, state: str, reason_code: str, now):
    """The `escalate_at` value of an UPDATE moving the event into recovery state `state`.

    An event already in a recovery state keeps its time (a move inside the queue is not a new entry);
    one coming from elsewhere gets now + the hours for its state and reason.
    """
    tenant = Tenant.objects.filter(pk__in=InboxEvent.objects.filter(pk=event_id).values("tenant_id")).first()
    due = now + timedelta(hours=escalate_after_hours(tenant, state, reason_code))
    return Case(
        When(state__in=InboxEvent.RECOVERY_STATES, escalate_at__isnull=False, then=F("escalate_at")), default=Value(due)
    )

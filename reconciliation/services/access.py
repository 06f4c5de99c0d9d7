"""The acting user of a console action: permission, tenant, refusal and the name audit rows carry.

Every `do_*` action checks the user's permission (`require`: PermissionDenied,
a 403) and tenant (`visible_event`: InboxEvent.DoesNotExist, a 404), refuses
what no longer applies (`ActionRefused`, nothing written) and leaves an
AuditEvent naming the user (`actor_name`: "user:<username>").
"""

from django.core.exceptions import PermissionDenied

from intake.models import InboxEvent
from ticketing import replay

from .. import selectors


class ActionRefused(Exception):
    """The action does not apply to this item (any more); nothing was written. The message says why."""


def actor_name(user) -> str:
    return f"user:{user.get_username()}"


def require(user, *perms: str) -> None:
    """PermissionDenied (a 403) unless `user` is active and has every one of `perms`."""
    if user is None or not user.is_active or not all(user.has_perm(p) for p in perms):
        raise PermissionDenied(f"needs {', '.join(perms)}")


def visible_event(user, event_id) -> InboxEvent:
    """The event if it belongs to one of the user's tenants; InboxEvent.DoesNotExist otherwise (a 404)."""
    return selectors.visible_events(user).select_related("mailbox", "tenant", "owner").get(pk=event_id)


def refusing(call, *args, **kwargs):
    """`call(...)`, with ticketing's refusal (`ReplayRefused`) turned into the console's `ActionRefused`."""
    try:
        return call(*args, **kwargs)
    except replay.ReplayRefused as exc:
        raise ActionRefused(str(exc)) from None

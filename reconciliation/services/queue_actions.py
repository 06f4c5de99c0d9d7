"""The recovery queue's actions on one item: triage, replays, confirmation, close, quarantine release.

Each one checks the acting user's permission and tenant (`access`), writes
through the owning app's services (intake.services, ticketing.replay), and
leaves an AuditEvent naming the user ("user:<username>").

Quarantine is the security role's decision: only `PERM_RELEASE` closes or releases a
quarantined item, and a replay of one that was ever quarantined and not released judges
it again (`ticketing.replay`). An assignee must be an active member of the item's tenant
who can see the queue (`assignable_users`); anyone else, existing or not, gets the same
refusal (`ASSIGNEE_REFUSED`), so the action reveals no usernames.

Mail without a usable sender (`missing_sender`) is not replayed until an operator entered whom its
ticket is for (`do_enter_requester`; `ticketing.people.lacks_requester`).
"""

import email.utils

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from intake.domains import address_key
from intake.logging import mask_address
from intake.models import InboxEvent
from intake.services import PROCESS_TOPIC, enqueue_outbox, record_audit, transition_event
from intake.vocabulary import AuditKind
from ticketing import people, replay
from ticketing.models import Intent

from .access import ActionRefused, actor_name, refusing, require, visible_event
from .roles import PERM_ASSIGN, PERM_CLOSE, PERM_CONFIRM, PERM_RELEASE, PERM_REPLAY, PERM_REPLAY_NEW, PERM_VIEW_QUEUE

ASSIGNEE_RULE = "an assignee is an active member of the item's tenant who can see the recovery queue"
ASSIGNEE_REFUSED = "no assignable user {name!r}: " + ASSIGNEE_RULE
CLOSE_QUARANTINED_DENIED = (
    "closing a quarantined item is the security role's decision "
    f"(needs {PERM_RELEASE}); a release or a security user's close is the way out"
)

# --- triage ---------------------------------------------------------------------


def assignable_users(tenant_id: int) -> QuerySet:
    """Who may own an item of the tenant: its active members who can see the recovery queue."""
    app_label, codename = PERM_VIEW_QUEUE.split(".")
    grants = (
        Q(is_superuser=True)
        | Q(user_permissions__content_type__app_label=app_label, user_permissions__codename=codename)
        | Q(groups__permissions__content_type__app_label=app_label, groups__permissions__codename=codename)
    )
    users = get_user_model()._default_manager.filter(is_active=True, mailroom_tenants__pk=tenant_id)
    return users.filter(pk__in=users.filter(grants).values("pk")).order_by(get_user_model().USERNAME_FIELD)


def assignable_user(event: InboxEvent, username: str):
    """The assignable user called `username` for the item, or None: whether they exist elsewhere is not said."""
    field = get_user_model().USERNAME_FIELD
    return assignable_users(event.tenant_id).filter(**{field: username}).first()


def do_assign(user, event_id: int, assignee) -> None:
    """Make `assignee` (a user, or None to unassign) the owner of the item."""
    require(user, PERM_ASSIGN)
    event = visible_event(user, event_id)
    if assignee is not None and not assignable_users(event.tenant_id).filter(pk=assignee.pk).exists():
        raise ActionRefused(ASSIGNEE_REFUSED.format(name=assignee.get_username()))
    now = timezone.now()
    with transaction.atomic():
        InboxEvent.objects.filter(pk=event.pk).update(owner=assignee)
        record_audit(
            event.pk,
            kind=AuditKind.ASSIGNED,
            actor=actor_name(user),
            at=now,
            detail={
                "owner": assignee.get_username() if assignee is not None else None,
                "previous_owner": event.owner.get_username() if event.owner_id else None,
            },
        )


def do_assign_to_me(user, event_id: int) -> None:
    do_assign(user, event_id, user)


def do_set_escalation(user, event_id: int, escalate_at) -> None:
    """Set (or clear, with None) the time at which the item is escalated."""
    require(user, PERM_ASSIGN)
    event = visible_event(user, event_id)
    now = timezone.now()
    with transaction.atomic():
        InboxEvent.objects.filter(pk=event.pk).update(escalate_at=escalate_at)
        record_audit(
            event.pk,
            kind=AuditKind.ESCALATION_SET,
            actor=actor_name(user),
            at=now,
            detail={
                "escalate_at": escalate_at.isoformat() if escalate_at else None,
                "previous": event.escalate_at.isoformat() if event.escalate_at else None,
            },
        )


# --- replays ----------------------------------------------------------------------


def do_replay(user, event_id: int) -> str:
    """Send the item on again under its original idempotency key (`replay.replay_same_key`). Returns
    "reopened" (its intent failed/held -> pending), "rerouted" (no intent yet: back to `ready`), "linked"
    (an intent that was ever unknown: the lookup found its ticket, the item is complete, nothing is sent),
    "rejudged" (quarantined and never released: back to validation and the scan) or
    "acknowledgment_reopened" (a completed item's stuck acknowledgment is sent again)."""
    require(user, PERM_REPLAY)
    event = visible_event(user, event_id)
    return refusing(replay.replay_same_key, event.pk, actor=actor_name(user))


def do_correct_and_replay(
    user, event_id: int, *, destination_id=None, queue: str = "", priority: str = "", request_type: str = ""
) -> str:
    """Store the corrected route (destination, queue, priority, request type), then replay with the same key.

    Returns what `do_replay` does, but never "acknowledgment_reopened". On "linked" the corrected route is
    not stored: the lookup found the ticket the first create made, with its original fields, and nothing
    more is sent for it, so a stored override would only make the console show a route that ticket does
    not have. The requested route stays in the `replayed` audit row; correct the ticket in the desk.

    No `destination_id` keeps the current destination: the intent's (`replay_same_key` leaves it), and a
    destination an earlier correction chose stays in the stored route."""
    require(user, PERM_REPLAY)
    event = visible_event(user, event_id)
    destination_id = destination_id or (event.route_override or {}).get("destination_id")
    route = {"destination_id": destination_id, "queue": queue, "priority": priority, "request_type": request_type}
    return refusing(replay.replay_same_key, event.pk, actor=actor_name(user), route=route)


MAX_ADDRESS_CHARS = 320


def requester_address(tenant_id: int, text: str) -> str:
    """The one email address `text` names ("Name <a@b.example>" or "a@b.example"), checked; ActionRefused
    saying what is wrong otherwise. One of the tenant's own mailbox addresses is refused: a ticket for it
    would mail ourselves."""
    text = (text or "").strip()
    if not text:
        raise ActionRefused("enter the requester's email address")
    if len(text) > MAX_ADDRESS_CHARS or any(c in text for c in ",;\r\n"):
        raise ActionRefused("enter one email address, e.g. name@example.com")
    _, address = email.utils.parseaddr(text)
    try:
        validate_email(address)
    except ValidationError:
        raise ActionRefused("that is not a valid email address (name@example.com)") from None
    if address_key(address) in people.own_addresses(tenant_id):
        raise ActionRefused("that is one of this tenant's own mailbox addresses, not a requester")
    return address


def do_enter_requester(user, event_id: int, *, address: str) -> str:
    """Say whom the ticket of an item without a usable sender is for: stored on the event
    (`details["requester_entered"]`, read by `ticketing.people.requester`) with its audit row. Needs the
    replay permission (it decides whom the destination writes to); returns the address."""
    require(user, PERM_REPLAY)
    event = visible_event(user, event_id)
    address = requester_address(event.tenant_id, address)
    now = timezone.now()
    actor = actor_name(user)
    with transaction.atomic():
        locked = InboxEvent.objects.select_for_update().only("pk", "state", "details").get(pk=event.pk)
        if locked.state not in replay.REPLAYABLE_EVENT_STATES:
            raise ActionRefused(f"the event is {locked.state}: its requester is no longer entered here")
        previous = people.entered_requester(locked)
        details = {
            **(locked.details or {}),
            people.REQUESTER_ENTERED: {"address": address, "by": actor, "at": now.isoformat()},
        }
        InboxEvent.objects.filter(pk=locked.pk).update(details=details)
        record_audit(
            locked.pk,
            kind=AuditKind.REQUESTER_ENTERED,
            actor=actor,
            at=now,
            detail={"requester": mask_address(address), "previous": mask_address(previous) if previous else None},
        )
    return address


def do_replay_as_new_action(
    user,
    event_id: int,
    *,
    reason: str,
    destination_id=None,
    queue: str = "",
    priority: str = "",
    request_type: str = "",
) -> Intent:
    """A new action_version with its own key, approved (and recorded as approved) by `user`."""
    require(user, PERM_REPLAY, PERM_REPLAY_NEW)
    if not (reason or "").strip():
        raise ActionRefused("a reason is required to approve a new action")
    event = visible_event(user, event_id)
    route = None
    if destination_id or queue or priority or request_type:
        route = {"destination_id": destination_id, "queue": queue, "priority": priority, "request_type": request_type}
    return refusing(
        replay.replay_as_new_action,
        event.pk,
        actor=actor_name(user),
        approved_by=actor_name(user),
        route=route,
        reason=reason.strip(),
    )


def do_confirm_existing_ticket(
    user, event_id: int, *, ticket_id: str, ticket_url: str = "", destination_id=None
) -> Intent:
    """Complete the item with a ticket the reviewer found. No destination call is made."""
    require(user, PERM_CONFIRM)
    event = visible_event(user, event_id)
    return refusing(
        replay.confirm_existing_ticket,
        event.pk,
        actor=actor_name(user),
        ticket_id=ticket_id,
        ticket_url=ticket_url,
        destination_id=destination_id,
    )


def do_settle_acknowledgment(user, event_id: int, *, note: str = "") -> None:
    """A completed item's held or failed acknowledgment: mark it handled, send no email."""
    require(user, PERM_CONFIRM)
    event = visible_event(user, event_id)
    refusing(replay.settle_acknowledgment, event.pk, actor=actor_name(user), note=note)


def may_close(user, event: InboxEvent) -> bool:
    """A quarantined item is closed by the security role (`PERM_RELEASE`); any other by `PERM_CLOSE`."""
    needed = PERM_RELEASE if event.state == InboxEvent.State.QUARANTINED else PERM_CLOSE
    return user is not None and user.is_active and user.has_perm(needed)


def do_close_not_a_request(user, event_id: int, *, reason: str) -> None:
    """Close the item as not-a-request (suppressed), with a mandatory reason. Nothing is deleted.

    A quarantined item only by the security role; a replay after the close judges it again all the same.
    """
    if user is None or not (user.has_perm(PERM_CLOSE) or user.has_perm(PERM_RELEASE)):
        require(user, PERM_CLOSE)
    event = visible_event(user, event_id)
    if not may_close(user, event):
        if event.state == InboxEvent.State.QUARANTINED:
            raise PermissionDenied(CLOSE_QUARANTINED_DENIED)
        require(user, PERM_CLOSE)
    refusing(
        replay.close_not_a_request,
        event.pk,
        actor=actor_name(user),
        reason=reason,
        may_close_quarantined=user.has_perm(PERM_RELEASE),
    )


def do_release_quarantine(user, event_id: int, *, note: str = "") -> None:
    """Security only: quarantined -> ready, back into the pipeline, with the release recorded on the event."""
    require(user, PERM_RELEASE)
    event = visible_event(user, event_id)
    now = timezone.now()
    actor = actor_name(user)
    with transaction.atomic():
        locked = InboxEvent.objects.select_for_update().only("pk", "state", "reason_code", "details").get(pk=event.pk)
        if locked.state != InboxEvent.State.QUARANTINED:
            raise ActionRefused(f"the event is {locked.state}, not quarantined")
        release = {"by": actor, "at": now.isoformat(), "reason_code": locked.reason_code, "note": note[:500]}
        details = {**(locked.details or {}), "quarantine_release": release}
        if not transition_event(
            locked.pk,
            [InboxEvent.State.QUARANTINED],
            InboxEvent.State.READY,
            actor=actor,
            kind=AuditKind.QUARANTINE_RELEASED,
            detail={"previous_reason": locked.reason_code, "note": note[:500]},
            extra={"details": details, "retry_at": None, "dispatch_count": 1},
        ):
            raise ActionRefused("the event changed meanwhile")
        enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": locked.pk}, now=now)

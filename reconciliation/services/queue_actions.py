"""The recovery queue's actions on one item: triage, replays, confirmation, close, quarantine release.

Each one checks the acting user's permission and tenant (`access`), writes
through the owning app's services (intake.services, ticketing.replay), and
leaves an AuditEvent naming the user ("user:<username>").
"""
from django.db import transaction
from django.utils import timezone

from intake.models import InboxEvent
from intake.services import PROCESS_TOPIC, enqueue_outbox, record_audit, transition_event
from intake.vocabulary import AuditKind
from ticketing import replay
from ticketing.models import Intent

from .access import ActionRefused, actor_name, refusing, require, visible_event
from .roles import PERM_ASSIGN, PERM_CLOSE, PERM_CONFIRM, PERM_RELEASE, PERM_REPLAY, PERM_REPLAY_NEW

# --- triage ---------------------------------------------------------------------

def do_assign(user, event_id: int, assignee) -> None:
    """Make `assignee` (a user, or None to unassign) the owner of the item."""
    require(user, PERM_ASSIGN)
    event = visible_event(user, event_id)
    if assignee is not None:
        member = assignee.is_superuser or event.tenant.members.filter(pk=assignee.pk).exists()
        if not assignee.is_active or not member:
            raise ActionRefused(f"{assignee.get_username()} is not a member of tenant {event.tenant.slug}")
    now = timezone.now()
    with transaction.atomic():
        InboxEvent.objects.filter(pk=event.pk).update(owner=assignee)
        record_audit(event.pk, AuditKind.ASSIGNED, actor=actor_name(user), at=now, detail={
            "owner": assignee.get_username() if assignee is not None else None,
            "previous_owner": event.owner.get_username() if event.owner_id else None})


def do_assign_to_me(user, event_id: int) -> None:
    do_assign(user, event_id, user)


def do_set_escalation(user, event_id: int, escalate_at) -> None:
    """Set (or clear, with None) the time at which the item is escalated."""
    require(user, PERM_ASSIGN)
    event = visible_event(user, event_id)
    now = timezone.now()
    with transaction.atomic():
        InboxEvent.objects.filter(pk=event.pk).update(escalate_at=escalate_at)
        record_audit(event.pk, AuditKind.ESCALATION_SET, actor=actor_name(user), at=now, detail={
            "escalate_at": escalate_at.isoformat() if escalate_at else None,
            "previous": event.escalate_at.isoformat() if event.escalate_at else None})


# --- replays ----------------------------------------------------------------------

def do_replay(user, event_id: int) -> str:
    """Send the item on again under its original idempotency key ("reopened" or "rerouted")."""
    require(user, PERM_REPLAY)
    event = visible_event(user, event_id)
    return refusing(replay.replay_same_key, event.pk, actor=actor_name(user))


def do_correct_and_replay(user, event_id: int, *, destination_id=None, queue: str = "", priority: str = "",
                          request_type: str = "") -> str:
    """Store the corrected route (destination, queue, priority, request type), then replay with the same key."""
    require(user, PERM_REPLAY)
    event = visible_event(user, event_id)
    route = {"destination_id": destination_id, "queue": queue, "priority": priority, "request_type": request_type}
    return refusing(replay.replay_same_key, event.pk, actor=actor_name(user), route=route)


def do_replay_as_new_action(user, event_id: int, *, reason: str, destination_id=None, queue: str = "",
                            priority: str = "", request_type: str = "") -> Intent:
    """A new action_version with its own key, approved (and recorded as approved) by `user`."""
    require(user, PERM_REPLAY, PERM_REPLAY_NEW)
    if not (reason or "").strip():
        raise ActionRefused("a reason is required to approve a new action")
    event = visible_event(user, event_id)
    route = None
    if destination_id or queue or priority or request_type:
        route = {"destination_id": destination_id, "queue": queue, "priority": priority,
                 "request_type": request_type}
    return refusing(replay.replay_as_new_action, event.pk, actor=actor_name(user),
                     approved_by=actor_name(user), route=route, reason=reason.strip())


def do_confirm_existing_ticket(user, event_id: int, *, ticket_id: str, ticket_url: str = "",
                               destination_id=None) -> Intent:
    """Complete the item with a ticket the reviewer found. No destination call is made."""
    require(user, PERM_CONFIRM)
    event = visible_event(user, event_id)
    return refusing(replay.confirm_existing_ticket, event.pk, actor=actor_name(user), ticket_id=ticket_id,
                     ticket_url=ticket_url, destination_id=destination_id)


def do_settle_acknowledgment(user, event_id: int, *, note: str = "") -> None:
    """A completed item's held or failed acknowledgment: mark it handled, send no email."""
    require(user, PERM_CONFIRM)
    event = visible_event(user, event_id)
    refusing(replay.settle_acknowledgment, event.pk, actor=actor_name(user), note=note)


def do_close_not_a_request(user, event_id: int, *, reason: str) -> None:
    """Close the item as not-a-request (suppressed), with a mandatory reason. Nothing is deleted."""
    require(user, PERM_CLOSE)
    event = visible_event(user, event_id)
    refusing(replay.close_not_a_request, event.pk, actor=actor_name(user), reason=reason)


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
        if not transition_event(locked.pk, [InboxEvent.State.QUARANTINED], InboxEvent.State.READY, actor=actor,
                                kind=AuditKind.QUARANTINE_RELEASED,
                                detail={"previous_reason": locked.reason_code, "note": note[:500]},
                                extra={"details": details, "retry_at": None, "dispatch_count": 1}):
            raise ActionRefused("the event changed meanwhile")
        enqueue_outbox(PROCESS_TOPIC, {"inbox_event_id": locked.pk}, now=now)

"""Operational writes that span the apps below (set-up, drills, the recovery queue's actions).

They call those apps' services. The queue's actions (`do_*`) take the acting
user: each checks the user's permission (PermissionDenied: a 403) and tenant
(InboxEvent.DoesNotExist: a 404), refuses what no longer applies
(ActionRefused, nothing written) and leaves an AuditEvent naming the user
("user:<username>"). Roles are groups: see ROLE_PERMISSIONS.
"""
import logging
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from django.apps import apps as global_apps
from django.conf import settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from intake.mime import attachment_payload, parse_message
from intake.models import InboxEvent, Mailbox, Switch, Tenant
from intake.selectors import global_pause_on
from intake.services import PROCESS_TOPIC, enqueue_outbox, record_audit, release_waiting_events, transition_event
from intake.vocabulary import AuditKind
from ticketing import intents as ticketing_intents
from ticketing import replay
from ticketing.models import Destination, Intent

from . import selectors

logger = logging.getLogger(__name__)

DEMO_SECRET_VAR = "MAILROOM_DEMO_WEBHOOK_SECRET"
DEMO_PASSWORD_VAR = "MAILROOM_DEMO_ADMIN_PASSWORD"


def ensure_env_secret(env_file: Path, name: str) -> str:
    """The value of `name` from the environment or `env_file`; generated and appended when missing."""
    value = os.environ.get(name)
    if value:
        return value
    value = secrets.token_urlsafe(24)
    with env_file.open("a") as handle:
        handle.write(f"{name}={value}\n")
    env_file.chmod(0o600)
    os.environ[name] = value
    return value


@transaction.atomic
def do_bootstrap_demo(env_file: Path, admin_username: str = "admin") -> dict:
    """A demo tenant, mailbox `demo`, the built-in default destination and an admin user.

    Secrets go to `env_file` (never the database); running it again changes nothing.
    """
    ensure_env_secret(env_file, DEMO_SECRET_VAR)
    password = ensure_env_secret(env_file, DEMO_PASSWORD_VAR)
    tenant, _ = Tenant.objects.get_or_create(slug="demo", defaults={"name": "Demo"})
    mailbox, _ = Mailbox.objects.get_or_create(slug="demo", defaults={
        "tenant": tenant, "address": "support@demo.mailroom.test", "provider": Mailbox.Provider.RAW,
        "webhook_secret_ref": f"env:{DEMO_SECRET_VAR}", "allowed_recipients": ["support@demo.mailroom.test"],
    })
    Destination.objects.get_or_create(tenant=tenant, slug="builtin", defaults={
        "kind": Destination.Kind.BUILTIN, "is_default": True})
    user_model = get_user_model()
    user = user_model.objects.filter(username=admin_username).first() or user_model(username=admin_username)
    user.is_staff = user.is_superuser = True
    user.set_password(password)
    user.save()
    tenant.members.add(user)
    return {"username": admin_username, "password": password, "mailbox": mailbox.slug}


# =====================================================================================
# The recovery queue's actions. Each one checks the acting user's permission and tenant,
# writes through the owning app's services (intake.services, ticketing.replay), and
# leaves an AuditEvent naming the user ("user:<username>").
# =====================================================================================

PERM_VIEW_QUEUE = "reconciliation.view_recoveryitem"
PERM_ASSIGN = "reconciliation.assign_recoveryitem"
PERM_REPLAY = "reconciliation.replay_recoveryitem"
PERM_CONFIRM = "reconciliation.confirm_recoveryitem"
PERM_CLOSE = "reconciliation.close_recoveryitem"
PERM_REPLAY_NEW = "reconciliation.replay_new_action"
PERM_VIEW_BODY = "intake.view_message_body"
PERM_RELEASE = "intake.release_quarantine"
PERM_PAUSE = "reconciliation.change_pauseswitch"
PERM_GLOBAL_PAUSE = "reconciliation.set_global_pause"

DEFAULT_BULK_REPLAY_CAP = 20

# The roles (DESIGN: operator, security, mailroom-admin) as (app_label, codename) pairs.
# Permissions of models that do not exist yet (routing rules) are skipped until they do:
# run ensure_role_groups() again from the migration that adds them.
ROLE_PERMISSIONS = {
    "operator": [
        ("reconciliation", "view_recoveryitem"),
        ("reconciliation", "assign_recoveryitem"),
        ("reconciliation", "replay_recoveryitem"),
        ("reconciliation", "confirm_recoveryitem"),
        ("reconciliation", "close_recoveryitem"),
    ],
    "security": [
        ("reconciliation", "view_recoveryitem"),
        ("intake", "view_message_body"),
        ("intake", "release_quarantine"),
    ],
    "mailroom-admin": [
        ("intake", "view_mailbox"), ("intake", "add_mailbox"), ("intake", "change_mailbox"),
        ("ticketing", "view_destination"), ("ticketing", "add_destination"), ("ticketing", "change_destination"),
        ("ticketing", "view_routingrule"), ("ticketing", "add_routingrule"), ("ticketing", "change_routingrule"),
        ("ticketing", "delete_routingrule"),
        ("reconciliation", "view_pauseswitch"), ("reconciliation", "change_pauseswitch"),
        ("reconciliation", "set_global_pause"),
    ],
}


def ensure_role_groups(apps=None) -> dict:
    """Create the role groups and give them their permissions (only adds; safe to run again).

    `apps` is a migration's historical registry, or the global one.
    """
    apps = apps or global_apps
    group_model = apps.get_model("auth", "Group")
    permission_model = apps.get_model("auth", "Permission")
    granted = {}
    for name, pairs in ROLE_PERMISSIONS.items():
        group, _ = group_model.objects.get_or_create(name=name)
        wanted = Q()
        for app_label, codename in pairs:
            wanted |= Q(content_type__app_label=app_label, codename=codename)
        permissions = list(permission_model.objects.filter(wanted))
        group.permissions.add(*permissions)
        granted[name] = sorted(f"{p.content_type.app_label}.{p.codename}" for p in permissions)
    return granted


class ActionRefused(Exception):
    """The action does not apply to this item (any more); nothing was written. The message says why."""


def actor_name(user) -> str:
    return f"user:{user.get_username()}"


def _require(user, *perms: str) -> None:
    if user is None or not user.is_active or not all(user.has_perm(p) for p in perms):
        raise PermissionDenied(f"needs {', '.join(perms)}")


def visible_event(user, event_id) -> InboxEvent:
    """The event if it belongs to one of the user's tenants; InboxEvent.DoesNotExist otherwise (a 404)."""
    return selectors.visible_events(user).select_related("mailbox", "tenant", "owner").get(pk=event_id)


def _refusing(call, *args, **kwargs):
    try:
        return call(*args, **kwargs)
    except replay.ReplayRefused as exc:
        raise ActionRefused(str(exc)) from None


# --- triage ---------------------------------------------------------------------

def do_assign(user, event_id: int, assignee) -> None:
    """Make `assignee` (a user, or None to unassign) the owner of the item."""
    _require(user, PERM_ASSIGN)
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
    _require(user, PERM_ASSIGN)
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
    _require(user, PERM_REPLAY)
    event = visible_event(user, event_id)
    return _refusing(replay.replay_same_key, event.pk, actor=actor_name(user))


def do_correct_and_replay(user, event_id: int, *, destination_id=None, queue: str = "", priority: str = "",
                          request_type: str = "") -> str:
    """Store the corrected route (destination, queue, priority, request type), then replay with the same key."""
    _require(user, PERM_REPLAY)
    event = visible_event(user, event_id)
    route = {"destination_id": destination_id, "queue": queue, "priority": priority, "request_type": request_type}
    return _refusing(replay.replay_same_key, event.pk, actor=actor_name(user), route=route)


def do_replay_as_new_action(user, event_id: int, *, reason: str, destination_id=None, queue: str = "",
                            priority: str = "", request_type: str = "") -> Intent:
    """A new action_version with its own key, approved (and recorded as approved) by `user`."""
    _require(user, PERM_REPLAY, PERM_REPLAY_NEW)
    if not (reason or "").strip():
        raise ActionRefused("a reason is required to approve a new action")
    event = visible_event(user, event_id)
    route = None
    if destination_id or queue or priority or request_type:
        route = {"destination_id": destination_id, "queue": queue, "priority": priority,
                 "request_type": request_type}
    return _refusing(replay.replay_as_new_action, event.pk, actor=actor_name(user),
                     approved_by=actor_name(user), route=route, reason=reason.strip())


def do_confirm_existing_ticket(user, event_id: int, *, ticket_id: str, ticket_url: str = "",
                               destination_id=None) -> Intent:
    """Complete the item with a ticket the reviewer found. No destination call is made."""
    _require(user, PERM_CONFIRM)
    event = visible_event(user, event_id)
    return _refusing(replay.confirm_existing_ticket, event.pk, actor=actor_name(user), ticket_id=ticket_id,
                     ticket_url=ticket_url, destination_id=destination_id)


def do_settle_acknowledgment(user, event_id: int, *, note: str = "") -> None:
    """A completed item's held or failed acknowledgment: mark it handled, send no email."""
    _require(user, PERM_CONFIRM)
    event = visible_event(user, event_id)
    _refusing(replay.settle_acknowledgment, event.pk, actor=actor_name(user), note=note)


def do_close_not_a_request(user, event_id: int, *, reason: str) -> None:
    """Close the item as not-a-request (suppressed), with a mandatory reason. Nothing is deleted."""
    _require(user, PERM_CLOSE)
    event = visible_event(user, event_id)
    _refusing(replay.close_not_a_request, event.pk, actor=actor_name(user), reason=reason)


def do_release_quarantine(user, event_id: int, *, note: str = "") -> None:
    """Security only: quarantined -> ready, back into the pipeline, with the release recorded on the event."""
    _require(user, PERM_RELEASE)
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


# --- bodies (security) -------------------------------------------------------------

@dataclass
class BodyView:
    available: bool
    subject: str = ""
    sender: str = ""
    text: str = ""
    attachments: list = field(default_factory=list)


def do_view_message_body(user, event_id: int) -> BodyView:
    """The message text and its attachment list; every view leaves an audit row."""
    _require(user, PERM_VIEW_BODY)
    event = visible_event(user, event_id)
    raw = InboxEvent.objects.filter(pk=event.pk).values_list("raw", flat=True).first()
    record_audit(event.pk, AuditKind.BODY_VIEWED, actor=actor_name(user), detail={"purged": raw is None})
    if raw is None:
        return BodyView(available=False)
    parsed = parse_message(bytes(raw))
    return BodyView(available=True, subject=parsed.subject, sender=parsed.sender, text=parsed.text,
                    attachments=list(parsed.attachments))


def do_download_attachment(user, event_id: int, index: int):
    """(attachment, bytes) of one attachment; audited like a body view."""
    _require(user, PERM_VIEW_BODY)
    event = visible_event(user, event_id)
    raw = InboxEvent.objects.filter(pk=event.pk).values_list("raw", flat=True).first()
    if raw is None:
        raise ActionRefused("the message was purged by retention")
    parsed = parse_message(bytes(raw))
    if not 0 <= index < len(parsed.attachments):
        raise ActionRefused("no such attachment")
    attachment = parsed.attachments[index]
    record_audit(event.pk, AuditKind.ATTACHMENT_DOWNLOADED, actor=actor_name(user), detail={
        "index": index, "sha256": attachment.sha256, "sniffed_type": attachment.sniffed_type})
    return attachment, attachment_payload(parsed, index)


# --- bulk replay ---------------------------------------------------------------------

def bulk_replay_cap() -> int:
    return int(getattr(settings, "MAILROOM_BULK_REPLAY_CAP", DEFAULT_BULK_REPLAY_CAP))


@dataclass
class BulkItem:
    event_id: int
    subject: str
    event_state: str
    intent_state: str
    destination: str
    external_ref: str
    lookup: str
    found_ticket_id: str = ""
    found_ticket_url: str = ""
    lookup_detail: str = ""
    plan: str = "skip"          # confirm, replay, resolve, reroute, skip
    plan_text: str = ""
    outcome: str = ""


def _bulk_plan(event: InboxEvent, intent: Intent | None, found: replay.Lookup) -> tuple[str, str]:
    state = event.state
    if state == InboxEvent.State.QUARANTINED:
        return "skip", "quarantined: only a release (security role) lets it out"
    if state not in replay.REPLAYABLE_EVENT_STATES:
        return "skip", f"{state}: nothing to replay"
    if intent is None:
        return "reroute", "never sent to a destination: back to routing"
    if intent.state not in (Intent.State.FAILED, Intent.State.HELD, Intent.State.UNKNOWN):
        return "skip", f"its intent is {intent.state}"
    if found.status == "found":
        return "confirm", f"the destination has ticket {found.ticket.ticket_id}: link it, no write"
    if intent.state == Intent.State.UNKNOWN:
        if found.status == "not_found":
            return "resolve", "outcome unknown, nothing found: settled by reconciliation's rules"
        return "skip", "outcome unknown and the destination cannot be asked: review it on its own page"
    if found.status == "not_found":
        return "replay", "nothing found: replay with the original idempotency key"
    if intent.state == Intent.State.FAILED:
        return "replay", "a known failure (nothing was written): replay with the original idempotency key"
    return "skip", "held and the destination cannot be asked: review it on its own page"


def _bulk_items(user, event_ids) -> list[tuple[BulkItem, InboxEvent, Intent | None, replay.Lookup]]:
    ids = sorted({int(i) for i in event_ids})
    cap = bulk_replay_cap()
    if not ids:
        raise ActionRefused("select at least one item")
    if len(ids) > cap:
        raise ActionRefused(f"select at most {cap} items for a bulk replay ({len(ids)} selected)")
    events = {e.pk: e for e in selectors.visible_events(user).filter(pk__in=ids)}
    missing = set(ids) - set(events)
    if missing:
        raise InboxEvent.DoesNotExist(f"no visible events {sorted(missing)}")
    rows = []
    for event_id in ids:
        event = events[event_id]
        intent = replay.current_intent(event_id)
        found = replay.lookup_existing(intent) if event.state in replay.REPLAYABLE_EVENT_STATES \
            and intent is not None else replay.Lookup("no_intent" if intent is None else "skipped")
        plan, text = _bulk_plan(event, intent, found)
        item = BulkItem(
            event_id=event_id, subject=event.subject, event_state=event.state,
            intent_state=intent.state if intent else "", destination=intent.destination.slug if intent else "",
            external_ref=intent.external_ref if intent else "", lookup=found.status,
            found_ticket_id=found.ticket.ticket_id if found.ticket else "",
            found_ticket_url=found.ticket.url if found.ticket else "", lookup_detail=found.detail,
            plan=plan, plan_text=text)
        rows.append((item, event, intent, found))
    return rows


def do_bulk_replay_preview(user, event_ids) -> list[BulkItem]:
    """Look each selected item up in its destination by external reference; say what a bulk replay would do."""
    _require(user, PERM_REPLAY, PERM_CONFIRM)
    return [item for item, *_ in _bulk_items(user, event_ids)]


def do_bulk_replay(user, event_ids) -> list[BulkItem]:
    """Look up again (the preview may be stale), then link found tickets and replay the rest with their keys."""
    _require(user, PERM_REPLAY, PERM_CONFIRM)
    actor = actor_name(user)
    done = []
    for item, event, intent, found in _bulk_items(user, event_ids):
        if item.plan != "skip":
            record_audit(event.pk, AuditKind.BULK_LOOKUP, actor=actor, detail={
                "lookup": found.status, "ticket_id": item.found_ticket_id, "plan": item.plan,
                "external_ref": item.external_ref})
        try:
            if item.plan == "confirm":
                replay.confirm_existing_ticket(event.pk, actor=actor, ticket_id=found.ticket.ticket_id,
                                               ticket_url=found.ticket.url)
                item.outcome = f"linked ticket {found.ticket.ticket_id}"
            elif item.plan in ("replay", "reroute"):
                item.outcome = replay.replay_same_key(event.pk, actor=actor)
            elif item.plan == "resolve":
                item.outcome = ticketing_intents.resolve_unknown(intent.pk, actor=actor) or "unchanged"
            else:
                item.outcome = "skipped"
        except replay.ReplayRefused as exc:
            item.outcome = f"refused: {exc}"
        done.append(item)
    return done


# --- pauses -------------------------------------------------------------------------

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
    _require(user, PERM_GLOBAL_PAUSE)
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
    _require(user, PERM_PAUSE)
    mailbox = selectors.visible_mailboxes(user).get(pk=mailbox_id)
    with transaction.atomic():
        Mailbox.objects.filter(pk=mailbox.pk).update(paused=bool(paused))
        _log_change(user, mailbox, f"mailbox {'paused' if paused else 'resumed'}")
    logger.warning("mailbox %s %s by %s", mailbox.slug, "paused" if paused else "resumed", actor_name(user))
    return 0 if paused else _release([mailbox.pk])


def do_set_destination_pause(user, destination_id: int, paused: bool) -> int:
    """Pause or resume one destination of the user's tenants; a resume drains its tenant's backlog."""
    _require(user, PERM_PAUSE)
    destination = selectors.visible_destinations(user).get(pk=destination_id)
    with transaction.atomic():
        Destination.objects.filter(pk=destination.pk).update(paused=bool(paused))
        _log_change(user, destination, f"destination {'paused' if paused else 'resumed'}")
    logger.warning("destination %s %s by %s", destination, "paused" if paused else "resumed", actor_name(user))
    if paused:
        return 0
    return _release(Mailbox.objects.filter(tenant_id=destination.tenant_id, paused=False)
                    .order_by("pk").values_list("pk", flat=True))

"""Roles and permissions: what each console action needs, and the groups that grant it.

The roles are groups created by migration `reconciliation/0002_role_groups`
(`ensure_role_groups`): `operator`, `security`, `mailroom-admin`
(docs/design.md §7 "Recovery console").

Quarantine is the security role's decision: closing or releasing a quarantined item needs
`PERM_RELEASE` (`queue_actions`). Stopping every tenant is the platform's: the global pause needs a
superuser, and no role grants it (`pauses`).
"""

from django.apps import apps as global_apps
from django.db.models import Q

PERM_VIEW_QUEUE = "reconciliation.view_recoveryitem"
PERM_ASSIGN = "reconciliation.assign_recoveryitem"
PERM_REPLAY = "reconciliation.replay_recoveryitem"
PERM_CONFIRM = "reconciliation.confirm_recoveryitem"
PERM_CLOSE = "reconciliation.close_recoveryitem"
PERM_REPLAY_NEW = "reconciliation.replay_new_action"
PERM_VIEW_BODY = "intake.view_message_body"
PERM_RELEASE = "intake.release_quarantine"
PERM_PAUSE = "reconciliation.change_pauseswitch"

# The roles as (app_label, codename) pairs.
# Permissions of models that do not exist yet are skipped until they do: run ensure_role_groups()
# again from the migration that adds them (routing: reconciliation/0003_routing_role_permissions).
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
        ("intake", "view_mailbox"),
        ("intake", "add_mailbox"),
        ("intake", "change_mailbox"),
        ("ticketing", "view_destination"),
        ("ticketing", "add_destination"),
        ("ticketing", "change_destination"),
        ("ticketing", "view_routingrule"),
        ("ticketing", "add_routingrule"),
        ("ticketing", "change_routingrule"),
        ("ticketing", "delete_routingrule"),
        ("ticketing", "view_routingpolicy"),
        ("ticketing", "change_routingpolicy"),
        # Sender block/allow lists (intake.sender_lists): entries are added and removed, never edited.
        ("intake", "view_senderlistentry"),
        ("intake", "add_senderlistentry"),
        ("intake", "delete_senderlistentry"),
        # Acknowledgment templates and business hours (ticketing.ack_admin).
        ("ticketing", "view_acknowledgmenttemplate"),
        ("ticketing", "add_acknowledgmenttemplate"),
        ("ticketing", "change_acknowledgmenttemplate"),
        ("ticketing", "delete_acknowledgmenttemplate"),
        ("ticketing", "view_businesshours"),
        ("ticketing", "add_businesshours"),
        ("ticketing", "change_businesshours"),
        ("ticketing", "delete_businesshours"),
        # A mailbox's connection history (tokens, health, quiet alarms, archive imports): evidence, read only.
        ("intake", "view_mailboxaudit"),
        # Their own tenant's pauses; the global pause is the platform's (superusers: services.pauses).
        ("reconciliation", "view_pauseswitch"),
        ("reconciliation", "change_pauseswitch"),
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

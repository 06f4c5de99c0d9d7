"""Existing installations get the permissions of models added after their role groups were made: the migration
grants them (tests elsewhere call ensure_role_groups() themselves, so only this test shows the migration does)."""

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("reconciliation", "0009_readable_labels")
AFTER = ("reconciliation", "0010_connected_mailbox_role_permissions")
GRANTED = {
    "view_senderlistentry",
    "add_senderlistentry",
    "delete_senderlistentry",
    "view_mailboxaudit",
    "view_acknowledgmenttemplate",
    "change_acknowledgmenttemplate",
    "view_businesshours",
    "change_businesshours",
}


def codenames() -> set[str]:
    group = Group.objects.filter(name="mailroom-admin").first()
    return set(group.permissions.values_list("codename", flat=True)) if group else set()


def test_the_migration_gives_mailroom_admin_the_sender_list_template_and_mailbox_history_permissions():
    executor = MigrationExecutor(connection)
    executor.migrate([BEFORE])
    assert not GRANTED & codenames(), "undone: the permissions are withdrawn"

    executor = MigrationExecutor(connection)
    executor.migrate([AFTER])

    assert GRANTED <= codenames()
    assert "change_senderlistentry" not in codenames(), "entries are added and removed, never edited"

"""Roles as groups: `operator`, `security`, `mailroom-admin` (see reconciliation.services.ROLE_PERMISSIONS).

Permissions are created by a post_migrate signal, after every migration has run;
on a fresh database they do not exist yet here, so they are created first. Any
grant of the delete permission on events, intents, mappings and audit rows is
withdrawn: evidence is never deleted (the admin refuses it too, for everyone).
"""
from django.apps import apps as global_apps
from django.contrib.auth.management import create_permissions
from django.db import migrations

EVIDENCE_DELETE_PERMISSIONS = [
    ("intake", "delete_inboxevent"),
    ("intake", "delete_auditevent"),
    ("ticketing", "delete_intent"),
    ("ticketing", "delete_ticketmapping"),
]


def create_role_groups(apps, schema_editor):
    from reconciliation.services import ensure_role_groups

    for label in ("intake", "ticketing", "reconciliation"):
        create_permissions(global_apps.get_app_config(label), apps=apps, verbosity=0,
                           using=schema_editor.connection.alias)
    ensure_role_groups(apps)
    permission_model = apps.get_model("auth", "Permission")
    for app_label, codename in EVIDENCE_DELETE_PERMISSIONS:
        for permission in permission_model.objects.filter(content_type__app_label=app_label, codename=codename):
            permission.group_set.clear()
            permission.user_set.clear()


def drop_role_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=["operator", "security", "mailroom-admin"]).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("intake", "0002_groundwork_for_validation_channels_and_review"),
        ("ticketing", "0002_groundwork_for_validation_channels_and_review"),
        ("reconciliation", "0001_recovery_queue_and_pauses"),
    ]

    operations = [
        migrations.RunPython(create_role_groups, drop_role_groups),
    ]

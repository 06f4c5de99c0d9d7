"""`mailroom-admin` manages its tenant's sender block/allow lists, acknowledgment templates and business hours, and
reads its mailboxes' connection history. Those models did not exist when the groups were last granted."""
from django.apps import apps as global_apps
from django.contrib.auth.management import create_permissions
from django.db import migrations

MODELS = {"intake": ["senderlistentry", "mailboxaudit"], "ticketing": ["acknowledgmenttemplate", "businesshours"]}


def grant(apps, schema_editor):
    from reconciliation.services import ensure_role_groups

    for label in MODELS:
        create_permissions(global_apps.get_app_config(label), apps=apps, verbosity=0,
                           using=schema_editor.connection.alias)
    ensure_role_groups(apps)


def withdraw(apps, schema_editor):
    group = apps.get_model("auth", "Group").objects.filter(name="mailroom-admin").first()
    if group is None:
        return
    permission = apps.get_model("auth", "Permission")
    for label, models in MODELS.items():
        group.permissions.remove(*permission.objects.filter(content_type__app_label=label,
                                                            content_type__model__in=models))


class Migration(migrations.Migration):

    dependencies = [
        ("reconciliation", "0009_readable_labels"),
        ("intake", "0022_connected_mailboxes_filters_archive"),
        ("ticketing", "0019_acknowledgment_templates"),
    ]

    operations = [
        migrations.RunPython(grant, withdraw),
    ]

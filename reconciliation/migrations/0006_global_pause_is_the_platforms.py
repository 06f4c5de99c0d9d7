"""The global pause stops every tenant, so it is the platform's (superusers only): the
`set_global_pause` permission, which `mailroom-admin` (any tenant's admin) held, is withdrawn and
removed. A tenant's admins pause their own tenant instead (`reconciliation.services.pauses`)."""
from django.db import migrations


def remove_global_pause_permission(apps, schema_editor):
    apps.get_model("auth", "Permission").objects.filter(
        content_type__app_label="reconciliation", codename="set_global_pause").delete()


class Migration(migrations.Migration):

    dependencies = [
        ("reconciliation", "0005_api_tokens"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="pauseswitch",
            options={"default_permissions": ("view", "change"), "verbose_name": "pause",
                     "verbose_name_plural": "pauses"},
        ),
        # Deleting the permission row also drops it from every group and user that held it.
        migrations.RunPython(remove_global_pause_permission, migrations.RunPython.noop),
    ]

"""`mailroom-admin` manages routing: rules (view, add, change, delete) and the tenant's policy (view,
change). The permissions of RoutingRule/RoutingPolicy did not exist when 0002 made the groups."""
from django.apps import apps as global_apps
from django.contrib.auth.management import create_permissions
from django.db import migrations


def grant_routing_permissions(apps, schema_editor):
    from reconciliation.services import ensure_role_groups

    create_permissions(global_apps.get_app_config("ticketing"), apps=apps, verbosity=0,
                       using=schema_editor.connection.alias)
    ensure_role_groups(apps)


def withdraw_routing_permissions(apps, schema_editor):
    group = apps.get_model("auth", "Group").objects.filter(name="mailroom-admin").first()
    if group is not None:
        group.permissions.remove(*apps.get_model("auth", "Permission").objects.filter(
            content_type__app_label="ticketing", content_type__model__in=["routingrule", "routingpolicy"]))


class Migration(migrations.Migration):

    dependencies = [
        ("reconciliation", "0002_role_groups"),
        ("ticketing", "0007_every_tenant_has_a_routing_policy"),
    ]

    operations = [
        migrations.RunPython(grant_routing_permissions, withdraw_routing_permissions),
    ]

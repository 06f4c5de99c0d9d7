from django.db import migrations


def create_policies(apps, schema_editor):
    Tenant = apps.get_model("intake", "Tenant")
    RoutingPolicy = apps.get_model("ticketing", "RoutingPolicy")
    for tenant_id in Tenant.objects.filter(routing_policy__isnull=True).values_list("pk", flat=True):
        RoutingPolicy.objects.create(tenant_id=tenant_id)


class Migration(migrations.Migration):
    dependencies = [("ticketing", "0006_routing_policies_and_rules")]
    operations = [migrations.RunPython(create_policies, migrations.RunPython.noop)]

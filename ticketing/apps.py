from django.apps import AppConfig
from django.db.models.signals import post_save


def _give_new_tenants_a_routing_policy(sender, instance, created, raw=False, **kwargs):
    # A tenant lives in intake, which knows nothing of routing: ticketing attaches its policy here.
    if created and not raw:
        from .models import RoutingPolicy

        RoutingPolicy.objects.get_or_create(tenant=instance)


class TicketingConfig(AppConfig):
    name = "ticketing"
    verbose_name = "Ticketing"

    def ready(self):
        from intake.models import Tenant

        from . import checks  # noqa: F401  (registers the system checks)

        post_save.connect(
            _give_new_tenants_a_routing_policy, sender=Tenant, dispatch_uid="ticketing.routing_policy_for_new_tenants"
        )

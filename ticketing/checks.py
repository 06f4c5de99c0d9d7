"""System checks (`manage.py check`): destination credentials outside their tenant's scope (intake.secrets)."""

from django.core import checks


@checks.register(checks.Tags.security)
def destination_secret_refs(app_configs=None, **kwargs):
    from intake.checks import secret_ref_warnings

    from .models import Destination

    return secret_ref_warnings(Destination.objects.all(), ("credentials_ref",), "destination", "ticketing.W001")

from django.core.management.base import BaseCommand, CommandError

from intake.domains import verified_domains, verify_domain
from intake.models import Tenant


class Command(BaseCommand):
    help = (
        "Give a mail domain to a tenant (a platform operator's act: the shell is the platform), or list the "
        "tenant's verified domains when no domain is named. A domain belongs to one tenant only."
    )

    def add_arguments(self, parser):
        parser.add_argument("tenant", help="the tenant's slug")
        parser.add_argument("domain", nargs="*", help="domains to verify for the tenant")

    def handle(self, *args, **options):
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"no tenant {options['tenant']!r}")
        for domain in options["domain"]:
            try:
                row = verify_domain(tenant=tenant, domain=domain, verified_by="manage.py verify_domain")
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"{row.domain}: verified for {tenant.slug}")
        self.stdout.write(f"{tenant.slug}: {', '.join(verified_domains(tenant)) or 'no verified domains'}")

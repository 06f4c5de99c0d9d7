from django.conf import settings
from django.core.management.base import BaseCommand

from reconciliation.services import do_bootstrap_demo


class Command(BaseCommand):
    help = "Create the demo tenant, mailbox `demo`, the built-in destination and an admin user (idempotent)."

    def handle(self, *args, **options):
        result = do_bootstrap_demo(settings.BASE_DIR / ".env")
        self.stdout.write(f"demo ready: mailbox {result['mailbox']}, admin user {result['username']}")
        if not result["secret_ref_listed"]:
            self.stderr.write("MAILROOM_PLATFORM_SECRET_REFS is set without binding the demo's webhook secret to "
                              "its mailbox: add env:MAILROOM_DEMO_WEBHOOK_SECRET=mailbox:demo, or the demo mailbox's "
                              "webhooks are refused")

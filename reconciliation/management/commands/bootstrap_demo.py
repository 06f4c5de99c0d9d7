import os
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from reconciliation.services import do_bootstrap_demo


class Command(BaseCommand):
    help = (
        "Create the demo tenant, mailbox `demo`, the built-in destination and an admin user (idempotent; the "
        "admin's password is generated once into .env and never reset)."
    )

    def handle(self, *args, **options):
        # The file settings read (MAILROOM_ENV_FILE, default .env in the project root).
        env_file = Path(os.environ.get("MAILROOM_ENV_FILE") or settings.BASE_DIR / ".env")
        result = do_bootstrap_demo(env_file)
        password = "set (kept in .env)" if result["password_set"] else "unchanged"
        self.stdout.write(
            f"demo ready: mailbox {result['mailbox']}, admin user {result['username']}, password {password}"
        )
        if not result["secret_ref_listed"]:
            self.stderr.write(
                "MAILROOM_PLATFORM_SECRET_REFS is set without binding the demo's webhook secret to "
                "its mailbox: add env:MAILROOM_DEMO_WEBHOOK_SECRET=mailbox:demo, or the demo mailbox's "
                "webhooks are refused"
            )

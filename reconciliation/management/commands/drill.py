"""`manage.py drill`: the rehearsal set against a FakeDesk this command starts (reconciliation.drills).

There is no option to name a destination: the drill only ever writes to its own in-process FakeDesk
on 127.0.0.1, in a new scratch tenant. Exit status non-zero when any scenario fails.
"""
import secrets

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.test.utils import override_settings

from fakedesk import DeskClient, FakeDesk
from reconciliation.drills import format_table, run_drill


class Command(BaseCommand):
    help = "Rehearse the failure windows against a FakeDesk started here, in a scratch tenant; non-zero on failure."

    def handle(self, *args, **options):
        # The drill's destination is the FakeDesk started here, on loopback: the egress guard (intake.egress)
        # lets this process reach it, whatever MAILROOM_EGRESS_ALLOWED_NETWORKS says for tenants' URLs.
        allowed = [*settings.MAILROOM_EGRESS_ALLOWED_NETWORKS, "127.0.0.1/32"]
        with FakeDesk(host="127.0.0.1", port=0, token=secrets.token_urlsafe(16)) as server, \
                override_settings(MAILROOM_EGRESS_ALLOWED_NETWORKS=allowed):
            drill, results = run_drill(DeskClient(server.url, token=server.token))
        self.stdout.write(format_table(results))
        self.stdout.write(f"\nscratch tenant {drill.slug} (mailbox {drill.mailbox.slug}, destination "
                          f"{drill.destination}) is kept as evidence; its mailbox and destination are now paused.")
        failed = [r.scenario.name for r in results if not r.passed]
        if failed:
            raise CommandError(f"drill failed: {', '.join(failed)}")
        self.stdout.write(self.style.SUCCESS(f"drill passed: {len(results)} scenarios"))

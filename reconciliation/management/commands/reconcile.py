"""`manage.py reconcile [--mailbox SLUG] [--destination [TENANT/]SLUG]`: one reconciliation pass now.

Prints one summary line per reconciler and scope (scanned, findings, repaired, error). Without
options every mailbox and destination and the outbox are reconciled, as the beat task does (a drill's
scratch tenant never is). Exits non-zero when a reconciler failed.
"""

from django.core.management.base import BaseCommand, CommandError

from reconciliation.reconcilers import reconcile, select


class Command(BaseCommand):
    help = "Run one reconciliation pass now (provider, unmapped, destination, outbox) and print a summary."

    def add_arguments(self, parser):
        parser.add_argument("--mailbox", metavar="SLUG", help="only this mailbox (provider and unmapped)")
        parser.add_argument("--destination", metavar="[TENANT/]SLUG", help="only this destination")

    def handle(self, *args, mailbox=None, destination=None, **options):
        mailboxes, destinations, _ = select(mailbox, destination)
        if mailbox and not mailboxes:
            raise CommandError(f"no mailbox {mailbox!r}")
        if destination and not destinations:
            raise CommandError(f"no destination {destination!r}")
        summaries = reconcile(mailbox=mailbox, destination=destination)
        for summary in summaries:
            self.stdout.write(summary.line())
        failed = [s for s in summaries if s.error]
        if failed:  # a monitor or a cron job sees it in the exit status, not only in the text
            raise CommandError(
                f"{len(failed)} reconciler(s) failed: "
                f"{', '.join(f'{s.kind} {s.scope}' for s in failed)}; see the lines above"
            )

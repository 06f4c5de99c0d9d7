"""`manage.py drill [--keep] [--report PATH]`: the rehearsal set against a FakeDesk this command starts
(reconciliation.drills); `manage.py drill --discard SLUG`: remove a kept scratch tenant.

There is no option to name a destination: the drill only ever writes to its own in-process FakeDesk
on 127.0.0.1, in a new scratch tenant that the live workers, sweeps, reconcilers and /metrics leave alone.
Afterwards the tenant and everything it made are deleted, unless --keep. The table printed and the JSON
report written are the evidence. Exit status non-zero when any scenario (or the clean-up) fails.
"""

import secrets

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.test.utils import override_settings

from fakedesk import DeskClient, FakeDesk
from reconciliation.drills import format_table, run_drill
from reconciliation.drills.cleanup import NotADrillTenant, discard
from reconciliation.drills.report import write_report


def _rows(deleted: dict[str, int]) -> str:
    return ", ".join(f"{label.rpartition('.')[2].lower()} {n}" for label, n in sorted(deleted.items()))


class Command(BaseCommand):
    help = (
        "Rehearse the failure windows against a FakeDesk started here, in a scratch tenant that is deleted "
        "afterwards (--keep: kept as evidence); non-zero on failure."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--keep",
            action="store_true",
            help="keep the scratch tenant and its rows as evidence (mailbox and destination paused)",
        )
        parser.add_argument(
            "--report",
            metavar="PATH",
            help="where to write the JSON report (default: MAILROOM_VAR_DIR/drill/<slug>.json)",
        )
        parser.add_argument(
            "--discard",
            metavar="SLUG",
            dest="discard_slug",
            help="delete a kept drill tenant and everything in it, then exit (runs no drill)",
        )

    def handle(self, *args, keep=False, report=None, discard_slug=None, **options):
        if discard_slug:
            if keep or report:
                raise CommandError("--discard runs no drill: it takes neither --keep nor --report")
            return self._discard(discard_slug)
        # The drill's destination is the FakeDesk started here, on loopback: the egress guard (intake.egress)
        # lets this process reach it, whatever MAILROOM_EGRESS_ALLOWED_NETWORKS says for tenants' URLs.
        allowed = [*settings.MAILROOM_EGRESS_ALLOWED_NETWORKS, "127.0.0.1/32"]
        with (
            FakeDesk(host="127.0.0.1", port=0, token=secrets.token_urlsafe(16)) as server,
            override_settings(MAILROOM_EGRESS_ALLOWED_NETWORKS=allowed),
        ):
            run = run_drill(DeskClient(server.url, token=server.token), keep=keep)
        self.stdout.write(format_table(run.results))
        if run.cleanup_error:
            self.stdout.write(
                f"\nscratch tenant {run.slug}: clean-up failed ({run.cleanup_error}); the live paths "
                f"still leave it alone. Remove it with `manage.py drill --discard {run.slug}`."
            )
        elif keep:
            self.stdout.write(
                f"\nscratch tenant {run.slug} (mailbox {run.mailbox}, destination {run.destination}) "
                f"is kept as evidence (--keep); its mailbox and destination are now paused. Remove it "
                f"with `manage.py drill --discard {run.slug}`."
            )
        else:
            self.stdout.write(
                f"\nscratch tenant {run.slug} discarded with everything it made ({_rows(run.discarded)})."
            )
        try:
            path = write_report(run, report)
        except OSError as exc:
            raise CommandError(f"could not write the drill report: {exc}") from None
        self.stdout.write(f"report: {path}")
        if run.failed or run.cleanup_error:
            raise CommandError(f"drill failed: {', '.join(run.failed or ['clean-up'])}")
        self.stdout.write(self.style.SUCCESS(f"drill passed: {len(run.results)} scenarios"))

    def _discard(self, slug: str) -> None:
        try:
            deleted = discard(slug=slug)
        except NotADrillTenant as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"drill tenant {slug} discarded ({_rows(deleted)}).")

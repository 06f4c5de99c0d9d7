from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from intake import archive
from intake.channels import polling
from intake.models import Mailbox
from intake.vocabulary import SystemActor


class Command(BaseCommand):
    help = (
        "Import a mailbox's mail received before a cut-off date as history (no acknowledgments; tickets "
        "closed or none), then live. The import runs in the mailbox's polls; --now polls until it is done."
    )

    def add_arguments(self, parser):
        parser.add_argument("mailbox", help="the mailbox's slug")
        parser.add_argument("--before", required=True, help="the cut-off, YYYY-MM-DD (the start of that day)")
        parser.add_argument(
            "--tickets",
            required=True,
            choices=archive.TICKET_CHOICES,
            help="none: events only; closed: a closed ticket per message",
        )
        parser.add_argument("--now", action="store_true", help="poll now, until the import is finished")

    def handle(self, *args, **options):
        mailbox = Mailbox.objects.select_related("tenant").filter(slug=options["mailbox"]).first()
        if mailbox is None:
            raise CommandError(f"no mailbox {options['mailbox']!r}")
        try:
            before = archive.cutoff_from_date(options["before"])
        except ValueError:
            raise CommandError("--before takes a date, YYYY-MM-DD") from None
        try:
            archive.start_archive_import(
                mailbox=mailbox, before=before, tickets=options["tickets"], actor=SystemActor.MANAGE_PY
            )
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        self.stdout.write(
            f"mailbox {mailbox.slug}: archive import of mail before {before:%Y-%m-%d %H:%M %Z} "
            f"started (tickets: {options['tickets']})"
        )
        if not options["now"]:
            self.stdout.write("the next polls import it; `manage.py archive_import ... --now` polls at once")
            return
        stored, cursor = 0, None
        while True:
            report = polling.poll_mailbox(mailbox.pk, trigger=polling.MANUAL)
            if report.status != "ok":
                raise CommandError(f"mailbox {mailbox.slug}: {report.status}: {report.detail}")
            stored += report.new
            done = Mailbox.objects.filter(pk=mailbox.pk).values_list("archive_done_at", flat=True).first()
            if done is not None and not report.more:
                break
            if report.cursor == cursor:  # a poll that moved nothing: never loop forever
                raise CommandError(f"mailbox {mailbox.slug}: the import made no progress; see its health")
            cursor = report.cursor
        self.stdout.write(f"mailbox {mailbox.slug}: archive import finished, {stored} new events")

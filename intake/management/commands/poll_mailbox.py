from django.core.management.base import BaseCommand, CommandError

from intake.channels import polling
from intake.logging import mask_address
from intake.models import Mailbox


class Command(BaseCommand):
    help = "Poll one mailbox now (even while it backs off) and print what was ingested."

    def add_arguments(self, parser):
        parser.add_argument("mailbox", help="the mailbox's slug")
        parser.add_argument("--batch-size", type=int, default=None, help="messages per batch (this poll only)")
        parser.add_argument("--max-batches", type=int, default=None, help="batches in this poll at most")

    def handle(self, *args, **options):
        mailbox = Mailbox.objects.filter(slug=options["mailbox"]).first()
        if mailbox is None:
            raise CommandError(f"no mailbox {options['mailbox']!r}")
        report = polling.poll_mailbox(
            mailbox.pk, trigger=polling.MANUAL, batch_size=options["batch_size"], max_batches=options["max_batches"]
        )
        for message in report.messages:
            label = "duplicate" if message.duplicate else "new"
            self.stdout.write(
                f"{label:9} event {message.inbox_event_id}  {message.size} bytes  "
                f"{mask_address(message.provider_message_id)}"
            )
        summary = (
            f"mailbox {mailbox.slug}: {report.status}, {report.new} new, {report.duplicates} duplicate, "
            f"{report.batches} batch(es)"
        )
        if report.more:
            summary += "; more waiting (a follow-up poll was queued)"
        if report.status != "ok":
            raise CommandError(f"{summary}: {report.detail}")
        self.stdout.write(summary)

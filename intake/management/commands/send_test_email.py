import os
import uuid
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime

import requests
from django.core.management.base import BaseCommand, CommandError

from intake.models import Mailbox
from intake.secrets import SecretUnavailable, resolve_secret
from intake.signing import signed_headers


def sample_message(to: str, subject: str, sender: str = "customer@example.com") -> bytes:
    message = EmailMessage()
    message["From"] = f"A Customer <{sender}>"
    message["To"] = to
    message["Subject"] = subject
    message["Date"] = format_datetime(datetime.now(UTC))
    message["Message-ID"] = f"<{uuid.uuid4()}@sample.mailroom.test>"
    message.set_content("Hello,\n\nmy printer is on fire again. Could you have a look?\n\nThanks\n")
    return message.as_bytes()


class Command(BaseCommand):
    help = "Send a sample email, signed with the v2 scheme, to a raw mailbox's webhook and print the answer."

    def add_arguments(self, parser):
        parser.add_argument("mailbox")
        parser.add_argument(
            "--url",
            default=f"http://127.0.0.1:{os.environ.get('PORT', '8000')}",
            help="where Mailroom's web process listens",
        )
        parser.add_argument("--subject", default="Sample request from Mailroom")
        parser.add_argument("--count", type=int, default=1)

    def handle(self, *args, **options):
        mailbox = Mailbox.objects.filter(slug=options["mailbox"]).first()
        if mailbox is None:
            raise CommandError(f"no mailbox {options['mailbox']!r}")
        if mailbox.provider != Mailbox.Provider.RAW:
            raise CommandError(
                f"mailbox {mailbox.slug!r} is a {mailbox.provider} mailbox: only a raw mailbox takes the raw webhook"
            )
        try:
            secret = resolve_secret(mailbox.webhook_secret_ref, tenant=mailbox.tenant, owner=mailbox)
        except SecretUnavailable as exc:
            raise CommandError(f"mailbox secret: {exc}") from None
        endpoint = f"{options['url'].rstrip('/')}/webhooks/raw/{mailbox.slug}/"
        for n in range(options["count"]):
            subject = options["subject"] if options["count"] == 1 else f"{options['subject']} #{n + 1}"
            body = sample_message(mailbox.address, subject)
            response = requests.post(
                endpoint,
                data=body,
                headers={**signed_headers(secret, body), "Content-Type": "message/rfc822"},
                timeout=10,
            )
            self.stdout.write(f"{response.status_code} {response.text}")
            if response.status_code >= 300:
                raise CommandError("the webhook did not accept the message")

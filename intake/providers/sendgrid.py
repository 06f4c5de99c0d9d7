"""SendGrid Inbound Parse, verified by HTTP basic auth.

Configure the Parse setting with "POST the raw, full MIME message" and the URL
`https://<user>:<password>@<host>/webhooks/sendgrid/<slug>/`;
`Mailbox.webhook_secret_ref` resolves to `<user>:<password>`. The message is
the multipart field `email`, taken as bytes exactly as posted.
"""

from intake.keys import provider_message_id_for_raw
from intake.secrets import resolve_secret

from .base import FetchedMessage, PermanentError, Provider, WebhookResult
from .inbound import FormError, check_basic_auth, parse_form


class SendgridProvider(Provider):
    name = "sendgrid"
    supports_webhook = True
    supports_polling = False

    def handle_webhook(self, request, body: bytes) -> WebhookResult:
        check_basic_auth(
            request, resolve_secret(self.mailbox.webhook_secret_ref, tenant=self.mailbox.tenant, owner=self.mailbox)
        )
        try:
            fields = parse_form(request.META.get("CONTENT_TYPE", ""), body)
        except FormError as exc:
            raise PermanentError("malformed", str(exc)) from None
        raw = fields.get("email")
        if not raw:
            raise PermanentError("malformed", "no 'email' field: turn on 'POST the raw, full MIME message'")
        return WebhookResult(messages=[FetchedMessage(provider_message_id_for_raw(raw), raw)])

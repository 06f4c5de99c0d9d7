"""Provider adapters, one module per provider. `provider_for` picks the one a mailbox needs."""
from importlib import import_module

from .base import Provider

_PROVIDERS = {
    "imap": "intake.providers.imap.ImapProvider",
    "gmail": "intake.providers.gmail.GmailProvider",
    "graph": "intake.providers.graph.GraphProvider",
    "mailgun": "intake.providers.mailgun.MailgunProvider",
    "postmark": "intake.providers.postmark.PostmarkProvider",
    "sendgrid": "intake.providers.sendgrid.SendgridProvider",
    "ses": "intake.providers.ses.SesProvider",
}


def provider_class(name: str) -> type[Provider]:
    path = _PROVIDERS.get(name)
    if path is None:
        raise LookupError(f"no provider {name!r}")
    module_name, class_name = path.rsplit(".", 1)
    return getattr(import_module(module_name), class_name)


def provider_for(mailbox) -> Provider:
    return provider_class(mailbox.provider)(mailbox)

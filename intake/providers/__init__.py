"""Provider adapters, one module per provider. `provider_for` picks the one a mailbox needs;
`endpoint_errors` checks the hosts and URLs a mailbox's settings name against the egress guard."""

from importlib import import_module

from intake.egress import IMAP_PORTS, host_problem, url_problem

from .base import Provider

# The one list of provider adapters; every `Mailbox.Provider` but `raw` (the signed raw webhook needs none) has
# one, and every provider has a settings schema (tests/test_registries.py).
PROVIDERS = {
    "imap": "intake.providers.imap.ImapProvider",
    "gmail": "intake.providers.gmail.GmailProvider",
    "graph": "intake.providers.graph.GraphProvider",
    "mailgun": "intake.providers.mailgun.MailgunProvider",
    "postmark": "intake.providers.postmark.PostmarkProvider",
    "sendgrid": "intake.providers.sendgrid.SendgridProvider",
    "ses": "intake.providers.ses.SesProvider",
}


def provider_class(name: str) -> type[Provider]:
    path = PROVIDERS.get(name)
    if path is None:
        raise LookupError(f"no provider {name!r}")
    module_name, class_name = path.rsplit(".", 1)
    return getattr(import_module(module_name), class_name)


def provider_for(mailbox) -> Provider:
    return provider_class(mailbox.provider)(mailbox)


# The `Mailbox.settings` that name a URL we call, per provider (IMAP's host and port are checked apart).
ENDPOINT_SETTINGS = {
    "imap": ("token_url",),
    "gmail": ("api_base", "token_url", "jwks_url"),
    "graph": ("api_base", "token_url"),
    "mailgun": ("api_base",),
    "ses": ("s3_endpoint_url",),
}


def endpoint_errors(provider: str, settings) -> dict[str, list[str]]:
    """{"settings": [messages]} for the hosts and URLs of a mailbox's settings the egress guard refuses
    (intake.egress), checked without DNS: saving never waits on a resolver; every connection is checked again
    when it is made. {} when they are fine."""
    settings = settings if isinstance(settings, dict) else {}
    problems = []
    if provider == "imap" and settings.get("host"):
        use_ssl = bool(settings.get("ssl", True))
        port = settings.get("port") or (993 if use_ssl else 143)
        try:
            port = int(port)
        except (TypeError, ValueError):
            problems.append(f"port: {port!r} is not a port")
        else:
            problems.append(host_problem(str(settings["host"]), port, purpose="host", ports=IMAP_PORTS))
    for name in ENDPOINT_SETTINGS.get(provider, ()):
        value = settings.get(name)
        if value not in (None, ""):
            problems.append(url_problem(str(value), purpose=name))
    problems = [problem for problem in problems if problem]
    return {"settings": problems} if problems else {}

"""IMAP mailboxes on a real Dovecot: a Dovecot user with a Support folder and the Mailroom mailbox polling it."""

import uuid

from intake.channels.polling import poll_mailbox
from intake.models import Mailbox, PollCursor
from intake.secrets import env_prefix

FOLDER = "Support"


class ImapBox:
    """A Dovecot user with a `Support` folder, and the Mailroom mailbox that polls it."""

    def __init__(self, server, mailbox, username, password, password_var):
        self.server, self.mailbox = server, mailbox
        self.username, self.password, self.password_var = username, password, password_var

    def client(self):
        return self.server.client(self.username, self.password)

    def append(self, messages, when=None):
        with self.client() as client:
            if not client.folder_exists(FOLDER):
                client.create_folder(FOLDER)
            for raw in messages:
                client.append(FOLDER, raw, msg_time=when)

    def server_state(self):
        """(UIDVALIDITY, {uid: flags}) as the server sees the folder, read with EXAMINE."""
        with self.client() as client:
            status = client.select_folder(FOLDER, readonly=True)
            uids = client.search("ALL")
            flags = client.fetch(uids, ["FLAGS"]) if uids else {}
        return status[b"UIDVALIDITY"], {uid: data[b"FLAGS"] for uid, data in flags.items()}

    def poll(self, **kwargs):
        return poll_mailbox(self.mailbox.pk, **kwargs)

    def cursor(self):
        return PollCursor.objects.filter(mailbox=self.mailbox).values_list("value", flat=True).first()


def make_imap_box(server, tenant, monkeypatch, slug="imap-support", **settings) -> ImapBox:
    username, password = server.add_user()
    password_var = f"{env_prefix(tenant.slug)}IMAP_PASSWORD_{uuid.uuid4().hex[:8].upper()}"  # tenant-scoped
    monkeypatch.setenv(password_var, password)
    mailbox = Mailbox.objects.create(
        tenant=tenant,
        slug=slug,
        address=username,
        provider="imap",
        poll_enabled=True,
        credentials_ref=f"env:{password_var}",
        webhook_secret_ref="env:MAILROOM_TEST_WEBHOOK_SECRET",
        settings={
            "host": "127.0.0.1",
            "port": server.port,
            "ssl": False,
            "username": username,
            "folder": FOLDER,
            **settings,
        },
    )
    return ImapBox(server, mailbox, username, password, password_var)

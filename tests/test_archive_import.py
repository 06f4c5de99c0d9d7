"""Archive import against a real Dovecot (tests/dovecot.py), FakeGoogle and FakeGraph over real HTTP: mail
before the cut-off is history, then live.

Every message here is written as a mail client writes it (Date, Message-ID, MIME-Version, a plain and an
HTML part) and carries our MTA's Authentication-Results (tests.senderauth), so each one *would* be
acknowledged if it were live mail: history is never acknowledged because it is history.
"""

import io
import json
import time
import uuid
from datetime import UTC, timedelta
from email.message import EmailMessage
from email.utils import format_datetime

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from intake import archive
from intake.channels.polling import MANUAL, poll_mailbox
from intake.models import AuditEvent, InboxEvent, Mailbox, MailboxAudit
from intake.secrets import env_prefix
from reconciliation.models import Finding
from reconciliation.reconcilers import reconcile
from reconciliation.selectors import recovery_queue
from tests.dovecot import dovecot  # noqa: F401  (fixture)
from tests.factories import make_desk_destination, make_destination, make_mailbox, make_tenant
from tests.senderauth import stamped, trust_our_mta
from tests.smtp import smtp_server  # noqa: F401  (fixture)
from ticketing import acknowledgments, intents
from ticketing.models import Intent, Ticket, TicketMapping
from ticketing.services import process_inbox_event
from ticketing.tasks import process_inbox_events

FOLDER = "INBOX"
pytestmark = pytest.mark.usefixtures("scanner_off")


def client_message(n: int, when, sender="jane@example.com", subject=None) -> bytes:
    """What a mail client sends (plain + HTML alternative), as our MTA hands it on (authenticated)."""
    message = EmailMessage()
    message["From"] = f"Jane Doe <{sender}>"
    message["To"] = "support@acme.test"
    message["Subject"] = subject or f"Order {n}: the printer jams again"
    message["Date"] = format_datetime(when)
    message["Message-ID"] = f"<{uuid.uuid4()}@mail.example.com>"
    message["MIME-Version"] = "1.0"
    message.set_content(f"Hello,\n\norder {n} jams on page two.\n\nJane\n")
    message.add_alternative(f"<p>Hello,</p><p>order {n} jams on page two.</p><p>Jane</p>", subtype="html")
    return stamped(message.as_bytes())


class Box:
    """A Dovecot user and the IMAP mailbox of tenant acme that polls its INBOX."""

    def __init__(self, server, mailbox, username, password):
        self.server, self.mailbox, self.username, self.password = server, mailbox, username, password

    def append(self, messages):
        """[(raw, internal date)] through MULTIAPPEND, as a migration tool would put old mail in."""
        with self.server.client(self.username, self.password) as client:
            for start in range(0, len(messages), 500):
                client.multiappend(FOLDER, [{"msg": raw, "date": when} for raw, when in messages[start : start + 500]])

    def poll_until_imported(self, limit=100) -> int:
        polls = 0
        while polls < limit:
            polls += 1
            report = poll_mailbox(self.mailbox.pk, trigger=MANUAL)
            assert report.status == "ok", report.detail
            self.mailbox.refresh_from_db()
            if self.mailbox.archive_done_at is not None and not report.more:
                return polls
        pytest.fail("the archive import never finished")

    def process_all(self):
        """The pipeline in-process, in the relay's groups, over every open event of the mailbox."""
        ids = list(
            InboxEvent.objects.filter(mailbox=self.mailbox, state__in=InboxEvent.OPEN_STATES)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        for start in range(0, len(ids), 100):
            process_inbox_events(ids[start : start + 100])

    def events(self, **filters):
        return InboxEvent.objects.filter(mailbox=self.mailbox, **filters)


@pytest.fixture
def box(dovecot, tenant, monkeypatch):  # noqa: F811
    username, password = dovecot.add_user()
    variable = f"{env_prefix(tenant.slug)}IMAP_PASSWORD_{uuid.uuid4().hex[:8].upper()}"
    monkeypatch.setenv(variable, password)
    make_destination(tenant)
    mailbox = Mailbox.objects.create(
        tenant=tenant,
        slug="archive-support",
        address=username,
        provider="imap",
        poll_enabled=True,
        credentials_ref=f"env:{variable}",
        settings={"host": "127.0.0.1", "port": dovecot.port, "ssl": False, "username": username, "folder": FOLDER},
    )
    trust_our_mta(mailbox)
    return Box(dovecot, mailbox, username, password)


def acknowledge_all(smtp_server) -> int:  # noqa: F811
    sent = 0
    for intent_id in Intent.objects.filter(action=Intent.Action.NOTIFY_REQUESTER, state="pending").values_list(
        "pk", flat=True
    ):
        sent += acknowledgments.send(intent_id, "worker-test") == "sent"
    return sent


def nothing_missing(mailbox, settings) -> list:
    """The reconcilers over a window that holds the history too: the findings they opened."""
    settings.MAILROOM_RECONCILE_WINDOW_DAYS = 120
    settings.MAILROOM_RECONCILE_GRACE_SECONDS = 0
    settings.MAILROOM_RECONCILE_LIMIT = 10_000
    summaries = reconcile(mailbox=mailbox.slug)
    assert all(not s.error for s in summaries), [s.line() for s in summaries]
    return list(Finding.objects.filter(kind__in=[Finding.Kind.MISSING_FROM_INBOX, "unmapped"]))


def test_two_thousand_archived_messages_become_history_without_tickets_or_acknowledgments_then_mail_is_live(
    box, smtp_server, settings
):  # noqa: F811
    now = timezone.now()
    cutoff = now - timedelta(days=3)
    # Older than the sync window (7 days) too: the import takes them anyway.
    history = [
        (client_message(n, now - timedelta(days=40, minutes=n)), now - timedelta(days=40, minutes=n))
        for n in range(2000)
    ]
    recent = [
        (client_message(9000 + n, now - timedelta(days=1, minutes=n)), now - timedelta(days=1, minutes=n))
        for n in range(3)
    ]
    box.append(history + recent)
    archive.start_archive_import(mailbox=box.mailbox, before=cutoff, tickets="none", actor="user:admin")

    started = time.monotonic()
    polls = box.poll_until_imported()
    fetched = time.monotonic()
    box.process_all()
    processed = time.monotonic()
    print(
        f"\n2,000 archived messages: fetched in {fetched - started:.1f} s ({polls} polls), "
        f"processed in {processed - fetched:.1f} s"
    )

    assert box.events(history=True).count() == 2000
    assert box.events(history=True, state="suppressed", reason_code="archived").count() == 2000
    assert (
        AuditEvent.objects.filter(
            inbox_event__mailbox=box.mailbox, inbox_event__history=True, kind="suppressed", detail__reason="archived"
        ).count()
        == 2000
    )
    assert not TicketMapping.objects.filter(inbox_event__history=True).exists()
    # The mail after the cut-off was ticketed and acknowledged as usual, from the start.
    live = box.events(history=False)
    assert live.count() == 3 and set(live.values_list("state", flat=True)) == {"completed"}
    assert Ticket.objects.count() == 3
    assert acknowledge_all(smtp_server) == 3 and len(smtp_server.messages) == 3
    assert not Intent.objects.filter(action=Intent.Action.NOTIFY_REQUESTER, inbox_event__history=True).exists()
    assert not AuditEvent.objects.filter(inbox_event__history=True, kind="acknowledged").exists()
    box.mailbox.refresh_from_db()
    assert box.mailbox.archive_done_at is not None
    finished = MailboxAudit.objects.get(mailbox=box.mailbox, kind="archive_import_finished")
    assert finished.detail["history_events"] == 2000 and finished.actor == "system:poll"
    assert MailboxAudit.objects.filter(mailbox=box.mailbox, kind="archive_import_started").count() == 1

    # Live from now on: new mail is ticketed and acknowledged as usual.
    box.append([(client_message(1, timezone.now(), subject="New: the scanner is offline"), timezone.now())])
    report = poll_mailbox(box.mailbox.pk, trigger=MANUAL)
    assert (report.status, report.new) == ("ok", 1)
    box.process_all()
    new = box.events(subject="New: the scanner is offline").get()
    assert (new.history, new.state) == (False, "completed")
    assert acknowledge_all(smtp_server) == 1
    assert smtp_server.messages[-1]["Subject"].endswith("Re: New: the scanner is offline")

    # Stored and accounted for: the reconcilers find nothing missing, nothing is stuck or queued.
    assert nothing_missing(box.mailbox, settings) == []
    assert not recovery_queue().filter(mailbox=box.mailbox).exists()
    assert box.events(state__in=InboxEvent.OPEN_STATES).count() == 0


def test_archive_with_closed_tickets_makes_a_closed_ticket_per_message_and_acknowledges_none(
    box, smtp_server, settings
):  # noqa: F811
    now = timezone.now()
    # One sender, fifty messages at once: the sender rate limit holds floods back, not an archive.
    history = [
        (client_message(n, now - timedelta(days=20, hours=n)), now - timedelta(days=20, hours=n)) for n in range(50)
    ]
    box.append(history)
    archive.start_archive_import(
        mailbox=box.mailbox, before=now - timedelta(days=10), tickets="closed", actor="user:admin"
    )
    box.poll_until_imported()
    box.process_all()

    assert box.events(history=True, state="completed").count() == 50
    tickets = Ticket.objects.filter(destination__tenant=box.mailbox.tenant)
    assert tickets.count() == 50 and set(tickets.values_list("status", flat=True)) == {"solved"}
    assert all("mailroom-archived" in t.tags for t in tickets)
    assert not Intent.objects.filter(action=Intent.Action.NOTIFY_REQUESTER).exists()
    assert AuditEvent.objects.filter(kind="acknowledgment_skipped", detail__reason="archived").count() == 50

    box.append([(client_message(1, timezone.now(), subject="Live: toner empty"), timezone.now())])
    poll_mailbox(box.mailbox.pk, trigger=MANUAL)
    box.process_all()
    live = box.events(subject="Live: toner empty").get()
    assert live.state == "completed" and not live.history
    ticket = Ticket.objects.get(pk=int(TicketMapping.objects.get(inbox_event=live).ticket_id))
    assert ticket.status == "new" and "mailroom-archived" not in ticket.tags
    assert acknowledge_all(smtp_server) == 1
    assert nothing_missing(box.mailbox, settings) == []


def test_archive_history_for_zendesk_is_imported_closed_and_dated_and_a_lost_answer_makes_one_ticket(
    box, desk, monkeypatch, smtp_server
):  # noqa: F811
    make_desk_destination(box.mailbox.tenant, desk, monkeypatch)
    now = timezone.now().replace(microsecond=0)
    written = {f"Order {n}: the printer jams again": now - timedelta(days=20, hours=n) for n in range(3)}
    box.append([(client_message(n, when), when) for n, when in enumerate(written.values())])
    archive.start_archive_import(
        mailbox=box.mailbox, before=now - timedelta(days=10), tickets="closed", actor="user:admin"
    )
    # Zendesk documents its Idempotency-Key for the Tickets API, not for imports: this desk ignores it, and
    # the answer to the first import is lost after the ticket was made.
    desk.set_idempotency(enabled=False)
    desk.set_plan(["drop_after_commit"])
    box.poll_until_imported()
    box.process_all()
    [unknown] = Intent.objects.filter(state="unknown")
    assert intents.resolve_unknown(unknown.pk) == "pending"  # the key is trusted: the import is tried again
    assert process_inbox_event(unknown.inbox_event_id) == "created"  # ...and the lookup finds the ticket

    tickets = desk.tickets()
    assert sorted(t["subject"] for t in tickets) == sorted(written)
    assert {t["status"] for t in tickets} == {"closed"}
    assert {t["subject"]: t["fields"]["created_at"] for t in tickets} == {
        subject: f"{when.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}" for subject, when in written.items()
    }
    assert [(e["path"], e["committed"]) for e in desk.requests_log()] == [("/api/v2/imports/tickets", True)] * 3
    assert box.events(history=True, state="completed").count() == 3
    assert not Intent.objects.filter(action=Intent.Action.NOTIFY_REQUESTER).exists()

    box.append([(client_message(1, timezone.now(), subject="Live: toner empty"), timezone.now())])
    poll_mailbox(box.mailbox.pk, trigger=MANUAL)
    box.process_all()
    [live] = [t for t in desk.tickets() if t["subject"] == "Live: toner empty"]
    assert live["status"] == "new" and "created_at" not in live["fields"]
    assert desk.requests_log()[-1]["path"] == "/api/v2/tickets.json"


def test_the_reconciler_running_before_the_import_stores_old_mail_as_history_too(box, settings):
    now = timezone.now()
    box.append([(client_message(n, now - timedelta(days=30)), now - timedelta(days=30)) for n in range(5)])
    archive.start_archive_import(
        mailbox=box.mailbox, before=now - timedelta(days=2), tickets="none", actor="user:admin"
    )
    settings.MAILROOM_RECONCILE_WINDOW_DAYS = 60
    settings.MAILROOM_RECONCILE_GRACE_SECONDS = 0
    reconcile(mailbox=box.mailbox.slug)  # finds them "missing" and stores them
    assert box.events(history=True).count() == 5
    box.poll_until_imported()  # the scan then fetches them again: duplicates
    box.process_all()
    assert box.events().count() == 5
    assert box.events(state="suppressed", reason_code="archived").count() == 5
    assert not Intent.objects.exists()


def test_an_import_started_on_a_live_mailbox_takes_the_old_mail_it_never_fetched(box):
    now = timezone.now()
    box.append([(client_message(1, now - timedelta(hours=1), subject="Yesterday"), now - timedelta(hours=1))])
    assert poll_mailbox(box.mailbox.pk, trigger=MANUAL).new == 1  # live: the sync window only
    box.append([(client_message(n, now - timedelta(days=90)), now - timedelta(days=90)) for n in range(7)])
    archive.start_archive_import(
        mailbox=box.mailbox, before=now - timedelta(days=1), tickets="none", actor="user:admin"
    )
    reports = []
    while not reports or reports[-1].more:
        reports.append(poll_mailbox(box.mailbox.pk, trigger=MANUAL))
    assert sum(r.new for r in reports) == 7 and sum(r.duplicates for r in reports) == 0  # each fetched once
    box.process_all()
    assert box.events(history=True, reason_code="archived").count() == 7
    assert box.events(history=False).get().subject == "Yesterday"


def test_a_second_import_with_a_later_cutoff_takes_the_mail_the_first_left_out(box):
    now = timezone.now()
    ninety, thirty = now - timedelta(days=90), now - timedelta(days=30)
    box.append(
        [(client_message(n, ninety), ninety) for n in range(4)]
        + [(client_message(10 + n, thirty), thirty) for n in range(3)]
    )
    archive.start_archive_import(
        mailbox=box.mailbox, before=now - timedelta(days=60), tickets="none", actor="user:admin"
    )
    box.poll_until_imported()
    # After the cut-off but older than the sync window: neither history nor live, as without an import.
    assert box.events().count() == 4
    archive.start_archive_import(
        mailbox=box.mailbox, before=now - timedelta(days=10), tickets="none", actor="user:admin"
    )
    box.poll_until_imported()
    assert box.events(history=True).count() == 7 and box.events().count() == 7
    assert MailboxAudit.objects.filter(mailbox=box.mailbox, kind="archive_import_finished").count() == 2


def test_manage_py_archive_import_starts_the_import_and_polls_it_to_the_end(box):
    now = timezone.now()
    box.append([(client_message(n, now - timedelta(days=15)), now - timedelta(days=15)) for n in range(12)])
    out = io.StringIO()
    day = (now - timedelta(days=2)).date().isoformat()
    call_command("archive_import", box.mailbox.slug, "--before", day, "--tickets", "none", "--now", stdout=out)
    assert "archive import finished, 12 new events" in out.getvalue()
    box.mailbox.refresh_from_db()
    assert box.mailbox.archive_tickets == "none" and box.mailbox.archive_done_at is not None
    assert box.mailbox.archive_before == archive.cutoff_from_date(day)
    started = MailboxAudit.objects.get(mailbox=box.mailbox, kind="archive_import_started")
    assert started.actor == "system:manage.py" and started.detail["tickets"] == "none"


def test_starting_an_import_is_refused_for_another_tenants_admin_a_future_cutoff_and_unknown_choices(
    box, django_user_model
):
    from django.contrib.auth.models import Permission

    other = make_tenant(slug="globex", domains=("globex.test",))
    outsider = django_user_model.objects.create_user("olga", password="x", is_staff=True)
    outsider.user_permissions.add(Permission.objects.get(codename="change_mailbox"))
    other.members.add(outsider)
    with pytest.raises(PermissionDenied):
        archive.start_archive_import(
            mailbox=box.mailbox, before=timezone.now(), tickets="none", actor="user:olga", user=outsider
        )
    with pytest.raises(ValidationError):
        archive.start_archive_import(
            mailbox=box.mailbox, before=timezone.now() + timedelta(days=1), tickets="none", actor="user:admin"
        )
    with pytest.raises(ValidationError):
        archive.start_archive_import(mailbox=box.mailbox, before=timezone.now(), tickets="open", actor="user:a")
    raw = make_mailbox(box.mailbox.tenant, slug="webhook-box", address="hooks@acme.test")
    with pytest.raises(ValidationError):
        archive.start_archive_import(mailbox=raw, before=timezone.now(), tickets="none", actor="user:admin")
    box.mailbox.refresh_from_db()
    assert box.mailbox.archive_before is None and not MailboxAudit.objects.exists()


def mailbox_form(box, **changes) -> dict:
    mailbox = box.mailbox
    data = {
        "tenant": mailbox.tenant_id,
        "slug": mailbox.slug,
        "address": mailbox.address,
        "provider": "imap",
        "webhook_secret_ref": "",
        "credentials_ref": mailbox.credentials_ref,
        "allowed_recipients": "",
        "poll_enabled": "on",
        "settings": json.dumps(mailbox.settings),
        "archive_before_0": "",
        "archive_before_1": "",
        "archive_tickets": "",
    }
    data.update(changes)
    return data


def test_the_mailbox_page_starts_an_import_as_its_admin_and_refuses_a_future_cutoff(box):
    from tests.support.users import make_user

    ann = make_user("ann", groups=["mailroom-admin"], tenants=[box.mailbox.tenant])
    page = Client()
    page.force_login(ann)
    url = f"/admin/intake/mailbox/{box.mailbox.pk}/change/"
    later = timezone.localtime() + timedelta(days=2)
    refused = page.post(
        url,
        mailbox_form(box, archive_before_0=f"{later:%Y-%m-%d}", archive_before_1="00:00:00", archive_tickets="none"),
    )
    assert refused.status_code == 200 and b"the cut-off must not be in the future" in refused.content
    saved = page.post(
        url, mailbox_form(box, archive_before_0="2026-01-31", archive_before_1="00:00:00", archive_tickets="closed")
    )
    assert saved.status_code == 302, saved.content[:3000]
    box.mailbox.refresh_from_db()
    assert box.mailbox.archive_before == archive.cutoff_from_date("2026-01-31")
    assert (box.mailbox.archive_tickets, box.mailbox.archive_done_at) == ("closed", None)
    started = MailboxAudit.objects.get(mailbox=box.mailbox, kind="archive_import_started")
    assert started.actor == "user:ann" and started.detail["tickets"] == "closed"
    assert page.get(url).status_code == 200
    # Saving the page again without touching the import starts nothing new.
    again = page.post(
        url, mailbox_form(box, archive_before_0="2026-01-31", archive_before_1="00:00:00", archive_tickets="closed")
    )
    assert again.status_code == 302
    assert MailboxAudit.objects.filter(mailbox=box.mailbox, kind="archive_import_started").count() == 1


def imported_without_tickets(mailbox, *, old, recent) -> "Box":
    """Poll an API mailbox until its archive import finishes and process it: the old messages are history without
    tickets, the recent ones ticketed, none acknowledged as history."""
    box = Box(None, mailbox, "", "")
    box.poll_until_imported()
    box.process_all()
    assert sorted(box.events(history=True).values_list("provider_message_id", flat=True)) == sorted(old)
    assert box.events(history=True, state="suppressed", reason_code="archived").count() == 25
    assert sorted(box.events(history=False, state="completed").values_list("provider_message_id", flat=True)) == sorted(
        recent
    )
    assert not Intent.objects.filter(action=Intent.Action.NOTIFY_REQUESTER, inbox_event__history=True).exists()
    return box


def test_a_gmail_mailbox_imports_its_archive_through_the_api_then_is_live(tenant, monkeypatch):
    from tests.fake_google import FakeGoogle

    google = FakeGoogle().start()
    try:
        variable = f"{env_prefix(tenant.slug)}GMAIL_ARCHIVE_CREDENTIALS"  # tenant-scoped
        monkeypatch.setenv(
            variable, json.dumps({"refresh_token": google.refresh_token, "client_secret": google.client_secret})
        )
        make_destination(tenant)
        mailbox = Mailbox.objects.create(
            tenant=tenant,
            slug="archive-gmail",
            address="support@acme.test",
            provider="gmail",
            poll_enabled=True,
            credentials_ref=f"env:{variable}",
            settings={
                "api_base": google.url,
                "token_url": f"{google.url}/token",
                "client_id": google.client_id,
                "page_size": 10,
                "resync_days": 7,
            },
        )
        now = timezone.now()
        old = [
            google.add_message(client_message(n, now - timedelta(days=40)), age_days=40 + n / 100) for n in range(25)
        ]
        recent = [google.add_message(client_message(100 + n, now - timedelta(days=1)), age_days=1) for n in range(2)]
        archive.start_archive_import(
            mailbox=mailbox, before=now - timedelta(days=3), tickets="none", actor="user:admin"
        )
        box = imported_without_tickets(mailbox, old=old, recent=recent)
        assert MailboxAudit.objects.get(mailbox=mailbox, kind="archive_import_finished").detail["history_events"] == 25

        live = google.add_message(client_message(7, timezone.now(), subject="Live via Gmail"))
        poll_mailbox(mailbox.pk, trigger=MANUAL)
        box.process_all()
        assert box.events(provider_message_id=live, history=False, state="completed").exists()
    finally:
        google.stop()


def test_a_graph_mailbox_imports_its_archive_through_the_api_then_is_live(tenant, monkeypatch, settings):
    from tests.fake_graph import FakeGraph

    graph = FakeGraph().start()
    try:
        variable = f"{env_prefix(tenant.slug)}GRAPH_ARCHIVE_CREDENTIALS"  # tenant-scoped
        monkeypatch.setenv(variable, json.dumps({"client_secret": graph.client_secret}))
        make_destination(tenant)
        mailbox = Mailbox.objects.create(
            tenant=tenant,
            slug="archive-graph",
            address="support@acme.test",
            provider="graph",
            poll_enabled=True,
            credentials_ref=f"env:{variable}",
            settings={
                "api_base": graph.api_base,
                "token_url": graph.token_url,
                "client_id": graph.client_id,
                "tenant_id": graph.tenant,
                "user": graph.user,
                "folder": "inbox",
                "page_size": 10,
            },
        )
        now = timezone.now()
        old = [graph.add_message(client_message(n, now - timedelta(days=40)), age_days=40 + n / 100) for n in range(25)]
        recent = [graph.add_message(client_message(100 + n, now - timedelta(days=1)), age_days=1) for n in range(2)]
        archive.start_archive_import(
            mailbox=mailbox, before=now - timedelta(days=3), tickets="none", actor="user:admin"
        )
        box = imported_without_tickets(mailbox, old=old, recent=recent)

        live = graph.add_message(client_message(7, timezone.now(), subject="Live via Graph"))
        poll_mailbox(mailbox.pk, trigger=MANUAL)
        box.process_all()
        assert box.events(provider_message_id=live, history=False, state="completed").exists()
        assert nothing_missing(mailbox, settings) == []
    finally:
        graph.stop()

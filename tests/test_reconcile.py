"""Reconciliation (reconciliation.reconcilers, `manage.py reconcile`).

A message the IMAP server (real Dovecot) has and we lost is ingested once and recorded as a
repaired `missing_from_inbox`; a FakeDesk ticket carrying our external reference and no mapping is
adopted through the intents' door; a stuck open event becomes `unmapped`, shows in the recovery
queue and is settled once it completes; a mapping whose ticket is gone is `ticket_missing`; a stuck
outbox row; the command's output. Each second pass finds nothing new.
"""

import io
import json
from datetime import timedelta

import pytest
import requests
from django.core.management import CommandError, call_command
from django.utils import timezone

from intake.channels.polling import poll_mailbox
from intake.models import AuditEvent, InboxEvent, Mailbox, OutboxMessage
from reconciliation.models import Finding, ReconciliationRun
from reconciliation.reconcilers import reconcile
from reconciliation.selectors import recovery_queue
from tests.conftest import WEBHOOK_SECRET
from tests.dovecot import dovecot  # noqa: F401  (fixture)
from tests.factories import make_desk_destination, make_event
from tests.fake_google import FakeGoogle
from tests.mail import make_message
from tests.support.gmail import make_raw
from tests.support.imap import make_imap_box
from ticketing import intents
from ticketing.models import Intent, Ticket, TicketMapping
from ticketing.services import process_inbox_event

pytestmark = pytest.mark.usefixtures("scanner_off")


def by_kind(summaries) -> dict:
    return {(s.kind, s.scope): s for s in summaries}


def counts(summary) -> tuple:
    return summary.scanned, summary.findings, summary.repaired, summary.error


# --- provider ↔ inbox events (IMAP, real Dovecot) -----------------------------------------------------


def test_a_message_lost_behind_our_back_is_ingested_once_and_recorded(dovecot, tenant, monkeypatch):  # noqa: F811
    monkeypatch.setenv("MAILROOM_TEST_WEBHOOK_SECRET", WEBHOOK_SECRET)
    box = make_imap_box(dovecot, tenant, monkeypatch)
    messages = [make_message(subject=f"Request {n}") for n in range(3)]
    box.append(messages, when=timezone.now() - timedelta(hours=1))  # older than the grace period
    assert box.poll().new == 3
    lost = InboxEvent.objects.filter(mailbox=box.mailbox).order_by("pk")[1]
    lost_id, lost_fingerprint = lost.provider_message_id, lost.fingerprint
    # Behind the system's back: the row (and its audit trail) simply disappears.
    AuditEvent.objects.filter(inbox_event=lost).delete()
    InboxEvent.objects.filter(pk=lost.pk).delete()

    first = by_kind(reconcile(mailbox=box.mailbox.slug))[("provider", box.mailbox.slug)]
    assert counts(first) == (3, 1, 1, "")
    stored = InboxEvent.objects.get(mailbox=box.mailbox, provider_message_id=lost_id)
    assert (stored.state, stored.source, stored.fingerprint) == ("received", "imap", lost_fingerprint)
    finding = Finding.objects.get(kind="missing_from_inbox")
    assert finding.object == f"mailbox:{box.mailbox.pk}:{lost_id}"
    assert (finding.resolution, finding.inbox_event_id) == ("ingested", stored.pk) and finding.resolved_at

    second = by_kind(reconcile(mailbox=box.mailbox.slug))[("provider", box.mailbox.slug)]
    assert counts(second) == (3, 0, 0, "")
    assert InboxEvent.objects.filter(mailbox=box.mailbox).count() == 3
    assert Finding.objects.filter(kind="missing_from_inbox").count() == 1
    runs = ReconciliationRun.objects.filter(kind="provider", scope=box.mailbox.slug).order_by("pk")
    assert [(r.scanned, r.findings, r.repaired, r.cursor) for r in runs] == [(3, 1, 1, {}), (3, 0, 0, {})]
    assert all(r.finished_at for r in runs)


def test_a_bounded_pass_resumes_where_it_stopped(dovecot, tenant, monkeypatch, settings):  # noqa: F811
    monkeypatch.setenv("MAILROOM_TEST_WEBHOOK_SECRET", WEBHOOK_SECRET)
    settings.MAILROOM_RECONCILE_LIMIT = 2
    box = make_imap_box(dovecot, tenant, monkeypatch, slug="imap-bounded")
    box.append([make_message(subject=f"Request {n}") for n in range(5)], when=timezone.now() - timedelta(hours=1))

    passes = [by_kind(reconcile(mailbox=box.mailbox.slug))[("provider", box.mailbox.slug)] for _ in range(4)]
    assert [(s.scanned, s.repaired, s.more) for s in passes] == [
        (2, 2, True),
        (2, 2, True),
        (1, 1, False),
        (2, 0, True),
    ]
    assert InboxEvent.objects.filter(mailbox=box.mailbox).count() == 5


# --- destination ↔ mappings -------------------------------------------------------------------------


def _desk_ticket(desk, external_id: str) -> str:
    response = requests.post(
        f"{desk.url}/api/v2/tickets.json",
        auth=desk.auth,
        timeout=5,
        json={
            "ticket": {"subject": "made, but never recorded", "comment": {"body": "hello"}, "external_id": external_id}
        },
    )
    response.raise_for_status()
    return str(response.json()["ticket"]["id"])


def test_a_desk_ticket_with_our_reference_and_no_mapping_is_adopted(desk, mailbox, monkeypatch):
    destination = make_desk_destination(mailbox.tenant, desk, monkeypatch)
    event = make_event(mailbox)
    intent = intents.ensure_intent(event, Intent.Action.CREATE_TICKET, destination)
    ticket_id = _desk_ticket(desk, intent.external_ref)  # the create happened; its answer was lost
    stranger = _desk_ticket(desk, "mailroom-" + "f" * 40)  # our prefix, but no intent of ours

    scope = f"destination:{mailbox.tenant.slug}/desk"
    first = by_kind(reconcile(destination="desk"))[("destination", scope)]
    assert counts(first) == (3, 2, 1, "")  # 2 records, then the adopted mapping checked
    intent.refresh_from_db()
    event.refresh_from_db()
    mapping = TicketMapping.objects.get(inbox_event=event, action="create_ticket")
    assert (intent.state, intent.result_ref, mapping.ticket_id, event.state) == (
        "succeeded",
        ticket_id,
        ticket_id,
        "completed",
    )
    assert event.audit_events.filter(kind="ticket_created", actor="system:reconcile").count() == 1
    adopted = Finding.objects.get(object=f"destination:{destination.pk}:ticket:{ticket_id}")
    assert (adopted.kind, adopted.resolution, adopted.inbox_event_id) == ("orphan_in_destination", "adopted", event.pk)
    held = Finding.objects.get(object=f"destination:{destination.pk}:ticket:{stranger}")
    assert held.resolved_at is None and held.detail["held"] == "no_intent"

    second = by_kind(reconcile(destination=f"{mailbox.tenant.slug}/desk"))[("destination", scope)]
    assert counts(second) == (3, 1, 0, "")  # 2 records + 1 mapping in the window; the stranger is still held
    assert Finding.objects.filter(kind="orphan_in_destination").count() == 2
    assert TicketMapping.objects.filter(inbox_event=event).count() == 1
    assert len(desk.tickets()) == 2, "reconciliation never writes to the destination"


def test_a_mapping_whose_ticket_is_gone_is_ticket_missing(mailbox):
    event = make_event(mailbox)
    assert process_inbox_event(event.pk)
    mapping = TicketMapping.objects.get(inbox_event=event)
    Ticket.objects.filter(pk=int(mapping.ticket_id)).delete()  # behind the system's back

    scope = f"destination:{mailbox.tenant.slug}/builtin"
    first = by_kind(reconcile(destination="builtin"))[("destination", scope)]
    assert (first.findings, first.repaired) == (1, 0)
    finding = Finding.objects.get(kind="ticket_missing")
    assert (finding.object, finding.inbox_event_id, finding.resolved_at) == (f"mapping:{mapping.pk}", event.pk, None)
    reconcile(destination="builtin")
    assert Finding.objects.filter(kind="ticket_missing").count() == 1, "one open finding, not one per pass"


# --- inbox events ↔ mappings --------------------------------------------------------------------------


def test_a_stuck_event_is_unmapped_in_the_queue_and_settles_when_it_completes(mailbox):
    mailbox.tenant.settings = {"unmapped_after_minutes": 20}
    mailbox.tenant.save()
    stuck, fresh = make_event(mailbox), make_event(mailbox)
    InboxEvent.objects.filter(pk=stuck.pk).update(received_at=timezone.now() - timedelta(minutes=25))
    InboxEvent.objects.filter(pk=fresh.pk).update(received_at=timezone.now() - timedelta(minutes=15))

    first = by_kind(reconcile(mailbox=mailbox.slug))[("unmapped", mailbox.slug)]
    assert (first.scanned, first.findings) == (1, 1)
    finding = Finding.objects.get(kind="unmapped")
    assert (finding.object, finding.inbox_event_id, finding.detail["state"]) == (
        f"event:{stuck.pk}",
        stuck.pk,
        "received",
    )
    assert list(recovery_queue().values_list("pk", flat=True)) == [stuck.pk]
    again = by_kind(reconcile(mailbox=mailbox.slug))[("unmapped", mailbox.slug)]
    assert again.findings == 1 and Finding.objects.filter(kind="unmapped").count() == 1

    assert process_inbox_event(stuck.pk)
    stuck.refresh_from_db()
    assert stuck.state == "completed"
    settled = by_kind(reconcile(mailbox=mailbox.slug))[("unmapped", mailbox.slug)]
    assert settled.findings == 0
    finding.refresh_from_db()
    assert finding.resolution == "completed" and finding.resolved_at
    assert not recovery_queue().exists()


# --- outbox -------------------------------------------------------------------------------------------


def test_an_outbox_row_unpublished_too_long_is_stuck_until_published(db):
    OutboxMessage.objects.all().delete()
    old = OutboxMessage.objects.create(
        topic="inbox_event.process", payload={"x": 1}, created_at=timezone.now() - timedelta(minutes=10)
    )
    OutboxMessage.objects.create(topic="inbox_event.process", payload={"x": 2}, created_at=timezone.now())

    first = by_kind(reconcile())[("outbox", "(all)")]
    assert (first.scanned, first.findings) == (1, 1)
    finding = Finding.objects.get(kind="outbox_stuck")
    assert finding.object == f"outbox:{old.pk}" and finding.detail["age_seconds"] >= 600

    OutboxMessage.objects.filter(pk=old.pk).update(published_at=timezone.now())
    second = by_kind(reconcile())[("outbox", "(all)")]
    assert second.findings == 0
    finding.refresh_from_db()
    assert finding.resolution == "published"


# --- the command --------------------------------------------------------------------------------------


def test_the_command_prints_one_line_per_reconciler(mailbox):
    out = io.StringIO()
    call_command("reconcile", "--mailbox", mailbox.slug, "--destination", "builtin", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines == [
        "provider     support: skipped (provider raw has no listing)",
        "unmapped     support: scanned 0, findings 0, repaired 0",
        "destination  destination:acme/builtin: scanned 0, findings 0, repaired 0",
    ]
    assert ReconciliationRun.objects.filter(scope="support", kind="unmapped").exists()
    with pytest.raises(CommandError, match="no mailbox"):
        call_command("reconcile", "--mailbox", "nope", stdout=io.StringIO())


# --- an API provider: Gmail (FakeGoogle) ---------------------------------------------------------------


def test_gmail_listing_finds_and_ingests_a_lost_message(tenant, monkeypatch):
    google = FakeGoogle().start()
    try:
        monkeypatch.setenv(
            "GMAIL_TEST_CREDENTIALS",
            json.dumps({"refresh_token": google.refresh_token, "client_secret": google.client_secret}),
        )
        mailbox = Mailbox.objects.create(
            tenant=tenant,
            slug="support-gmail",
            address="support@acme.test",
            provider="gmail",
            credentials_ref="env:GMAIL_TEST_CREDENTIALS",
            settings={
                "api_base": google.url,
                "token_url": f"{google.url}/token",
                "client_id": google.client_id,
                "page_size": 2,
            },
        )
        ids = [google.add_message(make_raw(n), age_days=0.5) for n in range(3)]
        assert poll_mailbox(mailbox.pk, trigger="manual").new == 3
        lost = InboxEvent.objects.get(mailbox=mailbox, provider_message_id=ids[1])
        AuditEvent.objects.filter(inbox_event=lost).delete()
        lost.delete()

        first = by_kind(reconcile(mailbox="support-gmail"))[("provider", "support-gmail")]
        assert counts(first) == (3, 1, 1, "")
        assert InboxEvent.objects.filter(mailbox=mailbox, provider_message_id=ids[1]).count() == 1
        second = by_kind(reconcile(mailbox="support-gmail"))[("provider", "support-gmail")]
        assert counts(second) == (3, 0, 0, "")
        listing = [r for r in google.requests if r["method"] == "GET" and r["path"].endswith("/messages")][-1]
        query = listing["query"]["q"][0]
        assert query.startswith("after:") and " before:" in query, query
    finally:
        google.stop()


def test_beat_runs_the_pass_and_old_empty_runs_are_purged(db, settings):
    from reconciliation.reconcilers.base import purge_runs

    assert settings.CELERY_BEAT_SCHEDULE["reconcile"]["task"] == "reconciliation.tasks.reconcile"
    long_ago = timezone.now() - timedelta(days=40)
    empty = ReconciliationRun.objects.create(kind="outbox", scope="(all)", started_at=long_ago)
    kept = ReconciliationRun.objects.create(kind="outbox", scope="(all)", started_at=long_ago)
    Finding.objects.create(run=kept, kind="outbox_stuck", object="outbox:1", first_seen=long_ago, last_seen=long_ago)
    recent = ReconciliationRun.objects.create(kind="outbox", scope="(all)", started_at=timezone.now())
    assert purge_runs() == 1
    assert set(ReconciliationRun.objects.values_list("pk", flat=True)) == {kept.pk, recent.pk}
    assert not ReconciliationRun.objects.filter(pk=empty.pk).exists()

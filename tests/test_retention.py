"""Retention (intake.retention): raw bodies go after their age, the evidence stays, holds and open work are kept."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from intake import retention
from intake.models import AuditEvent, InboxEvent
from intake.services import transition_event
from intake.vocabulary import AuditKind, ReasonCode
from tests.factories import make_event
from ticketing.models import Intent, TicketMapping
from ticketing.services import process_inbox_event

pytestmark = pytest.mark.django_db(transaction=True)


def aged(event_id, days):
    InboxEvent.objects.filter(pk=event_id).update(received_at=timezone.now() - timedelta(days=days))


def completed(mailbox, days, **fields):
    event = make_event(mailbox, **fields)
    process_inbox_event(event.pk)
    assert InboxEvent.objects.get(pk=event.pk).state == InboxEvent.State.COMPLETED
    aged(event.pk, days)
    return event.pk


def in_state(mailbox, days, state, reason):
    event = make_event(mailbox)
    assert transition_event(event.pk, [InboxEvent.State.RECEIVED], state, actor="test", kind=None, reason_code=reason)
    aged(event.pk, days)
    return event.pk


def body(event_id):
    return InboxEvent.objects.values_list("raw", flat=True).get(pk=event_id)


def test_purges_bodies_past_their_age_and_keeps_the_evidence(mailbox, scanner_off):
    old = completed(mailbox, 91)
    young = completed(mailbox, 89)
    kinds_before = list(AuditEvent.objects.filter(inbox_event_id=old).values_list("kind", flat=True))
    mapping = TicketMapping.objects.get(inbox_event_id=old)

    result = retention.purge_expired_bodies()

    event = InboxEvent.objects.get(pk=old)
    assert event.raw is None and event.purged_at is not None
    assert event.state == InboxEvent.State.COMPLETED and event.subject and event.sender and event.size
    assert TicketMapping.objects.get(inbox_event_id=old) == mapping
    kinds_after = list(
        AuditEvent.objects.filter(inbox_event_id=old).order_by("at", "pk").values_list("kind", flat=True)
    )
    assert kinds_after[: len(kinds_before)] == kinds_before and kinds_after[-1] == AuditKind.PURGED
    assert body(young) is not None
    # The run audits itself: one `purged` row per purged event, all naming the run.
    purged = AuditEvent.objects.get(inbox_event_id=old, kind=AuditKind.PURGED)
    assert purged.actor == "retention" and purged.detail == {"run": result["run"], "retention_days": 90}
    assert result["purged"] == 1 and result["tenants"] == {"acme": 1}

    # A second run finds nothing more and writes nothing.
    assert retention.purge_expired_bodies()["purged"] == 0
    assert AuditEvent.objects.filter(kind=AuditKind.PURGED).count() == 1


def test_skips_legal_holds_open_events_and_the_recovery_queue(mailbox, scanner_off):
    held = completed(mailbox, 200)
    assert retention.set_legal_hold(held, True, actor="user:legal", note="case 42")
    open_event = make_event(mailbox).pk
    aged(open_event, 200)
    review = in_state(mailbox, 200, InboxEvent.State.AWAITING_REVIEW, ReasonCode.NO_DESTINATION)
    suppressed = in_state(mailbox, 200, InboxEvent.State.SUPPRESSED, ReasonCode.AUTO_SUBMITTED)
    # A completed event with a held intent is in the recovery queue too.
    held_intent = completed(mailbox, 200)
    Intent.objects.filter(inbox_event_id=held_intent).update(state=Intent.State.HELD)

    assert retention.purge_expired_bodies()["purged"] == 1
    assert body(suppressed) is None
    for kept in (held, open_event, review, held_intent):
        assert body(kept) is not None, kept
    assert AuditEvent.objects.filter(inbox_event_id=held, kind=AuditKind.LEGAL_HOLD_SET).exists()

    # Released, the held body goes on the next run.
    assert retention.set_legal_hold(held, False, actor="user:legal")
    assert retention.purge_expired_bodies()["purged"] == 1 and body(held) is None


def test_tenant_override_and_bounded_batches(mailbox, scanner_off):
    ids = [completed(mailbox, 40) for _ in range(5)]
    assert retention.purge_expired_bodies()["purged"] == 0  # 40 days < the default 90
    mailbox.tenant.settings = {"raw_retention_days": 30}
    mailbox.tenant.save()
    first = retention.purge_expired_bodies(batch_size=2, max_batches=2)
    assert first["purged"] == 4 and first["batches"] == 2
    assert retention.purge_expired_bodies(batch_size=2, max_batches=2)["purged"] == 1
    assert all(body(pk) is None for pk in ids)


def test_the_console_shows_purged_by_retention_with_the_date(client, mailbox, scanner_off):
    event_id = completed(mailbox, 100)
    retention.purge_expired_bodies()
    day = f"{InboxEvent.objects.get(pk=event_id).purged_at:%Y-%m-%d}"
    client.force_login(get_user_model().objects.create_superuser("root", "root@staff.test", "pw-9f8e7d6c5b"))

    detail = client.get(f"/admin/reconciliation/recoveryitem/{event_id}/change/").content.decode()
    assert "purged by retention on " + day in detail
    page = client.get(f"/admin/reconciliation/recoveryitem/{event_id}/body/").content.decode()
    assert 'id="body-purged"' in page and "purged by retention on " + day in page
    admin_page = client.get(f"/admin/intake/inboxevent/{event_id}/change/").content.decode()
    assert "purged by retention on " + day in admin_page

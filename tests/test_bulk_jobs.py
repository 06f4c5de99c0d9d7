"""Bulk work over the queue's filter: a flood of 200 items closed as one background job.

The services (`reconciliation.services.bulk_jobs`) on PostgreSQL: the filter decides what is touched,
every item gets its own audit rows, quarantined items stay with the security role, permissions are the
service's, and a job whose worker died mid-way resumes from its cursor without acting twice; then the
pages through Django's test client. The real processes (a Celery worker, Chromium, the embedded
default on SQLite) are in tests/test_bulk_jobs_live.py.
"""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from intake.models import AuditEvent, InboxEvent, Mailbox, Tenant
from intake.vocabulary import AuditKind
from reconciliation import services
from reconciliation.models import BulkJob
from reconciliation.services import bulk_jobs
from tests.support.bulk import CLOSE_REASON, FLOOD_REASON, FLOOD_SENDER, applied_per_item, flood, kinds_of
from tests.support.queue import QUEUE_URL, new_event, quarantine
from tests.support.users import make_user, operator  # noqa: F401  (fixture)
from ticketing.models import Destination


def run_to_the_end(job_id, worker="test-runner", size=50) -> list[bulk_jobs.ChunkOutcome]:
    outcomes = []
    for _ in range(100):
        outcomes.append(bulk_jobs.run_bulk_job_chunk(job_id, size=size, worker=worker))
        if not outcomes[-1].more:
            return outcomes
    pytest.fail("the job never finished")


@pytest.fixture
def globex(db):
    tenant = Tenant.objects.create(slug="globex", name="Globex")
    Destination.objects.create(tenant=tenant, slug="builtin", kind="builtin", is_default=True)
    return Mailbox.objects.create(tenant=tenant, slug="globex-support", address="help@globex.test")


# --- the services, on PostgreSQL ---------------------------------------------------------------------


def test_a_bulk_close_over_a_filter_closes_the_200_matching_items_and_audits_each(mailbox, operator, globex):
    spam = flood(mailbox, 200)
    other_reason = flood(mailbox, 3, reason="missing_sender", sender="someone@customer.test")
    other_sender = flood(mailbox, 2, sender="real.customer@customer.test")
    other_tenant = flood(globex, 3)
    filters = {"reason": FLOOD_REASON, "sender": "flood.test"}

    count, sample = services.preview_bulk(operator, filters=filters)
    assert count == 200
    assert [row.pk for row in sample] == spam[:10]
    assert all(row.sender == "p***@f***.test" for row in sample)  # masked, as in the queue

    job = services.do_start_bulk_job(
        operator, filters=filters, action="close", reason=CLOSE_REASON, expected_count=count
    )
    assert (job.state, job.total, job.done, job.tenant_ids) == ("pending", 200, 0, [mailbox.tenant_id])
    outcomes = run_to_the_end(job.pk)
    assert [o.handled for o in outcomes] == [50, 50, 50, 50, 0]

    job.refresh_from_db()
    assert (job.state, job.total, job.done, job.succeeded, job.skipped, job.failed) == ("done", 200, 200, 200, 0, 0)
    assert job.cursor == spam[-1] and job.finished_at is not None and job.claimed_by == ""
    closed = InboxEvent.objects.filter(pk__in=spam)
    assert set(closed.values_list("state", "reason_code", "reason_detail")) == {
        ("suppressed", "not_a_request", CLOSE_REASON)
    }
    kinds = kinds_of(spam)
    assert kinds[AuditKind.CLOSED_NOT_A_REQUEST] == 200 and kinds[AuditKind.BULK_JOB_APPLIED] == 200
    assert set(applied_per_item(job.pk).values()) == {1} and len(applied_per_item(job.pk)) == 200
    row = AuditEvent.objects.get(inbox_event_id=spam[0], kind=AuditKind.CLOSED_NOT_A_REQUEST)
    assert row.actor == "user:oper"
    # Outside the filter or the tenant: untouched, no row of the job.
    untouched = other_reason + other_sender + other_tenant
    assert set(InboxEvent.objects.filter(pk__in=untouched).values_list("state", flat=True)) == {"awaiting_review"}
    assert not (kinds_of(untouched).keys() & {AuditKind.CLOSED_NOT_A_REQUEST, AuditKind.BULK_JOB_APPLIED})


def test_quarantined_items_are_skipped_for_an_operator_and_closed_by_security(mailbox, operator, tenant):
    plain = flood(mailbox, 4, reason="attachment_type")
    held = [new_event(mailbox, subject=f"Invoice {i}", sender="mallory@customer.test") for i in range(2)]
    for event_id in held:
        quarantine(event_id)  # quarantined, reason attachment_type
    filters = {"reason": "attachment_type"}
    job = services.do_start_bulk_job(operator, filters=filters, action="suppress", reason="", expected_count=6)
    run_to_the_end(job.pk)
    job.refresh_from_db()
    assert (job.state, job.succeeded, job.skipped, job.failed) == ("done", 4, 2, 0)
    assert job.reason == "spam"
    assert {s["item"] for s in job.samples} == set(held)
    assert all("security role" in s["reason"] for s in job.samples)
    assert set(InboxEvent.objects.filter(pk__in=held).values_list("state", flat=True)) == {"quarantined"}
    assert set(InboxEvent.objects.filter(pk__in=plain).values_list("reason_detail", flat=True)) == {"spam"}

    security = make_user("sec", groups=["security"], tenants=[tenant])
    job = services.do_start_bulk_job(
        security, filters={"state": "quarantined"}, action="close", reason="malware wave", expected_count=2
    )
    run_to_the_end(job.pk)
    job.refresh_from_db()
    assert (job.succeeded, job.skipped) == (2, 0)
    assert set(InboxEvent.objects.filter(pk__in=held).values_list("state", flat=True)) == {"suppressed"}


def test_the_service_refuses_what_the_user_may_not_do_or_did_not_confirm(mailbox, operator, tenant):
    flood(mailbox, 30)
    security = make_user("sec", groups=["security"], tenants=[tenant])
    viewer = make_user("viewer", tenants=[tenant])
    viewer.user_permissions.add(*Permission.objects.filter(codename="view_recoveryitem"))
    filters = {"reason": FLOOD_REASON}
    with pytest.raises(PermissionDenied):
        services.do_start_bulk_job(security, filters=filters, action="replay", expected_count=30)
    with pytest.raises(PermissionDenied):
        services.do_start_bulk_job(viewer, filters=filters, action="close", reason="x", expected_count=30)
    with pytest.raises(services.ActionRefused, match="now matches 30 items, not the 60"):
        services.do_start_bulk_job(operator, filters=filters, action="close", reason="x", expected_count=60)
    with pytest.raises(services.ActionRefused, match="matches no items"):
        services.do_start_bulk_job(
            operator, filters={"reason": "malware"}, action="close", reason="x", expected_count=0
        )
    with pytest.raises(services.ActionRefused, match="reason is required"):
        services.do_start_bulk_job(operator, filters=filters, action="close", reason=" ", expected_count=30)
    with pytest.raises(services.ActionRefused, match="number of hours"):
        services.preview_bulk(operator, filters={"older_than_hours": "soon"})
    stranger = make_user("stranger", groups=["operator"])  # no tenant in common
    with pytest.raises(services.ActionRefused, match="no assignable user"):
        services.do_start_bulk_job(operator, filters=filters, action="assign", assignee=stranger, expected_count=30)
    assert not BulkJob.objects.exists()

    # A permission taken away while the job waits: the job fails, nothing is closed.
    job = services.do_start_bulk_job(operator, filters=filters, action="close", reason="x", expected_count=30)
    operator.groups.clear()
    assert bulk_jobs.run_bulk_job_chunk(job.pk, worker="w").state == "failed"
    job.refresh_from_db()
    assert job.state == "failed" and "can no longer do this" in job.error and job.done == 0
    assert not InboxEvent.objects.filter(state="suppressed").exists()


def test_a_job_whose_worker_died_resumes_from_its_cursor_and_acts_on_no_item_twice(
    mailbox, operator, django_capture_on_commit_callbacks
):
    spam = flood(mailbox, 200)
    job = services.do_start_bulk_job(
        operator, filters={"reason": FLOOD_REASON}, action="close", reason=CLOSE_REASON, expected_count=200
    )
    assert bulk_jobs.run_bulk_job_chunk(job.pk, size=50, worker="worker-a").handled == 50
    assert bulk_jobs.run_bulk_job_chunk(job.pk, size=50, worker="worker-a").handled == 50
    # worker-a dies holding its claim, mid-job: the sweep leaves it alone while the claim lasts, and
    # another runner is refused.
    assert bulk_jobs.resume_stalled_bulk_jobs() == []
    assert bulk_jobs.run_bulk_job_chunk(job.pk, worker="worker-b").status == "busy"
    job.refresh_from_db()
    assert (job.state, job.cursor, job.done) == ("running", spam[99], 100)
    BulkJob.objects.filter(pk=job.pk).update(claimed_until=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks() as published:
        assert bulk_jobs.resume_stalled_bulk_jobs() == [job.pk]
    assert len(published) == 1  # the run task is sent again
    outcomes = run_to_the_end(job.pk, worker="worker-b")
    assert sum(o.handled for o in outcomes) == 100
    # worker-a comes back from the dead: the job is over, it does nothing.
    assert bulk_jobs.run_bulk_job_chunk(job.pk, worker="worker-a").status == "closed"
    job.refresh_from_db()
    assert (job.state, job.done, job.succeeded) == ("done", 200, 200)
    assert set(applied_per_item(job.pk).values()) == {1} and len(applied_per_item(job.pk)) == 200
    assert kinds_of(spam)[AuditKind.CLOSED_NOT_A_REQUEST] == 200


def test_a_chunk_whose_claim_was_taken_over_meanwhile_is_rolled_back_whole(mailbox, operator):
    spam = flood(mailbox, 20)
    job = services.do_start_bulk_job(
        operator, filters={"reason": FLOOD_REASON}, action="close", reason="x", expected_count=20
    )
    # While worker-a works on its chunk, another runner takes the job over (worker-a's claim expired): a
    # trigger does it when the chunk reaches its sixth item, inside worker-a's transaction.
    with connection.cursor() as cursor:
        cursor.execute(f"""
            CREATE FUNCTION test_take_over() RETURNS trigger AS $$ BEGIN
              UPDATE reconciliation_bulkjob SET claimed_by = 'worker-b' WHERE id = {job.pk}; RETURN NEW;
            END $$ LANGUAGE plpgsql;
            CREATE TRIGGER test_take_over AFTER INSERT ON intake_auditevent FOR EACH ROW
              WHEN (NEW.inbox_event_id = {spam[5]} AND NEW.kind = 'bulk_job_applied')
              EXECUTE FUNCTION test_take_over();""")
    assert bulk_jobs.run_bulk_job_chunk(job.pk, size=10, worker="worker-a").status == "lost"
    assert not InboxEvent.objects.filter(pk__in=spam, state="suppressed").exists()
    assert not AuditEvent.objects.filter(kind=AuditKind.BULK_JOB_APPLIED).exists()
    job.refresh_from_db()
    assert (job.done, job.cursor, job.claimed_by) == (0, 0, "worker-a")


def test_cancel_stops_a_job_before_its_next_chunk_and_keeps_what_was_done(mailbox, operator, tenant):
    flood(mailbox, 120)
    job = services.do_start_bulk_job(operator, filters={}, action="assign", assignee=operator, expected_count=120)
    assert bulk_jobs.run_bulk_job_chunk(job.pk, size=50, worker="w").handled == 50
    other = make_user("other-oper", groups=["operator"], tenants=[tenant])
    with pytest.raises(BulkJob.DoesNotExist):  # not theirs
        services.do_cancel_bulk_job(other, job.pk)
    assert services.do_cancel_bulk_job(operator, job.pk) is True
    assert bulk_jobs.run_bulk_job_chunk(job.pk, size=50, worker="w").status == "closed"
    assert services.do_cancel_bulk_job(operator, job.pk) is False
    job.refresh_from_db()
    assert (job.state, job.done) == ("cancelled", 50)
    assert InboxEvent.objects.filter(owner=operator).count() == 50
    assert kinds_of(InboxEvent.objects.values_list("pk", flat=True))[AuditKind.ASSIGNED] == 50


def test_the_database_refuses_an_unknown_state_and_counts_that_do_not_add_up(mailbox, operator):
    flood(mailbox, 1)
    job = services.do_start_bulk_job(operator, filters={}, action="replay", expected_count=1)
    for change in ({"state": "exploded"}, {"done": 5}, {"state": "done"}):
        with pytest.raises(IntegrityError), transaction.atomic():
            BulkJob.objects.filter(pk=job.pk).update(**change)


def test_older_than_is_frozen_at_the_start_and_items_arriving_later_are_not_part_of_the_job(mailbox, operator):
    old = flood(mailbox, 3)
    InboxEvent.objects.filter(pk__in=old).update(received_at=timezone.now() - timedelta(hours=5))
    flood(mailbox, 2)  # fresh
    assert services.preview_bulk(operator, filters={"older_than_hours": "4"})[0] == 3
    job = services.do_start_bulk_job(
        operator, filters={"reason": FLOOD_REASON}, action="close", reason="x", expected_count=5
    )
    late = flood(mailbox, 2)  # the wave goes on after the confirmation
    run_to_the_end(job.pk)
    job.refresh_from_db()
    assert (job.total, job.succeeded) == (5, 5)
    assert set(InboxEvent.objects.filter(pk__in=late).values_list("state", flat=True)) == {"awaiting_review"}


# --- the pages, through Django's test client ------------------------------------------------------------

BULK_URL = f"{QUEUE_URL}bulk/"


def test_the_bulk_pages_preview_confirm_and_follow_a_job_for_its_owner_only(client, mailbox, operator, tenant):
    spam = flood(mailbox, 12)
    flood(mailbox, 2, sender="someone@customer.test")
    client.force_login(operator)
    page = client.get(BULK_URL, {"reason": FLOOD_REASON, "sender": "flood.test"})
    html = page.content.decode()
    assert page.status_code == 200
    assert '<strong id="bulk-count">12</strong>' in html and html.count('class="bulk-sample-row"') == 10
    assert FLOOD_SENDER not in html and "sender contains: flood.test" in html

    # A count that moved too far since the preview: refused with the reason, no job.
    post = {"reason": FLOOD_REASON, "sender": "flood.test", "job-action": "close", "job-reason": CLOSE_REASON}
    refused = client.post(BULK_URL, {**post, "job-expected_count": "40"}, follow=True)
    assert "now matches 12 items, not the 40 you confirmed" in refused.content.decode()
    assert not BulkJob.objects.exists()

    started = client.post(BULK_URL, {**post, "job-expected_count": "12"})
    job = BulkJob.objects.get()
    assert started.status_code == 302 and started["Location"] == f"{BULK_URL}{job.pk}/"
    assert (job.action, job.reason, job.filters) == (
        "close",
        CLOSE_REASON,
        {"reason": FLOOD_REASON, "sender": "flood.test"},
    )
    run_to_the_end(job.pk)
    status = client.get(f"{BULK_URL}{job.pk}/status/").json()
    assert status == {
        "state": "done",
        "state_label": "Done",
        "total": 12,
        "done": 12,
        "succeeded": 12,
        "skipped": 0,
        "failed": 0,
        "open": False,
    }
    job_page = client.get(f"{BULK_URL}{job.pk}/").content.decode()
    assert 'id="bulk-done">12<' in job_page and 'id="bulk-cancel"' not in job_page
    assert set(InboxEvent.objects.filter(pk__in=spam).values_list("state", flat=True)) == {"suppressed"}

    flood(mailbox, 3, reason="missing_sender")
    waiting = services.do_start_bulk_job(
        operator, filters={"reason": "missing_sender"}, action="replay", expected_count=3
    )
    assert 'id="bulk-cancel"' in client.get(f"{BULK_URL}{waiting.pk}/").content.decode()

    client.force_login(make_user("other-oper", groups=["operator"], tenants=[tenant]))
    for url in (f"{BULK_URL}{job.pk}/", f"{BULK_URL}{job.pk}/status/"):
        assert client.get(url).status_code == 404
    assert client.post(f"{BULK_URL}{waiting.pk}/cancel/").status_code == 404
    client.force_login(operator)
    assert client.get(f"{BULK_URL}{waiting.pk}/cancel/").status_code == 405
    cancelled = client.post(f"{BULK_URL}{waiting.pk}/cancel/", follow=True)
    assert f"Bulk job #{waiting.pk} cancelled" in cancelled.content.decode()
    waiting.refresh_from_db()
    assert waiting.state == "cancelled" and waiting.error == "cancelled by user:oper"
    assert set(InboxEvent.objects.filter(reason_code="missing_sender").values_list("state", flat=True)) == {
        "awaiting_review"
    }


def test_the_bulk_page_says_what_is_wrong_with_a_filter_and_offers_only_permitted_actions(client, mailbox, tenant):
    flood(mailbox, 3)
    security = make_user("sec", groups=["security"], tenants=[tenant])
    client.force_login(security)
    html = client.get(BULK_URL, {"older_than_hours": "soon"}).content.decode()
    assert "&#x27;older than&#x27; is a number of hours" in html and 'id="bulk-start"' not in html
    html = client.get(BULK_URL, {"reason": FLOOD_REASON}).content.decode()
    assert 'value="close"' in html and 'value="suppress"' in html
    assert 'value="replay"' not in html and 'value="assign"' not in html  # not the security role's

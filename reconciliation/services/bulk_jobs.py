"""Bulk work over the queue's filter: preview, start, run in chunks, cancel (`BulkJob`, the one door).

An operator filters the queue, sees the count and a sample (`preview_bulk`), confirms with that count
(`do_start_bulk_job`: refused if it moved a lot meanwhile) and a background task runs the job chunk by
chunk (`run_bulk_job_chunk`). Every item goes through the same per-item service a single click uses
(`do_close_not_a_request`, `do_replay`, `do_assign`), AS the user who started the job, so permissions,
tenant, refusals and the item's own audit row are those of a click; an AuditKind.BULK_JOB_APPLIED row
names the job. What a service refuses (an item that changed meanwhile, a quarantined item for someone
without the security role) is skipped with its reason.

Crash safety: a chunk is one transaction with the cursor and the counts, and commits only while the
runner still holds the job's claim (a guarded UPDATE on state, claim and cursor); a worker killed
mid-chunk leaves nothing of that chunk, its claim expires, and `resume_stalled_bulk_jobs` (beat) starts
the job again from its cursor. Only guarded UPDATEs: no row locks, so SQLite (the embedded default)
runs it the same way.
"""

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery import current_app
from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import DateTimeField, Exists, F, Max, OuterRef, Q, QuerySet, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from intake.logging import mask_address
from intake.models import InboxEvent
from intake.selectors import visible_tenants
from intake.services import record_audit
from intake.vocabulary import AuditKind
from ticketing.workers import worker_identity

from .. import selectors
from ..models import BulkJob
from .access import ActionRefused, actor_name, require
from .queue_actions import assignable_users, do_assign, do_close_not_a_request, do_replay
from .roles import PERM_ASSIGN, PERM_CLOSE, PERM_RELEASE, PERM_REPLAY, PERM_VIEW_QUEUE

logger = logging.getLogger(__name__)

RUN_TASK = "reconciliation.tasks.run_bulk_job"
SAMPLE_SIZE = 10  # items shown before confirming
KEPT_SAMPLES = 20  # skipped/failed items kept on the job, with their reasons
OPEN_STATES = (BulkJob.State.PENDING, BulkJob.State.RUNNING)
SPAM_REASON = "spam"
FILTER_KEYS = ("reason", "state", "mailbox", "owner", "tenant", "q", "sender", "subject", "older_than_hours")
TEXT_LIMIT = 200


def chunk_size() -> int:
    return int(getattr(settings, "MAILROOM_BULK_JOB_CHUNK", 50))


def claim_seconds() -> float:
    """How long a runner's claim lasts; a runner that has not renewed it by then is presumed dead."""
    return float(getattr(settings, "MAILROOM_BULK_JOB_CLAIM_SECONDS", 120))


def allowed_drift(expected: int) -> int:
    """How far the count may move between the preview and the confirmation (mail keeps arriving)."""
    return max(5, expected // 10)


# --- the filter ----------------------------------------------------------------------------------


def clean_filters(raw) -> dict:
    """The queue's querystring as a bulk filter; ActionRefused (saying which) for a value that makes no sense."""
    raw = raw or {}
    # `.get`, not dict(): a QueryDict's dict() holds lists.
    raw = {
        key: str(raw.get(key)).strip()
        for key in (*FILTER_KEYS, "reason_code", "received_before")
        if raw.get(key) not in (None, "")
    }
    if raw.get("reason_code") and not raw.get("reason"):
        raw["reason"] = raw["reason_code"]
    cleaned = {}
    for key in FILTER_KEYS:
        value = raw.get(key, "")
        if not value:
            continue
        if len(value) > TEXT_LIMIT:
            raise ActionRefused(f"the {key} filter is longer than {TEXT_LIMIT} characters")
        if key == "state" and value not in (*InboxEvent.RECOVERY_STATES, "held"):
            raise ActionRefused(f"no queue state {value!r}")
        if key in ("mailbox", "tenant") and not value.isdigit():
            raise ActionRefused(f"the {key} filter is an id")
        if key == "owner" and value not in ("mine", "unassigned"):
            raise ActionRefused("the owner filter is 'mine' or 'unassigned'")
        if key == "older_than_hours":
            try:
                hours = float(value)
            except ValueError:
                raise ActionRefused("'older than' is a number of hours") from None
            if not 0 <= hours <= 24 * 3660:
                raise ActionRefused("'older than' is a number of hours between 0 and ten years")
            value = hours
        cleaned[key] = value
    if raw.get("received_before"):  # a job's frozen cut-off, passed back as it was stored
        if parse_datetime(raw["received_before"]) is None:
            raise ActionRefused("received_before is not a time")
        cleaned["received_before"] = raw["received_before"]
    return cleaned


def freeze(filters: dict, now: datetime) -> dict:
    """'older than N hours' as a fixed cut-off: the job acts on what the user saw, not on what ages into it."""
    frozen = dict(filters)
    hours = frozen.get("older_than_hours")
    if hours is not None and "received_before" not in frozen:
        frozen["received_before"] = (now - timedelta(hours=float(hours))).isoformat()
    return frozen


def matching_items(user, filters: dict, *, tenant_ids=None, now: datetime | None = None) -> QuerySet:
    """The queue items the filter matches among `tenant_ids` (default: the user's tenants), by pk."""
    filters = freeze(filters, now or timezone.now())
    scope = list(tenant_ids) if tenant_ids is not None else visible_tenants(user).values("pk")
    items = selectors.recovery_queue().filter(tenant__in=scope)
    if filters.get("reason"):
        items = items.filter(reason_code=filters["reason"])
    if filters.get("state") == "held":
        items = items.filter(Exists(selectors.held_intents().filter(inbox_event=OuterRef("pk"))))
    elif filters.get("state"):
        items = items.filter(state=filters["state"])
    if filters.get("mailbox"):
        items = items.filter(mailbox_id=int(filters["mailbox"]))
    if filters.get("tenant"):
        items = items.filter(tenant_id=int(filters["tenant"]))
    if filters.get("owner") == "mine":
        items = items.filter(owner=user)
    elif filters.get("owner") == "unassigned":
        items = items.filter(owner__isnull=True)
    if filters.get("sender"):
        items = items.filter(sender__icontains=filters["sender"])
    if filters.get("subject"):
        items = items.filter(subject__icontains=filters["subject"])
    if filters.get("received_before"):
        items = items.filter(received_at__lt=parse_datetime(filters["received_before"]))
    return selectors.search_queue(items, filters.get("q", "")).select_related(None).order_by("pk")


@dataclass
class SampleRow:
    pk: int
    received_at: datetime
    state: str
    reason_code: str
    sender: str  # masked
    subject: str


def preview_bulk(user, *, filters) -> tuple[int, list[SampleRow]]:
    """How many queue items the filter matches now, and the first few of them (senders masked)."""
    require(user, PERM_VIEW_QUEUE)
    items = matching_items(user, clean_filters(filters))
    sample = [
        SampleRow(e.pk, e.received_at, e.state, e.reason_code, mask_address(e.sender), e.subject[:120])
        for e in items.only("pk", "received_at", "state", "reason_code", "sender", "subject")[:SAMPLE_SIZE]
    ]
    return items.count(), sample


# --- starting, cancelling --------------------------------------------------------------------------


def action_permissions(action: str) -> tuple[str, ...]:
    """Any one of these lets the user start the action (closing quarantined items is the security role's)."""
    return {
        BulkJob.Action.CLOSE: (PERM_CLOSE, PERM_RELEASE),
        BulkJob.Action.SUPPRESS: (PERM_CLOSE, PERM_RELEASE),
        BulkJob.Action.REPLAY: (PERM_REPLAY,),
        BulkJob.Action.ASSIGN: (PERM_ASSIGN,),
    }[action]


def permission_problem(user, action: str) -> str:
    """Why `user` may not run `action` now ("" if they may)."""
    if user is None or not user.is_active or not user.has_perm(PERM_VIEW_QUEUE):
        return f"needs {PERM_VIEW_QUEUE}"
    needed = action_permissions(action)
    return "" if any(user.has_perm(p) for p in needed) else f"needs {' or '.join(needed)}"


def do_start_bulk_job(user, *, filters, action: str, reason: str = "", assignee=None, expected_count: int) -> BulkJob:
    """Create the job for what the user confirmed, and hand it to a worker after the commit."""
    if action not in BulkJob.Action.values:
        raise ActionRefused(f"no bulk action {action!r}")
    problem = permission_problem(user, action)
    if problem:
        raise PermissionDenied(problem)
    reason = (reason or "").strip()[:500]
    if action == BulkJob.Action.CLOSE and not reason:
        raise ActionRefused("a reason is required to close items as not a request")
    if action == BulkJob.Action.SUPPRESS:
        reason = f"{SPAM_REASON}: {reason}" if reason and reason.lower() != SPAM_REASON else SPAM_REASON
    if action == BulkJob.Action.ASSIGN:
        if assignee is None:
            raise ActionRefused("choose whom to assign the items to")
    elif assignee is not None:
        raise ActionRefused("only an assignment has an assignee")
    now = timezone.now()
    tenant_ids = sorted(visible_tenants(user).values_list("pk", flat=True))
    if assignee is not None and not any(assignable_users(t).filter(pk=assignee.pk).exists() for t in tenant_ids):
        raise ActionRefused(f"no assignable user {assignee.get_username()!r} in your tenants")
    frozen = freeze(clean_filters(filters), now)
    items = matching_items(user, frozen, tenant_ids=tenant_ids, now=now)
    count = items.count()
    if count == 0:
        raise ActionRefused("the filter matches no items now: nothing to do")
    if abs(count - int(expected_count)) > allowed_drift(int(expected_count)):
        raise ActionRefused(
            f"the filter now matches {count} items, not the {expected_count} you confirmed: look at the preview again"
        )
    with transaction.atomic():
        job = BulkJob.objects.create(
            started_by=user,
            tenant_ids=tenant_ids,
            action=action,
            assignee=assignee,
            reason=reason,
            filters=frozen,
            max_pk=items.aggregate(top=Max("pk"))["top"],
            total=count,
            created_at=now,
        )
        publish(job.pk)
    return job


def visible_jobs(user) -> QuerySet:
    """The jobs a user may watch and cancel: their own (a superuser: every one)."""
    if user is None or not user.is_active:
        return BulkJob.objects.none()
    jobs = BulkJob.objects.select_related("started_by", "assignee")
    return jobs if user.is_superuser else jobs.filter(started_by=user)


def do_cancel_bulk_job(user, job_id: int) -> bool:
    """Stop the job before its next chunk (a chunk running now is rolled back, not half done). False if it
    had finished already. BulkJob.DoesNotExist (a 404) if the job is not the user's."""
    job = visible_jobs(user).get(pk=job_id)
    now = timezone.now()
    return bool(
        BulkJob.objects.filter(pk=job.pk, state__in=OPEN_STATES).update(
            state=BulkJob.State.CANCELLED,
            finished_at=now,
            claimed_by="",
            claimed_until=None,
            error=f"cancelled by {actor_name(user)}",
        )
    )


# --- running --------------------------------------------------------------------------------------


@dataclass
class ChunkOutcome:
    status: str  # "ran", "busy" (someone else holds the claim), "lost" (claim lost mid-chunk), "closed"
    state: str
    handled: int = 0
    more: bool = False


class _ClaimLost(Exception):
    """Raised inside the chunk's transaction to roll it back."""


def claim(job_id: int, worker: str, now: datetime) -> bool:
    """pending/running -> running under `worker`'s claim, if the claim is theirs, free or expired."""
    return bool(
        BulkJob.objects.filter(pk=job_id, state__in=OPEN_STATES)
        .filter(Q(claimed_by=worker) | Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .update(
            state=BulkJob.State.RUNNING,
            claimed_by=worker,
            claimed_until=now + timedelta(seconds=claim_seconds()),
            heartbeat_at=now,
            started_at=Coalesce(F("started_at"), Value(now, output_field=DateTimeField())),
        )
    )


def _carry_out(job: BulkJob, user, event_id: int) -> str:
    if job.action in (BulkJob.Action.CLOSE, BulkJob.Action.SUPPRESS):
        do_close_not_a_request(user, event_id, reason=job.reason)
        return "closed"
    if job.action == BulkJob.Action.REPLAY:
        return do_replay(user, event_id)
    do_assign(user, event_id, job.assignee)
    return f"assigned to {job.assignee.get_username()}"


def _apply_one(job: BulkJob, user, event_id: int) -> tuple[str, str]:
    """("succeeded" | "skipped" | "failed", what happened), the item's writes kept only on success."""
    try:
        with transaction.atomic():
            outcome = _carry_out(job, user, event_id)
            record_audit(
                event_id,
                kind=AuditKind.BULK_JOB_APPLIED,
                actor=actor_name(user),
                detail={"bulk_job": job.pk, "action": job.action, "outcome": outcome},
            )
        return "succeeded", outcome
    except (ActionRefused, PermissionDenied) as exc:
        return "skipped", str(exc)[:300]
    except InboxEvent.DoesNotExist:
        return "skipped", "no longer in the tenants of the user who started the job"
    except Exception as exc:  # one item's bug must not stop the flood's clearing: counted, logged, shown
        logger.exception("bulk job %s: item %s failed", job.pk, event_id)
        return "failed", f"error ({type(exc).__name__}); see the log"


def _close(job_id: int, worker: str, state: str, error: str, now) -> None:
    BulkJob.objects.filter(pk=job_id, state=BulkJob.State.RUNNING, claimed_by=worker).update(
        state=state, error=error[:1000], finished_at=now, claimed_by="", claimed_until=None
    )


def run_bulk_job_chunk(job_id: int, *, size: int | None = None, worker: str | None = None) -> ChunkOutcome:
    """Claim the job, apply its action to the next `size` items after the cursor, and commit those items with
    the new cursor and counts in one transaction (or not at all, if the claim was lost meanwhile)."""
    size = size or chunk_size()
    worker = worker or worker_identity()
    now = timezone.now()
    if not claim(job_id, worker, now):
        state = BulkJob.objects.filter(pk=job_id).values_list("state", flat=True).first() or ""
        return ChunkOutcome("busy" if state in OPEN_STATES else "closed", state)
    job = BulkJob.objects.select_related("started_by", "assignee").get(pk=job_id)
    user = job.started_by
    problem = permission_problem(user, job.action)
    if problem:
        _close(job.pk, worker, BulkJob.State.FAILED, f"the user who started it can no longer do this: {problem}", now)
        return ChunkOutcome("closed", BulkJob.State.FAILED)
    try:
        with transaction.atomic():
            ids = list(
                matching_items(user, job.filters, tenant_ids=job.tenant_ids)
                .filter(pk__gt=job.cursor, pk__lte=job.max_pk)
                .values_list("pk", flat=True)[:size]
            )
            counts = {"succeeded": job.succeeded, "skipped": job.skipped, "failed": job.failed}
            samples = list(job.samples)
            for event_id in ids:
                result, text = _apply_one(job, user, event_id)
                counts[result] += 1
                if result != "succeeded" and len(samples) < KEPT_SAMPLES:
                    samples.append({"item": event_id, "outcome": result, "reason": text})
            done = sum(counts.values())
            total, finished = max(job.total, done), len(ids) < size
            if finished and done < total:  # matched at the start, then left the queue or the filter by themselves
                counts["skipped"] += total - done
                if len(samples) < KEPT_SAMPLES:
                    samples.append(
                        {
                            "item": None,
                            "outcome": "skipped",
                            "reason": f"{total - done} item(s) no longer matched the filter when their "
                            "turn came (closed, replayed or changed meanwhile)",
                        }
                    )
                done = total
            later = timezone.now()
            fields = {
                **counts,
                "done": done,
                "total": total,
                "samples": samples,
                "heartbeat_at": later,
                "cursor": ids[-1] if ids else job.cursor,
                "claimed_until": later + timedelta(seconds=claim_seconds()),
            }
            if finished:
                fields.update(state=BulkJob.State.DONE, finished_at=later, claimed_by="", claimed_until=None)
            if not BulkJob.objects.filter(
                pk=job.pk, state=BulkJob.State.RUNNING, claimed_by=worker, cursor=job.cursor
            ).update(**fields):
                raise _ClaimLost()
    except _ClaimLost:
        state = BulkJob.objects.filter(pk=job_id).values_list("state", flat=True).first() or ""
        logger.warning("bulk job %s: claim lost during a chunk (now %s); the chunk was rolled back", job_id, state)
        return ChunkOutcome("lost", state)
    return ChunkOutcome("ran", fields.get("state", BulkJob.State.RUNNING), handled=len(ids), more=not finished)


# --- the background task's side: publishing, continuing, resuming ------------------------------------


def publish(job_id: int, token: str | None = None) -> None:
    """Send the run task after the commit. A failed publish is only logged: the sweep starts the job later."""

    def send():
        try:
            current_app.send_task(RUN_TASK, args=[job_id], kwargs={"token": token} if token else {})
        except Exception:
            logger.exception("bulk job %s: publishing its next chunk failed; the sweep resumes it", job_id)

    transaction.on_commit(send)


def run_and_continue(job_id: int, token: str | None = None) -> str:
    """One chunk, then the next one as a new task under the same claim token: a killed worker loses one
    chunk's claim (it expires), never the job."""
    token = token or f"bulk:{uuid.uuid4().hex}"
    outcome = run_bulk_job_chunk(job_id, worker=token)
    if outcome.more:
        publish(job_id, token)  # outside any transaction: on_commit sends at once
    return outcome.status


def resume_stalled_bulk_jobs(now: datetime | None = None) -> list[int]:
    """Open jobs whose claim expired (their worker died) or that no worker ever took: published again."""
    now = now or timezone.now()
    grace = now - timedelta(seconds=min(claim_seconds(), 30))
    stalled = list(
        BulkJob.objects.filter(state__in=OPEN_STATES)
        .filter(Q(claimed_until__lt=now) | Q(claimed_until__isnull=True, created_at__lt=grace))
        .order_by("pk")
        .values_list("pk", flat=True)[:100]
    )
    for job_id in stalled:
        publish(job_id)
    return stalled

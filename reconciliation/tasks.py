"""Celery tasks of the reconciliation app: thin."""

from celery import shared_task


@shared_task
def reconcile() -> list[str]:
    """One reconciliation pass over everything (beat: MAILROOM_RECONCILE_SECONDS)."""
    from .reconcilers import reconcile as run
    from .reconcilers.base import purge_runs

    lines = [summary.line() for summary in run()]
    purge_runs()
    return lines


@shared_task
def send_escalations() -> int:
    """Email the owners (or operators) of overdue items, once per escalation (beat: every minute)."""
    from .services.escalation import send_escalations as send

    return send()


@shared_task
def send_daily_digests() -> int:
    """Each tenant's operators get one digest of open items a day (beat: MAILROOM_DIGEST_HOUR)."""
    from .services.escalation import send_daily_digests as send

    return send()


@shared_task
def run_bulk_job(job_id: int, token: str | None = None) -> str:
    """One chunk of a bulk job; the next chunk is its own task (services.bulk_jobs.run_and_continue)."""
    from .services.bulk_jobs import run_and_continue

    return run_and_continue(job_id, token)


@shared_task
def resume_bulk_jobs() -> list[int]:
    """Start again the bulk jobs whose worker died or whose task was lost (beat: every 30 s)."""
    from .services.bulk_jobs import resume_stalled_bulk_jobs

    return resume_stalled_bulk_jobs()

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


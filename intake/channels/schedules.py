"""Beat: one django-celery-beat `PeriodicTask` per polling mailbox, kept in step with the mailbox.

`sync_mailbox_schedule(mailbox)` runs on every save of a Mailbox (a post_save
signal connected in `IntakeConfig.ready`): it creates the mailbox's periodic
poll when polling is enabled for a provider that polls, updates its interval
(`Mailbox.settings["poll_seconds"]`, default 60) and enables or disables it.
Deleting the mailbox deletes its task. DatabaseScheduler notices every change
through django-celery-beat's own change tracking.

The task is `intake.tasks.poll_mailbox(mailbox_id=…, trigger="schedule")`; a
run that comes while the previous one still holds the mailbox's poll lock
returns at once, and a run the workers could not start within one interval
expires instead of piling up.
"""

import json
import logging

from django.db import transaction

logger = logging.getLogger(__name__)

POLL_TASK = "intake.tasks.poll_mailbox"
DEFAULT_POLL_SECONDS = 60
MIN_POLL_SECONDS = 5


def task_name(mailbox_id: int) -> str:
    return f"mailroom: poll mailbox {mailbox_id}"


def poll_seconds(mailbox) -> int:
    try:
        seconds = int((mailbox.settings or {}).get("poll_seconds") or DEFAULT_POLL_SECONDS)
    except (TypeError, ValueError):
        seconds = DEFAULT_POLL_SECONDS
    return max(MIN_POLL_SECONDS, seconds)


def provider_polls(provider: str) -> bool:
    from ..providers import provider_class

    try:
        return bool(provider_class(provider).supports_polling)
    except (LookupError, ImportError):
        return False


def sync_mailbox_schedule(mailbox):
    """Create, update or disable the mailbox's periodic poll; returns the task (or None when there is none)."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    wanted = bool(mailbox.poll_enabled) and provider_polls(mailbox.provider)
    name = task_name(mailbox.pk)
    with transaction.atomic():
        task = PeriodicTask.objects.select_for_update().filter(name=name).first()
        if task is None and not wanted:
            return None
        seconds = poll_seconds(mailbox)
        every = {"every": seconds, "period": IntervalSchedule.SECONDS}
        interval = IntervalSchedule.objects.filter(**every).order_by("pk").first() or IntervalSchedule.objects.create(
            **every
        )
        desired = {
            "task": POLL_TASK,
            "interval": interval,
            "kwargs": json.dumps({"mailbox_id": mailbox.pk, "trigger": "schedule"}),
            "enabled": wanted,
            "expire_seconds": seconds,
            "description": f"Poll mailbox {mailbox.slug} ({mailbox.provider}) every {seconds} s",
        }
        if task is None:
            task = PeriodicTask.objects.create(name=name, **desired)
            logger.info("created periodic poll for mailbox %s every %d s", mailbox.slug, seconds)
            return task
        changed = [
            key
            for key, value in desired.items()
            if (task.interval_id != interval.pk if key == "interval" else getattr(task, key) != value)
        ]
        if task.crontab_id or task.solar_id or task.clocked_id:
            task.crontab = task.solar = task.clocked = None
            changed.append("schedule")
        if changed:  # saving bumps the scheduler's change marker: only when something changed
            for key, value in desired.items():
                setattr(task, key, value)
            task.save()
            logger.info("updated periodic poll for mailbox %s (%s)", mailbox.slug, ", ".join(changed))
        return task


def delete_mailbox_schedule(mailbox_id: int) -> None:
    from django_celery_beat.models import PeriodicTask

    for task in PeriodicTask.objects.filter(name=task_name(mailbox_id)):
        task.delete()  # one by one, so django-celery-beat records the change


def sync_all_schedules() -> int:
    """Bring every mailbox's periodic poll in step (for example after restoring a database)."""
    from ..models import Mailbox

    count = 0
    for mailbox in Mailbox.objects.all():
        sync_mailbox_schedule(mailbox)
        count += 1
    return count


# --- signal receivers (connected in IntakeConfig.ready) -------------------------------------------


def on_mailbox_saved(sender, instance, raw=False, **kwargs):
    if raw:  # loaddata: schedules are not fixtures' business
        return
    sync_mailbox_schedule(instance)


def on_mailbox_deleted(sender, instance, **kwargs):
    delete_mailbox_schedule(instance.pk)

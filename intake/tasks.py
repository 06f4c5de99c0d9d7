"""Celery tasks of the intake app: thin, take ids, safe to run twice."""
from celery import shared_task

from . import relay, services


@shared_task
def relay_outbox() -> int:
    return relay.publish_all_pending()


@shared_task
def requeue_stale_events() -> dict:
    return services.requeue_stale_events()


@shared_task
def purge_published_outbox() -> int:
    return relay.purge_published()

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


@shared_task
def purge_webhook_nonces() -> int:
    return services.purge_webhook_nonces()


@shared_task
def purge_expired_bodies() -> dict:
    from . import retention

    return retention.purge_expired_bodies()


@shared_task
def poll_mailbox(mailbox_id: int, trigger: str = "push") -> dict:
    """One poll of one mailbox (beat: trigger="schedule"; outbox `mailbox.poll`: "push"; admin: "manual")."""
    from .channels import polling

    return polling.poll_mailbox(mailbox_id, trigger=trigger).as_dict()


@shared_task
def renew_provider_subscriptions() -> dict:
    from .channels import graph_subscriptions

    return graph_subscriptions.renew_due_subscriptions()

"""Celery tasks of the intake app: thin, take ids, safe to run twice."""

from typing import Any

from celery import shared_task

from . import relay, services


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def relay_outbox() -> int:
    return relay.publish_all_pending()


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def requeue_stale_events() -> dict[str, int]:
    return services.requeue_stale_events()


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def purge_published_outbox() -> int:
    return relay.purge_published()


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def purge_webhook_nonces() -> int:
    return services.purge_webhook_nonces()


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def purge_expired_bodies() -> dict[str, Any]:
    from . import retention

    return retention.purge_expired_bodies()


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def poll_mailbox(mailbox_id: int, trigger: str = "push") -> dict[str, Any]:
    """One poll of one mailbox (beat: trigger="schedule"; outbox `mailbox.poll`: "push"; admin: "manual")."""
    from .channels import polling

    return polling.poll_mailbox(mailbox_id, trigger=trigger).as_dict()


@shared_task  # type: ignore[untyped-decorator]  # celery ships no type hints
def renew_provider_subscriptions() -> dict[str, int]:
    from .channels import graph_subscriptions

    return graph_subscriptions.renew_due_subscriptions()

"""Emails to Mailroom's own staff, each sent once: the circuit breaker's, escalations, daily digests.

`send_once` writes the `Notification` row (unique key) and sends in one transaction: a row already
there means the email went out, and nothing is sent; a failed send rolls the row back, so the next
run tries again. Callers build the text: an item number, a reason, an age, a link, never a message
body or a full address (`intake.logging.mask_address`).
"""

import logging

from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.utils import timezone

from .models import Notification

logger = logging.getLogger(__name__)


def already_sent(key: str) -> bool:
    return Notification.objects.filter(key=key).exists()


def send_once(
    key: str,
    kind: str,
    tenant_id: int,
    users,
    subject: str,
    body: str,
    *,
    inbox_event_id=None,
    destination_id=None,
    escalation_at=None,
    mailbox_id=None,
) -> bool:
    """Send `subject`/`body` to `users` (those with an address) unless `key` was sent. True if sent now."""
    users = [u for u in users if getattr(u, "email", "")]
    if not users or already_sent(key):
        return False
    try:
        with transaction.atomic():
            Notification.objects.create(
                key=key[:200],
                kind=kind,
                tenant_id=tenant_id,
                inbox_event_id=inbox_event_id,
                destination_id=destination_id,
                escalation_at=escalation_at,
                mailbox_id=mailbox_id,
                recipients=[u.get_username() for u in users],
                subject=subject[:300],
                sent_at=timezone.now(),
            )
            send_mail(subject, body, None, [u.email for u in users])
    except IntegrityError:  # sent by a concurrent run
        return False
    logger.info("sent %s notification %s to %d recipient(s)", kind, key, len(users))
    return True

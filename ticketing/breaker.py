"""The circuit breaker per destination: stop calling a destination that is plainly broken.

Every call to an external destination is recorded (`DestinationAttempt`: `record_success` from
`services.execute_intent`, `observe_failure` from `intents.record_failure`). The breaker trips when

- the last `credential_failures` attempts (default 3) all failed with reason `credentials`, or
- at least `min_attempts` (10) attempts in the last `window_seconds` (600) failed at a rate of
  `failure_rate` (0.5) or more, counting only failures that say the destination is broken
  (credentials, configuration, not found, 5xx before processing, refused connections — not 429s,
  ambiguous outcomes or one message's invalid fields),

and tripping pauses the destination (`paused=True`, `paused_reason`, `paused_by="system:breaker"`,
`paused_at`: one conditional UPDATE, so one trip) and emails the tenant's admins (members in the
`mailroom-admin` group; masked, no message content). `MAILROOM_BREAKER` holds the defaults, a
destination overrides them with `settings["breaker"]` (`{"enabled": false}` turns it off).

Items then wait instead of failing one by one: the failure that trips the breaker, and any failure
on a paused destination, sends the intent to `retry_wait` (due after MAILROOM_PAUSE_RECHECK_SECONDS)
when it is a `credentials` or a transient failure, not to `failed` (`intents.record_failure`). New
work waits in `services._act`, as for any pause. The failures before the trip end as they always
did (`failed/credentials`, to be replayed). Only a person resumes (the console's pause switch,
`reconciliation.services.pauses`), which calls `resumed`: the reason is cleared, the attempt
history forgotten and the intents that waited on the destination made due at once.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone

from intake.failures import PermanentError, TransientError
from intake.logging import mask_address
from intake.vocabulary import ReasonCode, SystemActor

from . import notifications
from .models import Destination, DestinationAttempt, Intent, Notification

logger = logging.getLogger(__name__)

ACTOR = SystemActor.BREAKER
ADMIN_GROUP = "mailroom-admin"
DEFAULTS = {"enabled": True, "credential_failures": 3, "failure_rate": 0.5, "min_attempts": 10, "window_seconds": 600}


def config(destination: Destination) -> dict:
    conf = {**DEFAULTS, **(getattr(settings, "MAILROOM_BREAKER", None) or {})}
    own = (destination.settings or {}).get("breaker")
    if isinstance(own, dict):
        conf.update(own)
    return conf


def record_success(destination: Destination, now=None) -> None:
    if config(destination)["enabled"]:
        DestinationAttempt.objects.create(destination_id=destination.pk, at=now or timezone.now(), ok=True)


def waits_out_pause(exc) -> bool:
    """A failure the destination's pause explains: the item waits for the resume instead of failing."""
    credentials = isinstance(exc, PermanentError) and exc.reason == ReasonCode.CREDENTIALS
    return credentials or isinstance(exc, TransientError)


# What says the destination itself is broken. Not a 429 (backoff handles it), not an ambiguous
# outcome (a timeout after the request was sent is resolved by lookup), not a rejection of one
# message's fields (the next message may be fine): counting those paused a healthy destination
# under a seeded fault mix in the soak test.
_HEALTH_REASONS = frozenset({ReasonCode.CREDENTIALS, ReasonCode.CONFIGURATION, ReasonCode.NOT_FOUND})


def says_destination_is_broken(exc) -> bool:
    if isinstance(exc, PermanentError):
        return exc.reason in _HEALTH_REASONS
    return isinstance(exc, TransientError) and exc.reason != ReasonCode.RATE_LIMITED


def observe_failure(destination: Destination, exc, now=None) -> bool:
    """Record a failed call and trip the breaker if it should. True when the destination is now paused
    (tripped by this failure, or paused before it by anyone). Failures that say nothing about the
    destination's health (`says_destination_is_broken`) are not recorded."""
    conf = config(destination)
    if not conf["enabled"] or not says_destination_is_broken(exc):
        return Destination.objects.filter(pk=destination.pk, paused=True).exists()
    now = now or timezone.now()
    DestinationAttempt.objects.create(
        destination_id=destination.pk, at=now, ok=False, reason=(getattr(exc, "reason", "") or "")[:50]
    )
    if Destination.objects.filter(pk=destination.pk, paused=True).exists():
        return True
    reason = _trip_reason(destination, conf, now)
    if reason is None:
        return False
    trip(destination, reason, now)
    return True


def _trip_reason(destination: Destination, conf: dict, now) -> str | None:
    streak = int(conf["credential_failures"] or 0)
    if streak > 0:
        last = list(
            DestinationAttempt.objects.filter(destination_id=destination.pk)
            .order_by("-at", "-pk")
            .values_list("ok", "reason")[:streak]
        )
        if len(last) == streak and all(not ok and reason == ReasonCode.CREDENTIALS for ok, reason in last):
            return f"{streak} consecutive credentials failures (HTTP 401/403): check the destination's credentials"
    window = float(conf["window_seconds"])
    counts = DestinationAttempt.objects.filter(
        destination_id=destination.pk, at__gt=now - timedelta(seconds=window)
    ).aggregate(total=Count("pk"), failed=Count("pk", filter=Q(ok=False)))
    total, failed = counts["total"], counts["failed"]
    if total >= int(conf["min_attempts"]) and total and failed / total >= float(conf["failure_rate"]):
        return f"{failed} of the last {total} attempts failed within {int(window)} s"
    return None


def trip(destination: Destination, reason: str, now=None) -> bool:
    """Pause the destination as the breaker (once: only an unpaused destination trips) and tell its admins."""
    now = now or timezone.now()
    if not Destination.objects.filter(pk=destination.pk, paused=False).update(
        paused=True, paused_reason=reason[:500], paused_by=ACTOR, paused_at=now
    ):
        return False
    logger.warning("circuit breaker paused destination %s: %s", destination, reason)
    try:
        _notify_admins(destination, reason, now)
    except Exception:  # the pause stands; the console shows it even if the email could not go
        logger.exception("circuit breaker: could not email the admins of tenant %s", destination.tenant_id)
    return True


def _notify_admins(destination: Destination, reason: str, now) -> None:
    from django.contrib.auth import get_user_model

    if destination.tenant.is_drill:  # a drill (reconciliation.drills) trips its own breaker on purpose
        return

    admins = list(
        get_user_model()
        .objects.filter(mailroom_tenants=destination.tenant_id, is_active=True, groups__name=ADMIN_GROUP)
        .exclude(email="")
        .distinct()
        .order_by("pk")
    )
    tenant_slug = destination.tenant.slug
    subject = f"[Mailroom] destination {tenant_slug}/{destination.slug} paused by the circuit breaker"
    body = "\n".join(
        [
            f"Mailroom stopped writing to destination {destination.slug} of tenant {tenant_slug}.",
            f"Why: {mask_address(reason)}",
            f"When: {now:%Y-%m-%d %H:%M} UTC",
            "",
            "Messages keep arriving and wait; none is lost. Fix the destination (for example its credentials),",
            "then resume it in the console (only a person can):",
            f"{settings.MAILROOM_PUBLIC_URL}/admin/reconciliation/pauseswitch/",
            "",
            "Items that failed before the pause are in the recovery queue: replay them after the fix.",
        ]
    )
    notifications.send_once(
        f"breaker:{destination.pk}:{now.isoformat()}",
        Notification.Kind.BREAKER,
        destination.tenant_id,
        admins,
        subject,
        body,
        destination_id=destination.pk,
    )


def resumed(destination_id: int) -> int:
    """A person resumed the destination: clear the breaker's reason and history, make its waiting intents
    due now. Returns how many intents were made due."""
    now = timezone.now()
    Destination.objects.filter(pk=destination_id, paused=False).update(paused_reason="", paused_by="", paused_at=None)
    DestinationAttempt.objects.filter(destination_id=destination_id).delete()
    # Not a state change (the intents stay retry_wait): only when they are due.
    return Intent.objects.filter(
        destination_id=destination_id, state=Intent.State.RETRY_WAIT, next_attempt_at__gt=now
    ).update(next_attempt_at=now)


def prune(older_than_seconds: float | None = None) -> int:
    """Forget attempts older than every window (beat, hourly)."""
    keep = older_than_seconds if older_than_seconds is not None else 86400
    old = DestinationAttempt.objects.filter(at__lt=timezone.now() - timedelta(seconds=keep))
    # Not a drill's (reconciliation.drills): its breaker history is part of what it rehearses, and goes with it.
    deleted, _ = old.exclude(destination__tenant__is_drill=True).delete()
    return deleted

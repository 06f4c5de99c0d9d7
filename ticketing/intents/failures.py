"""What a failed attempt becomes: a retry, a failure for good, an unknown outcome, or, after an earlier
unknown outcome, a question to the destination first (ticketing.intents.lookup). The writes are the
transitions of ticketing.intents.core."""

from django.conf import settings

from .. import breaker
from ..destinations.base import PermanentError, TransientError
from ..models import Intent
from . import lookup
from .core import AttemptError, fail, max_attempts, outcome_unknown, retry_later


def record_failure(intent: Intent, *, exc: AttemptError, worker: str) -> str:
    """Map a failure kind to the next state. Returns the state the intent is now in (or '' if lost)."""
    attempts = Intent.objects.filter(pk=intent.pk).values_list("attempts", flat=True).first() or 0
    # The circuit breaker counts a destination call's failure (not an acknowledgment's: that is our SMTP);
    # on a destination it paused (now or before), a credentials or transient failure waits for the
    # resume instead of failing the item (see ticketing.breaker).
    destination_call = intent.action != Intent.Action.NOTIFY_REQUESTER
    if destination_call and breaker.observe_failure(intent.destination, exc) and breaker.waits_out_pause(exc):
        return retry_later(intent, exc, worker, attempts, delay=settings.MAILROOM_PAUSE_RECHECK_SECONDS)
    if isinstance(exc, TransientError) and attempts < max_attempts(intent):
        return retry_later(intent, exc, worker, attempts)
    if isinstance(exc, (TransientError, PermanentError)):
        if lookup.last_unknown_at(intent) is not None:
            # An earlier attempt's outcome was never settled: this failure is known only once the
            # destination says that attempt made nothing.
            return lookup.fail_after_unknown(intent, exc=exc, worker=worker, attempts=attempts)
        return fail(intent, exc, worker, attempts)
    return outcome_unknown(intent, exc, worker, attempts)

"""The polling service: one poll of one mailbox, whatever its provider (docs/design.md §2 "The flow, end to end").

`poll_mailbox(mailbox_id)`:

* takes a per-mailbox lock, so two polls of one mailbox never overlap (a second
  one returns at once with status "locked"). On PostgreSQL it is a session-level
  advisory lock held on a dedicated connection: a poller that dies, even by
  SIGKILL, loses its session and with it the lock; nothing to expire or clean up.
  On SQLite (the embedded default) an `fcntl` lock on a file under VAR_DIR plays
  the same role.
* asks the provider for bounded batches (`Provider.poll(cursor) -> PollBatch`),
  ingests the messages of a batch through `intake.services.ingest_batch` (one
  statement on PostgreSQL) and stores the batch's cursor in `PollCursor`, all in
  one transaction (one commit per batch, not per message). A crash anywhere in a batch leaves the cursor before
  it and none of the batch stored: the next poll fetches the batch again (and
  the dedupe key absorbs anything another channel stored meanwhile).
* maps provider failures: `TransientError` (429, 5xx, connection) and
  `AmbiguousOutcome` -> `health="backoff"` until `poll_backoff_until`
  (exponential, `retry_after` honoured), cursor untouched;
  `PermanentError("credentials")` -> `health="credentials_invalid"`: the mailbox
  is not polled again until an admin resets its health; another
  `PermanentError` (a missing folder, bad settings) -> the longest backoff, with
  the detail shown in the admin.
  Every outcome is also reported to `intake.mailbox_health` (the link state
  up/failing/down/recovered that admins are emailed about and /metrics shows).

Triggers: "schedule" (the beat's periodic task: skipped when the mailbox's
polling is disabled or it is backing off), "push" (an outbox `mailbox.poll`
request, e.g. after a Gmail/Graph notification: skipped while backing off) and
"manual" (admin "poll now", `manage.py poll_mailbox`: runs even while backing
off). No trigger polls a mailbox whose credentials were refused.

Settings read from `Mailbox.settings` (every provider may honour them):
`batch_size` (messages per batch), `max_batches` (per poll; when reached with
more waiting, a follow-up poll is queued in the outbox).
"""

import logging
import random
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .. import archive, mailbox_health, secrets, services
from ..failures import AmbiguousOutcome, PermanentError, TransientError
from ..locks import exclusive
from ..logging import mask_address
from ..models import Mailbox, PollCursor
from ..providers import provider_for
from ..secrets import SecretUnavailable
from ..testhooks import pause_point  # inert unless MAILROOM_PAUSE_AT=<point>:<path>

logger = logging.getLogger(__name__)

# First key of the two-key advisory lock: "MRPL" — keeps Mailroom's poll locks apart from other users'.
LOCK_NAMESPACE = 0x4D52504C
DEFAULT_MAX_BATCHES = 50
BACKOFF_BASE_SECONDS = 30
BACKOFF_MAX_SECONDS = 3600

SCHEDULE, PUSH, MANUAL = "schedule", "push", "manual"
TRIGGERS = (SCHEDULE, PUSH, MANUAL)


@dataclass
class PolledMessage:
    inbox_event_id: int
    duplicate: bool
    provider_message_id: str
    size: int


@dataclass
class PollReport:
    mailbox_id: int
    status: str = "ok"  # ok | locked | skipped | backoff | credentials_invalid | unsupported | missing
    detail: str = ""
    batches: int = 0
    messages: list[PolledMessage] = field(default_factory=list)
    cursor: dict | None = None
    more: bool = False
    backoff_until: datetime | None = None

    @property
    def new(self) -> int:
        return sum(1 for m in self.messages if not m.duplicate)

    @property
    def duplicates(self) -> int:
        return sum(1 for m in self.messages if m.duplicate)

    def as_dict(self) -> dict:
        data = asdict(self)
        data["backoff_until"] = self.backoff_until.isoformat() if self.backoff_until else None
        data["new"], data["duplicates"] = self.new, self.duplicates
        data["messages"] = [{"inbox_event_id": m.inbox_event_id, "duplicate": m.duplicate} for m in self.messages]
        return data


# --- the lock -------------------------------------------------------------------------------------


def _lock_key(mailbox_id: int) -> int:
    # The second key is an int4: fold larger ids (collisions only make two polls wait for each other).
    return mailbox_id if mailbox_id < 2**31 else zlib.crc32(str(mailbox_id).encode()) & 0x7FFFFFFF


def mailbox_poll_lock(mailbox_id: int):
    """Yields True when this process now holds the mailbox's poll lock, False when another does."""
    return exclusive(LOCK_NAMESPACE, _lock_key(mailbox_id), f"poll-mailbox-{mailbox_id}")


# --- health ---------------------------------------------------------------------------------------


def _detail(exc: Exception) -> str:
    return mask_address(f"{getattr(exc, 'kind', type(exc).__name__)}: {exc}")[:500]


def _backoff_seconds(mailbox: Mailbox, retry_after: float | None, longest: bool = False) -> float:
    base = float(getattr(settings, "MAILROOM_POLL_BACKOFF_SECONDS", BACKOFF_BASE_SECONDS))
    ceiling = float(getattr(settings, "MAILROOM_POLL_BACKOFF_MAX_SECONDS", BACKOFF_MAX_SECONDS))
    if longest:
        return ceiling
    delay = base
    if mailbox.health == Mailbox.Health.BACKOFF and mailbox.poll_backoff_until and mailbox.last_polled_at:
        # The previous delay, read back from the last failed attempt: each failure in a row doubles it.
        previous = (mailbox.poll_backoff_until - mailbox.last_polled_at).total_seconds()
        delay = max(base, previous * 2)
    delay = min(delay, ceiling) * random.uniform(1.0, 1.2)
    if retry_after:
        delay = max(delay, float(retry_after))
    return delay


def _record_backoff(mailbox: Mailbox, report: PollReport, exc: Exception, started, longest=False) -> None:
    delay = _backoff_seconds(mailbox, getattr(exc, "retry_after", None), longest=longest)
    until = timezone.now() + timedelta(seconds=delay)
    detail = _detail(exc)
    Mailbox.objects.filter(pk=mailbox.pk).update(
        health=Mailbox.Health.BACKOFF, health_detail=detail, poll_backoff_until=until, last_polled_at=started
    )
    # A permanent error (the longest backoff: a missing folder, unusable settings) waits for a person: down at once.
    mailbox_health.record_poll_failure(mailbox, at=started, detail=detail, permanent=longest)
    report.status, report.detail, report.backoff_until = "backoff", detail, until
    logger.warning("poll of mailbox %s failed (%s); backing off %.0f s", mailbox.slug, detail, delay)


def _record_credentials_invalid(mailbox: Mailbox, report: PollReport, exc: Exception, started) -> None:
    detail = _detail(exc)
    Mailbox.objects.filter(pk=mailbox.pk).update(
        health=Mailbox.Health.CREDENTIALS_INVALID, health_detail=detail, poll_backoff_until=None, last_polled_at=started
    )
    mailbox_health.record_poll_failure(mailbox, at=started, detail=detail, permanent=True)
    report.status, report.detail = "credentials_invalid", detail
    logger.error(
        "credentials of mailbox %s refused (%s): polling stops until an admin resets its health", mailbox.slug, detail
    )


def reset_health(mailbox_ids) -> int:
    """What an admin does once credentials or settings are fixed: the mailbox is polled again."""
    return Mailbox.objects.filter(pk__in=list(mailbox_ids)).update(
        health=Mailbox.Health.OK, health_detail="", poll_backoff_until=None
    )


def request_poll(mailbox_id: int, trigger: str = PUSH) -> None:
    """Queue a durable poll (through the outbox, published after the current transaction commits)."""
    payload = {"mailbox_id": mailbox_id}
    if trigger != PUSH:
        payload["trigger"] = trigger
    with transaction.atomic():
        services.enqueue_outbox(services.POLL_TOPIC, payload)


# --- the poll -------------------------------------------------------------------------------------


def poll_mailbox(
    mailbox_id: int, *, trigger: str = PUSH, batch_size: int | None = None, max_batches: int | None = None
) -> PollReport:
    if trigger not in TRIGGERS:
        raise ValueError(f"unknown poll trigger {trigger!r}")
    with mailbox_poll_lock(mailbox_id) as acquired:
        if not acquired:
            logger.info("mailbox %s is being polled by someone else; skipping", mailbox_id)
            return PollReport(mailbox_id, status="locked", detail="another poll of this mailbox is running")
        return _poll_locked(mailbox_id, trigger, batch_size, max_batches)


def _skip_reason(mailbox: Mailbox, trigger: str, now) -> str:
    if mailbox.health == Mailbox.Health.CREDENTIALS_INVALID:
        return f"credentials invalid ({mailbox.health_detail or 'refused'}); reset health once fixed"
    if trigger == SCHEDULE and not mailbox.poll_enabled:
        return "polling is disabled for this mailbox"
    if trigger != MANUAL and mailbox.poll_backoff_until and mailbox.poll_backoff_until > now:
        return f"backing off until {mailbox.poll_backoff_until.isoformat()}"
    return ""


def _close(adapter, mailbox: Mailbox) -> None:
    close = getattr(adapter, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # closing is courtesy; the poll's outcome is already decided
            logger.debug("closing the %s connection failed", mailbox.provider, exc_info=True)


def _poll_locked(mailbox_id: int, trigger: str, batch_size: int | None, max_batches: int | None) -> PollReport:
    report = PollReport(mailbox_id)
    mailbox = Mailbox.objects.select_related("tenant").filter(pk=mailbox_id).first()
    if mailbox is None:
        report.status, report.detail = "missing", "no such mailbox"
        return report
    started = timezone.now()
    reason = _skip_reason(mailbox, trigger, started)
    if reason:
        report.status = "credentials_invalid" if mailbox.health == Mailbox.Health.CREDENTIALS_INVALID else "skipped"
        report.detail = reason
        report.backoff_until = mailbox.poll_backoff_until
        return report

    overrides = {k: v for k, v in (("batch_size", batch_size), ("max_batches", max_batches)) if v}
    if overrides:  # for this poll only; never saved
        mailbox.settings = {**(mailbox.settings or {}), **overrides}
    try:
        adapter = provider_for(mailbox)
    except (LookupError, ImportError) as exc:
        report.status, report.detail = "unsupported", str(exc)
        return report
    except (ValueError, TypeError) as exc:  # settings the adapter cannot use (a port that is not a number…)
        _record_backoff(mailbox, report, PermanentError("settings", str(exc)), started, longest=True)
        return report
    if not adapter.supports_polling:
        report.status, report.detail = "unsupported", f"provider {mailbox.provider!r} does not poll"
        return report

    cursor_row, _ = PollCursor.objects.get_or_create(mailbox=mailbox)
    cursor = dict(cursor_row.value or {})
    report.cursor = cursor
    limit = int((mailbox.settings or {}).get("max_batches") or DEFAULT_MAX_BATCHES)
    reread = False
    # The next batch is fetched while this one is stored (the database and the provider work at once) when
    # the provider says its poll may run on another thread (it touches no database and no shared state).
    pool = ThreadPoolExecutor(1, thread_name_prefix="poll-ahead") if hasattr(adapter, "fetches_ahead") else None
    ahead = None
    try:
        while True:
            future, ahead = ahead, None
            try:
                batch = future.result() if future is not None else adapter.poll(cursor)
            except PermanentError as exc:
                if exc.reason != "credentials" or reread or not mailbox.credentials_ref:
                    raise
                # The provider refused the credentials: the secret may have been rotated. Re-read it, once,
                # and poll again only with a new value.
                logger.info(
                    "mailbox %s: credentials refused; re-reading %s once", mailbox.slug, mailbox.credentials_ref
                )
                reread = True
                if not secrets.reread(mailbox.credentials_ref, tenant=mailbox.tenant, owner=mailbox):
                    raise
                _close(adapter, mailbox)
                adapter = provider_for(mailbox)
                continue
            report.batches += 1
            if (
                pool is not None
                and batch.more
                and not batch.archive_done
                and report.batches < limit
                and adapter.fetches_ahead
            ):
                ahead = pool.submit(adapter.poll, batch.cursor)  # what the next turn would ask for
            # One transaction per batch: its events and the cursor that moves past them commit together
            # (one commit instead of one per message; a crash mid-batch stores none of it, and the
            # unmoved cursor fetches it all again).
            with transaction.atomic():
                outcomes = services.ingest_batch(
                    mailbox=mailbox,
                    source=mailbox.provider,
                    items=[
                        services.IngestItem(m.provider_message_id, m.raw, m.thread_key, m.history)
                        for m in batch.messages
                    ],
                )
                for message, outcome in zip(batch.messages, outcomes, strict=True):
                    report.messages.append(
                        PolledMessage(
                            outcome.inbox_event_id, outcome.duplicate, message.provider_message_id, len(message.raw)
                        )
                    )
                    pause_point(f"poll.ingested.{len(report.messages)}")
                if batch.cursor != cursor:
                    PollCursor.objects.filter(pk=cursor_row.pk).update(value=batch.cursor, updated_at=timezone.now())
                archive.note_batch(mailbox, archive_done=batch.archive_done)  # an archive import's end
            cursor = report.cursor = batch.cursor
            pause_point(f"poll.batch_committed.{report.batches}")
            if not batch.more:
                break
            if report.batches >= limit:
                report.more = True
                break
    except (TransientError, AmbiguousOutcome) as exc:
        _record_backoff(mailbox, report, exc, started)
        return report
    except SecretUnavailable as exc:
        _record_credentials_invalid(mailbox, report, exc, started)
        return report
    except PermanentError as exc:
        if exc.reason == "credentials":
            _record_credentials_invalid(mailbox, report, exc, started)
        else:
            _record_backoff(mailbox, report, exc, started, longest=True)
        return report
    finally:
        if pool is not None:
            pool.shutdown(wait=True)  # a fetch ahead ends before its connection is closed
        _close(adapter, mailbox)

    Mailbox.objects.filter(pk=mailbox.pk).update(
        health=Mailbox.Health.OK, health_detail="", poll_backoff_until=None, last_polled_at=started
    )
    mailbox_health.record_poll_success(mailbox, at=started, messages=report.new)
    if report.more:
        # Bounded polls: the rest of a large backlog is fetched by a follow-up poll, not in this one.
        request_poll(mailbox.pk)
    # A poll that found nothing is the common case: not worth a line at INFO every few seconds.
    logger.log(
        logging.INFO if report.new else logging.DEBUG,
        "polled mailbox %s: %d batches, %d new, %d duplicate",
        mailbox.slug,
        report.batches,
        report.new,
        report.duplicates,
    )
    return report

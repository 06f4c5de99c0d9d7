"""A mailbox's link state, the one door to it: up -> failing -> down -> recovered (-> up).

Polling (intake.channels.polling) reports every outcome here: `record_poll_success` and `record_poll_failure`.
Each is one transaction: the counters move in SQL (`F()`), the mailbox row is locked while the next state is
decided, and the state moves by a guarded UPDATE (`WHERE link_state = <the state read>`), so two concurrent
reports never make two transitions. Each transition writes a `MailboxAudit` row and an outbox row
(`mailbox.alert`) in the same transaction; ticketing.mailbox_alerts emails the tenant's admins once per row.

Rules (settings, instance-wide):

* a failure when up or recovered -> failing once `MAILROOM_MAILBOX_FAILING_AFTER` (1) failed in a row;
* -> down after `MAILROOM_MAILBOX_DOWN_AFTER` (3) failures in a row, or when failing has lasted
  `MAILROOM_MAILBOX_DOWN_AFTER_MINUTES` (30), or at once on a permanent failure (credentials refused, a
  missing folder, settings the provider cannot use: nothing changes until a person acts);
* a success when failing or down -> recovered. "Recovered" is a period, not one poll: it lasts
  `MAILROOM_MAILBOX_RECOVERED_SECONDS` (900), then the next success makes the mailbox up again silently
  (no audit row: nothing to tell). A failure while recovered counts as from up.

The quiet-mailbox alarm (`check_quiet_mailboxes`, beat; not for a failing or down mailbox) is raised and cleared
here too (`quiet_alarm_since`, QUIET_ALARM / QUIET_CLEARED rows); its threshold comes from the mailbox's own
history (intake.quiet).
"""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from . import quiet, services
from .logging import mask_address
from .models import InboxEvent, Mailbox, MailboxAudit
from .selectors import drill_tenants
from .vocabulary import SystemActor

logger = logging.getLogger(__name__)

ACTOR = SystemActor.MAILBOX_HEALTH
ALERT_TOPIC = "mailbox.alert"  # intake.relay -> ticketing.tasks.send_mailbox_alerts
Link, Kind = Mailbox.Link, MailboxAudit.Kind
HEALTHY = (Link.UP, Link.RECOVERED)


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


def _transition(
    mailbox: Mailbox, *, from_state: str, to_state: str, kind: str, at: datetime, detail: dict
) -> MailboxAudit | None:
    """Move the link state if it still is `from_state`; the audit and outbox rows only when it moved."""
    moved = Mailbox.objects.filter(pk=mailbox.pk, link_state=from_state).update(
        link_state=to_state, link_state_since=at
    )
    mailbox.link_state, mailbox.link_state_since = (
        (to_state, at) if moved else (mailbox.link_state, mailbox.link_state_since)
    )
    if not moved or not kind:
        return None
    return _audit(mailbox, kind=kind, at=at, detail={"from": from_state, "to": to_state, **detail})


def _audit(mailbox: Mailbox, *, kind: str, at: datetime, detail: dict) -> MailboxAudit:
    audit = MailboxAudit.objects.create(
        mailbox_id=mailbox.pk, tenant_id=mailbox.tenant_id, kind=kind, actor=ACTOR, detail=detail, at=at
    )
    services.enqueue_outbox(ALERT_TOPIC, {"mailbox_audit_id": audit.pk})
    logger.info("mailbox %s: %s", mailbox.slug, kind)
    return audit


def _locked_row(mailbox: Mailbox) -> dict:
    # FOR UPDATE: the state read here is the one the guarded UPDATE expects (ignored on SQLite, whose
    # writers are serialized anyway; the guard still holds there).
    return (
        Mailbox.objects.select_for_update()
        .filter(pk=mailbox.pk)
        .values("link_state", "link_state_since", "poll_failures", "quiet_alarm_since")
        .get()
    )


@transaction.atomic
def record_poll_success(mailbox: Mailbox, *, at: datetime, messages: int) -> MailboxAudit | None:
    """A poll worked (`messages` new ones). Returns the transition's audit row, if there was one."""
    row = _locked_row(mailbox)
    Mailbox.objects.filter(pk=mailbox.pk).update(poll_failures=0, last_success_at=at)
    mailbox.poll_failures, mailbox.last_success_at = 0, at
    if messages and row["quiet_alarm_since"]:
        clear_quiet_alarm(mailbox, at=at, reason="mail arrived")
    state = row["link_state"]
    if state in (Link.FAILING, Link.DOWN):
        return _transition(
            mailbox,
            from_state=state,
            to_state=Link.RECOVERED,
            kind=Kind.LINK_RECOVERED,
            at=at,
            detail={"failures": row["poll_failures"]},
        )
    since = row["link_state_since"]
    recovered_for = timedelta(seconds=_setting("MAILROOM_MAILBOX_RECOVERED_SECONDS", 900))
    if state == Link.RECOVERED and (since is None or at - since >= recovered_for):
        _transition(mailbox, from_state=state, to_state=Link.UP, kind="", at=at, detail={})
    return None


def _failure_target(state: str, failures: int, since, at: datetime, permanent: bool) -> str | None:
    if state == Link.DOWN:
        return None
    down_after = _setting("MAILROOM_MAILBOX_DOWN_AFTER", 3)
    lasting = timedelta(minutes=_setting("MAILROOM_MAILBOX_DOWN_AFTER_MINUTES", 30))
    if permanent or failures >= down_after or (state == Link.FAILING and since and at - since >= lasting):
        return Link.DOWN
    if state in HEALTHY and failures >= _setting("MAILROOM_MAILBOX_FAILING_AFTER", 1):
        return Link.FAILING
    return None


@transaction.atomic
def record_poll_failure(mailbox: Mailbox, *, at: datetime, detail: str, permanent: bool) -> MailboxAudit | None:
    """A poll failed (`detail` masked here again; `permanent`: only a person can fix it). Returns the
    transition's audit row, if there was one."""
    row = _locked_row(mailbox)
    Mailbox.objects.filter(pk=mailbox.pk).update(
        poll_failures=F("poll_failures") + 1, poll_errors_total=F("poll_errors_total") + 1
    )
    failures = row["poll_failures"] + 1
    mailbox.poll_failures = failures
    target = _failure_target(row["link_state"], failures, row["link_state_since"], at, permanent)
    if target is None:
        return None
    kind = Kind.LINK_DOWN if target == Link.DOWN else Kind.LINK_FAILING
    return _transition(
        mailbox,
        from_state=row["link_state"],
        to_state=target,
        kind=kind,
        at=at,
        detail={"failures": failures, "permanent": permanent, "error": mask_address(detail)[:300]},
    )


# --- the quiet-mailbox alarm --------------------------------------------------------------------------------


def raise_quiet_alarm(
    mailbox: Mailbox, *, at: datetime, last_message_at, threshold_hours: float
) -> MailboxAudit | None:
    with transaction.atomic():
        if not Mailbox.objects.filter(pk=mailbox.pk, quiet_alarm_since__isnull=True).update(quiet_alarm_since=at):
            return None
        mailbox.quiet_alarm_since = at
        return _audit(
            mailbox,
            kind=Kind.QUIET_ALARM,
            at=at,
            detail={
                "threshold_hours": round(threshold_hours, 2),
                "last_message_at": last_message_at.isoformat() if last_message_at else None,
            },
        )


def clear_quiet_alarm(mailbox: Mailbox, *, at: datetime, reason: str) -> MailboxAudit | None:
    with transaction.atomic():
        if not Mailbox.objects.filter(pk=mailbox.pk, quiet_alarm_since__isnull=False).update(quiet_alarm_since=None):
            return None
        mailbox.quiet_alarm_since = None
        return _audit(mailbox, kind=Kind.QUIET_CLEARED, at=at, detail={"reason": reason})


def check_quiet_mailboxes(*, now: datetime | None = None) -> dict:
    """Raise or clear each mailbox's quiet alarm (beat). {"raised": n, "cleared": n, "watched": n}."""
    now = now or timezone.now()
    counts = {"raised": 0, "cleared": 0, "watched": 0}
    last_by_box = dict(
        InboxEvent.objects.filter(history=False)
        .order_by()
        .values("mailbox_id")
        .annotate(last=Max("received_at"))
        .values_list("mailbox_id", "last")
    )
    for mailbox in Mailbox.objects.exclude(tenant_id__in=drill_tenants()).order_by("pk"):
        if mailbox.link_state not in HEALTHY:  # failing or down says more already: no second alarm, none cleared
            continue
        threshold = quiet.threshold_hours(mailbox, now=now)
        last = last_by_box.get(mailbox.pk)
        if threshold is not None:
            counts["watched"] += 1
        silent = threshold is not None and last is not None and now - last > timedelta(hours=threshold)
        if silent and mailbox.quiet_alarm_since is None:
            counts["raised"] += bool(
                raise_quiet_alarm(mailbox, at=now, last_message_at=last, threshold_hours=threshold)
            )
        elif not silent and mailbox.quiet_alarm_since is not None:
            reason = "mail arrived" if threshold is not None else "alarm off for this mailbox"
            counts["cleared"] += bool(clear_quiet_alarm(mailbox, at=now, reason=reason))
    return counts

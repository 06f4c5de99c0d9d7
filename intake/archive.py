"""Archive import: a mailbox's existing mail up to a cut-off, stored as history, then live.

`start_archive_import(mailbox=..., before=..., tickets=..., actor=...)` sets the cut-off
(`Mailbox.archive_before`) and what history becomes (`archive_tickets`: "none" or "closed"). From the next
poll on, the provider fetches every message received before the cut-off, not only its sync window
(`intake.providers.imap`, `.gmail`, `.graph`), besides the live mail, which is fetched first and
ticketed as usual from the start. Mail before the cut-off is ingested with `InboxEvent.history`:

* `none`: normalization stores its sender and subject and ends it `suppressed` with reason `archived`
  (`intake.normalize`, through the event door, with its audit row): no ticket, no acknowledgment;
* `closed`: a ticket created closed (the built-in store's `solved`; other desks where the adapter supports
  it), never threaded onto another ticket, never acknowledged (skip reason `archived`).

Either way the event is stored, so the provider reconciler finds nothing missing, and it ends in a final
state, so it is never stuck nor in the recovery queue for acknowledgment reasons.

`note_batch` (called by `intake.channels.polling` inside each batch's transaction) records `archive_import_finished`
and sets `archive_done_at` with the batch that ends the scan; from then on the mailbox is live only.
"""

import logging
from datetime import datetime, time

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from .models import InboxEvent, Mailbox, MailboxAudit
from .selectors import visible_tenants
from .vocabulary import MailboxAuditKind, SystemActor

logger = logging.getLogger(__name__)

NO_TICKETS, CLOSED_TICKETS = "none", "closed"
TICKET_CHOICES = (NO_TICKETS, CLOSED_TICKETS)
# Providers whose poll runs the archive scan (the others only receive, or fetch a sync window).
ARCHIVE_PROVIDERS = frozenset({Mailbox.Provider.IMAP, Mailbox.Provider.GMAIL, Mailbox.Provider.GRAPH})
PERMISSION = "intake.change_mailbox"


def cutoff_from_date(day) -> datetime:
    """A `YYYY-MM-DD` (or date) as the cut-off: the start of that day in the current time zone."""
    if isinstance(day, str):
        day = datetime.strptime(day, "%Y-%m-%d").date()
    return timezone.make_aware(datetime.combine(day, time.min))


def running(mailbox: Mailbox) -> bool:
    return mailbox.archive_before is not None and mailbox.archive_done_at is None


def without_ticket(event: InboxEvent) -> bool:
    """History that becomes no ticket at all (the mailbox's `archive_tickets` is not "closed")."""
    return bool(event.history) and event.mailbox.archive_tickets != CLOSED_TICKETS


def _audit(mailbox: Mailbox, kind: MailboxAuditKind, actor: str, detail: dict, at) -> MailboxAudit:
    return MailboxAudit.objects.create(
        mailbox=mailbox, tenant_id=mailbox.tenant_id, kind=kind, actor=actor, detail=detail, at=at
    )


def check_allowed(*, user, mailbox: Mailbox) -> None:
    """PermissionDenied unless `user` may change `mailbox` (its tenant is theirs). `user=None`: the operator
    at the server (`manage.py archive_import`)."""
    if user is None:
        return
    if not user.has_perm(PERMISSION) or not visible_tenants(user).filter(pk=mailbox.tenant_id).exists():
        raise PermissionDenied("you may not change this mailbox")


def start_archive_import(*, mailbox: Mailbox, before: datetime, tickets: str, actor: str, user=None) -> Mailbox:
    """Import `mailbox`'s mail received before `before` as history, `tickets` "none" or "closed".

    Starting again (another cut-off, or after a finished import) scans again; what is already stored stays
    as it is (a message fetched twice is a duplicate). ValidationError for a choice that cannot be carried
    out; PermissionDenied for a user who may not change the mailbox.
    """
    check_allowed(user=user, mailbox=mailbox)
    if before is not None and timezone.is_naive(before):
        before = timezone.make_aware(before)
    errors = choice_errors(provider=mailbox.provider, before=before, tickets=tickets)
    if errors:
        raise ValidationError(errors)
    now = timezone.now()
    with transaction.atomic():
        Mailbox.objects.filter(pk=mailbox.pk).update(
            archive_before=before, archive_tickets=tickets, archive_done_at=None
        )
        _audit(
            mailbox,
            MailboxAuditKind.ARCHIVE_IMPORT_STARTED,
            actor,
            {"before": before.isoformat(), "tickets": tickets},
            now,
        )
    mailbox.archive_before, mailbox.archive_tickets, mailbox.archive_done_at = before, tickets, None
    logger.info("archive import of mailbox %s started (before %s, tickets %s)", mailbox.slug, before, tickets)
    return mailbox


def choice_errors(*, provider: str, before, tickets: str) -> dict[str, str]:
    """What is wrong with an import's choice, by mailbox field ({} when it can be carried out)."""
    errors = {}
    if provider not in ARCHIVE_PROVIDERS:
        errors["archive_before"] = (
            f"archive import is not available for {provider} mailboxes (only {', '.join(sorted(ARCHIVE_PROVIDERS))})"
        )
    elif before is None:
        errors["archive_before"] = "an archive import needs a cut-off"
    elif before > timezone.now():
        errors["archive_before"] = "the cut-off must not be in the future"
    if tickets not in TICKET_CHOICES:
        errors["archive_tickets"] = f"choose what history becomes: {' or '.join(TICKET_CHOICES)}"
    return errors


def form_request(mailbox: Mailbox, changed: list[str]) -> tuple[datetime, str] | None:
    """(cut-off, tickets) when an admin form set a new import on `mailbox` (unsaved): its archive fields are
    put back as stored, so the form's save leaves them alone and `start_archive_import` writes (and audits)
    them. None when the form did not touch them."""
    if not {"archive_before", "archive_tickets"} & set(changed):
        return None
    wanted = (mailbox.archive_before, mailbox.archive_tickets)
    stored = (
        Mailbox.objects.filter(pk=mailbox.pk).values("archive_before", "archive_tickets").first()
        if mailbox.pk
        else None
    )
    stored = stored or {"archive_before": None, "archive_tickets": ""}
    mailbox.archive_before, mailbox.archive_tickets = stored["archive_before"], stored["archive_tickets"]
    return wanted


def _started(mailbox: Mailbox) -> bool:
    return MailboxAudit.objects.filter(
        mailbox=mailbox, kind=MailboxAuditKind.ARCHIVE_IMPORT_STARTED, detail__before=mailbox.archive_before.isoformat()
    ).exists()


def note_batch(mailbox: Mailbox, *, archive_done: bool, at=None) -> None:
    """Inside a poll batch's transaction, while an import runs: its start is on record (the cut-off may have
    been set without `start_archive_import`), and the batch that ends the scan finishes it."""
    if not running(mailbox):
        return
    at = at or timezone.now()
    if not _started(mailbox):
        _audit(
            mailbox,
            MailboxAuditKind.ARCHIVE_IMPORT_STARTED,
            SystemActor.POLL,
            {"before": mailbox.archive_before.isoformat(), "tickets": mailbox.archive_tickets},
            at,
        )
    if archive_done:
        finish_archive_import(mailbox=mailbox, actor=SystemActor.POLL, at=at)


def finish_archive_import(*, mailbox: Mailbox, actor: str, at=None) -> bool:
    """The mail before the cut-off is all fetched: the mailbox is live. False when it was finished already
    (or the cut-off changed meanwhile: that import goes on)."""
    at = at or timezone.now()
    with transaction.atomic():
        finished = Mailbox.objects.filter(
            pk=mailbox.pk, archive_before=mailbox.archive_before, archive_done_at__isnull=True
        ).update(archive_done_at=at)
        if finished:
            history = InboxEvent.objects.filter(mailbox=mailbox, history=True).count()
            _audit(
                mailbox,
                MailboxAuditKind.ARCHIVE_IMPORT_FINISHED,
                actor,
                {
                    "before": mailbox.archive_before.isoformat(),
                    "tickets": mailbox.archive_tickets,
                    "history_events": history,
                },
                at,
            )
    if finished:
        mailbox.archive_done_at = at  # the provider reads this instance: the rest of this poll is live
        logger.info("archive import of mailbox %s finished", mailbox.slug)
    return bool(finished)

"""Provider ↔ inbox events: what the provider holds that we never stored (`missing_from_inbox`).

Per mailbox whose provider can list (`Provider.supports_listing`: IMAP, Gmail, Graph, Mailgun with
stored messages; not raw, Postmark or SendGrid), over the sliding window
[now − MAILROOM_RECONCILE_WINDOW_DAYS, now − MAILROOM_RECONCILE_GRACE_SECONDS] (the grace leaves the
newest mail to the poller and the webhooks), at most MAILROOM_RECONCILE_LIMIT listed messages per
pass (a pass that stops there stores the provider's resume point; the next pass goes on with the
same window). Listed ids are compared with stored ones by the unique (mailbox, provider_message_id)
index, so the cost follows the listing, not the table. A missing message is fetched and stored
through `intake.services.ingest` (the normal pipeline takes it from there): a finding opened, then
resolved "ingested" with its event. A Message-ID listed twice may be two messages reusing one id:
those are handed to `ingest` too, which tells a duplicate from a reuse.
"""

from collections import Counter
from datetime import UTC, datetime, timedelta

from intake.models import InboxEvent
from intake.providers import provider_for
from intake.services import ingest

from ..models import Finding
from .base import Pass, Summary, limit, recording, resolve, setting, window

KIND = "provider"


def grace() -> timedelta:
    return timedelta(seconds=float(setting("MAILROOM_RECONCILE_GRACE_SECONDS", 600)))


def reconcile_mailbox(mailbox, summaries: list, now) -> None:
    try:
        provider = provider_for(mailbox)
    except (LookupError, ImportError, ValueError, TypeError):
        provider = None
    if provider is None or not provider.supports_listing:
        summaries.append(Summary(KIND, mailbox.slug, skipped=f"provider {mailbox.provider} has no listing"))
        return
    with recording(KIND, mailbox.slug, summaries, now) as current:
        try:
            _reconcile(mailbox, provider, current, limit())
        finally:
            provider.close()


def _reconcile(mailbox, provider, current: Pass, budget: int) -> None:
    resume = current.resume
    if resume.get("page") is not None:  # an unfinished window: go on with it
        since, until = _time(resume["since"]), _time(resume["until"])
    else:
        since, until = current.now - window(), current.now - grace()
    since, until = since.astimezone(UTC), until.astimezone(UTC)
    page = resume.get("page") or None
    while current.run.scanned < budget:
        listing = provider.list_recent(since, until, budget - current.run.scanned, page)
        current.run.scanned += len(listing.messages)
        _repair(mailbox, provider, listing.messages, current)
        page = listing.resume
        # Saved as it goes: a failure further on resumes after what is already done.
        current.resume = {"since": since.isoformat(), "until": until.isoformat(), "page": page} if page else {}
        if page is None:
            break
    current.run.cursor = current.resume


def _repair(mailbox, provider, listed, current: Pass) -> None:
    if not listed:
        return
    counts = Counter(m.provider_message_id for m in listed)
    stored = set(
        InboxEvent.objects.filter(mailbox=mailbox, provider_message_id__in=list(counts)).values_list(
            "provider_message_id", flat=True
        )
    )
    wanted = [m for m in listed if m.provider_message_id not in stored or counts[m.provider_message_id] > 1]
    if not wanted:
        return
    for message in provider.fetch_listed(wanted):
        known = message.provider_message_id in stored
        finding = None
        if not known:
            finding = current.found(
                Finding.Kind.MISSING_FROM_INBOX,
                f"mailbox:{mailbox.pk}:{message.provider_message_id}",
                tenant_id=mailbox.tenant_id,
                detail={"mailbox": mailbox.slug},
            )
        # Listed from before an archive cut-off: history, as the poll would have stored it (intake.archive).
        result = ingest(
            mailbox, message.provider_message_id, message.raw, source=mailbox.provider, history=message.history
        )
        if result.duplicate:
            if finding is not None:  # stored meanwhile by the poller or a webhook: nothing was lost
                resolve(finding.pk, "stored_meanwhile", current.now, inbox_event_id=result.inbox_event_id)
            continue
        if finding is None:  # a second message reusing a stored Message-ID, stored under its derived id
            pmid = (
                InboxEvent.objects.filter(pk=result.inbox_event_id)
                .values_list("provider_message_id", flat=True)
                .first()
            )
            finding = current.found(
                Finding.Kind.MISSING_FROM_INBOX,
                f"mailbox:{mailbox.pk}:{pmid}",
                tenant_id=mailbox.tenant_id,
                detail={"mailbox": mailbox.slug},
            )
        current.repaired(finding, "ingested", inbox_event_id=result.inbox_event_id)


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value)

"""Inbox events ↔ mappings: an open event with no ticket mapping past the tenant's threshold (`unmapped`).

Per mailbox: events still `received`, `ready` or `write_pending` (the open states, so the read uses
the (state, updated_at) index and its size is the open backlog, not the table), received more than
`Tenant.settings["unmapped_after_minutes"]` (default MAILROOM_UNMAPPED_AFTER_MINUTES, 15) ago,
without a `TicketMapping`. A paused mailbox, its tenant's pause or the global pause waits on purpose: not a finding.

The event is not moved: it stays open, so a worker that is merely slow still completes it, and
an open `unmapped` finding puts it in the recovery queue (`reconciliation.selectors.recovery_queue`,
third arm), where a person sees it. Moving it to `failed/unmapped` instead would stop the sweeps
and workers from finishing what may be only late. The finding is resolved by the next pass once
the event has left the open states: "completed" (or "mapped"), or "moved_to_<state>" when it went
to a recovery state (the queue then shows it by its state) or was suppressed.
"""

from datetime import timedelta

from django.db.models import Exists, OuterRef

from intake.models import InboxEvent
from intake.selectors import global_pause_on, tenant_pause_on
from ticketing.models import TicketMapping

from ..models import Finding
from .base import Pass, limit, open_findings, recording, resolve, setting

KIND = "unmapped"


def threshold_minutes(tenant) -> int:
    """The tenant's `unmapped_after_minutes`, read defensively (the settings field may be absent)."""
    default = int(setting("MAILROOM_UNMAPPED_AFTER_MINUTES", 15))
    getter = getattr(tenant, "int_setting", None)
    if getter is not None:
        try:
            return getter("unmapped_after_minutes", default)
        except KeyError:
            pass
    value = (getattr(tenant, "settings", None) or {}).get("unmapped_after_minutes")
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return default
    return int(value)


def reconcile_mailbox(mailbox, summaries: list, now) -> None:
    with recording(KIND, mailbox.slug, summaries, now) as current:
        _resolve_settled(mailbox, current)
        if mailbox.paused or global_pause_on() or tenant_pause_on(mailbox.tenant_id):
            current.run.cursor = {}
            return
        _find(mailbox, current)


def _find(mailbox, current: Pass) -> None:
    cutoff = current.now - timedelta(minutes=threshold_minutes(mailbox.tenant))
    after = int(current.resume.get("after_id") or 0)
    budget = limit()
    rows = list(
        InboxEvent.objects.filter(
            state__in=InboxEvent.OPEN_STATES, mailbox=mailbox, received_at__lt=cutoff, pk__gt=after
        )
        .exclude(Exists(TicketMapping.objects.filter(inbox_event=OuterRef("pk"))))
        .order_by("pk")
        .values_list("pk", "state", "received_at")[:budget]
    )
    current.run.scanned += len(rows)
    for event_id, state, received_at in rows:
        current.found(
            Finding.Kind.UNMAPPED,
            f"event:{event_id}",
            tenant_id=mailbox.tenant_id,
            inbox_event_id=event_id,
            detail={"state": state, "received_at": received_at.isoformat(), "mailbox": mailbox.slug},
        )
    current.run.cursor = {"after_id": rows[-1][0]} if len(rows) == budget else {}


def _resolve_settled(mailbox, current: Pass) -> None:
    """Close the findings whose event is no longer open and unmapped."""
    findings = list(
        open_findings(Finding.Kind.UNMAPPED, inbox_event__mailbox=mailbox).values_list("pk", "inbox_event_id")[
            : limit()
        ]
    )
    if not findings:
        return
    states = dict(InboxEvent.objects.filter(pk__in=[e for _, e in findings if e]).values_list("pk", "state"))
    mapped = set(TicketMapping.objects.filter(inbox_event_id__in=list(states)).values_list("inbox_event_id", flat=True))
    for finding_id, event_id in findings:
        state = states.get(event_id)
        if state == InboxEvent.State.COMPLETED:
            resolution = "completed"
        elif event_id in mapped:
            resolution = "mapped"
        elif state is None:
            resolution = "event_gone"
        elif state not in InboxEvent.OPEN_STATES:
            resolution = f"moved_to_{state}"
        else:
            continue
        resolve(finding_id, resolution, current.now)

"""Destination ↔ mappings: our records there without a mapping here, and mappings whose ticket is gone.

Per destination whose adapter lists (`DestinationAdapter.supports_listing`: built-in and Zendesk):

* `orphan_in_destination`: a record created (Zendesk: updated) in the window whose external
  reference has our prefix (`mailroom-<key[:40]>`, made by `ticketing.intents`) but no mapping
  here proves it. The intent is found by its key (the unique index on `Intent.idempotency_key`,
  by prefix). It is adopted, through the intents' own door (`record_success`: intent succeeded,
  mapping, event completed, audit, one transaction), when that is unambiguous: exactly one record
  carries the reference, the intent exists, is a `create_ticket` of this destination, has no
  mapping, is not in flight or succeeded, and its event was not closed. Otherwise the finding stays
  open for a person (`detail["held"]` says why). An intent in flight with a live claim is a
  worker about to record its own success: not a finding.
* `ticket_missing`: a `create_ticket` mapping of an event received in the window (read through the
  events' (mailbox, received_at) index) whose ticket the destination no longer has. Never
  repaired automatically (a second ticket is a decision); resolved if the ticket is back.

Both parts are bounded (MAILROOM_RECONCILE_LIMIT each) and resumable (the adapter's page cursor,
the last event id).
"""

from functools import reduce
from operator import or_

from django.db.models import Q

from intake.models import InboxEvent, Mailbox
from intake.vocabulary import SystemActor
from ticketing import intents
from ticketing.destinations import adapter_for
from ticketing.destinations.base import TicketResult
from ticketing.intents.creation import EXTERNAL_REF_PREFIX
from ticketing.models import Intent, TicketMapping

from ..models import Finding
from .base import Pass, Summary, limit, open_findings, recording, resolve, window

KIND = "destination"
REF_PREFIX = EXTERNAL_REF_PREFIX  # ticketing.intents.creation.external_ref
ACTOR = SystemActor.RECONCILE
ADOPTABLE = (
    Intent.State.PENDING,
    Intent.State.RETRY_WAIT,
    Intent.State.UNKNOWN,
    Intent.State.FAILED,
    Intent.State.HELD,
)


# Keys looked up per query (prefix matches on the unique key; SQLite's expression depth limit is 1,000).
KEYS_PER_QUERY = 200


def scope_of(destination) -> str:
    return f"destination:{destination.tenant.slug}/{destination.slug}"


def reconcile_destination(destination, summaries: list, now) -> None:
    try:
        adapter = adapter_for(destination)
    except LookupError:
        adapter = None
    if adapter is None or not adapter.supports_listing:
        summaries.append(Summary(KIND, scope_of(destination), skipped=f"{destination.kind} has no listing"))
        return
    with recording(KIND, scope_of(destination), summaries, now) as current:
        if not current.resume:  # a fresh pass (not the rest of one that hit its limit)
            _resolve_settled(destination, adapter, current)
        _orphans(destination, adapter, current)
        _missing_tickets(destination, adapter, current)
        done = current.resume.get("records") == "done" and current.resume.get("mappings") == "done"
        current.run.cursor = {} if done else current.resume


# --- records without a mapping ---------------------------------------------------------------------


def _orphans(destination, adapter, current: Pass) -> None:
    state = current.resume.get("records")
    if state == "done":
        return
    since = current.now - window()
    page, budget = state or None, limit()
    seen = 0
    while seen < budget:
        result = adapter.records_with_ref(REF_PREFIX, since, budget - seen, page)
        seen += len(result.records)
        _check_records(destination, adapter, result.records, current)
        page = result.resume
        current.resume = {**current.resume, "records": page or "done"}
        if page is None:
            break
    current.run.scanned += seen


def _check_records(destination, adapter, records, current: Pass) -> None:
    if not records:
        return
    keys = sorted({r.external_ref[len(REF_PREFIX) :] for r in records if len(r.external_ref) > len(REF_PREFIX)})
    found = []
    # In chunks: one OR-term per key, and SQLite refuses an expression deeper than 1,000 terms.
    for start in range(0, len(keys), KEYS_PER_QUERY):
        chunk = keys[start : start + KEYS_PER_QUERY]
        found += Intent.objects.filter(reduce(or_, (Q(idempotency_key__startswith=k) for k in chunk))).select_related(
            "destination"
        )
    by_ref: dict[str, list[Intent]] = {}
    for intent in found:
        by_ref.setdefault(intent.external_ref, []).append(intent)
    mappings = {
        (m.inbox_event_id, m.action): m
        for m in TicketMapping.objects.filter(inbox_event_id__in=[i.inbox_event_id for i in found])
    }
    for record in records:
        matching = by_ref.get(record.external_ref, [])
        mapping = next(
            (mappings.get((i.inbox_event_id, i.action)) for i in matching if (i.inbox_event_id, i.action) in mappings),
            None,
        )
        if mapping is not None and mapping.destination_id == destination.pk and mapping.ticket_id == record.ticket_id:
            continue  # the normal case: proved by its mapping
        live_claim = [
            i
            for i in matching
            if i.state == Intent.State.IN_FLIGHT and i.claimed_until and i.claimed_until > current.now
        ]
        if live_claim and mapping is None:
            continue  # a worker holds it and is about to record this very success
        obj = f"destination:{destination.pk}:ticket:{record.ticket_id}"
        intent = matching[0] if len(matching) == 1 else None
        held = _why_not_adopt(destination, adapter, record, matching, mapping)
        finding = current.found(
            Finding.Kind.ORPHAN_IN_DESTINATION,
            obj,
            tenant_id=destination.tenant_id,
            inbox_event_id=intent.inbox_event_id if intent else None,
            detail={
                "destination": destination.pk,
                "ticket_id": record.ticket_id,
                "external_ref": record.external_ref,
                "url": record.url,
                "held": held,
                "intent": intent.pk if intent else None,
            },
        )
        if held:
            continue
        if intents.record_success(
            intent,
            result=TicketResult(record.ticket_id, record.url or adapter.ticket_url(record.ticket_id)),
            actor=ACTOR,
            from_states=ADOPTABLE,
        ):
            current.repaired(finding, "adopted")
        else:  # the intent moved meanwhile: the next pass looks again
            finding.detail = {**finding.detail, "held": "intent_moved"}
            Finding.objects.filter(pk=finding.pk).update(detail=finding.detail)


def _why_not_adopt(destination, adapter, record, matching, mapping) -> str:
    """ "" when the record can be adopted as the intent's mapping; else why a person must decide."""
    if not matching:
        return "no_intent"
    if len(matching) > 1:
        return "several_intents"
    intent = matching[0]
    if mapping is not None:
        return "mapped_to_another_ticket"
    if intent.action != Intent.Action.CREATE_TICKET:
        return f"intent_is_{intent.action}"
    if intent.destination_id != destination.pk:
        return "intent_of_another_destination"
    if intent.state not in ADOPTABLE:
        return f"intent_{intent.state}"
    if InboxEvent.objects.filter(pk=intent.inbox_event_id, state=InboxEvent.State.SUPPRESSED).exists():
        return "event_closed"
    others = adapter.records_for_ref(record.external_ref)
    if [r.ticket_id for r in others] != [record.ticket_id]:
        return "several_records"
    return ""


# --- mappings without a ticket ---------------------------------------------------------------------


def _missing_tickets(destination, adapter, current: Pass) -> None:
    state = current.resume.get("mappings")
    if state == "done":
        return
    after = int(state or 0)
    budget = limit()
    mailboxes = list(Mailbox.objects.filter(tenant_id=destination.tenant_id).values_list("pk", flat=True))
    rows = list(
        TicketMapping.objects.filter(
            destination=destination,
            action=Intent.Action.CREATE_TICKET,
            inbox_event__mailbox_id__in=mailboxes,
            inbox_event__received_at__gte=current.now - window(),
            inbox_event_id__gt=after,
        )
        .order_by("inbox_event_id")
        .values_list("pk", "inbox_event_id", "ticket_id")[:budget]
    )
    current.run.scanned += len(rows)
    existing = adapter.existing_tickets([t for _, _, t in rows]) if rows else set()
    for mapping_id, event_id, ticket_id in rows:
        if ticket_id not in existing:
            current.found(
                Finding.Kind.TICKET_MISSING,
                f"mapping:{mapping_id}",
                tenant_id=destination.tenant_id,
                inbox_event_id=event_id,
                detail={"destination": destination.pk, "ticket_id": ticket_id},
            )
    current.resume = {**current.resume, "mappings": rows[-1][1] if len(rows) == budget else "done"}


# --- findings that went away ----------------------------------------------------------------------


def _resolve_settled(destination, adapter, current: Pass) -> None:
    budget = limit()
    orphans = list(
        open_findings(Finding.Kind.ORPHAN_IN_DESTINATION, object__startswith=f"destination:{destination.pk}:")[:budget]
    )
    for finding in orphans:
        ref, ticket_id = finding.detail.get("external_ref", ""), finding.detail.get("ticket_id", "")
        intent = Intent.objects.filter(external_ref=ref, idempotency_key__startswith=ref[len(REF_PREFIX) :]).first()
        mapped = (
            intent is not None
            and TicketMapping.objects.filter(
                inbox_event_id=intent.inbox_event_id, action=intent.action, destination=destination, ticket_id=ticket_id
            ).exists()
        )
        if mapped:
            resolve(finding.pk, "mapped", current.now)
        elif ticket_id not in adapter.existing_tickets([ticket_id]):
            resolve(finding.pk, "record_gone", current.now)
    missing = list(open_findings(Finding.Kind.TICKET_MISSING, detail__destination=destination.pk)[:budget])
    if missing:
        existing = adapter.existing_tickets([f.detail.get("ticket_id", "") for f in missing])
        for finding in missing:
            if finding.detail.get("ticket_id") in existing:
                resolve(finding.pk, "ticket_exists", current.now)

"""Everything the pipeline stored for a set of events, ids replaced by stable names, and a comparison of two."""

from intake.models import AuditEvent, InboxEvent, OutboxMessage
from ticketing.models import CopiedMessage, Intent, RoutingRule, Ticket, TicketMapping


def _canonical(value, names: dict):
    """`value` with every id in `names` (intent, ticket and event ids, as ints or strings) replaced."""
    if isinstance(value, dict):
        return {k: _canonical(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v, names) for v in value]
    if isinstance(value, str) and value.startswith("/admin/ticketing/ticket/"):
        number = value.split("/")[-3]
        tickets = {pk: n for (kind, *key), n in names.items() if kind == "ticket" for pk in key[1:]}
        return value.replace(f"/{number}/", f"/{tickets.get(number, number)}/")
    return value


def snapshot(event_ids: list[int], outbox_after: int) -> dict:
    """Everything the pipeline stored for these events, ids replaced by stable names."""
    index = {pk: f"event{n:02d}" for n, pk in enumerate(event_ids)}
    intents = list(
        Intent.objects.filter(inbox_event_id__in=event_ids).order_by("inbox_event_id", "action", "action_version")
    )
    tickets = {str(t.pk): t for t in Ticket.objects.filter(idempotency_key__in=[i.idempotency_key for i in intents])}
    names = {("intent", i.pk): f"intent:{index[i.inbox_event_id]}:{i.action}:{i.action_version}" for i in intents}
    names.update({("ticket", t.destination_id, pk): f"ticket:{t.idempotency_key[:12]}" for pk, t in tickets.items()})

    def name(kind, value, destination=None):
        return names.get((kind, value) if destination is None else (kind, destination, value), value)

    def audit_detail(detail):
        detail = dict(detail)
        if "intent" in detail:
            detail["intent"] = name("intent", detail["intent"])
        if "ticket_id" in detail:
            detail["ticket_id"] = name("ticket", detail["ticket_id"], detail.get("destination"))
        for key in ("primary_event", "first_event"):
            if key in detail:
                detail[key] = index.get(detail[key], detail[key])
        return _canonical(detail, names)

    events = []
    for event in InboxEvent.objects.filter(pk__in=event_ids):
        events.append(
            {
                "event": index[event.pk],
                "state": event.state,
                "reason_code": event.reason_code,
                "reason_detail": event.reason_detail,
                "sender": event.sender,
                "subject": event.subject,
                "message_id_header": event.message_id_header,
                "thread_key": event.thread_key,
                "details": event.details,
                "auth_results": event.auth_results,
                "route": event.route,
                "waits": event.retry_at is not None,
                "dispatch_count": event.dispatch_count,
                "copy_of": index.get(event.copy_of_id),
                "escalates": event.escalate_at is not None,
                "audit": [
                    (a.kind, a.actor, audit_detail(a.detail))
                    for a in AuditEvent.objects.filter(inbox_event_id=event.pk).order_by("pk")
                ],
                "mappings": sorted(
                    (
                        m.action,
                        m.destination_id,
                        name("ticket", m.ticket_id, m.destination_id),
                        _canonical(m.ticket_url, names),
                    )
                    for m in TicketMapping.objects.filter(inbox_event_id=event.pk)
                ),
            }
        )
    return {
        "events": sorted(events, key=lambda e: e["event"]),
        "intents": [
            (
                index[i.inbox_event_id],
                i.action,
                i.action_version,
                i.destination_id,
                i.state,
                i.attempts,
                i.claimed_by,
                i.claimed_until is None,
                i.next_attempt_at is None,
                i.completed_at is None,
                i.last_error_kind,
                i.last_error,
                i.external_ref,
                i.idempotency_key,
                name("ticket", i.result_ref, i.destination_id),
            )
            for i in intents
        ],
        "tickets": sorted(
            (
                names[("ticket", t.destination_id, pk)],
                t.destination_id,
                t.external_ref,
                t.subject,
                t.requester,
                t.description,
                t.status,
                t.tags,
                t.queue,
                t.priority,
                t.request_type,
                t.assignee,
            )
            for pk, t in tickets.items()
        ),
        "outbox": sorted(
            (
                o.topic,
                str(
                    _canonical(
                        {
                            k: (index.get(v, v) if k == "inbox_event_id" else name("intent", v))
                            for k, v in o.payload.items()
                        },
                        names,
                    )
                ),
                o.published_at is None,
            )
            for o in OutboxMessage.objects.filter(pk__gt=outbox_after)
        ),
        "rule_hits": sorted(RoutingRule.objects.values_list("pk", "hits")),
        "copies": sorted((c.fingerprint, index.get(c.primary_id)) for c in CopiedMessage.objects.all()),
    }


def assert_same(old: dict, new: dict) -> None:
    """Part by part and event by event, so a difference names where it is."""
    assert new.keys() == old.keys()
    for part in old:
        if part == "events":
            for before, after in zip(old[part], new[part], strict=True):
                for key in before:
                    assert after[key] == before[key], (before["event"], key)
        else:
            assert new[part] == old[part], part

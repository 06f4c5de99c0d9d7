"""Reads for operators: the recovery queue and what it shows."""

from django.contrib.auth import get_user_model
from django.db.models import (
    Case,
    Count,
    Exists,
    IntegerField,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from intake.models import AuditEvent, InboxEvent, Mailbox, Switch
from intake.selectors import paused_tenant_ids, visible_tenants
from intake.vocabulary import AuditKind, ReasonCode
from ticketing import numbers
from ticketing.models import Destination, Intent, RoutingRule, TicketMapping
from ticketing.selectors import WORK_ACTIONS  # the intents that carry an event's ticket work

from .models import Finding, ReconciliationRun

# Audit kinds that mark an attempt at the destination (its outcome).
ATTEMPT_KINDS = (
    AuditKind.INTENT_RETRY_WAIT,
    AuditKind.INTENT_FAILED,
    AuditKind.INTENT_UNKNOWN,
    AuditKind.TICKET_CREATED,
)

# Not a reason code: what the queue shows for a completed event whose acknowledgment is held.
ACKNOWLEDGMENT_HELD = "acknowledgment_held"

# What a reason code means, for the person reading the queue: the labels of intake's ReasonCode.
REASON_TEXT = {
    **{code.value: code.label for code in ReasonCode},
    ACKNOWLEDGMENT_HELD: "The ticket exists, but whether the acknowledgment email went out is unknown.",
}


def reason_text(code: str) -> str:
    return REASON_TEXT.get(code or "", "")


def reason_label(code: str) -> str:
    """A reason code as a short phrase for a list cell ("missing_sender" -> "Missing sender"); the sentence is
    `reason_text`."""
    return (code or "").replace("_", " ").capitalize()


def visible_events(user, model=InboxEvent) -> QuerySet:
    """Every event of the user's tenants (detail pages show events that have left the queue too)."""
    return model._default_manager.filter(tenant__in=visible_tenants(user).values("pk"))


def held_intents() -> QuerySet:
    """Held intents that are the current version of their action (a replay as a new action supersedes one)."""
    newer = Intent.objects.filter(
        inbox_event=OuterRef("inbox_event"), action=OuterRef("action"), action_version__gt=OuterRef("action_version")
    )
    return Intent.objects.filter(state=Intent.State.HELD).exclude(Exists(newer))


# Overdue items (their `escalate_at` has passed) first, then the rest; the database's clock decides.
OVERDUE_FIRST = Case(When(escalate_at__lte=Now(), then=Value(0)), default=Value(1)).asc()
QUEUE_ORDER = (OVERDUE_FIRST, "received_at", "pk")


def overdue_q(now=None) -> Q:
    return Q(escalate_at__lte=now or timezone.now())


def recovery_queue(model=InboxEvent) -> QuerySet:
    """Every event that needs a person: a recovery state, an intent held for investigation, or an open
    event a reconciler found stuck without a mapping (an open `unmapped` finding). Overdue items first
    (`escalate_at` passed), then oldest first.

    A held intent counts while it is the current version of its action and its
    event was not closed (suppressed). Written as a UNION of three indexed reads
    (events by state, intents by state, open unmapped findings), not an OR, so it
    stays fast on a big inbox.
    """
    in_recovery = InboxEvent.objects.filter(state__in=InboxEvent.RECOVERY_STATES).values("pk")
    held = held_intents().exclude(inbox_event__state=InboxEvent.State.SUPPRESSED).values("inbox_event_id")
    unmapped = Finding.objects.filter(
        kind=Finding.Kind.UNMAPPED, resolved_at__isnull=True, inbox_event__isnull=False
    ).values("inbox_event_id")
    return (
        model._default_manager.filter(pk__in=in_recovery.union(held, unmapped))
        .select_related("mailbox", "owner")
        .order_by(*QUEUE_ORDER)
    )


def recovery_queue_for(user, model=InboxEvent) -> QuerySet:
    return recovery_queue(model).filter(tenant__in=visible_tenants(user).values("pk"))


def with_queue_columns(queryset: QuerySet) -> QuerySet:
    """The queue's computed columns as subqueries: one query for the whole page, whatever its length."""
    current = Intent.objects.filter(inbox_event=OuterRef("pk"), action__in=WORK_ACTIONS).order_by(
        "-action_version", "-pk"
    )
    attempts = (
        Intent.objects.filter(inbox_event=OuterRef("pk"), action__in=WORK_ACTIONS)
        .order_by()
        .values("inbox_event")
        .annotate(total=Sum("attempts"))
        .values("total")
    )
    latest_attempt = (
        AuditEvent.objects.filter(inbox_event=OuterRef("pk"), kind__in=ATTEMPT_KINDS).order_by("-at").values("at")[:1]
    )
    held = held_intents().filter(inbox_event=OuterRef("pk"))
    return queryset.annotate(
        attempt_count=Coalesce(Subquery(attempts, output_field=IntegerField()), 0),
        latest_attempt_at=Subquery(latest_attempt),
        intent_state=Subquery(current.values("state")[:1]),
        intent_version=Subquery(current.values("action_version")[:1]),
        destination_slug=Subquery(current.values("destination__slug")[:1]),
        destination_kind=Subquery(current.values("destination__kind")[:1]),
        external_ref=Subquery(current.values("external_ref")[:1]),
        result_ref=Subquery(current.values("result_ref")[:1]),
        has_held_intent=Exists(held),
        held_action=Subquery(held.order_by("-action_version").values("action")[:1]),
    )


def with_queue_list_columns(queryset: QuerySet) -> QuerySet:
    """What the queue's list shows beyond the event's own fields (the current intent's state, a held intent):
    subqueries, so one query for the whole page. The item page has the rest (`with_queue_columns`)."""
    current = Intent.objects.filter(inbox_event=OuterRef("pk"), action__in=WORK_ACTIONS).order_by(
        "-action_version", "-pk"
    )
    held = held_intents().filter(inbox_event=OuterRef("pk"))
    return queryset.annotate(
        intent_state=Subquery(current.values("state")[:1]),
        has_held_intent=Exists(held),
        held_action=Subquery(held.order_by("-action_version").values("action")[:1]),
    )


def queue_summary(user) -> dict:
    """The head of the queue page: how many items are open and how old the oldest one is."""
    totals = (
        recovery_queue_for(user)
        .order_by()
        .aggregate(open=Count("pk"), oldest=Min("received_at"), overdue=Count("pk", filter=overdue_q()))
    )
    oldest = totals["oldest"]
    return {
        "open": totals["open"],
        "overdue": totals["overdue"],
        "oldest_received_at": oldest,
        "oldest_age": (timezone.now() - oldest) if oldest else None,
    }


def queue_overview(user) -> dict:
    """The queue page's head and its reason filter from one grouped read of the queue (not one read each):
    `queue_summary`'s keys plus `reason_codes` (as `queue_reason_codes`)."""
    rows = list(
        recovery_queue_for(user)
        .order_by()
        .values("reason_code")
        .annotate(n=Count("pk"), oldest=Min("received_at"), overdue=Count("pk", filter=overdue_q()))
    )
    oldest = min((row["oldest"] for row in rows), default=None)
    codes = {row["reason_code"] for row in rows} - {""}
    return {
        "open": sum(row["n"] for row in rows),
        "overdue": sum(row["overdue"] for row in rows),
        "oldest_received_at": oldest,
        "oldest_age": (timezone.now() - oldest) if oldest else None,
        "reason_codes": sorted(codes, key=lambda code: (REASON_ORDER.get(code, len(REASON_ORDER)), code)),
    }


def search_queue(queryset: QuerySet, term: str) -> QuerySet:
    """Sender, subject, Message-ID (header or provider id), ticket id (mapping, result or external ref) or a
    ticket number `MR-n`."""
    term = (term or "").strip()
    if not term:
        return queryset
    bare = term.strip("<>")
    ticket = Q(Exists(TicketMapping.objects.filter(inbox_event=OuterRef("pk"), ticket_id=bare))) | Q(
        Exists(Intent.objects.filter(inbox_event=OuterRef("pk")).filter(Q(result_ref=bare) | Q(external_ref=bare)))
    )
    match = (
        Q(sender__icontains=term)
        | Q(subject__icontains=term)
        | Q(message_id_header__iexact=bare)
        | Q(provider_message_id=bare)
        | ticket
    )
    if term.isdigit():
        match |= Q(pk=int(term))
    number = numbers.parse_number(term)
    if number is not None:  # "MR-12": the events of ticket 12 (its create, its comments, its copies)
        match |= Q(Exists(numbers.tickets_of_number(TicketMapping.objects.filter(inbox_event=OuterRef("pk")), number)))
    return queryset.filter(match)


REASON_ORDER = {code.value: position for position, code in enumerate(ReasonCode)}


def queue_reason_codes(user) -> list[str]:
    """The reason codes in the user's queue (the reason filter), in ReasonCode's order; unknown words last."""
    codes = set(recovery_queue_for(user).order_by().values_list("reason_code", flat=True)) - {""}
    return sorted(codes, key=lambda code: (REASON_ORDER.get(code, len(REASON_ORDER)), code))


def visible_mailboxes(user) -> QuerySet:
    return Mailbox.objects.filter(tenant__in=visible_tenants(user).values("pk")).select_related("tenant")


def visible_destinations(user) -> QuerySet:
    return Destination.objects.filter(tenant__in=visible_tenants(user).values("pk")).select_related("tenant")


def pause_status(user) -> dict:
    """What is paused, as far as this user may see: the global switch, their tenants' own pauses, their
    mailboxes and destinations."""
    switch = Switch.objects.filter(name=Switch.GLOBAL_PAUSE).first()
    return {
        "global": bool(switch and switch.on),
        "global_switch": switch,
        "tenants": list(visible_tenants(user).filter(pk__in=paused_tenant_ids()).order_by("slug")),
        "mailboxes": list(visible_mailboxes(user).filter(paused=True).order_by("slug")),
        "destinations": list(visible_destinations(user).filter(paused=True).order_by("tenant__slug", "slug")),
    }


def waiting_counts(user) -> dict:
    """Open events parked by a pause (their backlog), per visible mailbox id."""
    rows = (
        visible_events(user)
        .filter(state__in=InboxEvent.OPEN_STATES, retry_at__isnull=False)
        .order_by()
        .values("mailbox_id")
        .annotate(n=Count("pk"))
    )
    return {row["mailbox_id"]: row["n"] for row in rows}


def event_timeline(event_id: int) -> QuerySet:
    return AuditEvent.objects.filter(inbox_event_id=event_id).order_by("at", "pk")


def event_intents(event_id: int) -> QuerySet:
    return (
        Intent.objects.filter(inbox_event_id=event_id)
        .select_related("destination")
        .order_by("action", "action_version", "pk")
    )


def event_mappings(event_id: int) -> QuerySet:
    return (
        numbers.with_numbers(TicketMapping.objects.filter(inbox_event_id=event_id))
        .select_related("destination")
        .order_by("pk")
    )


# --- the REST API's reads (reconciliation.api): each scoped to the user's tenants -------------------


def filter_events(
    queryset: QuerySet,
    *,
    state: str = "",
    reason: str = "",
    mailbox: str = "",
    received_after=None,
    received_before=None,
) -> QuerySet:
    """The events list's filters: state, reason code, mailbox (slug or id), received date range [after, before)."""
    if state:
        queryset = queryset.filter(state=state)
    if reason:
        queryset = queryset.filter(reason_code=reason)
    if mailbox:
        queryset = queryset.filter(
            Q(mailbox__slug=mailbox) | (Q(mailbox_id=int(mailbox)) if mailbox.isdigit() else Q(pk__in=[]))
        )
    if received_after is not None:
        queryset = queryset.filter(received_at__gte=received_after)
    if received_before is not None:
        queryset = queryset.filter(received_at__lt=received_before)
    return queryset


def visible_intents(user) -> QuerySet:
    return Intent.objects.filter(inbox_event__tenant__in=visible_tenants(user).values("pk")).select_related(
        "destination"
    )


def visible_mappings(user) -> QuerySet:
    return numbers.with_numbers(
        TicketMapping.objects.filter(inbox_event__tenant__in=visible_tenants(user).values("pk"))
    ).select_related("destination")


def visible_routing_rules(user) -> QuerySet:
    return RoutingRule.objects.filter(tenant__in=visible_tenants(user).values("pk")).select_related("tenant")


def visible_runs(user) -> QuerySet:
    """Reconciliation runs of the user's mailboxes and destinations (a superuser: every run)."""
    rows = ReconciliationRun.objects.all()
    if user.is_superuser:
        return rows
    mailboxes = list(visible_mailboxes(user).values_list("slug", flat=True))
    destinations = [f"destination:{d.tenant.slug}/{d.slug}" for d in visible_destinations(user)]
    return rows.filter(scope__in=mailboxes + destinations)


def visible_findings(user) -> QuerySet:
    rows = Finding.objects.select_related("tenant")
    if user.is_superuser:
        return rows
    return rows.filter(tenant__in=visible_tenants(user).values("pk"))


def rule_names(tenant_id: int) -> dict[str, str]:
    """{rule id as stored in a route's origin ("rule:<id>"): its name} for the tenant's routing rules."""
    return {str(pk): name for pk, name in RoutingRule.objects.filter(tenant_id=tenant_id).values_list("pk", "name")}


# Who receives the escalation of an overdue unassigned item: the tenant's active members of this group with an
# email address. One definition, for the escalation emails (services.escalation) and the pages' warnings.
ESCALATION_GROUP = "operator"


def escalation_operators(tenant):
    """The users who receive a tenant's escalations; `tenant` is an id or an `OuterRef` to one."""
    return (
        get_user_model()
        .objects.filter(mailroom_tenants=tenant, is_active=True, groups__name=ESCALATION_GROUP)
        .exclude(email="")
    )


def tenants_without_escalation_recipients(user) -> list:
    """The user's tenants (not drills) where nobody can receive an escalation email (`escalation_operators` is
    empty). Their overdue unassigned items would only log a warning."""
    reachable = escalation_operators(OuterRef("pk"))
    return list(visible_tenants(user).filter(is_drill=False).exclude(Exists(reachable)).order_by("slug"))

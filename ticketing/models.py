"""Where tickets are made: destinations, durable intents, mappings and the built-in ticket store."""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Cast

from intake.models import InboxEvent, Mailbox, Tenant, check_secret_refs


class DestinationKind(models.TextChoices):
    """One per adapter (ticketing.destinations); `Destination.Kind`."""

    BUILTIN = "builtin", "Built-in ticket store"
    ZENDESK = "zendesk", "Zendesk"
    JIRA_SM = "jira_sm", "Jira Service Management"
    SERVICENOW = "servicenow", "ServiceNow"
    SALESFORCE = "salesforce", "Salesforce"
    HUBSPOT = "hubspot", "HubSpot"
    FRESHDESK = "freshdesk", "Freshdesk"
    REST = "rest", "Generic REST"


class Destination(models.Model):
    Kind = DestinationKind

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="destinations")
    slug = models.SlugField()
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.BUILTIN)
    base_url = models.URLField("base URL", blank=True)
    credentials_ref = models.CharField(
        "credentials reference",
        max_length=300,
        blank=True,
        help_text=(
            "env:MAILROOM_T_<TENANT>_<NAME>, a file under MAILROOM_SECRETS_DIR/<tenant>/ "
            "or vault:<mount>/mailroom/<tenant>/<path>#<key>"
        ),
    )
    settings = models.JSONField(default=dict, blank=True)
    is_default = models.BooleanField("default destination", default=False)
    paused = models.BooleanField(default=False, help_text="Workers make no writes to a paused destination.")
    # Who paused it, when and why: a person ("user:<name>") or the circuit breaker ("system:breaker",
    # ticketing.breaker). Only a person resumes; resuming clears the three.
    paused_reason = models.CharField("pause reason", max_length=500, blank=True)
    paused_by = models.CharField(max_length=150, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slug"], name="destination_slug_per_tenant"),
            models.UniqueConstraint(
                fields=["tenant"], condition=Q(is_default=True), name="destination_one_default_per_tenant"
            ),
            models.CheckConstraint(
                condition=Q(credentials_ref="")
                | Q(credentials_ref__startswith="env:")
                | Q(credentials_ref__startswith="file:")
                | Q(credentials_ref__startswith="vault:"),
                name="destination_credentials_is_a_reference",
            ),
            # A kind without an adapter could take intents that no worker can carry out.
            models.CheckConstraint(condition=Q(kind__in=DestinationKind.values), name="destination_known_kind"),
        ]

    def __str__(self):
        return f"{self.tenant.slug}/{self.slug}"

    def clean(self):
        super().clean()
        if self.tenant_id:
            check_secret_refs(self, self.tenant, ("credentials_ref",))
        # The egress guard on every URL it would call (intake.egress; checked again at connect time).
        from django.core.exceptions import ValidationError

        from .destinations import egress_errors

        refused = egress_errors(self.kind, self.base_url, self.settings)
        if refused:
            raise ValidationError(refused)


class Intent(models.Model):
    """One external action we mean to take, exactly once, under a stable idempotency key."""

    class Action(models.TextChoices):
        CREATE_TICKET = "create_ticket"
        ADD_COMMENT = "add_comment"
        NOTIFY_REQUESTER = "notify_requester"
        # The files of a ticket-making action that a desk takes only on the existing record, one call each
        # (ticketing.attachments); planned when that action succeeds, one per event.
        ATTACH_FILES = "attach_files"

    class State(models.TextChoices):
        PENDING = "pending"
        IN_FLIGHT = "in_flight"
        RETRY_WAIT = "retry_wait"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        UNKNOWN = "unknown"
        HELD = "held"

    idempotency_key = models.CharField(max_length=64, unique=True)
    inbox_event = models.ForeignKey(InboxEvent, on_delete=models.PROTECT, related_name="intents")
    action = models.CharField(max_length=30, choices=Action.choices)
    action_version = models.PositiveIntegerField(default=1)
    destination = models.ForeignKey(Destination, on_delete=models.PROTECT, related_name="intents")
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField("next attempt", null=True, blank=True)
    claimed_by = models.CharField("claimed by (worker)", max_length=200, blank=True)
    claimed_until = models.DateTimeField("claim expires", null=True, blank=True)
    last_error_kind = models.CharField(max_length=50, blank=True)
    last_error = models.TextField(blank=True)
    external_ref = models.CharField("external reference", max_length=200)
    result_ref = models.CharField("result reference", max_length=200, blank=True)
    # What a multi-step write has done so far (ticketing.destinations.journal): upload tokens, each file's
    # state. Written only under the attempt's claim (ticketing.intents.progress); never a state.
    progress = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField("created")
    completed_at = models.DateTimeField("completed", null=True, blank=True)

    class Meta:
        default_permissions = ("add", "change", "view")  # evidence: nobody deletes intents
        constraints = [
            models.UniqueConstraint(
                fields=["inbox_event", "action", "action_version"], name="intent_one_per_event_action_version"
            ),
            models.CheckConstraint(
                condition=~Q(state="in_flight") | Q(claimed_until__isnull=False),
                name="intent_in_flight_has_claim",
            ),
            models.CheckConstraint(
                condition=Q(state__in=["pending", "in_flight", "retry_wait", "succeeded", "failed", "unknown", "held"]),
                name="intent_known_state",
            ),
            # Success is a recorded result: what was made (or who settled it) and when.
            models.CheckConstraint(
                condition=~Q(state="succeeded") | (~Q(result_ref="") & Q(completed_at__isnull=False)),
                name="intent_succeeded_has_result",
            ),
        ]
        indexes = [
            models.Index(fields=["state", "next_attempt_at"], name="intent_due"),
            models.Index(fields=["state", "claimed_until"], name="intent_claims"),
        ]

    def __str__(self):
        return f"{self.action} v{self.action_version} for event {self.inbox_event_id} ({self.state})"


class TicketMapping(models.Model):
    """The proof of completion: this event's action produced that ticket."""

    inbox_event = models.ForeignKey(InboxEvent, on_delete=models.PROTECT, related_name="mappings")
    action = models.CharField(max_length=30)
    destination = models.ForeignKey(Destination, on_delete=models.PROTECT, related_name="+")
    ticket_id = models.CharField("ticket ID", max_length=200)
    ticket_url = models.URLField("ticket URL", max_length=500, blank=True)
    created_at = models.DateTimeField("created")

    class Meta:
        default_permissions = ("add", "change", "view")  # evidence: nobody deletes mappings
        constraints = [
            models.UniqueConstraint(fields=["inbox_event", "action"], name="ticket_mapping_one_per_event_action"),
            models.CheckConstraint(condition=~Q(ticket_id=""), name="ticket_mapping_has_ticket_id"),
        ]

    def __str__(self):
        return f"event {self.inbox_event_id} -> {self.destination.slug}#{self.ticket_id}"


class ThreadLease(models.Model):
    mailbox = models.ForeignKey(Mailbox, on_delete=models.CASCADE, related_name="+")
    thread_key = models.CharField("thread key", max_length=64)
    owner = models.CharField("holder", max_length=200)
    token = models.BigIntegerField("fencing token", default=0)
    expires_at = models.DateTimeField("expires")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["mailbox", "thread_key"], name="thread_lease_one_per_thread"),
        ]

    def __str__(self):
        return f"lease on thread {self.thread_key[:12]} of mailbox {self.mailbox_id}"


# Mailroom's ticket numbers read "MR-n" (ticketing.numbers): n is the id of the ticket's creating mapping.
TICKET_NUMBER_PREFIX = "MR"


def first_create_mapping(destination_id, ticket_id) -> models.Subquery:
    """The id of the first create mapping of ticket (`destination_id`, `ticket_id`): its number (ticketing.numbers).
    The arguments are expressions (OuterRef) of the queryset it annotates."""
    return models.Subquery(
        TicketMapping.objects.filter(
            destination_id=destination_id, ticket_id=ticket_id, action=Intent.Action.CREATE_TICKET
        )
        .order_by("pk")
        .values("pk")[:1]
    )


class TicketQuerySet(models.QuerySet):
    def with_numbers(self):
        """Each ticket annotated with `mapping_number`: the id of the mapping that created it (None before)."""
        return self.annotate(
            mapping_number=first_create_mapping(
                models.OuterRef("destination_id"), Cast(models.OuterRef("pk"), models.CharField())
            )
        )


class Ticket(models.Model):
    """The built-in ticket store: the embedded default destination.

    Its name is Mailroom's ticket number (`number`), not its own id: the number an acknowledgment
    gives the customer is the one every destination's tickets have (ticketing.numbers)."""

    class Status(models.TextChoices):
        NEW = "new"
        OPEN = "open"
        SOLVED = "solved"

    destination = models.ForeignKey(Destination, on_delete=models.PROTECT, related_name="tickets")
    # Our intent key: a second create for the same intent cannot insert a second row.
    idempotency_key = models.CharField(max_length=64, unique=True)
    external_ref = models.CharField("external reference", max_length=200, db_index=True)
    subject = models.CharField(max_length=998, blank=True)
    requester = models.CharField(max_length=320, blank=True)
    description = models.TextField(blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.NEW)
    # What Mailroom noticed about the message ("mailroom-message-id-reused", ...), for the agent.
    tags = models.JSONField(default=list, blank=True)
    # The route classification chose (ticketing.classification): where a person picks it up.
    queue = models.CharField(max_length=100, blank=True)
    priority = models.CharField(max_length=10, blank=True)
    request_type = models.CharField(max_length=100, blank=True)
    assignee = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField("created")

    objects = TicketQuerySet.as_manager()

    @property
    def number(self) -> int | None:
        if "mapping_number" in self.__dict__:
            return self.__dict__["mapping_number"]
        if self.pk is None:
            return None
        return Ticket.objects.filter(pk=self.pk).with_numbers().values_list("mapping_number", flat=True).first()

    def __str__(self):
        number = self.number
        return f"{TICKET_NUMBER_PREFIX}-{number}" if number else f"ticket {self.pk} (not mapped yet)"


class TicketComment(models.Model):
    """A comment on a built-in ticket (a reply in its thread)."""

    ticket = models.ForeignKey(Ticket, on_delete=models.PROTECT, related_name="comments")
    idempotency_key = models.CharField(max_length=64, unique=True)
    external_ref = models.CharField("external reference", max_length=200)
    author = models.CharField(max_length=320, blank=True)
    body = models.TextField(blank=True)
    created_at = models.DateTimeField("created")

    def __str__(self):
        return f"comment {self.pk} on {self.ticket}"


PRIORITIES = ("low", "normal", "high", "urgent")


class RoutingPolicy(models.Model):
    """A tenant's routing vocabulary and defaults: one per tenant, created with it.

    `queues`, `request_types` and `sensitive_request_types` are lists of slugs; a rule, the AI
    proposer and an operator may only choose among them. Priorities are the fixed `PRIORITIES`.
    """

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="routing_policy")
    queues = models.JSONField(default=list, blank=True)
    request_types = models.JSONField(default=list, blank=True)
    sensitive_request_types = models.JSONField(default=list, blank=True)
    default_queue = models.CharField(max_length=100, blank=True)
    default_priority = models.CharField(max_length=10, default="normal")
    default_request_type = models.CharField(max_length=100, blank=True)
    ai_enabled = models.BooleanField(
        "AI proposals enabled", default=False, help_text="Let the AI proposer suggest fields no rule set."
    )
    ai_min_confidence = models.FloatField("AI minimum confidence", default=0.7)
    # One message delivered to several mailboxes of the tenant (To support@, Cc sales@): one ticket
    # (the other deliveries link to it), or one ticket per mailbox.
    one_ticket_per_message = models.BooleanField(default=True)

    class Meta:
        verbose_name = "routing policy"
        verbose_name_plural = "routing policies"
        constraints = [
            models.CheckConstraint(
                condition=Q(ai_min_confidence__gte=0) & Q(ai_min_confidence__lte=1),
                name="routing_policy_confidence_is_a_probability",
            ),
            models.CheckConstraint(
                condition=Q(default_priority__in=PRIORITIES), name="routing_policy_default_priority_known"
            ),
        ]

    def __str__(self):
        return f"Routing policy — {self.tenant.slug}"


class RoutingRule(models.Model):
    """An admin's rule: when every condition holds, set these fields (see ticketing.classification)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="routing_rules")
    mailbox = models.ForeignKey(
        Mailbox,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        help_text="only mail of this mailbox (empty: every mailbox of the tenant)",
    )
    position = models.PositiveIntegerField(default=100, help_text="rules are tried in ascending position")
    name = models.CharField(max_length=200)
    enabled = models.BooleanField(default=True)
    conditions = models.JSONField(default=dict, blank=True)
    destination = models.ForeignKey(Destination, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    queue = models.CharField(max_length=100, blank=True)
    priority = models.CharField(max_length=10, blank=True)
    request_type = models.CharField(max_length=100, blank=True)
    assignee = models.CharField(max_length=200, blank=True)
    sensitive = models.BooleanField(default=False, help_text="tag the ticket needs-approval")
    stop_processing = models.BooleanField(default=True, help_text="off: later rules may fill fields still empty")

    class Action(models.TextChoices):
        ROUTE = "route", "route (fill the ticket's fields)"
        SUPPRESS = "suppress", "suppress (no ticket; shown in the console with the reason, replayable)"
        TAG = "tag", "tag (add tags to the ticket)"
        MARK_SPAM = "mark_spam", "mark as spam (ticket in the spam queue, no acknowledgment)"

    action = models.CharField(max_length=20, choices=Action.choices, default=Action.ROUTE, db_default=Action.ROUTE)
    tags = models.JSONField(default=list, blank=True, help_text="tags the ticket gets (action tag)")
    suppress_reason = models.CharField(
        "suppression reason",
        max_length=200,
        blank=True,
        help_text="what the console shows for mail this rule suppresses",
    )
    hits = models.PositiveIntegerField(default=0)
    last_hit_at = models.DateTimeField("last hit", null=True, blank=True)

    class Meta:
        ordering = ("tenant", "position", "pk")
        constraints = [
            models.CheckConstraint(
                condition=Q(priority="") | Q(priority__in=PRIORITIES), name="routing_rule_priority_known"
            ),
            models.CheckConstraint(
                condition=Q(action__in=["route", "suppress", "tag", "mark_spam"]), name="routing_rule_known_action"
            ),
        ]
        indexes = [models.Index(fields=["tenant", "enabled", "position"], name="routing_rule_order")]

    def __str__(self):
        return self.name


class CopiedMessage(models.Model):
    """One message delivered to several mailboxes of a tenant: the delivery (event) that makes its ticket.

    The first copy to reach routing inserts the row (`ticketing.copies`); the unique key makes it the
    only primary, however many workers race. The other copies link to its ticket.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    fingerprint = models.CharField("content fingerprint", max_length=64)
    primary = models.ForeignKey(InboxEvent, verbose_name="primary delivery", on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField("created")

    class Meta:
        default_permissions = ("add", "change", "view")  # evidence
        constraints = [
            models.UniqueConstraint(fields=["tenant", "fingerprint"], name="copied_message_one_primary"),
        ]

    def __str__(self):
        return f"message {self.fingerprint[:12]} of tenant {self.tenant_id}: primary event {self.primary_id}"


class DestinationAttempt(models.Model):
    """One call to an external destination and how it ended: what the circuit breaker counts.

    Insert-only; rows past the breaker's window are pruned (`ticketing.breaker.prune`).
    """

    destination = models.ForeignKey(Destination, on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField("time")
    ok = models.BooleanField("succeeded")
    reason = models.CharField(max_length=50, blank=True)  # the failure's reason code ("credentials", ...)

    class Meta:
        indexes = [models.Index(fields=["destination", "at"], name="destination_attempt_recent")]

    def __str__(self):
        return f"{'success' if self.ok else 'failure'} of destination {self.destination_id}"


class Notification(models.Model):
    """An email Mailroom sent to its own staff (escalation, daily digest, circuit breaker): the audit row.

    The unique `key` makes each email go out once: the row is written in the transaction that sends
    it, so a second beat run (or a concurrent one) finds it and sends nothing. No addresses are kept,
    only the recipients' usernames.
    """

    class Kind(models.TextChoices):
        ESCALATION = "escalation"
        DIGEST = "digest"
        BREAKER = "breaker"
        MAILBOX_HEALTH = "mailbox_health"
        CREDENTIALS = "credentials"
        QUIET_MAILBOX = "quiet_mailbox"

    key = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    inbox_event = models.ForeignKey(InboxEvent, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    destination = models.ForeignKey(Destination, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    mailbox = models.ForeignKey(Mailbox, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    # An escalation email: the `escalate_at` it was for (a new time set by an operator is a new escalation).
    escalation_at = models.DateTimeField("escalation time", null=True, blank=True)
    recipients = models.JSONField(default=list, blank=True)
    subject = models.CharField(max_length=300)
    sent_at = models.DateTimeField("sent")

    class Meta:
        default_permissions = ("view",)  # evidence

    def __str__(self):
        return self.key


class UndeliverableAddress(models.Model):
    """A requester's address that bounced one of our acknowledgments for good (a 5.x.x DSN, `ticketing.bounces`):
    no acknowledgment goes to it until `expires_at` (`MAILROOM_BOUNCE_MARK_DAYS`). One row per tenant and
    address (lowercased); a later bounce moves the expiry on."""

    # The reverse name is how intake's retention sweep purges expired marks (intake imports nothing of ticketing).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="undeliverable_addresses")
    address = models.CharField(max_length=320)
    status = models.CharField("DSN status", max_length=20, blank=True)
    reason = models.CharField(max_length=200, blank=True)  # the diagnostic's first line, addresses masked
    bounced_event = models.ForeignKey(
        InboxEvent, on_delete=models.CASCADE, related_name="+", verbose_name="bounce (inbox event)"
    )
    expires_at = models.DateTimeField("expires")
    created_at = models.DateTimeField("marked")

    class Meta:
        default_permissions = ("view",)  # written by the bounce tie only
        verbose_name = "undeliverable address"
        verbose_name_plural = "undeliverable addresses"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "address"], name="undeliverable_address_one_per_tenant"),
        ]

    def __str__(self):
        return f"{self.address.rpartition('@')[2]} address (until {self.expires_at:%Y-%m-%d})"


from .ack_models import AcknowledgmentTemplate, BusinessHours  # noqa: E402,F401  (acknowledgment templates, hours)

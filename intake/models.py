"""Where mail enters: tenants, mailboxes, the inbox events, the outbox and the audit trail."""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower

from .domains import address_key, mailbox_address_errors, normalize_domain
from .secret_scope import ref_error
from .vocabulary import (  # noqa: F401  (ReasonCode: re-exported for callers)
    AuditKind,
    MailboxAuditKind,
    ReasonCode,
    WebhookRejection,
)

# The keys of `Tenant.settings` (per-tenant overrides; absent = the instance-wide setting). The numbers are
# positive integers, anything else is ignored (read through `Tenant.int_setting`); `agent_addresses` is a list
# (read by `ticketing.people`).
TENANT_SETTINGS = {
    "raw_retention_days": "Days the raw message (and so its attachments) is kept; default MAILROOM_RAW_RETENTION_DAYS "
    "(intake.retention).",
    "unmapped_after_minutes": "Minutes after which an open event without a ticket mapping counts as stuck "
    "(reconcilers).",
    "escalate_after_hours": "Hours after which an item of the recovery queue escalates (escalation).",
    "ack_per_hour": "Acknowledgments the tenant may send in any hour; default MAILROOM_ACK_PER_HOUR "
    "(ticketing.acknowledgments).",
    "ack_per_domain_per_hour": "Acknowledgments to one recipient domain in any hour; default "
    "MAILROOM_ACK_PER_DOMAIN_PER_HOUR (ticketing.acknowledgments).",
    "agent_addresses": 'The tenant\'s agents: a list of addresses ("alice@example.com") and domains '
    '("@example.com"), compared ignoring case and +tags. An agent\'s reply becomes an internal '
    "note, and an agent's forward of a customer's message makes that customer the requester "
    "(ticketing.people). Not a number: read it with ticketing.people, not int_setting.",
}


class Tenant(models.Model):
    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=200, blank=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="mailroom_tenants")
    settings = models.JSONField(
        default=dict,
        blank=True,
        help_text="Per-tenant overrides, positive integers: raw_retention_days, unmapped_after_minutes, "
        "escalate_after_hours (see intake.models.TENANT_SETTINGS).",
    )
    # A `manage.py drill` scratch tenant (reconciliation.drills): set only by the drill, never through the
    # admin or the API. The live paths (workers, sweeps, reconcilers, escalation, /metrics) skip its rows:
    # the drill drives them itself, in its own process.
    is_drill = models.BooleanField("drill tenant", default=False, editable=False)

    def __str__(self):
        return self.slug

    def int_setting(self, key: str, default: int) -> int:
        """A documented key of `settings` (TENANT_SETTINGS) as a positive int, else `default`."""
        if key not in TENANT_SETTINGS:
            raise KeyError(f"undocumented tenant setting {key!r}: add it to intake.models.TENANT_SETTINGS")
        value = (self.settings or {}).get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            return default
        return int(value)


class VerifiedDomain(models.Model):
    """A mail domain that belongs to one tenant, set by a superuser: its mailboxes may use only these
    (intake.domains). No role can be given the right to add or change one: only superusers hold it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="verified_domains")
    domain = models.CharField(
        max_length=253,
        unique=True,
        help_text="Lower case, without a trailing dot; an internationalized name in its "
        "xn-- form. One tenant per domain.",
    )
    verified_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField("added", auto_now_add=True)

    class Meta:
        default_permissions = ("view",)
        ordering = ("domain",)
        constraints = [
            # Unique on the stored form, and the stored form is the normal one: unique case-insensitively.
            models.CheckConstraint(
                condition=Q(domain=Lower("domain")) & ~Q(domain=""), name="verified_domain_is_normalised"
            ),
        ]

    def __str__(self):
        return self.domain

    def clean(self):
        super().clean()
        self.domain = normalize_domain(self.domain)

    def save(self, *args, **kwargs):
        self.domain = normalize_domain(self.domain)
        super().save(*args, **kwargs)


ADDRESS_TAKEN = "This address is already used by another mailbox."


class MailboxProvider(models.TextChoices):
    """One per provider adapter (intake.providers); `Mailbox.Provider`."""

    RAW = "raw", "Raw MIME webhook"
    IMAP = "imap", "IMAP"
    GMAIL = "gmail", "Gmail API"
    GRAPH = "graph", "Microsoft Graph"
    MAILGUN = "mailgun", "Mailgun"
    POSTMARK = "postmark", "Postmark"
    SENDGRID = "sendgrid", "SendGrid"
    SES = "ses", "Amazon SES"


class Mailbox(models.Model):
    Provider = MailboxProvider

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="mailboxes")
    slug = models.SlugField(unique=True)
    address = models.EmailField()
    # `address` lower-cased without its +tag (intake.domains.address_key), kept by save(): unique across tenants.
    address_key = models.CharField("address key", max_length=320, editable=False)
    provider = models.CharField(max_length=20, choices=Provider.choices, default=Provider.RAW)
    # References (`env:`, `file:` or `vault:`, scoped to the tenant: intake.secrets), never the secret itself.
    webhook_secret_ref = models.CharField("webhook secret reference", max_length=300, blank=True)
    credentials_ref = models.CharField("credentials reference", max_length=300, blank=True)
    settings = models.JSONField(default=dict, blank=True)
    allowed_recipients = models.JSONField(default=list, blank=True)
    poll_enabled = models.BooleanField("polling enabled", default=False)
    paused = models.BooleanField(default=False, help_text="Intake still stores mail; processing waits.")
    created_at = models.DateTimeField("created", auto_now_add=True)

    class Health(models.TextChoices):
        OK = "ok"
        BACKOFF = "backoff"
        CREDENTIALS_INVALID = "credentials_invalid"

    # Polling's view of the provider: a mailbox whose credentials were refused is not polled again
    # until an admin fixes them; a throttled one waits until poll_backoff_until.
    health = models.CharField(max_length=30, choices=Health.choices, default=Health.OK)
    health_detail = models.CharField("health detail", max_length=500, blank=True)
    last_polled_at = models.DateTimeField("last polled", null=True, blank=True)
    poll_backoff_until = models.DateTimeField("no polling until", null=True, blank=True)

    class Link(models.TextChoices):
        """The connection's health as admins are told of it (intake.health_states): up -> failing -> down ->
        recovered (-> up), one email per transition."""

        UP = "up"
        FAILING = "failing"
        DOWN = "down"
        RECOVERED = "recovered"

    link_state = models.CharField(
        "connection", max_length=20, choices=Link.choices, default=Link.UP, db_default=Link.UP
    )
    link_state_since = models.DateTimeField("connection state since", null=True, blank=True)
    poll_failures = models.PositiveIntegerField("failed polls in a row", default=0, db_default=0)
    poll_errors_total = models.PositiveBigIntegerField("failed polls (total)", default=0, db_default=0)
    last_success_at = models.DateTimeField("last successful poll", null=True, blank=True)
    quiet_alarm_since = models.DateTimeField("silent (alarm raised) since", null=True, blank=True)
    # OAuth: what the provider granted (never a token: those live behind credentials_ref).
    oauth_scopes = models.CharField("granted scopes", max_length=1000, blank=True, db_default="")
    oauth_expires_at = models.DateTimeField("credentials expire", null=True, blank=True)
    oauth_connected_at = models.DateTimeField("connected", null=True, blank=True)
    oauth_connected_by = models.CharField("connected by", max_length=150, blank=True, db_default="")
    oauth_warned_at = models.DateTimeField("expiry warning sent", null=True, blank=True)
    # Archive import (intake.archive): mail received before the cut-off is history; null = live only.
    archive_before = models.DateTimeField("archive cut-off", null=True, blank=True)
    archive_tickets = models.CharField(
        "archive tickets",
        max_length=10,
        blank=True,
        db_default="",
        choices=[("none", "no tickets"), ("closed", "closed tickets")],
    )
    archive_done_at = models.DateTimeField("archive import finished", null=True, blank=True)

    class Meta:
        verbose_name_plural = "mailboxes"
        constraints = [
            models.CheckConstraint(
                condition=Q(webhook_secret_ref="")
                | Q(webhook_secret_ref__startswith="env:")
                | Q(webhook_secret_ref__startswith="file:")
                | Q(webhook_secret_ref__startswith="vault:"),
                name="mailbox_webhook_secret_is_a_reference",
            ),
            models.CheckConstraint(
                condition=Q(credentials_ref="")
                | Q(credentials_ref__startswith="env:")
                | Q(credentials_ref__startswith="file:")
                | Q(credentials_ref__startswith="vault:"),
                name="mailbox_credentials_is_a_reference",
            ),
            # A provider without an adapter could store mail no channel verifies or polls.
            models.CheckConstraint(condition=Q(provider__in=MailboxProvider.values), name="mailbox_known_provider"),
            # One mailbox per address on the whole platform: a second tenant cannot take over the mail of the first.
            models.UniqueConstraint(
                fields=["address_key"], name="mailbox_address_unique", violation_error_message=ADDRESS_TAKEN
            ),
            models.CheckConstraint(condition=~Q(address_key=""), name="mailbox_address_key_set"),
            models.CheckConstraint(
                condition=Q(link_state__in=["up", "failing", "down", "recovered"]), name="mailbox_known_link_state"
            ),
            models.CheckConstraint(
                condition=Q(archive_tickets__in=["", "none", "closed"]), name="mailbox_known_archive_tickets"
            ),
        ]

    def __str__(self):
        return self.slug

    def clean(self):
        super().clean()
        self.address_key = address_key(self.address)
        if self.tenant_id:
            if problems := mailbox_address_errors(self):
                from django.core.exceptions import ValidationError

                raise ValidationError(problems)
            check_secret_refs(self, self.tenant, ("webhook_secret_ref", "credentials_ref"))
        # The provider's settings key by key (types, ranges, names), then the egress guard on the hosts and URLs
        # they name (intake.egress; checked again at connect). Here, so the admin, the API and commands agree.
        from .providers import endpoint_errors
        from .providers.settings_schema import errors_by_field

        problems = errors_by_field(self.provider, self.settings).get("settings", [])
        refused = endpoint_errors(self.provider, self.settings).get("settings", [])
        if problems or refused:
            from django.core.exceptions import ValidationError

            raise ValidationError({"settings": [*problems, *refused]})

    def validate_constraints(self, exclude=None):
        # clean() checked the address's uniqueness, with a message on the field the user typed.
        super().validate_constraints(exclude={*(exclude or ()), "address_key"})

    def save(self, *args, **kwargs):
        self.address_key = address_key(self.address)
        if kwargs.get("update_fields") is not None and "address" in kwargs["update_fields"]:
            kwargs["update_fields"] = {*kwargs["update_fields"], "address_key"}
        super().save(*args, **kwargs)


def check_secret_refs(obj, tenant, fields) -> None:
    """ValidationError naming the allowed forms for each of `fields` that `tenant` may not use (intake.secrets)."""
    from django.core.exceptions import ValidationError

    errors = {name: message for name in fields if (message := ref_error(getattr(obj, name), tenant, owner=obj))}
    if errors:
        raise ValidationError(errors)


class PollCursor(models.Model):
    mailbox = models.OneToOneField(Mailbox, on_delete=models.CASCADE, related_name="poll_cursor")
    value = models.JSONField("position", default=dict, blank=True)
    updated_at = models.DateTimeField("updated", auto_now=True)

    def __str__(self):
        return f"poll position of mailbox {self.mailbox_id}"


# The stale sweep's backoff doubles its wait once per requeue no worker took, this many times at most
# (intake.services.sweeps); `InboxEvent.requeues` never exceeds it.
MAX_REQUEUE_DOUBLINGS = 4


class InboxEvent(models.Model):
    class State(models.TextChoices):
        RECEIVED = "received"
        READY = "ready"
        WRITE_PENDING = "write_pending"
        COMPLETED = "completed"
        SUPPRESSED = "suppressed"
        AWAITING_REVIEW = "awaiting_review"
        QUARANTINED = "quarantined"
        FAILED = "failed"
        UNKNOWN = "unknown"

    RECOVERY_STATES = (State.AWAITING_REVIEW, State.QUARANTINED, State.FAILED, State.UNKNOWN)
    # States in which a worker still has something to do.
    OPEN_STATES = (State.RECEIVED, State.READY, State.WRITE_PENDING)

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    mailbox = models.ForeignKey(Mailbox, on_delete=models.PROTECT, related_name="events")
    provider_message_id = models.CharField("provider message ID", max_length=998)
    dedupe_key = models.CharField("deduplication key", max_length=64, unique=True)
    # sha256 of what the author wrote (intake.keys.content_fingerprint): tells a second delivery
    # of this message from another message that reuses its Message-ID.
    fingerprint = models.CharField("content fingerprint", max_length=64, blank=True)
    # This message reused the Message-ID of an earlier, different one: its provider message id
    # is `<id>#<fingerprint prefix>` (intake.keys.reused_id).
    message_id_reused = models.BooleanField("Message-ID reused", default=False)
    source = models.CharField(max_length=20)
    state = models.CharField(max_length=20, choices=State.choices, default=State.RECEIVED)
    reason_code = models.CharField("reason", max_length=50, blank=True)
    reason_detail = models.TextField("reason detail", blank=True)
    received_at = models.DateTimeField("received")
    updated_at = models.DateTimeField("updated")
    raw = models.BinaryField("raw message", null=True, editable=False)
    size = models.PositiveIntegerField("size (bytes)")
    message_id_header = models.CharField("Message-ID", max_length=998, blank=True)
    sender = models.CharField(max_length=320, blank=True)
    subject = models.CharField(max_length=998, blank=True)
    thread_key = models.CharField("thread key", max_length=64, blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    escalate_at = models.DateTimeField("escalates at", null=True, blank=True)
    # How often a worker took the event since it last made progress (intake.services.record_taken); a cap
    # catches poison messages.
    dispatch_count = models.PositiveIntegerField("times dispatched", default=0)
    # How often the stale sweep handed it to the broker again since a worker last took it: each such
    # requeue doubles the wait before the next, so mail waiting in a backlog is not copied into it again
    # and again (intake.services.sweeps). A database default, so every INSERT path leaves it at 0; at most
    # MAX_REQUEUE_DOUBLINGS (the wait stops growing there), checked by the database.
    requeues = models.PositiveSmallIntegerField("requeues since taken", default=0, db_default=0)
    # Sender-authentication signals from the trusted authserv-id only: they inform, never authorize.
    auth_results = models.JSONField("sender authentication", default=dict, blank=True)
    # What normalization found: attachments (name, types, size, sha256), parser defects, flags.
    details = models.JSONField("parse details", default=dict, blank=True)
    # An event-level wait (for example while the malware scanner is unreachable).
    retry_at = models.DateTimeField("waits until", null=True, blank=True)
    # An operator's correction of the route: destination, queue, priority, request type.
    route_override = models.JSONField("route correction", default=dict, blank=True)
    # What classification chose and why: {"fields": {name: {"value", "origin"}}, "destination_id",
    # "sensitive", "rules": [ids], "ai": {...}}; origins are "rule:<id>", "ai", "default", "operator:<user>".
    route = models.JSONField(default=dict, blank=True)
    # A copy of a message also delivered to another mailbox of the tenant: the event that made (or
    # failed to make) the ticket (`ticketing.copies`). Set when the copy is linked or sent to review.
    copy_of = models.ForeignKey(
        "self", verbose_name="copy of", null=True, blank=True, on_delete=models.PROTECT, related_name="copies"
    )
    # Retention (intake.retention): a held event's body is never purged; `purged_at` is when it was.
    legal_hold = models.BooleanField(default=False, db_default=False)  # db_default: ingest inserts in raw SQL
    purged_at = models.DateTimeField("body purged at", null=True, blank=True, editable=False)
    # Imported as history by an archive import (intake.archive): never acknowledged, ticket closed or none.
    history = models.BooleanField(default=False, db_default=False, editable=False)

    class Meta:
        default_permissions = ("add", "change", "view")  # evidence: nobody deletes events
        permissions = [
            ("view_message_body", "Can view message bodies and attachments"),
            ("release_quarantine", "Can release quarantined messages"),
            ("set_legal_hold", "Can place and release legal holds (retention never purges a held body)"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["mailbox", "provider_message_id"], name="inbox_event_unique_per_mailbox"),
            models.CheckConstraint(
                condition=Q(state__in=["received", "ready", "write_pending", "completed"]) | ~Q(reason_code=""),
                name="inbox_event_off_path_needs_reason",
            ),
            models.CheckConstraint(
                condition=Q(
                    state__in=[
                        "received",
                        "ready",
                        "write_pending",
                        "completed",
                        "suppressed",
                        "awaiting_review",
                        "quarantined",
                        "failed",
                        "unknown",
                    ]
                ),
                name="inbox_event_known_state",
            ),
            models.CheckConstraint(
                condition=Q(requeues__lte=MAX_REQUEUE_DOUBLINGS), name="inbox_event_requeues_capped"
            ),
        ]
        indexes = [
            models.Index(fields=["state", "updated_at"], name="inbox_event_state_updated"),
            models.Index(fields=["mailbox", "received_at"], name="inbox_event_mailbox_received"),
            models.Index(fields=["mailbox", "sender", "received_at"], name="inbox_event_sender_rate"),
            models.Index(fields=["mailbox", "thread_key"], name="inbox_event_thread"),
            # Retention's scan: bodies not purged yet, oldest first.
            models.Index(
                fields=["tenant", "received_at"], condition=Q(purged_at__isnull=True), name="inbox_event_retention"
            ),
        ]

    def __str__(self):
        return f"event {self.pk} ({self.state})"


class OutboxMessage(models.Model):
    topic = models.CharField(max_length=100)
    payload = models.JSONField()
    created_at = models.DateTimeField("created")
    published_at = models.DateTimeField("published", null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [
            # The relay reads only the unpublished head; keep that index small.
            models.Index(fields=["id"], condition=Q(published_at__isnull=True), name="outbox_unpublished"),
        ]

    def __str__(self):
        return f"{self.topic} #{self.pk}"


class AuditEvent(models.Model):
    """Append-only: who did what to which event, and when."""

    Kind = AuditKind

    inbox_event = models.ForeignKey(InboxEvent, on_delete=models.PROTECT, related_name="audit_events")
    actor = models.CharField(max_length=150)
    kind = models.CharField(max_length=50, choices=AuditKind.choices)
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField("time")

    class Meta:
        default_permissions = ("add", "view")  # append-only
        indexes = [models.Index(fields=["inbox_event", "at"], name="audit_event_by_event")]

    def __str__(self):
        return f"{self.kind} by {self.actor}"


class WebhookRejectionCount(models.Model):
    """`mailroom_webhook_rejections_total`: one row per (provider, reason), bumped by an UPSERT.

    In the database so every web process counts into the same number and a restart loses nothing.
    Labels come from fixed sets (a mailbox provider or "unknown"; `WebhookRejection`), never from a URL.
    """

    provider = models.CharField(max_length=20)
    reason = models.CharField(max_length=30, choices=WebhookRejection.choices)
    count = models.BigIntegerField(default=0)
    last_at = models.DateTimeField("last rejected")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["provider", "reason"], name="webhook_rejection_count_once"),
        ]

    def __str__(self):
        return f"{self.provider}/{self.reason}: {self.count}"


class WebhookNonce(models.Model):
    """A provider's one-time token (for example Mailgun's), kept so a replayed webhook is refused."""

    mailbox = models.ForeignKey(Mailbox, on_delete=models.CASCADE, related_name="+")
    provider = models.CharField(max_length=20)
    nonce = models.CharField(max_length=200)
    seen_at = models.DateTimeField("seen")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["provider", "nonce"], name="webhook_nonce_once_per_provider"),
        ]

    def __str__(self):
        return f"{self.provider} token seen {self.seen_at:%Y-%m-%d %H:%M}"


class ProviderSubscription(models.Model):
    """A push subscription held at the provider (Graph change notifications, Gmail watch)."""

    mailbox = models.ForeignKey(Mailbox, on_delete=models.CASCADE, related_name="subscriptions")
    provider = models.CharField(max_length=20)
    external_id = models.CharField("external ID", max_length=300)
    resource = models.CharField(max_length=500, blank=True)
    expires_at = models.DateTimeField("expires")
    created_at = models.DateTimeField("created")
    renewed_at = models.DateTimeField("renewed", null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["mailbox", "provider"], name="provider_subscription_one_per_mailbox"),
        ]

    def __str__(self):
        return f"{self.provider} subscription of mailbox {self.mailbox_id}"


class Switch(models.Model):
    """Operational switches (the global pause), edited by admins.

    It lives here, at the bottom of the app graph, because intake's sweeps must
    respect it as much as ticketing's workers.
    """

    GLOBAL_PAUSE = "global_pause"

    name = models.SlugField(unique=True)
    on = models.BooleanField(default=False)
    changed_by = models.CharField(max_length=150, blank=True)
    changed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"{self.name}={'on' if self.on else 'off'}"


class SecretResolution(models.Model):
    """A secret reference was resolved (or refused): which, for whom, when. Never the value (intake.secrets)."""

    class Outcome(models.TextChoices):
        OK = "ok"
        UNAVAILABLE = "unavailable"
        REFUSED = "refused"

    ref = models.CharField("secret reference", max_length=300)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    owner = models.CharField(max_length=100, blank=True, help_text='"mailbox:<id>", "destination:<id>" or a label')
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    fresh = models.BooleanField("re-read", default=False, help_text="A re-read after the credentials were refused.")
    at = models.DateTimeField("time", db_index=True)

    class Meta:
        indexes = [models.Index(fields=["ref", "at"], name="secret_resolution_ref_at")]

    def __str__(self):
        return f"{self.ref} for {self.owner or 'platform'} at {self.at:%Y-%m-%d %H:%M:%S}: {self.outcome}"


class MailboxAudit(models.Model):
    """What happened to a mailbox's connection (tokens connected or rotated, health transitions, quiet alarms,
    archive imports): who, when, what; never a secret value. `AuditEvent` belongs to an inbox event."""

    Kind = MailboxAuditKind

    mailbox = models.ForeignKey(Mailbox, on_delete=models.CASCADE, related_name="audit")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=40, choices=MailboxAuditKind.choices)
    actor = models.CharField(max_length=150)
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField("time")

    class Meta:
        default_permissions = ("view",)  # evidence
        indexes = [models.Index(fields=["mailbox", "at"], name="mailbox_audit_mailbox_at")]

    def __str__(self):
        return f"{self.kind} of mailbox {self.mailbox_id} at {self.at:%Y-%m-%d %H:%M:%S}"


class SenderListEntry(models.Model):
    """A sender address or @domain on a tenant's (mailbox null) or a mailbox's block or allow list
    (intake.validation.sender_lists): blocked mail is suppressed with the list as its reason; allowed mail
    skips the sender rate limit."""

    class Kind(models.TextChoices):
        BLOCK = "block"
        ALLOW = "allow"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="sender_lists")
    mailbox = models.ForeignKey(
        Mailbox,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="sender_lists",
        help_text="empty: every mailbox of the tenant",
    )
    kind = models.CharField(max_length=10, choices=Kind.choices)
    # "name@example.com" or "@example.com", lowercase (clean() normalizes).
    pattern = models.CharField("address or @domain", max_length=320)
    note = models.CharField(max_length=200, blank=True)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField("added", auto_now_add=True)

    class Meta:
        verbose_name = "sender list entry"
        verbose_name_plural = "sender lists"
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=["block", "allow"]), name="sender_list_known_kind"),
            models.CheckConstraint(
                condition=Q(pattern=Lower("pattern")) & ~Q(pattern=""), name="sender_list_pattern_lowercase"
            ),
            models.UniqueConstraint(
                fields=["tenant", "pattern"], condition=Q(mailbox__isnull=True), name="sender_list_unique_per_tenant"
            ),
            models.UniqueConstraint(
                fields=["mailbox", "pattern"], condition=Q(mailbox__isnull=False), name="sender_list_unique_per_mailbox"
            ),
        ]

    def __str__(self):
        return f"{self.kind} {self.pattern}"

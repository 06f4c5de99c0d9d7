"""What the operators' console shows (proxies of intake's records) and what the reconcilers record.

`RecoveryItem` is an `InboxEvent` seen through the recovery queue; its
permissions are the operator's capabilities. `PauseSwitch` is the global
`Switch` seen through the pause page; tenant, mailbox and destination pauses are
edited there too. Bodies and quarantine release stay on `intake.InboxEvent`
(`intake.view_message_body`, `intake.release_quarantine`).
"""

from django.conf import settings
from django.db import models
from django.db.models import Q

from intake.models import InboxEvent, Switch


class RecoveryItem(InboxEvent):
    class Meta:
        proxy = True
        verbose_name = "recovery item"
        verbose_name_plural = "recovery queue"
        # Nobody adds, edits or deletes an event through the queue: every change is an action.
        default_permissions = ("view",)
        permissions = [
            ("assign_recoveryitem", "Can assign recovery items and set their escalation time"),
            ("replay_recoveryitem", "Can correct the routing of recovery items and replay them"),
            ("confirm_recoveryitem", "Can confirm an existing ticket for a recovery item"),
            ("close_recoveryitem", "Can close a recovery item as not-a-request"),
            ("replay_new_action", "Can approve a replay as a new action (new action version and key)"),
        ]


class PauseSwitch(Switch):
    class Meta:
        proxy = True
        verbose_name = "pause"
        verbose_name_plural = "pauses"
        # "change": a tenant's own pauses. The global pause is for superusers only (services.pauses).
        default_permissions = ("view", "change")


# --- reconcilers (reconciliation.reconcilers) ------------------------------------------------------


class ReconciliationRun(models.Model):
    """One bounded pass of one reconciler over one scope (docs/design.md §8 "Reconciliation").

    `kind` is the reconciler (`provider`, `unmapped`, `destination`, `outbox`); `scope` the mailbox
    slug, `destination:<tenant>/<slug>`, or `(all)`. `cursor` is where a pass that hit its LIMIT
    stopped (the next pass of the same kind and scope resumes there); `{}` once a pass reached the end.
    """

    kind = models.CharField(max_length=30)
    scope = models.CharField(max_length=200)
    started_at = models.DateTimeField("started")
    finished_at = models.DateTimeField("finished", null=True, blank=True)
    scanned = models.PositiveIntegerField(default=0)
    findings = models.PositiveIntegerField(default=0)
    repaired = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    cursor = models.JSONField(default=dict, blank=True)

    class Meta:
        default_permissions = ("view",)
        indexes = [
            models.Index(fields=["kind", "scope", "-started_at"], name="reconciliation_run_latest"),
            models.Index(fields=["scope", "-started_at"], name="reconciliation_run_scope"),
            models.Index(fields=["started_at"], name="reconciliation_run_started"),
        ]  # the purge

    def __str__(self):
        return f"{self.kind} {self.scope} at {self.started_at:%Y-%m-%d %H:%M:%S}"


class Finding(models.Model):
    """A discrepancy a reconciler saw; at most one open finding per (kind, object)."""

    class Kind(models.TextChoices):
        MISSING_FROM_INBOX = "missing_from_inbox", "The provider has a message we never stored"
        UNMAPPED = "unmapped", "An open event has no ticket mapping past the tenant's threshold"
        ORPHAN_IN_DESTINATION = "orphan_in_destination", "A destination record carries our reference, no mapping"
        TICKET_MISSING = "ticket_missing", "A mapping's ticket no longer exists in the destination"
        OUTBOX_STUCK = "outbox_stuck", "An outbox row stayed unpublished past the threshold"

    run = models.ForeignKey(ReconciliationRun, on_delete=models.PROTECT, related_name="finding_set")
    kind = models.CharField(max_length=30, choices=Kind.choices)
    # What it is about, as text: "mailbox:<id>:<provider message id>", "event:<id>",
    # "destination:<id>:ticket:<ticket id>", "mapping:<id>", "outbox:<id>".
    object = models.CharField(max_length=1200)
    tenant = models.ForeignKey("intake.Tenant", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    inbox_event = models.ForeignKey(
        "intake.InboxEvent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    detail = models.JSONField(default=dict, blank=True)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    resolved_at = models.DateTimeField("resolved", null=True, blank=True)
    resolution = models.CharField(max_length=200, blank=True)

    class Meta:
        default_permissions = ("view",)
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "object"], condition=Q(resolved_at__isnull=True), name="finding_one_open_per_object"
            ),
            models.CheckConstraint(
                condition=Q(resolved_at__isnull=True) | ~Q(resolution=""), name="finding_resolved_has_resolution"
            ),
        ]
        indexes = [
            # The recovery queue's third arm: events with an open `unmapped` finding.
            models.Index(
                fields=["inbox_event"],
                condition=Q(kind="unmapped", resolved_at__isnull=True),
                name="finding_open_unmapped",
            ),
        ]

    def __str__(self):
        state = f"resolved: {self.resolution}" if self.resolved_at else "open"
        return f"{self.kind} {self.object} ({state})"


# --- the REST API (reconciliation.api) ----------------------------------------------------------------


class ApiToken(models.Model):
    """A REST API token bound to a user (`manage.py api_token <username>`); only its SHA-256 is stored.

    The token itself is printed once when made; `prefix` (its first characters) tells tokens apart in
    the admin without revealing them. Deleting the row revokes the token.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField("key prefix", max_length=12)
    name = models.CharField(max_length=100, blank=True, help_text="What the token is for (a script, a job)")
    created_at = models.DateTimeField("created")
    expires_at = models.DateTimeField(
        "expires", null=True, blank=True, help_text="Refused from this time on; empty: never"
    )
    last_used_at = models.DateTimeField("last used", null=True, blank=True)

    class Meta:
        default_permissions = ("view",)  # revoked by a superuser (reconciliation grants no delete permission)
        verbose_name = "API token"

    def __str__(self):
        return f"{self.prefix}… ({self.user})"


# --- bulk work over the queue's filter (reconciliation.services.bulk_jobs) ---------------------------


class BulkJob(models.Model):
    """One action over every queue item a frozen filter matched, run in chunks by a background task.

    `filters` is the queue's filter as the user confirmed it (the age turned into a fixed cut-off) and
    `max_pk` the newest item then: mail that arrives later is never part of the job. `cursor` is the last
    item handled; it and the counts move in the same transaction as the chunk's per-item writes, so a
    crash loses at most one chunk's claim, never a half-counted chunk. State changes go through
    `services.bulk_jobs` only (guarded UPDATEs).
    """

    class State(models.TextChoices):
        PENDING = "pending", "Waiting for a worker"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        CANCELLED = "cancelled", "Cancelled"
        FAILED = "failed", "Failed"

    class Action(models.TextChoices):
        CLOSE = "close", "Close as not a request"
        SUPPRESS = "suppress", "Suppress as spam (closed as not a request)"
        REPLAY = "replay", "Replay with the original idempotency key"
        ASSIGN = "assign", "Assign"

    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="bulk_jobs")
    tenant_ids = models.JSONField(default=list, help_text="The tenants the user could see when the job started")
    action = models.CharField(max_length=20, choices=Action.choices)
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    reason = models.TextField(blank=True)
    filters = models.JSONField(default=dict, blank=True)
    max_pk = models.BigIntegerField(default=0)
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    succeeded = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    cursor = models.BigIntegerField(default=0)
    samples = models.JSONField(default=list, blank=True, help_text="The first skipped and failed items, with why")
    error = models.TextField(blank=True)
    claimed_by = models.CharField(max_length=200, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField("created")
    started_at = models.DateTimeField("started", null=True, blank=True)
    finished_at = models.DateTimeField("finished", null=True, blank=True)

    class Meta:
        default_permissions = ("view",)
        verbose_name = "bulk job"
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["pending", "running", "done", "cancelled", "failed"]),
                name="bulk_job_known_state",
            ),
            models.CheckConstraint(
                condition=Q(action__in=["close", "suppress", "replay", "assign"]), name="bulk_job_known_action"
            ),
            models.CheckConstraint(
                condition=Q(done=models.F("succeeded") + models.F("skipped") + models.F("failed")),
                name="bulk_job_counts_add_up",
            ),
            models.CheckConstraint(
                condition=~Q(action="assign") | Q(assignee__isnull=False), name="bulk_job_assign_has_assignee"
            ),
            models.CheckConstraint(
                condition=~Q(action__in=["close", "suppress"]) | ~Q(reason=""), name="bulk_job_close_has_reason"
            ),
            models.CheckConstraint(
                condition=Q(state__in=["pending", "running"]) | Q(finished_at__isnull=False),
                name="bulk_job_finished_has_time",
            ),
            models.CheckConstraint(
                condition=~Q(state="running") | Q(started_at__isnull=False), name="bulk_job_running_has_started"
            ),
        ]
        indexes = [
            models.Index(fields=["state", "claimed_until"], name="bulk_job_open"),
            models.Index(fields=["started_by", "-created_at"], name="bulk_job_by_user"),
        ]

    def __str__(self):
        return f"bulk {self.action} #{self.pk} ({self.state}, {self.done}/{self.total})"

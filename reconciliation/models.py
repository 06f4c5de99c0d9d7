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
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    scanned = models.PositiveIntegerField(default=0)
    findings = models.PositiveIntegerField(default=0)
    repaired = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    cursor = models.JSONField(default=dict, blank=True)

    class Meta:
        default_permissions = ("view",)
        indexes = [models.Index(fields=["kind", "scope", "-started_at"], name="reconciliation_run_latest"),
                   models.Index(fields=["scope", "-started_at"], name="reconciliation_run_scope"),
                   models.Index(fields=["started_at"], name="reconciliation_run_started")]  # the purge

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
    inbox_event = models.ForeignKey("intake.InboxEvent", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    detail = models.JSONField(default=dict, blank=True)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution = models.CharField(max_length=200, blank=True)

    class Meta:
        default_permissions = ("view",)
        constraints = [
            models.UniqueConstraint(fields=["kind", "object"], condition=Q(resolved_at__isnull=True),
                                    name="finding_one_open_per_object"),
            models.CheckConstraint(condition=Q(resolved_at__isnull=True) | ~Q(resolution=""),
                                   name="finding_resolved_has_resolution"),
        ]
        indexes = [
            # The recovery queue's third arm: events with an open `unmapped` finding.
            models.Index(fields=["inbox_event"], condition=Q(kind="unmapped", resolved_at__isnull=True),
                         name="finding_open_unmapped"),
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
    prefix = models.CharField(max_length=12)
    name = models.CharField(max_length=100, blank=True, help_text="What the token is for (a script, a job)")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Refused from this time on; empty: never")
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        default_permissions = ("view",)  # revoked by a superuser (reconciliation grants no delete permission)

    def __str__(self):
        return f"{self.prefix}… ({self.user})"

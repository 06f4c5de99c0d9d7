"""What the API shows, and the validation of what it writes.

Lists mask the sender (as the console's lists do); an event's detail shows it whole, with its audit
trail, intents and mappings. Configuration writes (mailboxes, destinations, routing rules) are
validated by the model's `full_clean` (field checks, `clean()`, constraints: a secret that is not a
reference is refused with the model's message) and kept inside the user's tenants.
"""

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied, ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from intake import secret_policy
from intake.logging import mask_address
from intake.models import AuditEvent, InboxEvent, Mailbox, SenderListEntry
from intake.selectors import visible_tenants
from intake.sender_lists import add_sender_list_entry
from ticketing import audit, numbers
from ticketing.classification.conditions import canonical_conditions, validate_conditions
from ticketing.classification.rules import action_errors, clean_tags
from ticketing.destinations import configuration_errors
from ticketing.models import PRIORITIES, Destination, Intent, RoutingPolicy, RoutingRule, TicketMapping

from .. import selectors, services
from ..models import Finding, ReconciliationRun

# --- errors -------------------------------------------------------------------------------------------


class ProblemSerializer(serializers.Serializer):
    """An error (RFC 9457, `application/problem+json`; reconciliation.api.errors)."""

    type = serializers.CharField()
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField(allow_blank=True)
    errors = serializers.DictField(required=False, help_text="a refused write or filter: the messages by field")


# --- events -------------------------------------------------------------------------------------------


class EventSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    mailbox = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    owner = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    sender = serializers.SerializerMethodField()

    class Meta:
        model = InboxEvent
        fields = (
            "id",
            "tenant",
            "mailbox",
            "state",
            "reason_code",
            "reason_detail",
            "received_at",
            "updated_at",
            "sender",
            "subject",
            "message_id_header",
            "source",
            "size",
            "owner",
            "escalate_at",
            "legal_hold",
            "purged_at",
        )

    def get_sender(self, obj) -> str:
        return mask_address(obj.sender)


class AuditSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ("id", "at", "kind", "actor", "detail")


class IntentSerializer(serializers.ModelSerializer):
    destination = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Intent
        fields = (
            "id",
            "inbox_event",
            "action",
            "action_version",
            "idempotency_key",
            "destination",
            "state",
            "attempts",
            "next_attempt_at",
            "last_error_kind",
            "last_error",
            "external_ref",
            "result_ref",
            "created_at",
            "completed_at",
        )


class MappingSerializer(serializers.ModelSerializer):
    destination = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    # Not format "uri": the built-in ticket store's tickets are paths on this site.
    ticket_url = serializers.CharField(read_only=True, help_text="the ticket's URL, or its path on this site")
    ticket_number = serializers.SerializerMethodField(
        help_text="Mailroom's number of the ticket, `MR-n`, as acknowledgments and the console name it"
    )

    class Meta:
        model = TicketMapping
        fields = (
            "id",
            "inbox_event",
            "action",
            "destination",
            "ticket_id",
            "ticket_number",
            "ticket_url",
            "created_at",
        )

    def get_ticket_number(self, mapping) -> str:
        number = getattr(mapping, "ticket_number", None) or numbers.number_of(mapping)
        return numbers.format_number(number)


class EventDetailSerializer(EventSerializer):
    audit = serializers.SerializerMethodField()
    intents = serializers.SerializerMethodField()
    mappings = serializers.SerializerMethodField()
    reason_text = serializers.SerializerMethodField()

    class Meta(EventSerializer.Meta):
        fields = (
            *EventSerializer.Meta.fields,
            "provider_message_id",
            "thread_key",
            "reason_text",
            "route",
            "route_override",
            "details",
            "audit",
            "intents",
            "mappings",
        )

    def get_sender(self, obj) -> str:
        return obj.sender

    def get_reason_text(self, obj) -> str:
        return selectors.reason_text(obj.reason_code)

    def get_audit(self, obj) -> list[dict]:
        return AuditSerializer(selectors.event_timeline(obj.pk), many=True).data

    def get_intents(self, obj) -> list[dict]:
        return IntentSerializer(selectors.event_intents(obj.pk), many=True).data

    def get_mappings(self, obj) -> list[dict]:
        return MappingSerializer(selectors.event_mappings(obj.pk), many=True).data


class QueueItemSerializer(EventSerializer):
    reason_text = serializers.SerializerMethodField()
    intent_state = serializers.CharField(read_only=True, allow_null=True)
    intent_version = serializers.IntegerField(read_only=True, allow_null=True)
    destination = serializers.CharField(source="destination_slug", read_only=True, allow_null=True)
    external_ref = serializers.CharField(read_only=True, allow_null=True)
    attempt_count = serializers.IntegerField(read_only=True)
    latest_attempt_at = serializers.DateTimeField(read_only=True, allow_null=True)
    has_held_intent = serializers.BooleanField(read_only=True)

    class Meta(EventSerializer.Meta):
        fields = (
            *EventSerializer.Meta.fields,
            "reason_text",
            "intent_state",
            "intent_version",
            "destination",
            "external_ref",
            "attempt_count",
            "latest_attempt_at",
            "has_held_intent",
        )

    def get_reason_text(self, obj) -> str:
        return selectors.reason_text(obj.reason_code) or obj.reason_detail[:200]


class AttachmentSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    filename = serializers.CharField()
    declared_type = serializers.CharField()
    sniffed_type = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()
    url = serializers.CharField()


class BodySerializer(serializers.Serializer):
    available = serializers.BooleanField()
    subject = serializers.CharField()
    sender = serializers.CharField()
    text = serializers.CharField()
    alternatives = serializers.ListField(child=serializers.DictField())
    attachments = AttachmentSerializer(many=True)
    purged_at = serializers.DateTimeField(allow_null=True)


# --- queue actions (input) ------------------------------------------------------------------------------

REQUEST_TYPE_HELP = "question, incident, problem, task or one of the tenant's routing policy's request types"


@extend_schema_field(OpenApiTypes.INT)
class TenantDestinationField(serializers.PrimaryKeyRelatedField):
    """A destination id of the item's tenant (the console's choices); another tenant's is 'does not exist'."""

    def get_queryset(self):
        event = self.context.get("event")
        return Destination.objects.filter(tenant_id=event.tenant_id) if event else Destination.objects.none()


class AssignSerializer(serializers.Serializer):
    assignee = serializers.CharField(
        allow_null=True,
        help_text="a username (an active member of the item's tenant who can see the queue); null unassigns",
    )


class EscalationSerializer(serializers.Serializer):
    escalate_at = serializers.DateTimeField(allow_null=True, help_text="null clears it")


class RouteSerializer(serializers.Serializer):
    # Left out or null: the item's current destination is kept (as the console's correction form does).
    destination = TenantDestinationField(required=False, allow_null=True, default=None)
    queue = serializers.CharField(required=False, allow_blank=True, max_length=100, default="")
    priority = serializers.ChoiceField(choices=("", *PRIORITIES), required=False, default="")
    request_type = serializers.CharField(
        required=False, allow_blank=True, max_length=100, default="", help_text=REQUEST_TYPE_HELP
    )

    def route(self) -> dict:
        data = self.validated_data
        destination = data.get("destination")
        return {
            "destination_id": destination.pk if destination else None,
            "queue": data.get("queue") or "",
            "priority": data.get("priority") or "",
            "request_type": data.get("request_type") or "",
        }


class ReplayNewSerializer(RouteSerializer):
    destination = TenantDestinationField(required=False, allow_null=True, default=None)
    reason = serializers.CharField(max_length=500, help_text="why the original key must not be reused")


class ConfirmSerializer(serializers.Serializer):
    ticket_id = serializers.CharField(
        max_length=200, help_text="the desk's ticket id; for the built-in store, the ticket's number MR-n"
    )
    ticket_url = serializers.URLField(required=False, allow_blank=True, max_length=500, default="")
    destination = TenantDestinationField(
        required=False, allow_null=True, default=None, help_text="where the ticket is (default: where the intent went)"
    )


class CloseSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000)


class ReleaseSerializer(serializers.Serializer):
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class BulkReplaySerializer(serializers.Serializer):
    event_ids = serializers.ListField(child=serializers.IntegerField(), allow_empty=False)
    preview = serializers.BooleanField(default=False, help_text="true: only look up and say what would be done")


class BulkItemSerializer(serializers.Serializer):
    event_id = serializers.IntegerField()
    subject = serializers.CharField()
    event_state = serializers.CharField()
    intent_state = serializers.CharField()
    destination = serializers.CharField()
    external_ref = serializers.CharField()
    lookup = serializers.CharField()
    found_ticket_id = serializers.CharField()
    found_ticket_url = serializers.CharField()
    plan = serializers.CharField()
    plan_text = serializers.CharField()
    outcome = serializers.CharField()


class ActionResultSerializer(serializers.Serializer):
    outcome = serializers.CharField()
    event = EventDetailSerializer()


# --- configuration (mailroom-admin) ---------------------------------------------------------------------


class VisibleTenantField(serializers.SlugRelatedField):
    def __init__(self, **kwargs):
        super().__init__(slug_field="slug", **kwargs)

    def get_queryset(self):
        return visible_tenants(self.context["request"].user)

    def to_internal_value(self, data):
        # A slug with a NUL byte names no tenant, and PostgreSQL refuses it in a query (a 500 otherwise).
        if isinstance(data, str) and "\x00" in data:
            self.fail("does_not_exist", slug_name=self.slug_field, value=data.replace("\x00", "\\x00"))
        return super().to_internal_value(data)


class TenantScopedRelatedField(serializers.PrimaryKeyRelatedField):
    """A mailbox or destination id among the user's tenants' (another tenant's: 'does not exist')."""

    def __init__(self, selector, **kwargs):
        self.selector = selector
        super().__init__(**kwargs)

    def get_queryset(self):
        return self.selector(self.context["request"].user)


class FullCleanModelSerializer(serializers.ModelSerializer):
    """Saves through the model's `full_clean`: its refusals (e.g. a secret that is not a reference) are 400s.

    The tenant is chosen on create and fixed afterwards.
    """

    def get_fields(self):
        fields = super().get_fields()
        if self.instance is not None and "tenant" in fields:
            fields["tenant"].read_only = True
        return fields

    def _saved(self, instance, validated_data):
        for name, value in validated_data.items():
            setattr(instance, name, value)
        try:
            instance.full_clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(
                exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
            ) from None
        try:
            with transaction.atomic():
                instance.save()
        except IntegrityError:
            # A row saved at the same moment took a unique value (an address, a slug): a 400 that says which,
            # found by judging again now that the other row is visible; never a 500.
            try:
                instance.full_clean()
            except DjangoValidationError as exc:
                raise serializers.ValidationError(
                    exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
                ) from None
            raise serializers.ValidationError(
                {"non_field_errors": ["another change saved at the same moment conflicts with this one; try again"]}
            ) from None
        return instance

    def create(self, validated_data):
        return self._saved(self.Meta.model(), validated_data)

    def update(self, instance, validated_data):
        return self._saved(instance, validated_data)


class SecretRulesMixin:
    """The secret rule (intake.secret_policy) with the request's user: a platform secret reference is set, and a
    row holding one redirected, only by a superuser; a base_url moved to another host needs `credentials_ref` in
    the same request. A destination's base_url change is audited as the admin's is (ticketing.audit)."""

    def validate(self, data):
        data = super().validate(data)
        row = self.instance if self.instance is not None else self.Meta.model()
        holder = secret_policy.holder_for(row)
        try:
            secret_policy.check_secret_change(
                actor=self.context["request"].user,
                row=row,
                before=secret_policy.stored_values(row),
                changes=data,
                reentered=[name for name in holder.ref_fields if name in self.initial_data],
            )
        except secret_policy.SecretChangeRefused as refused:
            raise serializers.ValidationError(refused.message_dict) from None
        return data

    def update(self, instance, validated_data):
        old_url = getattr(instance, "base_url", None)
        saved = super().update(instance, validated_data)
        if isinstance(saved, Destination):
            audit.base_url_changed(self.context["request"].user, saved, old_url or "")
        return saved


class PauseThroughServiceMixin:
    """`paused` is turned by the pause service (reconciliation.services.pauses), as on the pause page: a pause
    needs `pause_reason`, the pause permission, and is audited with it; a resume drains the backlog."""

    pause_service = ""  # the name of the service's do_set_*_pause

    def validate(self, data):
        data = super().validate(data)
        reason = data.pop("pause_reason", "")
        wanted = data.pop("paused", None)
        self._pause_change = None
        if wanted is not None and bool(wanted) != bool(getattr(self.instance, "paused", False)):
            user = self.context["request"].user
            if not user.has_perm(services.PERM_PAUSE):
                raise DjangoPermissionDenied(f"needs {services.PERM_PAUSE} to pause or resume")
            if wanted and not reason.strip():
                raise serializers.ValidationError({"pause_reason": services.REASON_NEEDED})
            self._pause_change = (bool(wanted), reason)
        return data

    def _pause(self, instance):
        if self._pause_change:
            paused, reason = self._pause_change
            getattr(services, self.pause_service)(self.context["request"].user, instance.pk, paused, reason=reason)
            instance.refresh_from_db()
        return instance

    def create(self, validated_data):
        with transaction.atomic():
            return self._pause(super().create(validated_data))

    def update(self, instance, validated_data):
        with transaction.atomic():
            return self._pause(super().update(instance, validated_data))


PAUSE_REASON_HELP = "Why (required when `paused` turns true); shown on the pause page and audited."


CONNECTION_FIELDS = (
    "link_state",
    "link_state_since",
    "poll_failures",
    "poll_errors_total",
    "last_success_at",
    "quiet_alarm_since",
    "oauth_scopes",
    "oauth_expires_at",
    "oauth_connected_at",
    "archive_before",
    "archive_tickets",
    "archive_done_at",
)


class MailboxSerializer(PauseThroughServiceMixin, SecretRulesMixin, FullCleanModelSerializer):
    tenant = VisibleTenantField()
    pause_reason = serializers.CharField(
        write_only=True, required=False, allow_blank=True, max_length=300, help_text=PAUSE_REASON_HELP
    )
    pause_service = "do_set_mailbox_pause"
    # "" (no archive import) besides the choices: a plain string in the schema, not an enum without "".
    archive_tickets = serializers.CharField(read_only=True, help_text='"" (no archive import), "none" or "closed"')

    class Meta:
        model = Mailbox
        fields = (
            "id",
            "tenant",
            "slug",
            "address",
            "provider",
            "webhook_secret_ref",
            "credentials_ref",
            "settings",
            "allowed_recipients",
            "poll_enabled",
            "paused",
            "pause_reason",
            "health",
            "health_detail",
            "last_polled_at",
            "created_at",
            *CONNECTION_FIELDS,
        )
        # The connection's state, the OAuth grant and the archive import move only through their own doors
        # (intake.mailbox_health, the consent flow, intake.archive): shown, never written here.
        read_only_fields = ("health", "health_detail", "last_polled_at", "created_at", *CONNECTION_FIELDS)


class DestinationSerializer(PauseThroughServiceMixin, SecretRulesMixin, FullCleanModelSerializer):
    tenant = VisibleTenantField()
    pause_reason = serializers.CharField(
        write_only=True, required=False, allow_blank=True, max_length=300, help_text=PAUSE_REASON_HELP
    )
    pause_service = "do_set_destination_pause"

    class Meta:
        model = Destination
        fields = (
            "id",
            "tenant",
            "slug",
            "kind",
            "base_url",
            "credentials_ref",
            "settings",
            "is_default",
            "paused",
            "pause_reason",
            "paused_reason",
            "paused_by",
            "paused_at",
        )
        read_only_fields = ("paused_reason", "paused_by", "paused_at")

    def validate(self, data):
        """The admin's checks (ticketing.destination_admin): the kind's settings, field by field."""
        data = super().validate(data)

        def current(name, default=""):
            return data[name] if name in data else getattr(self.instance, name, default)

        problems = configuration_errors(
            current("kind", "builtin"), current("base_url"), current("credentials_ref"), current("settings", {})
        )
        if problems:
            raise serializers.ValidationError(problems)
        return data


class RoutingRuleSerializer(FullCleanModelSerializer):
    tenant = VisibleTenantField()
    mailbox = TenantScopedRelatedField(selectors.visible_mailboxes, required=False, allow_null=True)
    destination = TenantScopedRelatedField(selectors.visible_destinations, required=False, allow_null=True)

    class Meta:
        model = RoutingRule
        fields = (
            "id",
            "tenant",
            "mailbox",
            "position",
            "name",
            "enabled",
            "conditions",
            "action",
            "destination",
            "queue",
            "priority",
            "request_type",
            "assignee",
            "sensitive",
            "tags",
            "suppress_reason",
            "stop_processing",
            "hits",
            "last_hit_at",
        )
        read_only_fields = ("hits", "last_hit_at")

    def validate_conditions(self, conditions):
        conditions = canonical_conditions({} if conditions in (None, "") else conditions)
        errors = validate_conditions(conditions)
        if errors:
            raise serializers.ValidationError(errors)
        return conditions

    def validate(self, data):
        """The console's checks (ticketing.routing_admin.RoutingRuleForm): same tenant, the policy's vocabulary."""
        tenant = data.get("tenant") or (self.instance.tenant if self.instance else None)
        errors = {}
        for name in ("mailbox", "destination"):
            related = data.get(name)
            if tenant is not None and related is not None and related.tenant_id != tenant.pk:
                errors[name] = f"This {name} belongs to another tenant."
        policy = RoutingPolicy.objects.filter(tenant=tenant).first() if tenant else None
        if data.get("queue") and data["queue"] not in (policy.queues if policy else []):
            errors["queue"] = f"'{data['queue']}' is not a queue of {tenant.slug}'s routing policy."
        if data.get("request_type") and data["request_type"] not in (policy.request_types if policy else []):
            errors["request_type"] = (
                f"'{data['request_type']}' is not a request type of {tenant.slug}'s routing policy."
            )

        def current(name, default=""):
            return data[name] if name in data else getattr(self.instance, name, default)

        if isinstance(data.get("tags"), (list, str)):
            data["tags"] = clean_tags(data["tags"])
        # Filter actions (ticketing.classification.rules): the console's checks.
        errors.update(
            action_errors(
                action=current("action", "route"),
                tags=current("tags", []),
                suppress_reason=current("suppress_reason"),
                fields={
                    name: current(name, None)
                    for name in ("destination", "queue", "priority", "request_type", "assignee")
                },
            )
        )
        if errors:
            raise serializers.ValidationError(errors)
        return data


class SenderListEntrySerializer(serializers.ModelSerializer):
    """A sender block/allow list entry; written through `intake.sender_lists` (tenant scoping, the pattern)."""

    tenant = VisibleTenantField()
    mailbox = TenantScopedRelatedField(
        selectors.visible_mailboxes,
        required=False,
        allow_null=True,
        help_text="empty: the tenant's list (every mailbox)",
    )

    class Meta:
        model = SenderListEntry
        fields = ("id", "tenant", "mailbox", "kind", "pattern", "note", "created_by", "created_at")
        read_only_fields = ("created_by", "created_at")
        validators = []  # the service normalizes the pattern first, then the unique constraints decide

    def create(self, validated_data):
        try:
            return add_sender_list_entry(
                actor=self.context["request"].user,
                tenant=validated_data["tenant"],
                mailbox=validated_data.get("mailbox"),
                kind=validated_data["kind"],
                pattern=validated_data["pattern"],
                note=validated_data.get("note", ""),
            )
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from None


# --- reconciliation ---------------------------------------------------------------------------------------


class RunSerializer(serializers.ModelSerializer):
    class Meta:
        model = ReconciliationRun
        fields = ("id", "kind", "scope", "started_at", "finished_at", "scanned", "findings", "repaired", "error")


class FindingSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)

    class Meta:
        model = Finding
        fields = (
            "id",
            "run",
            "kind",
            "object",
            "tenant",
            "inbox_event",
            "detail",
            "first_seen",
            "last_seen",
            "resolved_at",
            "resolution",
        )

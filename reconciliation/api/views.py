"""The API's endpoints: parse, call a selector or a `reconciliation.services` action, serialize.

Queue actions call exactly what the admin's item page calls (RecoveryItemAdmin._act_*), with the
same acting user: the same permission checks, intents, keys and audit rows ("user:<name>").
"""

from django.utils.dateparse import parse_date, parse_datetime
from django.utils.timezone import is_naive, make_aware
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from intake.models import InboxEvent, Mailbox, SenderListEntry
from intake.sender_lists import remove_sender_list_entry, visible_sender_list_entries
from ticketing.models import Destination, Intent, RoutingRule, TicketMapping

from .. import selectors, services
from ..downloads import attachment_response
from ..models import Finding, ReconciliationRun
from . import serializers
from .pagination import LatestRunsFirst, NewestFirst, OldestFirst
from .permissions import CanReadEvents, ModelPerms
from .schema import ProblemAutoSchema

EVENT_FILTERS = [
    OpenApiParameter("state", str, description="event state, e.g. failed, awaiting_review"),
    OpenApiParameter("reason", str, description="reason code, e.g. no_destination"),
    OpenApiParameter("mailbox", str, description="mailbox slug or id"),
    OpenApiParameter("received_after", OpenApiTypes.DATETIME, description="received at or after (ISO 8601)"),
    OpenApiParameter("received_before", OpenApiTypes.DATETIME, description="received before (ISO 8601)"),
]


def _when(params, name):
    value = params.get(name)
    if not value:
        return None
    parsed = parse_datetime(value)
    if parsed is None and parse_date(value) is not None:
        parsed = parse_datetime(f"{value}T00:00:00")
    if parsed is None:
        raise ValidationError({name: "Expected an ISO 8601 date or date-time."})
    parsed = make_aware(parsed) if is_naive(parsed) else parsed
    # PostgreSQL takes offsets up to ±15:59 and years 1..9999 after conversion; the fuzzer found
    # "+22:42", which reached the database as a 500. Real offsets are within ±14 h.
    offset = parsed.utcoffset()
    if offset is None or abs(offset.total_seconds()) > 14 * 3600 or not 1 < parsed.year < 9999:
        raise ValidationError({name: "Expected a date-time with a UTC offset within ±14:00."})
    return parsed


def _event_id(pk) -> int:
    if not str(pk).isdigit():
        raise NotFound()
    return int(pk)


class EventViewSet(viewsets.ReadOnlyModelViewSet):
    """Inbox events of the user's tenants, newest first; the detail carries the audit trail."""

    schema = ProblemAutoSchema()  # documents the problem+json errors too
    permission_classes = [CanReadEvents]
    pagination_class = NewestFirst
    serializer_class = serializers.EventSerializer
    queryset = InboxEvent.objects.none()  # the schema's model; requests use get_queryset

    def get_queryset(self):
        params = self.request.query_params
        rows = selectors.visible_events(self.request.user).select_related("tenant", "mailbox", "owner")
        return selectors.filter_events(
            rows,
            state=params.get("state", ""),
            reason=params.get("reason", ""),
            mailbox=params.get("mailbox", ""),
            received_after=_when(params, "received_after"),
            received_before=_when(params, "received_before"),
        )

    def get_serializer_class(self):
        return serializers.EventDetailSerializer if self.action == "retrieve" else serializers.EventSerializer

    @extend_schema(parameters=EVENT_FILTERS)
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def retrieve(self, request, pk=None):
        return Response(serializers.EventDetailSerializer(services.visible_event(request.user, _event_id(pk))).data)

    @extend_schema(responses=serializers.BodySerializer)
    @action(detail=True, methods=["get"])
    def body(self, request, pk=None):
        """The message text and its attachment list (security role; every view leaves a `body_viewed` audit row)."""
        event = services.visible_event(request.user, _event_id(pk))
        body = services.do_view_message_body(request.user, event.pk)
        attachments = [
            {
                "index": i,
                "filename": a.filename,
                "declared_type": a.declared_type,
                "sniffed_type": a.sniffed_type,
                "size": a.size,
                "sha256": a.sha256,
                "url": request.build_absolute_uri(f"/api/v1/events/{event.pk}/attachments/{i}/"),
            }
            for i, a in enumerate(body.attachments)
        ]
        data = {
            "available": body.available,
            "subject": body.subject,
            "sender": body.sender,
            "text": body.text,
            "alternatives": [{"type": t, "text": x} for t, x in body.alternatives],
            "attachments": attachments,
            "purged_at": body.purged_at,
        }
        response = Response(serializers.BodySerializer(data).data)
        response["Cache-Control"] = "no-store"
        return response

    @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY})
    @action(detail=True, methods=["get"], url_path=r"attachments/(?P<index>\d+)")
    def attachment(self, request, pk=None, index=None):
        """One attachment's bytes (security role; audited `attachment_downloaded`)."""
        event = services.visible_event(request.user, _event_id(pk))
        try:
            attachment, payload = services.do_download_attachment(request.user, event.pk, int(index))
        except services.ActionRefused:
            raise NotFound("No such attachment.") from None
        return attachment_response(attachment.filename, payload, index=int(index))


class IntentViewSet(viewsets.ReadOnlyModelViewSet):
    schema = ProblemAutoSchema()  # documents the problem+json errors too
    permission_classes = [CanReadEvents]
    model_perm = "ticketing.view_intent"
    serializer_class = serializers.IntentSerializer
    queryset = Intent.objects.none()

    def get_queryset(self):
        rows = selectors.visible_intents(self.request.user)
        event = self.request.query_params.get("event")
        return rows.filter(inbox_event_id=event) if event and event.isdigit() else rows

    @extend_schema(parameters=[OpenApiParameter("event", int, description="only this event's intents")])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)


class MappingViewSet(IntentViewSet):
    model_perm = "ticketing.view_ticketmapping"
    serializer_class = serializers.MappingSerializer
    queryset = TicketMapping.objects.none()

    def get_queryset(self):
        rows = selectors.visible_mappings(self.request.user)
        event = self.request.query_params.get("event")
        return rows.filter(inbox_event_id=event) if event and event.isdigit() else rows


def _action_schema(request_serializer, summary):
    return extend_schema(request=request_serializer, responses=serializers.ActionResultSerializer, summary=summary)


class QueueViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """The recovery queue (every event that needs a person), oldest first, and its actions.

    Each action is the console's: same permission (403 without it), same tenant check (404), refused
    when it no longer applies (409, nothing written), audited with the acting user.
    """

    schema = ProblemAutoSchema()  # documents the problem+json errors too
    permission_classes = [CanReadEvents]
    model_perm = "reconciliation.view_recoveryitem"
    pagination_class = OldestFirst
    serializer_class = serializers.QueueItemSerializer
    queryset = InboxEvent.objects.none()

    def get_queryset(self):
        return selectors.with_queue_columns(selectors.recovery_queue_for(self.request.user)).select_related(
            "tenant", "mailbox", "owner"
        )

    def _input(self, serializer_class, pk):
        event = services.visible_event(self.request.user, _event_id(pk))
        form = serializer_class(data=self.request.data, context={"request": self.request, "event": event})
        form.is_valid(raise_exception=True)
        return event, form

    def _done(self, event_id, outcome):
        event = services.visible_event(self.request.user, event_id)
        return Response({"outcome": outcome, "event": serializers.EventDetailSerializer(event).data})

    @_action_schema(serializers.AssignSerializer, "Assign the item (or unassign with null)")
    @action(detail=True, methods=["post"])
    def assign(self, request, pk=None):
        event, form = self._input(serializers.AssignSerializer, pk)
        username = form.validated_data["assignee"]
        assignee = None
        if username:
            # Only the item's assignable users are looked up: a user of another tenant, one without the queue
            # and one that does not exist get the same answer.
            assignee = services.assignable_user(event, username)
            if assignee is None:
                raise ValidationError({"assignee": services.ASSIGNEE_REFUSED.format(name=username)})
        services.do_assign(request.user, event.pk, assignee)
        return self._done(event.pk, f"assigned to {username}" if username else "unassigned")

    @_action_schema(serializers.EscalationSerializer, "Set or clear the escalation time")
    @action(detail=True, methods=["post"])
    def escalation(self, request, pk=None):
        event, form = self._input(serializers.EscalationSerializer, pk)
        escalate_at = form.validated_data["escalate_at"]
        services.do_set_escalation(request.user, event.pk, escalate_at)
        return self._done(event.pk, "escalation set" if escalate_at else "escalation cleared")

    @_action_schema(None, "Replay with the original idempotency key")
    @action(detail=True, methods=["post"])
    def replay(self, request, pk=None):
        event = services.visible_event(request.user, _event_id(pk))
        return self._done(event.pk, services.do_replay(request.user, event.pk))

    @_action_schema(serializers.RouteSerializer, "Correct the route and replay with the original idempotency key")
    @action(detail=True, methods=["post"], url_path="correct-and-replay")
    def correct_and_replay(self, request, pk=None):
        event, form = self._input(serializers.RouteSerializer, pk)
        return self._done(event.pk, services.do_correct_and_replay(request.user, event.pk, **form.route()))

    @_action_schema(serializers.ReplayNewSerializer, "Replay as a new action (new version and key; own permission)")
    @action(detail=True, methods=["post"], url_path="replay-as-new")
    def replay_as_new(self, request, pk=None):
        event, form = self._input(serializers.ReplayNewSerializer, pk)
        intent = services.do_replay_as_new_action(
            request.user, event.pk, reason=form.validated_data["reason"], **form.route()
        )
        return self._done(event.pk, f"new action version {intent.action_version}")

    @_action_schema(serializers.ConfirmSerializer, "Confirm an existing ticket (no destination call)")
    @action(detail=True, methods=["post"])
    def confirm(self, request, pk=None):
        event, form = self._input(serializers.ConfirmSerializer, pk)
        data = form.validated_data
        services.do_confirm_existing_ticket(
            request.user,
            event.pk,
            ticket_id=data["ticket_id"],
            ticket_url=data["ticket_url"],
            destination_id=data["destination"].pk if data["destination"] else None,
        )
        return self._done(event.pk, f"ticket {data['ticket_id']} confirmed")

    @_action_schema(serializers.CloseSerializer, "Close as not-a-request, with a reason")
    @action(detail=True, methods=["post"])
    def close(self, request, pk=None):
        event, form = self._input(serializers.CloseSerializer, pk)
        services.do_close_not_a_request(request.user, event.pk, reason=form.validated_data["reason"])
        return self._done(event.pk, "closed as not-a-request")

    @_action_schema(serializers.ReleaseSerializer, "Release from quarantine (security role), back into the pipeline")
    @action(detail=True, methods=["post"])
    def release(self, request, pk=None):
        event, form = self._input(serializers.ReleaseSerializer, pk)
        services.do_release_quarantine(request.user, event.pk, note=form.validated_data["note"])
        return self._done(event.pk, "released from quarantine")

    @extend_schema(
        request=serializers.BulkReplaySerializer,
        responses=serializers.BulkItemSerializer(many=True),
        summary="Bulk replay (at most MAILROOM_BULK_REPLAY_CAP items; each looked up first)",
    )
    @action(detail=False, methods=["post"], url_path="bulk-replay", pagination_class=None)
    def bulk_replay(self, request):
        form = serializers.BulkReplaySerializer(data=request.data)
        form.is_valid(raise_exception=True)
        ids = form.validated_data["event_ids"]
        call = services.do_bulk_replay_preview if form.validated_data["preview"] else services.do_bulk_replay
        items = call(request.user, ids)
        return Response(serializers.BulkItemSerializer(items, many=True).data)


class ConfigViewSet(viewsets.ModelViewSet):
    """Configuration of the user's tenants (mailroom-admin): the model permissions, `full_clean` on save."""

    schema = ProblemAutoSchema()  # documents the problem+json errors too
    permission_classes = [IsAuthenticated, ModelPerms]
    selector = None

    def get_queryset(self):
        return type(self).selector(self.request.user).order_by("pk")


class MailboxViewSet(ConfigViewSet):
    serializer_class = serializers.MailboxSerializer
    queryset = Mailbox.objects.none()
    selector = selectors.visible_mailboxes
    http_method_names = ["get", "post", "put", "patch", "head", "options"]  # evidence hangs off a mailbox


class DestinationViewSet(ConfigViewSet):
    serializer_class = serializers.DestinationSerializer
    queryset = Destination.objects.none()
    selector = selectors.visible_destinations
    http_method_names = ["get", "post", "put", "patch", "head", "options"]  # intents point at it


class RoutingRuleViewSet(ConfigViewSet):
    serializer_class = serializers.RoutingRuleSerializer
    queryset = RoutingRule.objects.none()
    selector = selectors.visible_routing_rules


class SenderListEntryViewSet(ConfigViewSet):
    serializer_class = serializers.SenderListEntrySerializer
    queryset = SenderListEntry.objects.none()
    selector = visible_sender_list_entries
    http_method_names = ["get", "post", "delete", "head", "options"]  # an entry is added or removed, not edited

    def perform_destroy(self, instance):
        remove_sender_list_entry(entry=instance, actor=self.request.user)


class RunViewSet(viewsets.ReadOnlyModelViewSet):
    schema = ProblemAutoSchema()  # documents the problem+json errors too
    permission_classes = [IsAuthenticated, ModelPerms]
    serializer_class = serializers.RunSerializer
    queryset = ReconciliationRun.objects.none()
    pagination_class = LatestRunsFirst

    def get_queryset(self):
        return selectors.visible_runs(self.request.user)


class FindingViewSet(viewsets.ReadOnlyModelViewSet):
    schema = ProblemAutoSchema()  # documents the problem+json errors too
    permission_classes = [IsAuthenticated, ModelPerms]
    serializer_class = serializers.FindingSerializer
    queryset = Finding.objects.none()

    def get_queryset(self):
        rows = selectors.visible_findings(self.request.user)
        status = self.request.query_params.get("open")
        if status in ("true", "false"):
            rows = rows.filter(resolved_at__isnull=status == "true")
        return rows

    @extend_schema(parameters=[OpenApiParameter("open", bool, description="true: open findings; false: resolved")])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

"""The drill's scratch tenant and the steps a scenario is made of (deliver, process, sweep, observe)."""

import os
import secrets
import socket
import uuid
from contextlib import contextmanager
from datetime import timedelta
from email.message import EmailMessage
from email.utils import formatdate
from urllib.parse import urlsplit

from django.db import transaction
from django.utils import timezone

from intake.keys import raw_message_keys
from intake.models import InboxEvent, Mailbox, OutboxMessage, Tenant
from intake.secrets import env_prefix
from intake.services import ingest, release_waiting_events
from intake.vocabulary import SystemActor
from ticketing import breaker, intents
from ticketing.models import Destination, Intent, TicketMapping
from ticketing.services import process_inbox_event

from ..selectors import recovery_queue
from .cleanup import drill_outbox_rows

CREDENTIALS_NAME = "DESK_CREDENTIALS"  # in the scratch tenant's scope: MAILROOM_T_<SLUG>_DESK_CREDENTIALS
WORKER = "drill:worker"
# Short timeouts and retry delays, so a stall is a timeout and a retry is due within the drill.
# The circuit breaker (ticketing.breaker) trips after 2 credential failures, and not on the failure rate:
# the drill fails calls on purpose, and its scenarios must not depend on how many came before.
DESK_SETTINGS = {
    "read_timeout": 1.0,
    "connect_timeout": 2.0,
    "retry_base_seconds": 0.01,
    "retry_cap_seconds": 0.05,
    "breaker": {"enabled": True, "credential_failures": 2, "min_attempts": 1_000_000},
}

PDF = (
    b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n2 0 obj<</Type/Pages/Kids[]/Count 0>>endobj\n"
    b"trailer<</Root 1 0 R>>\n%%EOF\n"
)


class NotAFakeDesk(Exception):
    """The drill was given something other than a FakeDesk on this machine."""


def ensure_fakedesk(desk) -> None:
    """Refuse anything but a FakeDesk on a loopback address: its control API must answer."""
    host = urlsplit(desk.url).hostname or ""
    if host not in ("127.0.0.1", "::1", "localhost"):
        raise NotAFakeDesk(f"{desk.url} is not on this machine")
    try:
        desk.plan()
    except Exception as exc:
        raise NotAFakeDesk(f"{desk.url} does not answer FakeDesk's control API: {exc}") from None


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Scratch:
    """One run's tenant, mailbox and FakeDesk destination, and the steps scenarios use."""

    def __init__(self, desk):
        ensure_fakedesk(desk)
        self.desk = desk
        self.slug = f"drill-{timezone.now():%Y%m%d%H%M%S}-{secrets.token_hex(3)}"
        self.address = f"support@{self.slug}.mailroom.test"
        self._sent = 0
        self.waiting: list[int] = []  # events left waiting on the paused destination, for the resume
        self.credentials_var = env_prefix(self.slug) + CREDENTIALS_NAME
        os.environ[self.credentials_var] = desk.credentials
        with transaction.atomic():
            # Marked a drill tenant: the live workers, sweeps and reconcilers leave its rows to this process.
            self.tenant = Tenant.objects.create(slug=self.slug, name=f"Drill {self.slug[6:]}", is_drill=True)
            # Synthetic customers are never written to: no acknowledgments from this mailbox.
            self.mailbox = Mailbox.objects.create(
                tenant=self.tenant,
                slug=self.slug,
                address=self.address,
                provider=Mailbox.Provider.RAW,
                settings={"acknowledge": False},
            )
            self.destination = Destination.objects.create(
                tenant=self.tenant,
                slug="fakedesk",
                kind=Destination.Kind.ZENDESK,
                base_url=desk.url,
                credentials_ref=f"env:{self.credentials_var}",
                settings=dict(DESK_SETTINGS),
                is_default=True,
            )

    def close(self) -> None:
        """The desk is gone: forget its credentials. What becomes of the rows is `keep`'s or `discard`'s."""
        os.environ.pop(self.credentials_var, None)

    def keep(self) -> None:
        """Keep every row (evidence); pause the scratch mailbox and destination. Only the drill's outbox rows go:
        they announce work no live worker takes (ticketing.tasks drops a drill's events), and would read as stuck."""
        with transaction.atomic():
            Mailbox.objects.filter(pk=self.mailbox.pk).update(paused=True)
            Destination.objects.filter(pk=self.destination.pk).update(
                paused=True,
                paused_by=SystemActor.DRILL,
                paused_at=timezone.now(),
                paused_reason="drill finished: its FakeDesk is gone (evidence kept)",
            )
            events = list(InboxEvent.objects.filter(tenant=self.tenant).values_list("pk", flat=True))
            made = list(Intent.objects.filter(inbox_event_id__in=events).values_list("pk", flat=True))
            OutboxMessage.objects.filter(
                drill_outbox_rows(event_ids=events, intent_ids=made, mailbox_ids=[self.mailbox.pk])
            ).delete()

    # --- mail ---------------------------------------------------------------------------------------

    def message(self, subject: str, body: str, attachment: tuple[str, str, bytes] | None = None) -> bytes:
        """A message as a mail client writes it; each from its own customer (no sender rate limit)."""
        self._sent += 1
        message = EmailMessage()
        message["From"] = f"Customer {self._sent} <customer{self._sent}.{self.slug}@example.com>"
        message["To"] = f"Support <{self.address}>"
        message["Subject"] = subject
        message["Date"] = formatdate(localtime=False, usegmt=True)
        message["Message-ID"] = f"<{uuid.uuid4()}@mail.example.com>"
        message["MIME-Version"] = "1.0"
        message.set_content(f"Hello,\n\n{body}\n\nThanks,\nCustomer {self._sent}\n")
        message.add_alternative(f"<p>Hello,</p><p>{body}</p><p>Thanks,<br>Customer {self._sent}</p>", subtype="html")
        if attachment:
            filename, content_type, data = attachment
            maintype, subtype = content_type.split("/", 1)
            message.add_attachment(data, maintype=maintype, subtype=subtype, filename=filename)
        return message.as_bytes()

    def deliver(self, raw: bytes):
        """Store it as the raw webhook does; the IngestResult (`duplicate` for a redelivery)."""
        provider_message_id, thread_key = raw_message_keys(raw)
        return ingest(self.mailbox, provider_message_id, raw, source="raw", thread_key=thread_key)

    def process(self, event_id: int, worker: str = WORKER) -> str:
        return process_inbox_event(event_id, worker=worker)

    # --- the desk and the destination ---------------------------------------------------------------

    def configure(self, **settings) -> None:
        """Change the scratch destination's settings (on top of DESK_SETTINGS)."""
        Destination.objects.filter(pk=self.destination.pk).update(settings={**DESK_SETTINGS, **settings})

    def set_paused(self, paused: bool) -> None:
        Destination.objects.filter(pk=self.destination.pk).update(paused=paused)

    def paused_by(self) -> str:
        destination = Destination.objects.get(pk=self.destination.pk)
        return destination.paused_by if destination.paused else ""

    def resume(self) -> int:
        """What a person's resume does (reconciliation.services.pauses.do_set_destination_pause, without a
        user): unpause, clear the breaker's record, make waiting intents due, release waiting events."""
        with transaction.atomic():
            Destination.objects.filter(pk=self.destination.pk).update(paused=False)
            breaker.resumed(self.destination.pk)
        return release_waiting_events(mailbox_id=self.mailbox.pk)

    @contextmanager
    def credentials(self, value: str):
        """The destination's secret replaced for a while (e.g. an expired token)."""
        saved = os.environ.get(self.credentials_var)
        os.environ[self.credentials_var] = value
        try:
            yield
        finally:
            os.environ[self.credentials_var] = saved or ""

    def ticket_count(self) -> int:
        return len(self.desk.tickets())

    def creates_since(self, mark: int) -> list[dict]:
        """Ticket-create requests the desk logged after `mark` (a length of the log)."""
        return [r for r in self.desk.requests_log()[mark:] if r["method"] == "POST"]

    def log_mark(self) -> int:
        return len(self.desk.requests_log())

    # --- the sweeps, scoped to this drill's events, and the clock -------------------------------------

    def intent(self, event_id: int) -> Intent | None:
        return (
            Intent.objects.filter(inbox_event_id=event_id, action=Intent.Action.CREATE_TICKET)
            .order_by("-action_version", "-pk")
            .first()
        )

    def advance(self, event_id: int) -> None:
        """Time passes for this event: retries come due, claims run out, deliberate waits end."""
        past = timezone.now() - timedelta(seconds=1)
        Intent.objects.filter(inbox_event_id=event_id, state=Intent.State.RETRY_WAIT).update(next_attempt_at=past)
        Intent.objects.filter(inbox_event_id=event_id, state=Intent.State.IN_FLIGHT).update(claimed_until=past)
        InboxEvent.objects.filter(pk=event_id, retry_at__isnull=False).update(retry_at=past)

    def sweep(self, event_id: int) -> dict:
        """What beat's sweeps do (expire_claims, enqueue_due, resolve_unknown_intents), for one event only."""
        now, done = timezone.now(), {}
        with transaction.atomic():
            for intent in Intent.objects.select_for_update().filter(inbox_event_id=event_id).order_by("pk"):
                if intent.state == Intent.State.IN_FLIGHT and intent.claimed_until and intent.claimed_until < now:
                    done["expired"] = done.get("expired", 0) + intents.expire(intent, now)
                elif intent.state == Intent.State.RETRY_WAIT and intent.next_attempt_at <= now:
                    done["requeued"] = done.get("requeued", 0) + intents.requeue(intent, now)
        for intent_id in Intent.objects.filter(inbox_event_id=event_id, state=Intent.State.UNKNOWN).values_list(
            "pk", flat=True
        ):
            done[intents.resolve_unknown(intent_id) or "unresolved"] = 1
        return done

    # --- what a scenario ends with ----------------------------------------------------------------------

    def in_queue(self, event_id: int) -> bool:
        return recovery_queue().filter(pk=event_id).exists()

    def mapping_matches_desk(self, event_id: int) -> bool:
        """The event's mapping names a desk ticket carrying its intent's external_ref."""
        mapping = TicketMapping.objects.filter(inbox_event_id=event_id).first()
        intent = self.intent(event_id)
        if mapping is None or intent is None:
            return False
        return any(
            str(t["id"]) == mapping.ticket_id and t["external_id"] == intent.external_ref for t in self.desk.tickets()
        )

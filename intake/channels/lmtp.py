"""Mailroom as the mail server's delivery target: what the LMTP/SMTP listener does with a message.

The mail server (Postfix, Exim) hands a message over by LMTP (or SMTP) and keeps it until we answer
`250`; so that answer is the acknowledgment, and it is given only after `services.ingest` committed
the event. Anything else is a temporary failure (`451 4.3.0`): the mail server keeps the message and
retries, and a retry of something we did store is a duplicate by the usual identity rules
(docs/design.md §4), never a second event. Nothing here answers a 5xx for a failure of ours: a 5xx
makes the mail server bounce, and a bounce is a lost message.

This module is the Django side: recipients to mailboxes (a read), one delivery per mailbox (the write)
and the aiosmtpd handler that ties them to the protocol's answers. The network side (LMTP or SMTP
protocol, size and client limits, STARTTLS, the server loop) is `intake.channels.lmtp_server`.

Recipients: by `Mailbox.address_key` (intake.domains.address_key: lower-cased, without the `+tag`), so
`Support+billing@Acme.test` is the mailbox of `support@acme.test`. The key is unique, so a recipient is one
mailbox of one tenant; as a second line of defence the lookup also matches the stored address itself (a row
whose key went stale, written past `save()`), and a recipient that still matches mailboxes of two tenants is
never delivered: `451 4.3.0` and a WARNING on the `mailroom.security` logger, until an operator fixes the
rows. Gmail and Graph mailboxes are not delivery targets: their provider message id is the provider's own,
so mail that also arrived here would be a second event. `Mailbox.allowed_recipients` is a validation
allow-list (normalize checks it), not a routing table, and is not used here.

The bytes are stored exactly as delivered (with the mail server's Received headers): identity is the
Message-ID and the content fingerprint, which ignore transport headers, so the same message that also
came by a webhook or IMAP is one event. The envelope (sender, recipients, client) is kept as a
`provider_metadata` audit row of a new event, in the ingest's transaction.
"""

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from django.db import Error as DatabaseLayerError, close_old_connections, connection, transaction
from django.db.models import Q

from .. import services
from ..domains import address_key
from ..keys import raw_message_keys
from ..logging import mask_address
from ..models import Mailbox
from ..vocabulary import AuditKind

logger = logging.getLogger(__name__)
# Alerts that the tenant boundary needed its second line of defence: for whoever watches security events.
security_log = logging.getLogger("mailroom.security")

# Whose provider message id is not the Message-ID (services.PROVIDER_OWN_IDS): never delivery targets.
NOT_DELIVERY_TARGETS = tuple(services.PROVIDER_OWN_IDS)
MAX_RECIPIENTS_PER_MESSAGE = 100

# The answers, with enhanced status codes (RFC 3463). Failures of ours are 4xx: the mail server retries.
DELIVERED = "250 2.0.0 Delivered"
ALREADY_DELIVERED = "250 2.0.0 Already delivered"
RECIPIENT_OK = "250 2.1.5 Recipient OK"
UNKNOWN_RECIPIENT = "550 5.1.1 No such mailbox here"
TOO_MANY_RECIPIENTS = "452 4.5.3 Too many recipients"
TEMPORARY_FAILURE = "451 4.3.0 Temporary failure, please try again later"


@dataclass(frozen=True)
class MailboxDelivery:
    """What happened to the message in one mailbox: stored (or already stored), or not."""

    mailbox_slug: str
    stored: bool
    inbox_event_id: int | None = None
    duplicate: bool = False


@dataclass
class MessageEnvelope:
    """The envelope as the listener builds it: each accepted recipient with the mailboxes it maps to."""

    mail_from: str
    client: str
    mailboxes_by_recipient: dict[str, list[Mailbox]] = field(default_factory=dict)

    def mailboxes(self) -> list[Mailbox]:
        """Each mailbox once, however many recipients map to it."""
        unique = {}
        for found in self.mailboxes_by_recipient.values():
            for mailbox in found:
                unique.setdefault(mailbox.pk, mailbox)
        return list(unique.values())


# --- reads and writes (run in a worker thread: the ORM is synchronous) ------------------------------


class RecipientInTwoTenants(Exception):
    """An envelope recipient matches mailboxes of more than one tenant: delivering would cross the boundary."""

    def __init__(self, mailboxes: list[Mailbox]):
        self.mailboxes = mailboxes
        super().__init__(f"mailboxes {', '.join(f'{m.slug} (tenant {m.tenant.slug})' for m in mailboxes)}")


def mailboxes_for_recipient(address: str) -> list[Mailbox]:
    """The mailboxes an envelope recipient delivers to ([] when none), all of one tenant: by address key.

    Raises RecipientInTwoTenants when the mailboxes found belong to more than one tenant.
    """
    key = address_key(address)
    if not key:
        return []
    address = address.strip()
    # The key is what the unique constraint holds; the stored address catches a row whose key is stale.
    found = list(
        Mailbox.objects.filter(Q(address_key=key) | Q(address__iexact=address) | Q(address__iexact=key))
        .exclude(provider__in=NOT_DELIVERY_TARGETS)
        .select_related("tenant")
        .order_by("pk")
    )
    if len({mailbox.tenant_id for mailbox in found}) > 1:
        raise RecipientInTwoTenants(found)
    return found


def deliver_to_mailbox(mailbox: Mailbox, raw: bytes, source: str, envelope_detail: dict) -> MailboxDelivery:
    """Ingest into one mailbox, committed before this returns; a failure is reported, never raised."""
    close_old_connections()  # a connection the database dropped is replaced here, not used
    try:
        provider_message_id, thread_key = raw_message_keys(raw)
        with transaction.atomic():
            result = services.ingest(mailbox, provider_message_id, raw, source=source, thread_key=thread_key)
            if not result.duplicate:
                services.record_audit(
                    result.inbox_event_id,
                    kind=AuditKind.PROVIDER_METADATA,
                    actor=f"provider:{source}",
                    detail=envelope_detail,
                )
    except DatabaseLayerError as exc:
        _forget_connection()
        logger.warning(
            "%s delivery to mailbox %s not stored: database error %s", source, mailbox.slug, type(exc).__name__
        )
        return MailboxDelivery(mailbox.slug, stored=False)
    except Exception as exc:  # anything else of ours is still a temporary failure: the mail server keeps it
        _forget_connection()
        logger.error("%s delivery to mailbox %s not stored: %s", source, mailbox.slug, type(exc).__name__)
        return MailboxDelivery(mailbox.slug, stored=False)
    return MailboxDelivery(mailbox.slug, stored=True, inbox_event_id=result.inbox_event_id, duplicate=result.duplicate)


def _forget_connection() -> None:
    """Close this thread's connection, so the next delivery reconnects instead of reusing a broken one."""
    try:
        connection.close()
    except DatabaseLayerError:
        pass


def lookup_recipient(address: str, source: str = "lmtp") -> list[Mailbox] | None:
    """`mailboxes_for_recipient`, or None (a temporary failure) when the database could not answer or the
    recipient matches mailboxes of two tenants (alerted on `mailroom.security`)."""
    close_old_connections()
    try:
        return mailboxes_for_recipient(address)
    except RecipientInTwoTenants as exc:
        security_log.warning(
            "%s recipient %s matches %s of %d tenants: deferred (451), delivered to none; "
            "give the address to one tenant",
            source,
            mask_address(address),
            exc,
            len({m.tenant_id for m in exc.mailboxes}),
        )
        return None
    except DatabaseLayerError as exc:
        _forget_connection()
        logger.warning("recipient lookup failed: database error %s", type(exc).__name__)
        return None


# --- the aiosmtpd handler ---------------------------------------------------------------------------


class DeliveryHandler:
    """aiosmtpd hooks: RCPT maps to mailboxes, DATA stores once per mailbox and answers.

    In LMTP (`per_recipient_answers`) DATA answers one line per accepted recipient, in RCPT order,
    each with the outcome of its own mailbox; in SMTP one line for the message, `250` only when every
    mailbox stored it (a retry of the others' is a duplicate there).
    """

    def __init__(
        self,
        source: str,
        per_recipient_answers: bool,
        executor: ThreadPoolExecutor,
        limits=None,
        require_tls: bool = False,
    ):
        self.source = source
        self.per_recipient_answers = per_recipient_answers
        self.executor = executor
        self.limits = limits  # intake.channels.lmtp_server.ClientLimits, or None
        # Checked here, at MAIL, rather than by aiosmtpd's require_starttls, which refuses LHLO before STARTTLS.
        self.require_tls = require_tls

    async def _in_thread(self, function, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        if self.require_tls and session.ssl is None:
            return "530 5.7.0 Must issue a STARTTLS command first"
        if self.limits is not None and not self.limits.allow_message(_client_host(session)):
            logger.warning("%s client %s over its message rate: deferred", self.source, _client_host(session))
            return "451 4.7.1 Too many messages from your address, please try again later"
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        envelope.mailroom = MessageEnvelope(mail_from=address, client=_client_host(session))
        return "250 2.1.0 Sender OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if len(envelope.rcpt_tos) >= MAX_RECIPIENTS_PER_MESSAGE:
            return TOO_MANY_RECIPIENTS
        mailboxes = await self._in_thread(lookup_recipient, address, self.source)
        if mailboxes is None:
            return TEMPORARY_FAILURE
        if not mailboxes:
            logger.info("%s recipient %s unknown: refused", self.source, mask_address(address))
            return UNKNOWN_RECIPIENT
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        envelope.mailroom.mailboxes_by_recipient.setdefault(address, mailboxes)
        return RECIPIENT_OK

    async def handle_DATA(self, server, session, envelope):
        message: MessageEnvelope = envelope.mailroom
        raw = envelope.original_content or b""
        mailboxes = message.mailboxes()

        def envelope_detail(mailbox: Mailbox) -> dict:
            # Only this mailbox's own recipients: another tenant's addresses are none of its business.
            own = [r for r in envelope.rcpt_tos if mailbox in message.mailboxes_by_recipient[r]]
            return {
                "envelope_from": message.mail_from,
                "envelope_to": own,
                "client": message.client,
                "helo": session.host_name or "",
                "transport": self.source,
                "tls": session.ssl is not None,
            }

        # Each mailbox in its own transaction (and thread): one mailbox's failure is its recipients' 451 only.
        results = await asyncio.gather(
            *(
                self._in_thread(deliver_to_mailbox, mailbox, raw, self.source, envelope_detail(mailbox))
                for mailbox in mailboxes
            )
        )
        outcomes = dict(zip((mailbox.pk for mailbox in mailboxes), results, strict=True))
        for outcome in results:
            _log_outcome(self.source, outcome, len(raw))
        if self.per_recipient_answers:
            return "\r\n".join(
                _answer([outcomes[m.pk] for m in message.mailboxes_by_recipient[recipient]])
                for recipient in envelope.rcpt_tos
            )
        return _answer(results)

    async def handle_exception(self, error):
        # A bug of ours while handling a command: a temporary failure, never a 5xx (which would bounce).
        logger.error("%s listener error while handling a command: %s", self.source, type(error).__name__)
        return TEMPORARY_FAILURE


def _answer(deliveries: list[MailboxDelivery]) -> str:
    """250 when every mailbox concerned holds the message (new or already), else 451: try again."""
    if not all(d.stored for d in deliveries):
        return TEMPORARY_FAILURE
    return DELIVERED if any(not d.duplicate for d in deliveries) else ALREADY_DELIVERED


def client_host(peer) -> str:
    """The client's address as limits and the envelope record it: the IP, or "unix" for a unix-socket client."""
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    if isinstance(peer, bytes):
        peer = peer.decode("utf-8", "replace")
    return str(peer or "") or "unix"  # a unix socket's client has no name


def _client_host(session) -> str:
    return client_host(session.peer)


def _log_outcome(source: str, outcome: MailboxDelivery, size: int) -> None:
    if not outcome.stored:
        return  # deliver_to_mailbox logged why
    what = "duplicate of event" if outcome.duplicate else "stored as event"
    logger.info(
        "%s delivery to mailbox %s: %s %s (%d bytes)", source, outcome.mailbox_slug, what, outcome.inbox_event_id, size
    )

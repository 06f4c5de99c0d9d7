"""The network side of the LMTP/SMTP listener (`manage.py run_lmtp`): protocol, limits, TLS, the loop.

aiosmtpd speaks the protocol; this module adapts it to a mail server that must never be told a
permanent lie:
- the size limit (`MAILROOM_MAX_MESSAGE_BYTES`) is announced in LHLO/EHLO (`SIZE`) and refused with
  `552 5.3.4` at `MAIL FROM ... SIZE=n` and at the end of DATA (aiosmtpd's own texts get the
  enhanced code);
- in LMTP a refusal after DATA is one line per accepted recipient, as RFC 2033 requires (aiosmtpd
  answers once, which would leave the client waiting for the others);
- per client address, at most `max_connections` open sessions (`421 4.7.0` and close) and
  `max_messages_per_minute` messages (`451 4.7.1` at MAIL): temporary answers, never a bounce;
- optional STARTTLS with a configured certificate, optionally required before MAIL (`530 5.7.0`).
What happens to a message is `intake.lmtp`.
"""
import asyncio
import logging
import ssl
import time
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from aiosmtpd.lmtp import LMTP
from aiosmtpd.smtp import SMTP

from .lmtp import DeliveryHandler

logger = logging.getLogger(__name__)

TOO_BIG = "552 5.3.4 Message size exceeds fixed maximum message size"
# aiosmtpd's own answers, as it words them, and ours with enhanced status codes.
_REWORDED = {
    "552 Error: message size exceeds fixed maximum message size": TOO_BIG,
    "552 Error: Too much mail data": TOO_BIG,
    "500 Line too long (see RFC5321 4.5.3.1.6)": "500 5.5.2 Line too long",
}
# What aiosmtpd answers on its own once DATA's content was read: in LMTP, one line per recipient.
_AFTER_DATA = frozenset({TOO_BIG, "500 5.5.2 Line too long", "500 Error: strict ASCII mode"})
TOO_MANY_CONNECTIONS = "421 4.7.0 Too many connections from your address, please try again later"


class ClientLimits:
    """Open sessions and recent messages per client address, shared by every session of the listener.

    0 means no limit. The message rate is a sliding window of 60 s.
    """

    WINDOW_SECONDS = 60.0

    def __init__(self, max_connections: int = 0, max_messages_per_minute: int = 0, clock=time.monotonic):
        self.max_connections = max_connections
        self.max_messages_per_minute = max_messages_per_minute
        self.clock = clock
        self.open_sessions: dict[str, int] = defaultdict(int)
        self.recent_messages: dict[str, deque] = {}

    def open_session(self, host: str) -> bool:
        """Count a new session; False (and not counted) when the client has too many already."""
        if self.max_connections and self.open_sessions[host] >= self.max_connections:
            return False
        self.open_sessions[host] += 1
        return True

    def close_session(self, host: str) -> None:
        self.open_sessions[host] -= 1
        if self.open_sessions[host] <= 0:
            del self.open_sessions[host]

    def allow_message(self, host: str) -> bool:
        if not self.max_messages_per_minute:
            return True
        now = self.clock()
        recent = self.recent_messages.setdefault(host, deque())
        while recent and recent[0] <= now - self.WINDOW_SECONDS:
            recent.popleft()
        if len(recent) >= self.max_messages_per_minute:
            return False
        recent.append(now)
        if len(self.recent_messages) > 10_000:  # forget clients that went quiet
            self.recent_messages = {h: d for h, d in self.recent_messages.items()
                                    if d and d[-1] > now - self.WINDOW_SECONDS}
        return True


class _MailroomProtocol:
    """Mixed into aiosmtpd's LMTP and SMTP: session limits and the answers described above."""

    per_recipient_answers = False

    def __init__(self, handler, *, limits: ClientLimits, **kwargs):
        super().__init__(handler, **kwargs)
        self.limits = limits
        self._counted_host: str | None = None
        self._refused = False
        self._in_data = False

    def connection_made(self, transport):
        if self._original_transport is None and self._counted_host is None and not self._refused:
            # The first connection_made (STARTTLS calls it again with the TLS transport).
            peer = transport.get_extra_info("peername")
            host = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer or "")
            if self.limits.open_session(host):
                self._counted_host = host
            else:
                self._refused = True
                logger.warning("client %s over its connection limit: refused", host)
        super().connection_made(transport)

    def connection_lost(self, error):
        if self._counted_host is not None:
            self.limits.close_session(self._counted_host)
            self._counted_host = None
        super().connection_lost(error)

    async def _handle_client(self):
        if self._refused:
            await self.push(TOO_MANY_CONNECTIONS)
            self.transport.close()
            return
        await super()._handle_client()

    async def smtp_DATA(self, arg):
        self._in_data = True
        try:
            await super().smtp_DATA(arg)
        finally:
            self._in_data = False

    async def push(self, status):
        if isinstance(status, str):
            status = _REWORDED.get(status, status)
            if self.per_recipient_answers and self._in_data and status in _AFTER_DATA and self.envelope:
                status = "\r\n".join([status] * max(1, len(self.envelope.rcpt_tos)))
        await super().push(status)


class MailroomLMTP(_MailroomProtocol, LMTP):
    per_recipient_answers = True


class MailroomSMTP(_MailroomProtocol, SMTP):
    pass


@dataclass(frozen=True)
class ListenerConfig:
    host: str
    port: int
    smtp: bool = False
    max_message_bytes: int = 25 * 1024 * 1024
    tls_cert: str = ""
    tls_key: str = ""
    require_starttls: bool = False
    max_connections_per_client: int = 20
    max_messages_per_minute: int = 600
    hostname: str = "mailroom"
    database_threads: int = 4
    timeout_seconds: float = 300.0

    @property
    def source(self) -> str:
        return "smtp" if self.smtp else "lmtp"


def tls_context(cert: str, key: str) -> ssl.SSLContext | None:
    if not cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key or None)
    return context


async def serve(config: ListenerConfig, stop: asyncio.Event, ready=None) -> None:
    """Listen until `stop` is set; then refuse new sessions and let deliveries under way finish."""
    loop = asyncio.get_running_loop()
    if config.require_starttls and not config.tls_cert:
        raise ValueError("require_starttls needs a TLS certificate")
    executor = ThreadPoolExecutor(max_workers=config.database_threads, thread_name_prefix=config.source)
    limits = ClientLimits(config.max_connections_per_client, config.max_messages_per_minute)
    handler = DeliveryHandler(config.source, per_recipient_answers=not config.smtp, executor=executor,
                              limits=limits, require_tls=config.require_starttls)
    protocol_class = MailroomSMTP if config.smtp else MailroomLMTP
    context = tls_context(config.tls_cert, config.tls_key)

    def make_protocol():
        # SMTPUTF8 announced: a mail server holding internationalized mail must not bounce it for our sake.
        return protocol_class(handler, limits=limits, data_size_limit=config.max_message_bytes,
                              enable_SMTPUTF8=True, hostname=config.hostname, tls_context=context,
                              timeout=config.timeout_seconds, loop=loop)

    server = await loop.create_server(make_protocol, host=config.host, port=config.port)
    bound = server.sockets[0].getsockname()
    logger.info("%s listener on %s:%s (SIZE %d, STARTTLS %s)", config.source.upper(), bound[0], bound[1],
                config.max_message_bytes, "required" if config.require_starttls else ("on" if context else "off"))
    if ready is not None:
        ready(bound)
    try:
        await stop.wait()
    finally:
        server.close()
        # Deliveries already in a worker thread finish (their client gets its answer if still there);
        # an answer lost now is a retry by the mail server, and a retry is a duplicate, not a loss.
        await loop.run_in_executor(None, executor.shutdown, True)
        logger.info("%s listener stopped", config.source.upper())

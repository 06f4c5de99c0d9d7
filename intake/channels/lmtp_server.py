"""The network side of the LMTP/SMTP listener (`manage.py run_lmtp`): protocol, limits, TLS, the loop.

aiosmtpd speaks the protocol; this module adapts it to a mail server that must never be told a
permanent lie:
- the size limit (`MAILROOM_MAX_MESSAGE_BYTES`) is announced in LHLO/EHLO (`SIZE`) and refused with
  `552 5.3.4` at `MAIL FROM ... SIZE=n` and at the end of DATA (aiosmtpd's own texts get the
  enhanced code);
- in LMTP a refusal after DATA is one line per accepted recipient, as RFC 2033 requires (aiosmtpd
  answers once, which would leave the client waiting for the others);
- time: a session waiting for a command is closed after `idle_timeout_seconds` (aiosmtpd's `timeout`);
  DATA must arrive within `data_timeout_seconds` and at `min_data_rate` bytes/s or more over every
  `data_grace_seconds` (a slow-loris is cut with `421 4.4.2`); storing it is bounded by the DATA timeout again;
- per client address, at most `max_connections` open sessions. At the cap a new session is not refused
  while another of that client waits idle: the one idle the longest is closed (`421 4.4.2`) to make room,
  so idle connections (from anyone on the mail server's host) cannot lock the mail server out. Only when
  every session is receiving or storing a message (each bounded by the DATA limits) is the newcomer
  refused (`421 4.7.0`). And `max_messages_per_minute` messages (`451 4.7.1` at MAIL): temporary
  answers, never a bounce;
- optional STARTTLS with a configured certificate, optionally required before MAIL (`530 5.7.0`);
- a TCP address, or a unix socket (`socket_path`, mode `socket_mode`): on a shared host the socket's file
  permissions, not the client address, decide who may deliver.
What happens to a message is `intake.channels.lmtp`.
"""

import asyncio
import logging
import os
import socket
import ssl
import stat
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from aiosmtpd.lmtp import LMTP
from aiosmtpd.smtp import SMTP

from .lmtp import DeliveryHandler, client_host

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
MADE_ROOM = "421 4.4.2 Idle connection closed: another connection from your address needed its place"
DATA_TOO_SLOW = "421 4.4.2 Message data arriving too slowly, closing connection"
DATA_TOO_LONG = "421 4.4.2 Message data not completed in time, closing connection"
TIMED_OUT = "421 4.4.2 Timed out, closing connection"


class ClientLimits:
    """Open sessions and recent messages per client address, shared by every session of the listener.

    0 means no limit. The message rate is a sliding window of 60 s. A session is anything with
    `is_idle()`, `last_activity` and `make_room()` (a `_MailroomProtocol`).
    """

    WINDOW_SECONDS = 60.0

    def __init__(self, max_connections: int = 0, max_messages_per_minute: int = 0, clock=time.monotonic):
        self.max_connections = max_connections
        self.max_messages_per_minute = max_messages_per_minute
        self.clock = clock
        self.sessions: dict[str, list] = {}
        self.recent_messages: dict[str, deque] = {}

    @property
    def open_sessions(self) -> dict[str, int]:
        return {host: len(sessions) for host, sessions in self.sessions.items()}

    def open_session(self, host: str, session) -> bool:
        """Count a new session. At the cap, the client's session idle the longest is closed to make room;
        False (and not counted) only when none of them is idle."""
        sessions = self.sessions.setdefault(host, [])
        if self.max_connections and len(sessions) >= self.max_connections:
            idle = [other for other in sessions if other.is_idle()]
            if not idle:
                return False
            oldest = min(idle, key=lambda other: other.last_activity)
            self.close_session(host, oldest)
            oldest.make_room()
            sessions = self.sessions.setdefault(host, [])
        sessions.append(session)
        return True

    def close_session(self, host: str, session) -> None:
        sessions = self.sessions.get(host, [])
        if session in sessions:
            sessions.remove(session)
        if not sessions:
            self.sessions.pop(host, None)

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
            self.recent_messages = {
                h: d for h, d in self.recent_messages.items() if d and d[-1] > now - self.WINDOW_SECONDS
            }
        return True


@dataclass(frozen=True)
class DataLimits:
    """How long DATA may take and how slowly it may arrive (0 rate: no minimum)."""

    timeout_seconds: float = 180.0
    min_rate: int = 10 * 1024
    grace_seconds: float = 10.0


class _MailroomProtocol:
    """Mixed into aiosmtpd's LMTP and SMTP: session limits, DATA limits and the answers described above."""

    per_recipient_answers = False

    def __init__(self, handler, *, limits: ClientLimits, data_limits: DataLimits = DataLimits(), **kwargs):
        super().__init__(handler, **kwargs)
        self.limits = limits
        self.data_limits = data_limits
        self._counted_host: str | None = None
        self._refused = False
        self._in_data = False  # from the DATA command to its answer
        self._in_hook = False  # our handler is working on a command (a lookup, the store)
        self.last_activity = time.monotonic()
        self._bytes_received = 0
        self._data_timers: list[asyncio.TimerHandle] = []

    # --- the session limit --------------------------------------------------------------------------

    def connection_made(self, transport):
        if self._original_transport is None and self._counted_host is None and not self._refused:
            # The first connection_made (STARTTLS calls it again with the TLS transport).
            host = client_host(transport.get_extra_info("peername"))
            if self.limits.open_session(host, self):
                self._counted_host = host
            else:
                self._refused = True
                logger.warning("client %s over its connection limit, every session busy: refused", host)
        super().connection_made(transport)

    def connection_lost(self, error):
        self._stop_data_timers()
        if self._counted_host is not None:
            self.limits.close_session(self._counted_host, self)
            self._counted_host = None
        super().connection_lost(error)

    def data_received(self, data):
        self.last_activity = time.monotonic()
        self._bytes_received += len(data)
        super().data_received(data)

    def is_idle(self) -> bool:
        """Waiting for the client's next command: neither receiving a message nor working on a command."""
        return not (self._in_data or self._in_hook or self._refused)

    def make_room(self) -> None:
        """Closed so a new session of the same client can open (ClientLimits.open_session)."""
        logger.info("client %s at its connection limit: idle session closed to make room", self._counted_host)
        self._counted_host = None  # no longer counted
        self._close_with(MADE_ROOM)

    def _close_with(self, status: str) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(status.encode("ascii") + b"\r\n")
            self.transport.close()

    def _timeout_cb(self):
        # aiosmtpd's timer (idle between commands; the DATA backstop; storing): say so before closing.
        logger.info("client %s: timed out, session closed", self._counted_host)
        self._close_with(TIMED_OUT)

    async def _handle_client(self):
        if self._refused:
            await self.push(TOO_MANY_CONNECTIONS)
            self.transport.close()
            return
        await super()._handle_client()

    # --- DATA: a deadline and a minimum rate ---------------------------------------------------------

    async def smtp_DATA(self, arg):
        self._in_data = True
        self._start_data_timers()
        try:
            await super().smtp_DATA(arg)
        finally:
            self._in_data = False
            self._stop_data_timers()
            if self.transport is not None:
                self._reset_timeout()  # the idle timeout again, for the next command

    def _start_data_timers(self) -> None:
        limits = self.data_limits
        # aiosmtpd's own timer (the idle timeout, armed at the command) would cut a long transfer: the DATA
        # deadline replaces it, with our own timer giving the client a 421 first.
        self._reset_timeout(limits.timeout_seconds + 5)
        self._data_timers = [self.loop.call_later(limits.timeout_seconds, self._cut_data, DATA_TOO_LONG)]
        if limits.min_rate:
            self._data_timers.append(self.loop.call_later(limits.grace_seconds, self._check_rate, self._bytes_received))

    def _check_rate(self, bytes_at_window_start: int) -> None:
        limits = self.data_limits
        if self._bytes_received - bytes_at_window_start < limits.min_rate * limits.grace_seconds:
            self._cut_data(DATA_TOO_SLOW)
            return
        self._data_timers.append(self.loop.call_later(limits.grace_seconds, self._check_rate, self._bytes_received))

    def _cut_data(self, status: str) -> None:
        logger.warning("client %s: %s", self._counted_host, status[10:])
        self._stop_data_timers()
        self._close_with(status)

    def _stop_data_timers(self) -> None:
        for timer in self._data_timers:
            timer.cancel()
        self._data_timers = []

    async def _call_handler_hook(self, command, *args):
        if command == "DATA":
            # The client's part is done; storing is ours, bounded by the DATA timeout once more.
            self._stop_data_timers()
            self._reset_timeout(self.data_limits.timeout_seconds)
        self._in_hook = True
        try:
            return await super()._call_handler_hook(command, *args)
        finally:
            self._in_hook = False

    # --- answers ------------------------------------------------------------------------------------

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
    host: str = "127.0.0.1"
    port: int = 8024
    # A unix socket path: listen there instead of host:port, the file made `socket_mode`.
    socket_path: str = ""
    socket_mode: int = 0o660
    smtp: bool = False
    max_message_bytes: int = 25 * 1024 * 1024
    tls_cert: str = ""
    tls_key: str = ""
    require_starttls: bool = False
    max_connections_per_client: int = 20
    max_messages_per_minute: int = 600
    hostname: str = "mailroom"
    database_threads: int = 4
    idle_timeout_seconds: float = 30.0
    data_limits: DataLimits = DataLimits()

    @property
    def source(self) -> str:
        return "smtp" if self.smtp else "lmtp"


def tls_context(cert: str, key: str) -> ssl.SSLContext | None:
    if not cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key or None)
    return context


def claim_socket_path(path: str) -> None:
    """Make `path` free for a new socket: a stale socket is removed; a live one or any other file is an error."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ValueError(f"{path} exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # nobody listens: left by a listener that did not stop cleanly
            return
    raise ValueError(f"{path}: another listener is running on this socket")


async def serve(config: ListenerConfig, stop: asyncio.Event, ready=None) -> None:
    """Listen until `stop` is set; then refuse new sessions and let deliveries under way finish.

    `ready` is called with where the listener listens ("127.0.0.1:8024" or "unix:/run/mailroom/lmtp.sock").
    """
    loop = asyncio.get_running_loop()
    if config.require_starttls and not config.tls_cert:
        raise ValueError("require_starttls needs a TLS certificate")
    if config.socket_path:
        claim_socket_path(config.socket_path)
    executor = ThreadPoolExecutor(max_workers=config.database_threads, thread_name_prefix=config.source)
    limits = ClientLimits(config.max_connections_per_client, config.max_messages_per_minute)
    handler = DeliveryHandler(
        config.source,
        per_recipient_answers=not config.smtp,
        executor=executor,
        limits=limits,
        require_tls=config.require_starttls,
    )
    protocol_class = MailroomSMTP if config.smtp else MailroomLMTP
    context = tls_context(config.tls_cert, config.tls_key)

    def make_protocol():
        # SMTPUTF8 announced: a mail server holding internationalized mail must not bounce it for our sake.
        return protocol_class(
            handler,
            limits=limits,
            data_limits=config.data_limits,
            data_size_limit=config.max_message_bytes,
            enable_SMTPUTF8=True,
            hostname=config.hostname,
            tls_context=context,
            timeout=config.idle_timeout_seconds,
            loop=loop,
        )

    if config.socket_path:
        server = await loop.create_unix_server(make_protocol, path=config.socket_path)
        os.chmod(config.socket_path, config.socket_mode)
        where = f"unix:{config.socket_path}"
    else:
        server = await loop.create_server(make_protocol, host=config.host, port=config.port)
        bound = server.sockets[0].getsockname()
        where = f"{bound[0]}:{bound[1]}"
    data = config.data_limits
    logger.info(
        "%s listener on %s (SIZE %d, STARTTLS %s, idle %gs, DATA %gs at %d B/s or more)",
        config.source.upper(),
        where,
        config.max_message_bytes,
        "required" if config.require_starttls else ("on" if context else "off"),
        config.idle_timeout_seconds,
        data.timeout_seconds,
        data.min_rate,
    )
    if ready is not None:
        ready(where)
    try:
        await stop.wait()
    finally:
        server.close()
        if config.socket_path:
            try:
                os.unlink(config.socket_path)
            except FileNotFoundError:
                pass
        # Deliveries already in a worker thread finish (their client gets its answer if still there);
        # an answer lost now is a retry by the mail server, and a retry is a duplicate, not a loss.
        await loop.run_in_executor(None, executor.shutdown, True)
        logger.info("%s listener stopped", config.source.upper())

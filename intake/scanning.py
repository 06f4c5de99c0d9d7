"""A clamd client (INSTREAM), standard library only.

    scanner = scanner_from_setting("tcp://127.0.0.1:3310")   # or "unix:///run/clamav/clamd.ctl", or "off" -> None
    result = scanner.scan(data)          # bytes, bytearray, memoryview, a binary file, or an iterable of chunks
    result.clean, result.signature       # True, None  /  False, "Eicar-Test-Signature"

    scan(data, address, **options) -> ScanResult     # the same, in one call

Every way of not getting a clear answer raises `ScannerUnavailable`:
connection refused or reset, a timeout (connecting, sending or waiting for the
verdict; `timeout` is one deadline for the whole scan), an empty, truncated or
unexpected reply, an "... ERROR" reply. The caller retries and then routes the
message to review; it never passes unscanned mail.

Size: clamd refuses a stream longer than its `StreamMaxLength` with
"INSTREAM size limit exceeded. ERROR" (and closes the connection, which can
surface to us as a broken pipe while still sending). That raises
`ScanLimitExceeded`, a subclass of `ScannerUnavailable`: the data was not
scanned, so callers that only know the base class still never pass it; callers
that know the difference can skip the retries, which cannot help, and route
to review at once (e.g. with reason `too_large`). Setting `max_stream_bytes`
to clamd's limit gives the same answer without sending anything.

What is scanned (`intake.normalize`, through `intake.mime.iter_attachment_files`):
every listed attachment, one stream each, read from its file (a large part spooled to a
temporary file, never held whole). An archive or an Outlook .msg is scanned
whole (clamd looks inside archives and OLE files itself, within its own limits) and
each file listed inside it is scanned again on its own (`nested`, origin "archive"
or "outlook"), so a hit names the inner file. An archive member past
`intake.mime.archives`' decompression limits, or an encrypted one, is sent as an
empty stream: only the archive's own scan covers it.

`scanner_from_setting("off")` returns None: scanning disabled by
configuration, a decision the caller must make visibly, not a scanner that
says "clean".
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

DEFAULT_TIMEOUT = 30.0
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_CHUNK_SIZE = 64 * 1024
MAX_REPLY_BYTES = 64 * 1024
SIZE_LIMIT_REPLY = "INSTREAM size limit exceeded"


class ScannerUnavailable(Exception):
    """No verdict: connection problem, timeout, or an answer we do not understand."""


class ScanLimitExceeded(ScannerUnavailable):
    """The data is larger than the scanner accepts; it was not scanned."""


@dataclass(frozen=True)
class ScanResult:
    clean: bool
    signature: str | None = None


@dataclass(frozen=True)
class ClamdAddress:
    family: str  # "tcp" or "unix"
    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self):
        return f"tcp://{self.host}:{self.port}" if self.family == "tcp" else f"unix://{self.path}"


def parse_address(setting: str) -> ClamdAddress | None:
    """`tcp://host:port`, `unix:///path/to/clamd.sock` (or a bare absolute path), or `off` -> None.

    Raises ValueError for anything else: a configuration error, found at start-up.
    """
    value = (setting or "").strip()
    if value.lower() in ("off", "none", "disabled", ""):
        return None
    if value.startswith("/"):
        return ClamdAddress("unix", path=value)
    parts = urlsplit(value)
    if parts.scheme == "unix":
        path = unquote(parts.netloc + parts.path)
        if not path.startswith("/"):
            raise ValueError(f"clamd unix socket path must be absolute: {setting!r}")
        return ClamdAddress("unix", path=path)
    if parts.scheme == "tcp":
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"bad clamd port in {setting!r}") from exc
        if not parts.hostname or not port:
            raise ValueError(f"clamd tcp address needs host and port: {setting!r}")
        return ClamdAddress("tcp", host=parts.hostname, port=port)
    raise ValueError(f"clamd address must be tcp://host:port, unix:///path or off, not {setting!r}")


def _pieces(data, chunk_size: int):
    """Non-empty memoryviews of at most chunk_size bytes (an empty chunk would end the stream)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        chunks = (data,)
    elif isinstance(data, str):
        raise TypeError("scan() takes bytes, not str")
    elif hasattr(data, "read"):  # a binary file (a spooled attachment): read a chunk at a time
        chunks = iter(lambda: data.read(chunk_size), b"")
    else:
        chunks = data
    for chunk in chunks:
        if isinstance(chunk, str):
            raise TypeError("scan() takes bytes chunks, not str")
        view = memoryview(chunk).cast("B")
        for start in range(0, len(view), chunk_size):
            yield view[start : start + chunk_size]


class ClamdClient:
    def __init__(
        self,
        address: str | ClamdAddress,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        max_stream_bytes: int | None = None,
    ):
        parsed = parse_address(address) if isinstance(address, str) else address
        if parsed is None:
            raise ValueError("scanning is off; use scanner_from_setting() to get None for that")
        self.address = parsed
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.chunk_size = max(1, min(chunk_size, 2**31 - 1))
        self.max_stream_bytes = max_stream_bytes

    def __repr__(self):
        return f"ClamdClient({str(self.address)!r})"

    # -- plumbing -------------------------------------------------------------------------
    def _connect(self, deadline: float) -> socket.socket:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ScannerUnavailable(f"clamd at {self.address}: timed out before connecting")
        try:
            if self.address.family == "tcp":
                sock = socket.create_connection(
                    (self.address.host, self.address.port), timeout=min(self.connect_timeout, remaining)
                )
            else:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(min(self.connect_timeout, remaining))
                try:
                    sock.connect(self.address.path)
                except BaseException:
                    sock.close()
                    raise
        except OSError as exc:
            raise ScannerUnavailable(f"clamd at {self.address}: cannot connect: {exc}") from exc
        return sock

    @staticmethod
    def _settimeout(sock: socket.socket, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed")
        sock.settimeout(remaining)

    def _read_reply(self, sock: socket.socket, deadline: float) -> str:
        """The reply up to its NUL terminator; a reply cut short raises ScannerUnavailable."""
        data = bytearray()
        while b"\0" not in data:
            if len(data) > MAX_REPLY_BYTES:
                raise ScannerUnavailable(f"clamd at {self.address}: reply longer than {MAX_REPLY_BYTES} bytes")
            self._settimeout(sock, deadline)
            chunk = sock.recv(4096)
            if not chunk:
                text = bytes(data).decode("utf-8", "replace").strip()
                if SIZE_LIMIT_REPLY in text:
                    return text
                raise ScannerUnavailable(
                    f"clamd at {self.address}: " + (f"reply cut short: {text[:200]!r}" if text else "no reply")
                )
            data += chunk
        return bytes(data).split(b"\0", 1)[0].decode("utf-8", "replace").strip()

    def _command(self, command: bytes) -> str:
        deadline = time.monotonic() + self.timeout
        sock = self._connect(deadline)
        try:
            self._settimeout(sock, deadline)
            sock.sendall(b"z" + command + b"\0")
            return self._read_reply(sock, deadline)
        except OSError as exc:
            raise ScannerUnavailable(f"clamd at {self.address}: {type(exc).__name__}: {exc}") from exc
        finally:
            sock.close()

    # -- commands ---------------------------------------------------------------------------
    def ping(self) -> None:
        """Raises ScannerUnavailable unless clamd answers PONG."""
        reply = self._command(b"PING")
        if reply != "PONG":
            raise ScannerUnavailable(f"clamd at {self.address}: unexpected PING reply {reply[:200]!r}")

    def version(self) -> str:
        reply = self._command(b"VERSION")
        if not reply.startswith("ClamAV"):
            raise ScannerUnavailable(f"clamd at {self.address}: unexpected VERSION reply {reply[:200]!r}")
        return reply

    def scan(self, data: bytes | bytearray | memoryview | BinaryIO | Iterable[bytes]) -> ScanResult:
        """Stream `data` to clamd (INSTREAM) and return its verdict; see the module docstring."""
        if isinstance(data, str):
            raise TypeError("scan() takes bytes, not str")
        limit = self.max_stream_bytes
        if limit is not None and isinstance(data, (bytes, bytearray, memoryview)) and memoryview(data).nbytes > limit:
            raise ScanLimitExceeded(f"{memoryview(data).nbytes} bytes; the scanner accepts {limit}")
        deadline = time.monotonic() + self.timeout
        sock = self._connect(deadline)
        sent = 0
        try:
            try:
                self._settimeout(sock, deadline)
                sock.sendall(b"zINSTREAM\0")
                for piece in _pieces(data, self.chunk_size):
                    sent += len(piece)
                    if limit is not None and sent > limit:
                        raise ScanLimitExceeded(f"more than {limit} bytes; the scanner accepts {limit}")
                    self._settimeout(sock, deadline)
                    sock.sendall(struct.pack(">I", len(piece)))
                    sock.sendall(piece)
                self._settimeout(sock, deadline)
                sock.sendall(b"\0\0\0\0")
            except (BrokenPipeError, ConnectionResetError) as exc:
                # clamd may have answered (size limit) and closed while we were still sending.
                reply = self._salvage_reply(sock, deadline)
                if SIZE_LIMIT_REPLY in reply:
                    raise ScanLimitExceeded(f"clamd at {self.address}: {reply}") from exc
                raise ScannerUnavailable(f"clamd at {self.address}: connection lost while sending: {exc}") from exc
            reply = self._read_reply(sock, deadline)
        except ScannerUnavailable:
            raise
        except OSError as exc:  # timeouts included
            raise ScannerUnavailable(f"clamd at {self.address}: {type(exc).__name__}: {exc}") from exc
        finally:
            sock.close()
        return self._verdict(reply)

    def _salvage_reply(self, sock: socket.socket, deadline: float) -> str:
        try:
            return self._read_reply(sock, min(deadline, time.monotonic() + 1.0))
        except (OSError, ScannerUnavailable):
            return ""

    def _verdict(self, reply: str) -> ScanResult:
        if reply == "stream: OK":
            return ScanResult(clean=True, signature=None)
        if reply.startswith("stream: ") and reply.endswith(" FOUND"):
            signature = reply[len("stream: ") : -len(" FOUND")].strip()
            if signature:
                return ScanResult(clean=False, signature=signature)
        if SIZE_LIMIT_REPLY in reply:
            raise ScanLimitExceeded(f"clamd at {self.address}: {reply}")
        if not reply:
            raise ScannerUnavailable(f"clamd at {self.address}: no reply")
        raise ScannerUnavailable(f"clamd at {self.address}: unexpected reply {reply[:200]!r}")


def scanner_from_setting(setting: str, **options) -> ClamdClient | None:
    """A client for a setting like MAILROOM_CLAMD (`tcp://...`, `unix://...`), or None for `off`."""
    address = parse_address(setting)
    return None if address is None else ClamdClient(address, **options)


def scan(data, address: str | ClamdAddress, **options) -> ScanResult:
    """One scan against `address`; raises ScannerUnavailable (ValueError if `address` is "off")."""
    return ClamdClient(address, **options).scan(data)

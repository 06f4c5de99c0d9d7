"""The clamd client against a real clamd (tests/clamd.py) and against sockets that misbehave."""

import io
import socket
import threading
import time
import zipfile
from email.message import EmailMessage

import pytest

from intake.mime import iter_attachment_payloads, parse_message
from intake.scanning import (
    ClamdAddress,
    ClamdClient,
    ScanLimitExceeded,
    ScannerUnavailable,
    ScanResult,
    parse_address,
    scan,
    scanner_from_setting,
)
from intake.validation import QUARANTINED, malware_finding, validate
from intake.vocabulary import ReasonCode
from tests.clamd import EICAR, EICAR_SIGNATURE, STREAM_MAX_LENGTH, start_clamd

FOUND = ScanResult(clean=False, signature=EICAR_SIGNATURE)
CLEAN = ScanResult(clean=True, signature=None)


def _zip(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, data)
    return buffer.getvalue()


def test_the_fixture_runs_a_real_clamd(clamd):
    client = ClamdClient(clamd.tcp_address)
    client.ping()
    assert client.version().startswith("ClamAV ")
    assert clamd.process.poll() is None


@pytest.mark.parametrize("which", ["tcp_address", "unix_address"])
def test_eicar_raw_is_found_over_tcp_and_unix_socket(clamd, which):
    assert scan(EICAR, getattr(clamd, which)) == FOUND


@pytest.mark.parametrize("which", ["tcp_address", "unix_address"])
def test_clean_data_is_clean(clamd, which):
    client = ClamdClient(getattr(clamd, which))
    assert client.scan(b"Hello, this is an ordinary attachment.\n" * 100) == CLEAN
    assert client.scan(b"") == CLEAN
    assert client.scan(b"X5O!P%@AP[4\\PZX54(P^)7CC)7}$EICAR-STANDARD-ANTIVIRUS-TEST-FILE!") == CLEAN  # one byte short


def test_eicar_inside_a_zip_is_found(clamd):
    archive = _zip("docs/readme.txt", b"padding " * 1000 + EICAR)
    assert archive.count(EICAR) == 0  # deflated: the signature is not visible in the raw bytes
    assert scan(archive, clamd.tcp_address) == FOUND


def test_eicar_in_a_base64_mime_attachment_is_found_through_the_mime_module(clamd):
    message = EmailMessage()
    message["From"] = "customer@example.com"
    message["To"] = "support@acme.test"
    message["Subject"] = "invoice"
    message.set_content("see attached")
    message.add_attachment(b"clean attachment", maintype="text", subtype="plain", filename="notes.txt")
    message.add_attachment(EICAR, maintype="application", subtype="pdf", filename="invoice.pdf")
    raw = message.as_bytes()
    assert EICAR not in raw  # base64 on the wire

    parsed = parse_message(raw)
    client = ClamdClient(clamd.unix_address)
    results = {attachment.filename: client.scan(data) for attachment, data in iter_attachment_payloads(parsed)}
    assert results == {"notes.txt": CLEAN, "invoice.pdf": FOUND}

    # The caller turns the hit into a finding; quarantine wins over everything else.
    verdict = validate(parsed, extra=[malware_finding("invoice.pdf", results["invoice.pdf"].signature)])
    assert (verdict.state, verdict.reason_code) == (QUARANTINED, ReasonCode.MALWARE)
    assert EICAR_SIGNATURE in verdict.detail
    # clamd also decodes MIME itself: the whole raw message is found too.
    assert client.scan(raw) == FOUND


def test_chunked_streaming_finds_a_signature_split_across_chunks(clamd):
    client = ClamdClient(clamd.tcp_address, chunk_size=7)
    data = b"A" * 100_003 + EICAR + b"B" * 10
    assert client.scan(data) == FOUND
    pieces = [data[i : i + 1000] for i in range(0, len(data), 1000)]
    assert ClamdClient(clamd.tcp_address).scan(iter([b"", *pieces, b""])) == FOUND  # empty chunks are skipped
    assert ClamdClient(clamd.tcp_address).scan(memoryview(bytearray(data))) == FOUND


def test_a_stream_over_clamds_limit_is_scan_limit_exceeded_not_a_verdict(clamd):
    too_big = b"\0" * (STREAM_MAX_LENGTH + 1024 * 1024)
    with pytest.raises(ScanLimitExceeded) as raised:
        ClamdClient(clamd.tcp_address).scan(too_big)
    assert isinstance(raised.value, ScannerUnavailable)  # callers that only know the base class never pass it
    # The same data in many chunks: clamd stops reading part-way.
    with pytest.raises(ScanLimitExceeded):
        ClamdClient(clamd.unix_address).scan(too_big[i : i + 65536] for i in range(0, len(too_big), 65536))
    # Right at the limit it still scans.
    assert ClamdClient(clamd.tcp_address).scan(b"\0" * (STREAM_MAX_LENGTH - 16)) == CLEAN


def test_client_side_limit_refuses_without_connecting():
    client = ClamdClient("tcp://127.0.0.1:1", max_stream_bytes=10)  # nothing listens on port 1
    with pytest.raises(ScanLimitExceeded):
        client.scan(b"x" * 11)
    with pytest.raises(ScannerUnavailable) as raised:  # under the limit it does try, and cannot connect
        client.scan(b"x" * 10)
    assert type(raised.value) is ScannerUnavailable


def test_stopped_clamd_is_unavailable_on_both_addresses():
    server = start_clamd()
    tcp, unix = ClamdClient(server.tcp_address, timeout=3), ClamdClient(server.unix_address, timeout=3)
    try:
        assert tcp.scan(EICAR) == FOUND
    finally:
        server.stop()
    assert server.process.poll() is not None
    for client in (tcp, unix):
        with pytest.raises(ScannerUnavailable):
            client.scan(EICAR)
        with pytest.raises(ScannerUnavailable):
            client.ping()


def test_unreachable_addresses_are_unavailable(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connection refused
        with pytest.raises(ScannerUnavailable, match="cannot connect"):
            scan(b"data", f"tcp://127.0.0.1:{port}", timeout=2)
    with pytest.raises(ScannerUnavailable, match="cannot connect"):
        scan(b"data", f"unix://{tmp_path}/missing.sock", timeout=2)


class FakeClamd:
    """A TCP server that reads what it is sent and answers with `handler(conn)`."""

    def __init__(self, handler):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.address = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        self.handler = handler
        self.connections = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections.append(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn):
        try:
            self.handler(conn)
        except OSError:
            pass

    def close(self):
        self.sock.close()
        for conn in self.connections:
            conn.close()


def _read_stream(conn):
    """Read an INSTREAM request to its terminating zero-length chunk."""
    buffer = b""
    while not buffer.endswith(b"\0\0\0\0"):
        chunk = conn.recv(65536)
        if not chunk:
            return
        buffer += chunk


@pytest.fixture
def fake_clamd():
    servers = []

    def make(handler):
        servers.append(FakeClamd(handler))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def test_a_silent_scanner_times_out_as_unavailable(fake_clamd):
    server = fake_clamd(lambda conn: (_read_stream(conn), time.sleep(10)))
    started = time.monotonic()
    with pytest.raises(ScannerUnavailable, match="timed out|timeout"):
        ClamdClient(server.address, timeout=0.5).scan(EICAR)
    assert time.monotonic() - started < 3


@pytest.mark.parametrize(
    "reply",
    [
        b"HELLO\0",  # not a verdict
        b"stream: FOUND\0",  # FOUND without a signature
        b"stream: Eicar-Test-Sig",  # cut short: no NUL terminator, then close
        b"",  # closed without a word
        b"Can't allocate memory ERROR\0",  # a clamd error
    ],
)
def test_unexpected_answers_are_unavailable(fake_clamd, reply):
    def handler(conn):
        _read_stream(conn)
        conn.sendall(reply)
        conn.close()

    server = fake_clamd(handler)
    with pytest.raises(ScannerUnavailable) as raised:
        ClamdClient(server.address, timeout=3).scan(b"data")
    assert type(raised.value) is ScannerUnavailable


def test_a_reply_the_fake_formats_like_clamd_is_understood(fake_clamd):
    # The parser is checked against the real clamd above; this pins the exact format it expects.
    def handler(conn):
        _read_stream(conn)
        conn.sendall(b"stream: Win.Test.Thing-1 FOUND\0")

    server = fake_clamd(handler)
    assert ClamdClient(server.address).scan(b"x") == ScanResult(clean=False, signature="Win.Test.Thing-1")


def test_addresses_and_settings():
    assert parse_address("tcp://127.0.0.1:3310") == ClamdAddress("tcp", host="127.0.0.1", port=3310)
    assert parse_address("unix:///run/clamav/clamd.ctl") == ClamdAddress("unix", path="/run/clamav/clamd.ctl")
    assert parse_address("/run/clamav/clamd.ctl") == ClamdAddress("unix", path="/run/clamav/clamd.ctl")
    assert parse_address("off") is None and parse_address("") is None
    assert scanner_from_setting("OFF") is None
    assert str(scanner_from_setting("tcp://localhost:3310").address) == "tcp://localhost:3310"
    for bad in ("tcp://127.0.0.1", "http://x:1", "unix://relative/path", "127.0.0.1:3310", "tcp://h:99999"):
        with pytest.raises(ValueError):
            parse_address(bad)
    with pytest.raises(ValueError):
        ClamdClient("off")
    with pytest.raises(TypeError):
        ClamdClient("tcp://127.0.0.1:1").scan("a str is not bytes")

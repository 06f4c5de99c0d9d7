"""LMTP by hand: a client, one transaction, the bytes on the wire, and run_lmtp on a unix socket."""

import shutil
import smtplib
import socket
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.live import MANAGE, PYTHON, LiveProcesses, database_url, subprocess_env, wait_for
from tests.postfix import Listener, stop_listeners

SENDER = "customer@example.com"


def lmtp(listener) -> smtplib.LMTP:
    client = smtplib.LMTP(listener.host, listener.port, timeout=20)
    client.ehlo("mta.example.test")  # smtplib.LMTP sends LHLO
    return client


def send(client, recipients, raw: bytes, sender: str = SENDER, per_recipient: bool = True):
    """One transaction by hand: (MAIL reply, [RCPT replies], [DATA replies]); LMTP answers DATA per recipient."""
    mail = client.mail(sender)
    rcpts = [client.rcpt(r) for r in recipients]
    accepted = sum(1 for code, _ in rcpts if code == 250)
    if not accepted:
        client.rset()
        return mail, rcpts, []
    replies = [client.data(on_the_wire(raw))]
    if per_recipient:
        replies += [client.getreply() for _ in range(accepted - 1)]
    return mail, rcpts, replies


def on_the_wire(raw: bytes) -> bytes:
    """`raw` with CRLF line endings, as a mail server transmits it (and so as the listener stores it)."""
    return raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")


@pytest.fixture
def unix_listener(transactional_db, tmp_path):
    """`run_lmtp --socket PATH` as a real process; (socket path, Listener). The path is short: AF_UNIX allows 107."""
    socket_dir = Path(tempfile.mkdtemp(prefix="mr-lmtp-"))
    socket_dir.chmod(0o755)  # a mail server's user may reach the socket; the socket's own mode decides the rest
    path = socket_dir / "lmtp.sock"
    processes = LiveProcesses(tmp_path)
    application_name = f"mailroom-lmtp-{uuid.uuid4().hex[:8]}"
    env = subprocess_env()
    env["DATABASE_URL"] = f"{database_url()}?application_name={application_name}"
    process = processes.start(
        "lmtp", [PYTHON, MANAGE, "run_lmtp", "--socket", str(path), "--hostname", "lmtp.mailroom.test"], env
    )
    listener = Listener(str(path), 0, application_name, process)

    def greets() -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(2)
                sock.connect(str(path))
                return sock.recv(512).startswith(b"220")
        except OSError:
            return False

    wait_for(lambda: greets() or not process.alive(), timeout=30, describe=process.tail)
    assert process.alive(), process.tail()
    try:
        yield path, listener
    finally:
        stop_listeners(processes, [listener])
        shutil.rmtree(socket_dir, ignore_errors=True)

"""A real clamd for tests: started in a temporary directory, stopped by its pid.

    from tests.clamd import clamd, start_clamd   # `clamd` is a session-scoped pytest fixture

No signature database can be downloaded here, so the database is one
hand-written NDB signature for the EICAR test string (SETUP.md, ClamAV); clamd
answers it as `Eicar-Test-Signature-NDB.UNOFFICIAL`. If `clamd` is not
installed, the fixture installs `clamav-daemon` with apt-get (root, as in CI),
running `apt-get update` first only if the plain install fails.
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.services import ensure_installed, free_port

EICAR = bytes.fromhex(
    "58354f2150254041505b345c505a58353428505e2937434329377d2445494341522d5354414e444152442d414e5449"
    "56495255532d544553542d46494c452124482b482a"
)
EICAR_SIGNATURE = "Eicar-Test-Signature-NDB.UNOFFICIAL"
NDB_LINE = f"Eicar-Test-Signature-NDB:0:*:{EICAR.hex()}\n"
STREAM_MAX_LENGTH = 4 * 1024 * 1024


def ensure_clamd_installed() -> str:
    return ensure_installed("clamd", "clamav-daemon")


def _pong(family, address) -> bool:
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(1)
            sock.connect(address)
            sock.sendall(b"zPING\0")
            return sock.recv(16).startswith(b"PONG")
    except OSError:
        return False


@dataclass
class ClamdProcess:
    directory: Path
    port: int
    socket_path: Path
    process: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def tcp_address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def unix_address(self) -> str:
        return f"unix://{self.socket_path}"

    def log(self) -> str:
        try:
            return (self.directory / "clamd.out").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop this clamd by its pid (SIGTERM, then SIGKILL) and remove its directory."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)


def start_clamd(stream_max_length: int = STREAM_MAX_LENGTH, attempts: int = 3) -> ClamdProcess:
    """Start a clamd on a free TCP port and a unix socket; returns once it answers PING on both."""
    binary = ensure_clamd_installed()
    last_log = ""
    for _ in range(attempts):
        directory = Path(tempfile.mkdtemp(prefix="clamd-"))
        (directory / "db").mkdir()
        (directory / "db" / "custom-eicar.ndb").write_text(NDB_LINE)
        port = free_port()
        socket_path = directory / "clamd.sock"
        (directory / "clamd.conf").write_text(
            "\n".join(
                [
                    "Foreground yes",
                    f"DatabaseDirectory {directory / 'db'}",
                    f"LocalSocket {socket_path}",
                    f"TCPSocket {port}",
                    "TCPAddr 127.0.0.1",
                    f"PidFile {directory / 'clamd.pid'}",
                    f"StreamMaxLength {stream_max_length}",
                    "MaxThreads 4",
                    "SelfCheck 0",
                    "",
                ]
            )
        )
        with open(directory / "clamd.out", "wb") as out:
            process = subprocess.Popen(
                [binary, "-c", str(directory / "clamd.conf")],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        server = ClamdProcess(directory, port, socket_path, process)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            if _pong(socket.AF_INET, ("127.0.0.1", port)) and _pong(socket.AF_UNIX, str(socket_path)):
                return server
            time.sleep(0.05)
        last_log = server.log()
        server.stop()  # died (port taken?) or never answered: try again on another port
    pytest.fail(f"clamd did not answer PING after {attempts} attempts:\n{last_log}")


@pytest.fixture(scope="session")
def clamd():
    server = start_clamd()
    yield server
    server.stop()

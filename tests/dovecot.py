"""A real Dovecot IMAP server for tests: its own directory and port, stopped by its pid.

    from tests.dovecot import dovecot, private_dovecot   # pytest fixtures

`dovecot` is shared by a test session; `private_dovecot` belongs to one test
(which may stop and start it). The configuration is the standalone one of
SETUP.md (nothing under /etc/dovecot is used), plus `auth_failure_delay = 0`
and no anvil auth penalty, so that refused logins answer at once and do not
slow down the logins that follow. Dovecot runs in the foreground (`-F`)
as our child, in its own session; `stop()` sends SIGTERM to that pid and waits,
SIGKILL to its process group at the deadline. If `dovecot` is not installed,
the fixture installs `dovecot-imapd` with apt-get (root, as in CI), running
`apt-get update` first only if the plain install fails.

`start_dovecot(oauth_introspection_url=...)` (or the `oauth_dovecot` fixture of tests/test_imap_oauth.py)
adds `passdb { driver = oauth2 }` for the XOAUTH2 and OAUTHBEARER mechanisms, checking each bearer token by
POSTing it to that URL (RFC 7662 introspection: `active`, `username`); PLAIN logins keep the users file.

Each test adds its own user (`add_user()`): users get separate maildirs, so
tests never see each other's mail. Dovecot re-reads the users file without a
restart, but at most about once a second: `add_user` returns once the new user
can log in.
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.services import ensure_installed, free_port

CONFIG = """\
base_dir = {d}/run
state_dir = {d}/state
log_path = {d}/dovecot.log
protocols = imap
listen = 127.0.0.1
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
auth_failure_delay = 0
first_valid_uid = 1
mail_location = maildir:{d}/mail/%u/Maildir
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {d}/users
}}
userdb {{
  driver = static
  args = uid=nobody gid=nogroup home={d}/mail/%u
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
service pop3-login {{
  inet_listener pop3 {{
    port = 0
  }}
}}
service anvil {{
  unix_listener anvil-auth-penalty {{
    mode = 0
  }}
}}
"""


# Dovecot 2.3's oauth2 passdb (doc.dovecot.org/2.3, "Open Authentication v2.0 database"), appended to CONFIG.
OAUTH_CONFIG = """\
auth_mechanisms = plain login xoauth2 oauthbearer
passdb {{
  driver = oauth2
  mechanisms = xoauth2 oauthbearer
  args = {d}/dovecot-oauth2.conf.ext
}}
"""
OAUTH_PASSDB = """\
introspection_mode = post
introspection_url = {url}
force_introspection = yes
username_attribute = username
active_attribute = active
active_value = true
"""


def ensure_dovecot_installed() -> str:
    return ensure_installed("dovecot", "dovecot-imapd")


def _greets(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            return sock.recv(64).startswith(b"* OK")
    except OSError:
        return False


class Dovecot:
    def __init__(self, binary: str, *, oauth_introspection_url: str = ""):
        self.binary = binary
        self.oauth_introspection_url = oauth_introspection_url
        self.directory = Path(tempfile.mkdtemp(prefix="dovecot-"))
        self.directory.chmod(0o755)  # Dovecot's auth process (user dovecot) reads the users file
        for sub in ("run", "state", "mail"):
            (self.directory / sub).mkdir()
        shutil.chown(self.directory / "mail", "nobody", "nogroup")
        self.users_file = self.directory / "users"
        # Users written before the start need no wait: add_user hands them out first.
        self._spare_users = [(f"support-{uuid.uuid4().hex[:10]}@example.test", uuid.uuid4().hex) for _ in range(16)]
        self.users_file.write_text("".join(f"{u}:{{PLAIN}}{p}\n" for u, p in self._spare_users))
        self.users_file.chmod(0o644)
        self.conf = self.directory / "dovecot.conf"
        self.port = 0
        self.process: subprocess.Popen | None = None

    def _write_config(self) -> None:
        config = CONFIG.format(d=self.directory, port=self.port)
        if self.oauth_introspection_url:
            config = config.replace("auth_mechanisms = plain login\n", "") + OAUTH_CONFIG.format(d=self.directory)
            passdb = self.directory / "dovecot-oauth2.conf.ext"
            passdb.write_text(OAUTH_PASSDB.format(url=self.oauth_introspection_url))
            passdb.chmod(0o644)
        self.conf.write_text(config)

    def start(self, attempts: int = 3) -> None:
        """Start (or restart on the same port); the first start picks a free port."""
        for _ in range(attempts):
            if not self.port or not self.conf.exists():
                self.port = free_port()
                self._write_config()
            with open(self.directory / "dovecot.out", "ab") as out:
                self.process = subprocess.Popen(
                    [self.binary, "-F", "-c", str(self.conf)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.process.poll() is None:
                if _greets(self.port):
                    return
                time.sleep(0.05)
            self.stop()
            self.port = 0  # port taken, most likely: another one
        pytest.fail(f"dovecot did not start:\n{self.log()}")

    def stop(self) -> None:
        """SIGTERM to our dovecot master, SIGKILL to its process group at the deadline; wait for the port."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(process.pid, signal.SIGKILL)  # whatever of its group is left
        except (ProcessLookupError, PermissionError):
            pass
        if process.poll() is None:
            process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _greets(self.port):
            time.sleep(0.05)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def log(self) -> str:
        text = ""
        for name in ("dovecot.out", "dovecot.log"):
            try:
                text += (self.directory / name).read_text(errors="replace")[-3000:]
            except OSError:
                pass
        return text

    def add_user(self, password: str | None = None) -> tuple[str, str]:
        if self._spare_users and password is None:
            return self._spare_users.pop()
        username = f"support-{uuid.uuid4().hex[:10]}@example.test"
        password = password or uuid.uuid4().hex
        with open(self.users_file, "a") as handle:
            handle.write(f"{username}:{{PLAIN}}{password}\n")
        from imapclient import IMAPClient
        from imapclient.exceptions import LoginError

        deadline = time.monotonic() + 10
        while True:
            client = IMAPClient("127.0.0.1", port=self.port, ssl=False, timeout=10)
            try:
                client.login(username, password)
                client.logout()
                return username, password
            except LoginError:
                client.shutdown()
                if time.monotonic() > deadline:
                    pytest.fail(f"dovecot never accepted the new user:\n{self.log()}")
                time.sleep(0.1)

    @contextmanager
    def client(self, username: str, password: str):
        """A logged-in IMAPClient (the test's own view of the server), logged out afterwards."""
        from imapclient import IMAPClient

        client = IMAPClient("127.0.0.1", port=self.port, ssl=False, timeout=10)
        client.login(username, password)
        try:
            yield client
        finally:
            try:
                client.logout()
            except Exception:
                pass


def start_dovecot(*, oauth_introspection_url: str = "") -> Dovecot:
    server = Dovecot(ensure_dovecot_installed(), oauth_introspection_url=oauth_introspection_url)
    try:
        server.start()
    except BaseException:
        server.cleanup()
        raise
    return server


@pytest.fixture(scope="session")
def dovecot():
    server = start_dovecot()
    yield server
    server.cleanup()


@pytest.fixture
def private_dovecot():
    server = start_dovecot()
    yield server
    server.cleanup()

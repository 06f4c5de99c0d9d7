"""The mail-server side of Mailroom's delivery target, for tests: the listener, a private Postfix, an outage.

    from tests.postfix import lmtp_listener, start_listener, private_postfix, database_outage

- `start_listener(*flags, env=...)` (a fixture: a factory) runs `manage.py run_lmtp` as a real
  process on the test database and returns once it greets; `lmtp_listener` is one LMTP listener
  shared by a module. Each listener connects with its own `application_name`, so an outage can
  cut exactly its connections, and its teardown waits for exactly its sessions to end.
- `database_outage(application_name)` makes the test database unavailable to that listener for real:
  `ALTER DATABASE ... ALLOW_CONNECTIONS false` (no new connection, for anyone) and
  `pg_terminate_backend` of the listener's sessions; the test's own connection stays open, and the
  database is opened again on leaving, whatever happened.
- `private_postfix` (a factory) runs Postfix from the distribution as a PRIVATE instance: its own
  config, queue and data directories under a temporary directory, smtpd on a free port of
  127.0.0.1, relaying the domains it is given to the listener by LMTP, short retry times. Started
  with `postfix -c <dir> start`, stopped with `postfix -c <dir> stop` (then its master by pid); the
  system's own Postfix configuration is never read or touched.

Postfix must be installed (`.ci/run` installs it with debconf's "No configuration"); when it is
not, the fixture installs it the same way (we run as root, as CI does).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.live import MANAGE, PYTHON, LiveProcess, LiveProcesses, database_url, subprocess_env, wait_for
from tests.services import ensure_installed, free_port

LISTENER_START_SECONDS = 30.0


# --- the listener ---------------------------------------------------------------------------------


@dataclass
class Listener:
    host: str
    port: int
    application_name: str
    process: LiveProcess

    def log(self) -> str:
        return self.process.tail(60)


def _greets(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.settimeout(2)
            return sock.recv(512).startswith(b"220")
    except OSError:
        return False


def launch_listener(processes: LiveProcesses, *flags: str, env: dict | None = None) -> Listener:
    """`manage.py run_lmtp` on a free port of 127.0.0.1, on the test database; returns once it greets."""
    application_name = f"mailroom-lmtp-{uuid.uuid4().hex[:8]}"
    port = free_port()
    child_env = subprocess_env(**(env or {}))
    child_env["DATABASE_URL"] = f"{database_url()}?application_name={application_name}"
    process = processes.start(
        "lmtp",
        [
            PYTHON,
            MANAGE,
            "run_lmtp",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--hostname",
            "lmtp.mailroom.test",
            *flags,
        ],
        child_env,
    )
    deadline = time.monotonic() + LISTENER_START_SECONDS
    while not _greets(port):
        if not process.alive() or time.monotonic() > deadline:
            pytest.fail(f"run_lmtp did not start:\n{process.tail()}")
        time.sleep(0.1)
    return Listener("127.0.0.1", port, application_name, process)


def stop_listeners(processes: LiveProcesses, listeners: list[Listener]) -> None:
    """Stop the listeners' processes and wait until the database has closed their sessions.

    Only theirs: other listeners (a module's) keep their connections open meanwhile.
    """
    for process in reversed(processes.started):
        process.stop()
    names = [listener.application_name for listener in listeners]
    wait_for(lambda: not _sessions_of(names), timeout=10, describe=lambda: f"sessions left: {_sessions_of(names)}")


def _sessions_of(application_names: list[str]) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY(%s)", [application_names])
        return cursor.fetchone()[0]


@pytest.fixture
def start_listener(transactional_db, tmp_path):
    """A factory: `start_listener("--smtp", env={"MAILROOM_MAX_MESSAGE_BYTES": "2000"})` -> Listener."""
    processes = LiveProcesses(tmp_path)
    started: list[Listener] = []

    def start(*flags, env=None) -> Listener:
        started.append(launch_listener(processes, *flags, env=env))
        return started[-1]

    try:
        yield start
    finally:
        stop_listeners(processes, started)


@pytest.fixture(scope="module")
def lmtp_listener(django_db_setup, django_db_blocker, tmp_path_factory):
    """One LMTP listener (default limits) for a whole test module, stopped at its end."""
    processes = LiveProcesses(tmp_path_factory.mktemp("lmtp"))
    listener = launch_listener(processes)
    try:
        yield listener
    finally:
        with django_db_blocker.unblock():
            stop_listeners(processes, [listener])


# --- a real outage ------------------------------------------------------------------------------


@contextmanager
def database_outage(application_name: str):
    """The test database refuses new connections, and the sessions of `application_name` are cut.

    Run from the server's maintenance database (a database cannot close itself to connections).
    """
    import psycopg
    from django.db import connection

    settings = connection.settings_dict
    name = settings["NAME"]
    admin = psycopg.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=settings["PORT"] or 5432,
        user=settings["USER"] or "postgres",
        password=settings["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    )
    try:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
                [name, application_name],
            )
            yield
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    finally:
        admin.close()


# --- a private Postfix ------------------------------------------------------------------------------

MAIN_CF = """\
compatibility_level = 3.6
queue_directory = {root}/spool
data_directory = {root}/data
mail_owner = postfix
setgid_group = postdrop
maillog_file = {root}/maillog
maillog_file_prefixes = {root}
myhostname = mta.mailroom.test
mydomain = mailroom.test
myorigin = $myhostname
mydestination =
local_recipient_maps =
alias_maps =
alias_database =
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
smtpd_relay_restrictions = permit_mynetworks, reject_unauth_destination
relay_domains = {relay_domains}
relay_transport = {lmtp_nexthop}
lmtp_destination_concurrency_limit = 4
queue_run_delay = 2s
minimal_backoff_time = 2s
maximal_backoff_time = 4s
smtputf8_enable = no
biff = no
"""

# Only what relaying to LMTP needs; nothing chrooted (the queue directory is a temporary one).
MASTER_CF = """\
127.0.0.1:{smtpd_port} inet n - n - - smtpd
pickup    unix n - n 60 1 pickup
cleanup   unix n - n - 0 cleanup
qmgr      unix n - n 300 1 qmgr
rewrite   unix - - n - - trivial-rewrite
bounce    unix - - n - 0 bounce
defer     unix - - n - 0 bounce
trace     unix - - n - 0 bounce
verify    unix - - n - 1 verify
flush     unix n - n 1000? 0 flush
proxymap  unix - - n - - proxymap
smtp      unix - - n - - smtp
relay     unix - - n - - smtp
showq     unix n - n - - showq
error     unix - - n - - error
retry     unix - - n - - error
discard   unix - - n - - discard
lmtp      unix - - n - - lmtp
anvil     unix - - n - 1 anvil
scache    unix - - n - 1 scache
postlog   unix-dgram n - n - 1 postlogd
"""


def ensure_postfix() -> str:
    """The postfix binary, installed first (debconf: "No configuration") when it is missing."""
    if not shutil.which("postfix") and not os.access("/usr/sbin/postfix", os.X_OK):
        subprocess.run(
            ["debconf-set-selections"],
            input="postfix postfix/main_mailer_type select No configuration\n",
            text=True,
            capture_output=True,
        )
    return ensure_installed("postfix", "postfix")


class PrivatePostfix:
    def __init__(self, root: Path, lmtp_host: str, lmtp_port: int, relay_domains: tuple[str, ...]):
        self.root = root
        self.config_dir = root / "etc"
        self.smtpd_port = free_port()
        self.postfix = ensure_postfix()
        self.postqueue = shutil.which("postqueue") or "/usr/sbin/postqueue"
        for sub in ("etc", "spool", "data"):
            (root / sub).mkdir()
        shutil.chown(root / "data", "postfix", "postfix")
        (self.config_dir / "main.cf").write_text(
            MAIN_CF.format(
                root=root,
                relay_domains=", ".join(relay_domains),
                # A path is the listener's unix socket (run_lmtp --socket); else host and port.
                lmtp_nexthop=(
                    f"lmtp:unix:{lmtp_host}" if lmtp_host.startswith("/") else f"lmtp:inet:{lmtp_host}:{lmtp_port}"
                ),
            )
        )
        (self.config_dir / "master.cf").write_text(MASTER_CF.format(smtpd_port=self.smtpd_port))

    def _run(self, *argv, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            pytest.fail(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}\n{self.log()}")
        return done

    def start(self) -> None:
        self._run(self.postfix, "-c", str(self.config_dir), "start")
        wait_for(self._smtpd_greets, timeout=20, describe=self.log)

    def _smtpd_greets(self) -> bool:
        return _greets(self.smtpd_port)

    def master_pid(self) -> int | None:
        try:
            return int((self.root / "spool" / "pid" / "master.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        pid = self.master_pid()
        self._run(self.postfix, "-c", str(self.config_dir), "stop", check=False)
        deadline = time.monotonic() + 15
        while pid and _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid and _alive(pid):  # its master by pid (the group is the master's own), never by name
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def queue(self) -> list[dict]:
        """`postqueue -j`: one dict per queued message (queue_name, queue_id, recipients with delay_reason)."""
        out = self._run(self.postqueue, "-c", str(self.config_dir), "-j").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def flush(self) -> None:
        self._run(self.postqueue, "-c", str(self.config_dir), "-f")

    def log(self, lines: int = 60) -> str:
        try:
            return "\n".join((self.root / "maillog").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no maillog)"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def private_postfix():
    """A factory: `private_postfix(lmtp_port, relay_domains=("acme.test",))` -> a started PrivatePostfix;
    `lmtp_host="/path/lmtp.sock"` relays to a unix socket instead (`lmtp_port` is then ignored)."""
    started: list[PrivatePostfix] = []

    def start(lmtp_port: int, relay_domains=("acme.test",), lmtp_host: str = "127.0.0.1") -> PrivatePostfix:
        # Under /tmp, not pytest's 0700 tmp_path: Postfix's daemons run as `postfix` and enter the queue.
        root = Path(tempfile.mkdtemp(prefix="mailroom-postfix-"))
        root.chmod(0o755)
        postfix = PrivatePostfix(root, lmtp_host, lmtp_port, tuple(relay_domains))
        started.append(postfix)
        postfix.start()
        return postfix

    try:
        yield start
    finally:
        for postfix in started:
            postfix.stop()
            shutil.rmtree(postfix.root, ignore_errors=True)

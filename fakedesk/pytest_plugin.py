"""pytest plugin: the `desk` fixture, a FakeDesk on 127.0.0.1 for one test.

Enable it in a conftest.py with `pytest_plugins = ["fakedesk.pytest_plugin"]`.
This module is the only part of `fakedesk` that needs pytest.

`desk` is a `RunningDesk`: a `fakedesk.client.DeskClient` (the control API over
HTTP: `set_plan`, `set_idempotency`, `tickets`, `requests_log`, `reset`, ...)
plus `url`, `token` and `stop()`. It listens on a free port, and the fixture
stops it after the test. By default it runs on a thread in the test process,
with a random token (read it as `desk.token`); the `fakedesk` marker changes
that, on a test, a class or a module (`pytestmark`):

    @pytest.mark.fakedesk(process=True)      # its own process, `python -m fakedesk`
    @pytest.mark.fakedesk(token="sekrit")    # a fixed token; token=None: no auth at all
    @pytest.mark.fakedesk(dialect="jira_sm", search_lag_seconds=2)   # another API (fakedesk.dialects)
    @pytest.mark.fakedesk(idempotency=False, retention_seconds=60, db_path=True)
                                             # db_path=True: a SQLite file in a temporary folder
    @pytest.mark.fakedesk(quota_per_minute=120)   # 429 + Retry-After past 120 API requests a sliding minute

`desk_factory(**options)` starts more desks (same options; they are stopped at
teardown too), e.g. two desks on one SQLite file, one after the other.

Request hook (in-process desks only): `desk.on_request(hook)` calls
`hook(fakedesk.desk.ApiRequest)` for every Zendesk API request (reads
included; the control API never), before authentication and faults, on the
server's thread. The hook returns None to let the request through, or
`(status, body)` / `(status, body, headers)` to answer instead (nothing is
written, no fault is used, nothing enters the request log). `on_request`
returns a function that removes the hook. E.g. counting every call:

    calls = []
    desk.on_request(lambda request: calls.append((request.method, request.path)))
"""

import os
import secrets
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .client import DeskClient
from .server import FakeDesk

_RANDOM = object()  # the default token: a fresh random one per desk
_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)
OPTIONS = (
    "process",
    "token",
    "idempotency",
    "retention_seconds",
    "db_path",
    "dialect",
    "search_lag_seconds",
    "quota_per_minute",
)


class RunningDesk(DeskClient):
    """A FakeDesk this test started: the control client, plus `stop()` and (in process) `on_request()`."""

    def __init__(
        self,
        url: str,
        token: str | None,
        server: FakeDesk | None = None,
        process: subprocess.Popen | None = None,
        log_path: Path | None = None,
        dialect: str = "zendesk",
    ):
        super().__init__(url, token=token)
        self.dialect = dialect
        self._server = server
        self._process = process
        self.log_path = log_path

    @property
    def in_process(self) -> bool:
        return self._server is not None

    def on_request(self, hook):
        """Register a request hook (see the module docstring); returns its remover."""
        if self._server is None:
            raise RuntimeError("request hooks need an in-process desk: drop process=True from the fakedesk marker")
        return self._server.add_request_hook(hook)

    def quota_report(self) -> dict | None:
        """The quota's counts (admitted, refused, busiest_minute; None without a quota). A desk process
        shows its refusals in the request log instead (fault "quota", status 429)."""
        if self._server is None:
            raise RuntimeError("the quota report needs an in-process desk; read requests_log() of a desk process")
        return self._server.quota_report()

    def tail(self, lines: int = 40) -> str:
        """The end of the desk process's log (empty for an in-process desk: it logs to this process)."""
        if self.log_path is None:
            return ""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self):
        """Stop the desk (idempotent). Its SQLite file, if any, stays."""
        if self._server is not None:
            server, self._server = self._server, None
            server.stop()
        if self._process is not None:
            process, self._process = self._process, None
            _stop_process(process)

    @property
    def stopped(self) -> bool:
        return self._server is None and self._process is None


def start_desk(
    *,
    process: bool = False,
    token=_RANDOM,
    idempotency: bool = True,
    retention_seconds: float | None = None,
    db_path=None,
    work_dir: Path | None = None,
    dialect: str = "zendesk",
    search_lag_seconds: float = 0.0,
    quota_per_minute: int | None = None,
) -> RunningDesk:
    """Start a FakeDesk on 127.0.0.1 with a free port; the caller stops it (`RunningDesk.stop()`)."""
    token = secrets.token_urlsafe(12) if token is _RANDOM else token
    if db_path is True:
        if work_dir is None:
            raise ValueError("db_path=True needs a work_dir")
        db_path = work_dir / "fakedesk.sqlite3"
    db_path = None if db_path is None else str(db_path)
    if not process:
        kwargs = {} if retention_seconds is None else {"retention_seconds": retention_seconds}
        server = FakeDesk(
            host="127.0.0.1",
            port=0,
            db_path=db_path,
            token=token,
            idempotency_enabled=idempotency,
            dialect=dialect,
            search_lag_seconds=search_lag_seconds,
            quota_per_minute=quota_per_minute,
            **kwargs,
        ).start()
        return RunningDesk(server.url, token, server=server, dialect=dialect)

    argv = [sys.executable, "-m", "fakedesk", "--host", "127.0.0.1", "--port", "0"]
    if db_path:
        argv += ["--db", db_path]
    if token:
        # One word: a random token may begin with "-", which argparse would take for an option.
        argv += [f"--token={token}"]
    if not idempotency:
        argv += ["--no-idempotency"]
    if retention_seconds is not None:
        argv += ["--retention-seconds", str(retention_seconds)]
    argv += ["--dialect", dialect, "--search-lag", str(search_lag_seconds)]
    if quota_per_minute:
        argv += ["--quota-per-minute", str(quota_per_minute)]
    if work_dir is None:
        raise ValueError("a desk process needs a work_dir for its log")
    log_path = work_dir / "fakedesk.log"
    python_path = os.pathsep.join(filter(None, [_PACKAGE_PARENT, os.environ.get("PYTHONPATH")]))
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": python_path},
        )
    url = _read_url(popen, log_path)
    return RunningDesk(url, token, process=popen, log_path=log_path, dialect=dialect).wait_until_up()


def _read_url(popen: subprocess.Popen, log_path: Path, timeout: float = 30.0) -> str:
    """The URL from the first line, "FakeDesk listening on http://...": with port 0 it is the only way to know."""
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        ready = select.select([popen.stdout], [], [], max(remaining, 0))[0] if remaining > 0 else []
        chunk = os.read(popen.stdout.fileno(), 256) if ready else b""
        if not chunk:
            _stop_process(popen)
            raise RuntimeError(f"FakeDesk did not start: {line!r}\n{log_path.read_text(errors='replace')}")
        line += chunk
    text = line.decode().strip()
    if not text.startswith("FakeDesk listening on "):
        _stop_process(popen)
        raise RuntimeError(f"FakeDesk did not start: {text!r}\n{log_path.read_text(errors='replace')}")
    return text.split()[-1]


def _stop_process(popen: subprocess.Popen, timeout: float = 10.0):
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(timeout=timeout)
    if popen.stdout is not None:
        popen.stdout.close()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "fakedesk(process=False, token=<random>, idempotency=True, retention_seconds=None, "
        "db_path=None, dialect='zendesk', search_lag_seconds=0, quota_per_minute=None): "
        "how the `desk` fixture starts FakeDesk (see fakedesk.pytest_plugin)",
    )


def _marker_options(request) -> dict:
    options = {}
    # Closest last, so a test's marker wins over its class's and its module's.
    for marker in reversed(list(request.node.iter_markers("fakedesk"))):
        if marker.args:
            raise TypeError("the fakedesk marker takes keyword arguments only")
        unknown = set(marker.kwargs) - set(OPTIONS)
        if unknown:
            raise TypeError(f"unknown fakedesk marker option(s) {sorted(unknown)}; known: {OPTIONS}")
        options.update(marker.kwargs)
    return options


@pytest.fixture
def desk_factory(request, tmp_path_factory):
    """`desk_factory(**options)` -> a started `RunningDesk`; every desk it started is stopped at teardown."""
    started: list[RunningDesk] = []
    defaults = _marker_options(request)

    def factory(**options) -> RunningDesk:
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise TypeError(f"unknown desk option(s) {sorted(unknown)}; known: {OPTIONS}")
        running = start_desk(**{**defaults, **options}, work_dir=tmp_path_factory.mktemp("fakedesk"))
        started.append(running)
        return running

    yield factory
    for running in reversed(started):
        running.stop()


@pytest.fixture
def desk(desk_factory) -> RunningDesk:
    """A FakeDesk for this test (see the module docstring); stopped after it."""
    return desk_factory()

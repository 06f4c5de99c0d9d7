"""The command line, shared by `python -m fakedesk` and `manage.py fakedesk`."""

import argparse
import logging
import signal
import sys
import threading

from .desk import DEFAULT_RETENTION_SECONDS
from .dialects import DIALECTS
from .server import FakeDesk


def add_arguments(parser: argparse.ArgumentParser):
    """The options shared by `python -m fakedesk` and `manage.py fakedesk`."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8025, help="0 picks a free port (printed at start)")
    parser.add_argument("--db", default=None, help="SQLite file; in memory when omitted")
    parser.add_argument("--token", default=None, help="require basic auth <anything>/token:<TOKEN>")
    parser.add_argument("--no-idempotency", action="store_true", help="ignore Idempotency-Key headers")
    parser.add_argument(
        "--dialect", default="zendesk", choices=sorted(DIALECTS), help="the API to speak (a Mailroom destination kind)"
    )
    parser.add_argument(
        "--search-lag", type=float, default=0.0, help="seconds before a search finds a new record (Jira, Freshdesk)"
    )
    parser.add_argument(
        "--retention-seconds", type=float, default=DEFAULT_RETENTION_SECONDS, help="how long idempotency keys are kept"
    )
    parser.add_argument(
        "--quota-per-minute",
        type=int,
        default=None,
        help="answer 429 with Retry-After past this many API requests in a sliding minute",
    )


def desk_from_options(options) -> FakeDesk:
    return FakeDesk(
        host=options.host,
        port=options.port,
        db_path=options.db,
        token=options.token,
        idempotency_enabled=not options.no_idempotency,
        retention_seconds=options.retention_seconds,
        dialect=options.dialect,
        search_lag_seconds=options.search_lag,
        quota_per_minute=options.quota_per_minute,
    )


def run_until_signalled(desk: FakeDesk, out=sys.stdout):
    """Serve until SIGTERM or Ctrl-C, then stop cleanly.

    Prints the URL first: with --port 0 it is the only way to know the port.
    """
    done = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: done.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        desk.start()
        out.write(f"FakeDesk listening on {desk.url}\n")
        out.flush()
        while not done.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        desk.stop()
    out.write("FakeDesk stopped\n")
    out.flush()


def main(argv=None):
    # The package docstring describes the server; the package is loaded before any of its modules, so this
    # reads it without importing the package from inside it.
    package_doc = sys.modules[__package__].__doc__
    summary = (package_doc or "FakeDesk").split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m fakedesk", description=summary)
    add_arguments(parser)
    parser.add_argument("--log-level", default="INFO")
    options = parser.parse_args(argv)
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    run_until_signalled(desk_from_options(options))

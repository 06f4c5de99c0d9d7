"""`mailroom-mailgate`: an MTA's pipe transport that hands one message to Mailroom's signed raw webhook.

    mailroom-mailgate --url https://mailroom.example.com --mailbox support --secret-file /etc/mailroom/gate.secret

Reads ONE message (bytes) on stdin and posts it to `POST <url>/webhooks/raw/<mailbox>/` with the raw
webhook's HMAC headers (`intake.signing`, the v2 scheme the server verifies; the Mailroom server must be
upgraded before its mailgates, since a server older than v2 knows only v1). The exit status is the
MTA's answer (sysexits, which Postfix's pipe(8) and Exim's pipe transport both understand); it is
the whole point of this program, because the MTA keeps the message for as long as we say "temporary":

    0   delivered: 202 (new) or 200 (duplicate: stored before, so a retry after a lost answer is safe)
    75  EX_TEMPFAIL, the MTA keeps the message and retries: connection refused or reset, timeouts,
        5xx, 429, 408, and every failure that is our own misconfiguration, not the sender's: a refused
        secret (401/403), a missing or unreadable secret file, bad arguments, a redirect, a 404 that is
        not the webhook's "unknown mailbox" (a wrong --url), any other unexpected answer. A bounce
        would tell the sender that a message failed which an admin can still deliver by fixing the
        configuration; a deferral keeps it in the queue, visible (`mailq`), until they do.
    67  EX_NOUSER: the webhook answered 404 "unknown mailbox" (the MTA bounces: 5.1.1)
    65  EX_DATAERR: larger than --max-bytes (refused here, nothing posted), the server's 413, an empty
        message (refused here), the webhook's own 400 (a JSON error) (the MTA bounces: 5.6.0)

`--url` is Mailroom's base URL (scheme, host, optional port and path prefix); the webhook path is
appended. A URL that already ends in `/webhooks/raw/<mailbox>/` is used as given, so copying the
full webhook URL also works. The secret comes from `--secret-file` (its first line; the file must be
readable by the user the MTA runs the pipe as) or else from `MAILROOM_MAILGATE_SECRET`.

Runs on the MTA host, where Mailroom's settings and database are not: it imports no Django (only
`requests` and `intake.signing`, which is standard library). One line on stderr says what happened
(the MTA logs it); never the message, an address or the secret.
"""

import argparse
import os
import re
import signal
import sys
import time
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

from intake.signing import signed_headers

EX_OK = 0
EX_DATAERR = 65
EX_NOUSER = 67
EX_TEMPFAIL = 75

DEFAULT_MAX_BYTES = 25 * 1024 * 1024  # the server's default MAILROOM_MAX_MESSAGE_BYTES
DEFAULT_TIMEOUT_SECONDS = 60.0
SECRET_ENV_VAR = "MAILROOM_MAILGATE_SECRET"
PROGRAM = "mailroom-mailgate"
# Statuses that mean "not now": the MTA keeps the message and tries again.
TEMPORARY_STATUSES = {408, 429}
_SLUG = re.compile(r"[-a-zA-Z0-9_]+")  # Django's <slug:...> path converter


class MailgateExit(Exception):
    """Stop with `code`, saying `message` on stderr."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        # argparse would exit 2, which an MTA takes for a permanent failure and bounces: a broken
        # transport definition is ours to fix, so the message waits in the queue instead.
        raise MailgateExit(EX_TEMPFAIL, f"bad arguments ({message}): message deferred")


def _parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog=PROGRAM, description="Deliver one message from stdin to a Mailroom mailbox.")
    parser.add_argument(
        "--url", required=True, help="Mailroom's base URL (https://mailroom.example.com), or the full raw webhook URL"
    )
    parser.add_argument("--mailbox", required=True, help="the mailbox slug")
    parser.add_argument("--secret-file", help=f"file holding the mailbox's webhook secret (else ${SECRET_ENV_VAR})")
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        help="refuse larger messages without posting (default 25 MiB, the server's default)",
    )
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS, help="seconds for the whole request (default 60)"
    )
    return parser


def webhook_url(url: str, mailbox: str) -> str:
    """The raw webhook URL for `mailbox`: `url` if it already names it, else `url` + /webhooks/raw/<mailbox>/."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise MailgateExit(EX_TEMPFAIL, "bad --url (expected http(s)://host[:port][/prefix]): message deferred")
    if not _SLUG.fullmatch(mailbox):
        raise MailgateExit(EX_TEMPFAIL, "bad --mailbox (expected a slug: letters, digits, - and _): message deferred")
    suffix = f"/webhooks/raw/{mailbox}"
    path = parts.path.rstrip("/")
    if not path.endswith(suffix):
        path += suffix
    return urlunsplit((parts.scheme, parts.netloc, path + "/", "", ""))


def _printable_url(url: str) -> str:
    """The URL without credentials, for the stderr line."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def read_secret(secret_file: str | None) -> str:
    if secret_file:
        try:
            with open(secret_file, encoding="utf-8") as handle:
                secret = handle.readline().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise MailgateExit(
                EX_TEMPFAIL, f"cannot read the secret file ({type(exc).__name__}): message deferred"
            ) from None
        if not secret:
            raise MailgateExit(EX_TEMPFAIL, "the secret file is empty: message deferred")
        return secret
    secret = os.environ.get(SECRET_ENV_VAR, "").strip()
    if not secret:
        raise MailgateExit(EX_TEMPFAIL, f"no secret (--secret-file or ${SECRET_ENV_VAR}): message deferred")
    return secret


def read_message(stream, max_bytes: int) -> bytes:
    """The message on `stream`, refusing (65) one larger than `max_bytes` before anything is posted."""
    body = stream.read(max_bytes + 1)
    if len(body) > max_bytes:
        raise MailgateExit(EX_DATAERR, f"message larger than --max-bytes ({max_bytes} bytes): refused, not posted")
    if not body.strip():
        raise MailgateExit(EX_DATAERR, "empty message on stdin: refused, not posted")
    return body


class _Deadline(Exception):
    pass


@contextmanager
def _overall_deadline(seconds: float):
    """Bound the whole request: requests' timeout is per socket operation, a trickling server could outlast it."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def expired(signum, frame):
        raise _Deadline()

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def post_message(url: str, secret: str, body: bytes, timeout: float) -> tuple[int, str, dict]:
    """POST `body` signed: (status, Location, the JSON object answered or {}). Transport failures: exit 75."""
    import requests  # imported here: `--help` and the argument checks need no HTTP stack

    headers = {"Content-Type": "message/rfc822", "User-Agent": PROGRAM, **signed_headers(secret, body)}
    try:
        with _overall_deadline(timeout + 1.0):
            response = requests.post(url, data=body, headers=headers, timeout=(timeout, timeout), allow_redirects=False)
            try:
                answer = response.json()
            except ValueError:
                answer = {}
    except (requests.Timeout, _Deadline):
        raise MailgateExit(EX_TEMPFAIL, f"no answer within {timeout:g} s: message deferred") from None
    except requests.RequestException as exc:
        raise MailgateExit(EX_TEMPFAIL, f"cannot reach Mailroom ({type(exc).__name__}): message deferred") from None
    return response.status_code, response.headers.get("Location", ""), answer if isinstance(answer, dict) else {}


def outcome(status: int, answer: dict, location: str = "") -> tuple[int, str]:
    """(exit code, stderr line) for the webhook's answer."""
    if status in (200, 202):
        event = answer.get("inbox_event_id", "?")
        return EX_OK, f"{'already stored' if status == 200 else 'stored'} as event {event}"
    if status == 404 and answer.get("error") == "unknown mailbox":
        return EX_NOUSER, "unknown mailbox: refused"
    if status == 413:
        return EX_DATAERR, "message larger than the server accepts (413): refused"
    if status == 400 and answer.get("error"):
        return EX_DATAERR, "the webhook refused the message as malformed (400): refused"
    if status in (401, 403):
        return EX_TEMPFAIL, f"the server refused our signature ({status}): check the secret; message deferred"
    if 300 <= status < 400:
        return EX_TEMPFAIL, f"redirected ({status} to {_printable_url(location)}): fix --url; message deferred"
    if status == 404:
        return EX_TEMPFAIL, "no raw webhook at this URL (404): fix --url; message deferred"
    if status >= 500 or status in TEMPORARY_STATUSES:
        return EX_TEMPFAIL, f"temporary failure ({status}): message deferred"
    return EX_TEMPFAIL, f"unexpected answer ({status}): message deferred"


def run(argv: list[str] | None, stdin) -> tuple[int, str]:
    options = _parser().parse_args(argv)
    if options.max_bytes <= 0 or options.timeout <= 0:
        raise MailgateExit(EX_TEMPFAIL, "bad arguments (--max-bytes and --timeout must be positive): message deferred")
    url = webhook_url(options.url, options.mailbox)
    secret = read_secret(options.secret_file)
    body = read_message(stdin, options.max_bytes)
    started = time.monotonic()
    status, location, answer = post_message(url, secret, body, options.timeout)
    code, line = outcome(status, answer, location)
    took = time.monotonic() - started
    return code, f"mailbox {options.mailbox} at {_printable_url(url)}: {line} ({len(body)} bytes, {took:.2f} s)"


def main(argv: list[str] | None = None) -> int:
    try:
        code, line = run(argv, sys.stdin.buffer)
    except MailgateExit as stop:
        code, line = stop.code, stop.message
    except KeyboardInterrupt:
        code, line = EX_TEMPFAIL, "interrupted: message deferred"
    except Exception as exc:  # whatever went wrong, the MTA must keep the message
        code, line = EX_TEMPFAIL, f"internal error ({type(exc).__name__}): message deferred"
    print(f"{PROGRAM}: {line}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""Logging filters: addresses masked, secrets redacted, request and task ids attached.

Every process logs through the handler of settings.LOGGING, which runs these filters: no line carries a
full address, an `Authorization` value or a `token=`/`key=`/`secret=` parameter. `LogContextFilter` puts
`request_id` (set by `intake.middleware.RequestIdMiddleware`) and `task_id` (set around every Celery
task, below) on each record, for LOG_FORMAT=json.
"""

import contextvars
import itertools
import logging
import re

from celery.signals import task_postrun, task_prerun
from django.conf import settings
from gunicorn.glogging import Logger as GunicornLogger

_ADDRESS = re.compile(r"([A-Za-z0-9._%+-])[A-Za-z0-9._%+-]*@([A-Za-z0-9-])[A-Za-z0-9.-]*(\.[A-Za-z]{2,})")

# `Authorization: Bearer abc`, `'Authorization': 'Basic abc'`, `authorization=abc`: the scheme stays.
_AUTHORIZATION = re.compile(
    r"""(?i)((?:proxy-)?authorization['"]?\s*[:=]\s*['"]?)(?:(bearer|basic|token|digest|hmac)\s+)?[^\s'",;}]+"""
)
# A bare `Bearer <token>`: the token has a digit or a symbol (prose such as "no bearer token" stays).
_BEARER = re.compile(r"(?i)\b(bearer)\s+(?=[A-Za-z]*[0-9._~+/=-])[A-Za-z0-9._~+/=-]{6,}")
# token=..., key=..., access_token=..., api_key=..., secret=..., password=..., signature=... (query strings,
# form bodies, key=value log fields); `dedupe_key=` and other `*_key` names of our own are not secrets.
_SECRET_PARAM = re.compile(
    r"(?i)\b((?:access_|refresh_|id_|api_|auth_)?token|(?:api_?)?key|(?:client_)?secret|password|passwd|"
    r"sig|signature)=([^&\s'\",;]+)"
)
REDACTED = "[redacted]"

# gunicorn's access log (run_stack, README): the path without its query string (%(U)s, not %(r)s), no
# referrer (%(f)s may carry a query), no user (%(u)s is read from the Authorization header).
ACCESS_LOG_FORMAT = '%(h)s %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms "%(a)s" %({x-request-id}o)s'
# Requests the access log leaves out: a page's static files and the browser's favicon probe (a third of a
# development log, and nothing an operator reads). STATIC_URL is "static/" (config/settings.py).
QUIET_ACCESS_PATHS = ("/favicon.ico",)
QUIET_ACCESS_PREFIXES = ("/static/",)

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("mailroom_request_id", default=None)
task_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("mailroom_task_id", default=None)


def mask_address(text: str) -> str:
    """`jane.doe@example.com` -> `j***@e***.com`: enough to tell two apart, not to mail them."""
    return _ADDRESS.sub(r"\1***@\2***\3", text or "")


def redact_secrets(text: str) -> str:
    """Authorization values and token=/key=/secret= parameters -> `[redacted]`."""
    text = _AUTHORIZATION.sub(lambda m: f"{m.group(1)}{m.group(2) + ' ' if m.group(2) else ''}{REDACTED}", text or "")
    text = _BEARER.sub(rf"\1 {REDACTED}", text)
    return _SECRET_PARAM.sub(rf"\1={REDACTED}", text)


_event_lines = itertools.count()


def event_line_due() -> bool:
    """Whether this event gets its INFO line ("stored event ...", "duplicate delivery ..."): one event in
    `MAILROOM_LOG_EVENT_SAMPLE` (1: every one); 0, the default, none. At the door's rates a line per event
    costs more CPU than its check and insert (the filters above run on every line); batches, refusals and
    warnings are always logged."""
    every = settings.MAILROOM_LOG_EVENT_SAMPLE
    return every > 0 and next(_event_lines) % every == 0


class _RewriteFilter(logging.Filter):
    rewrite = staticmethod(lambda text: text)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        rewritten = self.rewrite(message)
        if rewritten != message:
            record.msg, record.args = rewritten, None
        return True


class MaskAddressesFilter(_RewriteFilter):
    rewrite = staticmethod(mask_address)


class RedactSecretsFilter(_RewriteFilter):
    rewrite = staticmethod(redact_secrets)


class AccessLogger(GunicornLogger):
    """gunicorn's logger (`--logger-class intake.logging.AccessLogger`) without access lines for static files."""

    def access(self, resp, req, environ, request_time):
        path = environ.get("PATH_INFO") or ""
        if path in QUIET_ACCESS_PATHS or path.startswith(QUIET_ACCESS_PREFIXES):
            return
        super().access(resp, req, environ, request_time)


class LogContextFilter(logging.Filter):
    """Puts the current request id and Celery task id (or None) on the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        record.task_id = task_id_var.get()
        return True


_task_tokens: dict[str, contextvars.Token] = {}


@task_prerun.connect(dispatch_uid="intake.logging.task_id")
def _bind_task_id(task_id=None, **_):
    _task_tokens[task_id] = task_id_var.set(task_id)


@task_postrun.connect(dispatch_uid="intake.logging.task_id_reset")
def _unbind_task_id(task_id=None, **_):
    token = _task_tokens.pop(task_id, None)
    if token is not None:
        try:
            task_id_var.reset(token)
        except ValueError:  # set in another context (should not happen): just clear
            task_id_var.set(None)

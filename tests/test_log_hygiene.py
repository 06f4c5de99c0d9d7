"""Logs never carry bodies, full addresses or secrets; LOG_FORMAT=json carries request and task ids.

The pipeline test renders every record that was logged at DEBUG through the configured console handler
(its filters and formatter: what a process would print) and also checks the raw messages, which must
never hold a body line or a secret even before the filters.
"""

import io
import json
import logging
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests
from celery.signals import task_postrun, task_prerun
from django.http import HttpResponse
from django.test import Client, RequestFactory

from intake.logging import (
    ACCESS_LOG_FORMAT,
    LogContextFilter,
    MaskAddressesFilter,
    RedactSecretsFilter,
    redact_secrets,
)
from intake.middleware import RequestIdMiddleware
from tests.conftest import WEBHOOK_SECRET
from tests.live import free_port, subprocess_env
from tests.mail import make_message, webhook_headers
from tests.senderauth import stamped, trust_our_mta
from tests.smtp import smtp_server  # noqa: F401  (fixture)
from ticketing import acknowledgments
from ticketing.models import Intent
from ticketing.services import process_inbox_event

ROOT = Path(__file__).resolve().parent.parent


def console_handler() -> logging.Handler:
    """The handler settings.LOGGING installs on the root logger (the one with the masking filter)."""
    return next(
        h
        for h in logging.getLogger().handlers
        if any(isinstance(f, MaskAddressesFilter) for f in getattr(h, "filters", ()))
    )


def rendered(record: logging.LogRecord, handler: logging.Handler) -> str:
    record = logging.makeLogRecord(record.__dict__)  # the filters rewrite the record: work on a copy
    assert handler.filter(record)
    return handler.format(record)


def test_the_whole_pipeline_logs_no_body_no_address_no_secret(mailbox, scanner_off, smtp_server, caplog):
    marker = uuid.uuid4().hex[:10]
    sender = f"jane.doe.{marker}@example.com"
    body_lines = [f"My account number is 4711-{marker}.", f"The vault code is swordfish-{marker}."]
    trust_our_mta(mailbox)  # an authenticated sender: the acknowledgment goes out and is logged too
    message = stamped(
        make_message(
            subject="Printer on fire", sender=sender, to="support@acme.test", body="\n".join(body_lines) + "\n"
        )
    )
    bearer = f"bearer-{marker}"
    headers = webhook_headers(WEBHOOK_SECRET, message)
    signature_values = [v for v in headers.values() if len(v) >= 16]

    # The SMTP stand-in's own logger (aiosmtpd's mail.log, WARNING in settings.LOGGING) at DEBUG too: its lines
    # carry the acknowledgment's addresses and body, the hardest case for the filters.
    with caplog.at_level(logging.DEBUG), caplog.at_level(logging.DEBUG, logger="mail.log"):
        response = Client().post(
            f"/webhooks/raw/support/?token=query-{marker}",
            data=message,
            content_type="message/rfc822",
            HTTP_AUTHORIZATION=f"Bearer {bearer}",
            HTTP_X_REQUEST_ID=f"req-{marker}",
            **headers,
        )
        assert response.status_code == 202, response.content
        assert response["X-Request-ID"] == f"req-{marker}"
        event_id = response.json()["inbox_event_id"]
        assert process_inbox_event(event_id) == "created"
        intent = Intent.objects.get(inbox_event_id=event_id, action="notify_requester")
        assert acknowledgments.send(intent.pk, "worker-a") == "sent"
        # Someone logs a request the careless way: the filters still keep the secrets out.
        logging.getLogger("tests.careless").warning("GET /x?token=%s Authorization: Bearer %s", marker, bearer)
    assert len(smtp_server.messages) == 1

    records = caplog.records
    assert len(records) > 3, [r.getMessage() for r in records]  # the pipeline did log (DEBUG included)
    handler = console_handler()
    lines = [rendered(r, handler) for r in records]
    raw = [r.getMessage() for r in records if r.name != "tests.careless"]
    secrets = [WEBHOOK_SECRET, bearer, f"query-{marker}", *signature_values]
    for text in lines:
        for forbidden in [*body_lines, sender, "support@acme.test", *secrets, f"token={marker}"]:
            assert forbidden not in text, (forbidden, text)
    for text in raw:
        for forbidden in [*body_lines, *secrets]:
            assert forbidden not in text, (forbidden, text)
    careless = lines[-1]
    assert "token=[redacted]" in careless and "Bearer [redacted]" in careless


@pytest.mark.parametrize(
    "text, kept, gone",
    [
        ("Authorization: Bearer abc.def-ghi", "Authorization: Bearer [redacted]", "abc.def-ghi"),
        ("headers={'Authorization': 'Basic dXNlcjpwYXNz'}", "'Authorization': 'Basic [redacted]", "dXNlcjpwYXNz"),
        ("GET /hook?token=t0k3n&page=2", "token=[redacted]&page=2", "t0k3n"),
        ("url=https://x.test/?key=AIzaSyABC&x=1", "key=[redacted]&x=1", "AIzaSyABC"),
        ("access_token=zzz9 api_key=kkk9 client_secret=sss9", "access_token=[redacted] api_key=[redacted]", "kkk9"),
        ("dedupe_key=abc123 idempotency_key=def456", "dedupe_key=abc123 idempotency_key=def456", "[redacted]"),
        ("rejected: no bearer token", "no bearer token", "[redacted]"),
        ("sent Bearer eyJhbGciOi.J9x", "Bearer [redacted]", "eyJhbGciOi"),
    ],
)
def test_secrets_are_redacted_and_our_own_keys_are_not(text, kept, gone):
    out = redact_secrets(text)
    assert kept in out and gone not in out, out


def test_json_format_carries_the_request_id_and_the_task_id():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    from django.conf import settings
    from pythonjsonlogger.json import JsonFormatter

    handler.setFormatter(JsonFormatter(settings.LOGGING["formatters"]["json"]["format"]))
    for f in (LogContextFilter(), RedactSecretsFilter(), MaskAddressesFilter()):
        handler.addFilter(f)
    logger = logging.getLogger("tests.json_probe")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:

        def view(request):
            logger.info("handled for jane.doe@example.com")
            return HttpResponse("ok")

        response = RequestIdMiddleware(view)(RequestFactory().get("/x", HTTP_X_REQUEST_ID="req-42"))
        assert response["X-Request-ID"] == "req-42"
        # A header that is not a sane id is replaced by a fresh one (no log injection).
        fresh = RequestIdMiddleware(view)(RequestFactory().get("/x", HTTP_X_REQUEST_ID="a b\nINFO forged"))
        task_prerun.send(sender=None, task_id="task-7", task=None)
        logger.info("in a task")
        task_postrun.send(sender=None, task_id="task-7", task=None)
        logger.info("after")
    finally:
        logger.removeHandler(handler)
    first, second, in_task, after = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "handled for j***@e***.com" and first["request_id"] == "req-42"
    assert first["levelname"] == "INFO" and first["name"] == "tests.json_probe" and first["task_id"] is None
    assert second["request_id"] == fresh["X-Request-ID"] and len(fresh["X-Request-ID"]) == 32
    assert in_task["task_id"] == "task-7" and in_task["request_id"] is None
    assert after["task_id"] is None


def test_log_format_json_switches_the_console_handler():
    code = (
        "import django, logging; django.setup(); "
        "logging.getLogger('probe').warning('Authorization: Bearer s3cr3t for jane.doe@example.com')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(LOG_FORMAT="json"),
    )
    assert result.returncode == 0, result.stderr
    [line] = [json.loads(x) for x in result.stderr.splitlines() if x.startswith("{")]
    assert line["message"] == "Authorization: Bearer [redacted] for j***@e***.com"
    assert line["levelname"] == "WARNING" and "request_id" in line and "task_id" in line


def test_run_stack_starts_gunicorn_with_an_access_log_without_query_strings():
    from reconciliation.management.commands.run_stack import Command

    web = Command()._commands({"host": "127.0.0.1", "port": 8000, "web_workers": 1, "worker_concurrency": 1})["web"]
    assert web[web.index("--access-logformat") + 1] == ACCESS_LOG_FORMAT
    for atom in ("%(r)s", "%(q)s", "%(f)s", "%(u)s", "{authorization}i"):
        assert atom not in ACCESS_LOG_FORMAT


def test_the_access_log_has_the_path_but_not_the_query_or_the_authorization(tmp_path):
    port = free_port()
    access_log = tmp_path / "access.log"
    process = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("gunicorn")),
            "config.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--no-control-socket",
            "--access-logfile",
            str(access_log),
            "--access-logformat",
            ACCESS_LOG_FORMAT,
        ],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                response = requests.get(
                    f"{base}/healthz?token=q-s3cr3t&key=k-s3cr3t",
                    timeout=2,
                    headers={
                        "Authorization": "Bearer b-s3cr3t",
                        "X-Request-ID": "req-log-1",
                        "Referer": f"{base}/admin/?token=r-s3cr3t",
                    },
                )
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.1)
        assert response.status_code == 200
    finally:
        process.terminate()
        process.wait(10)
    log = access_log.read_text()
    assert '"GET /healthz HTTP/1.1" 200' in log and "req-log-1" in log, log
    assert "s3cr3t" not in log and "token" not in log and "key=" not in log, log

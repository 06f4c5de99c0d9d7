"""The embedded broker (config.broker): a SQLite file that several producers and consumers share.

A row it cannot decode is dropped with a WARNING that carries no body, and the worker goes on to the next
good message; several producer processes and several real Celery workers neither lose nor repeat a message
(bench/broker_embedded.py, run small). Everything runs on a broker file in a temporary folder.
"""

import base64
import json
import os
import sqlite3
import subprocess
import time
import uuid

import pytest
from kombu import Connection

from config.broker import UndecodableMessage, decode_payload
from tests.live import PYTHON, REPO_ROOT, kill_group, wait_for

GOOD_BODY = base64.b64encode(json.dumps([[1], {}, {}]).encode()).decode()


def envelope(**changes) -> str:
    payload = {
        "body": GOOD_BODY,
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"task": "x"},
        "properties": {
            "delivery_tag": "t",
            "delivery_info": {"exchange": "", "routing_key": "celery"},
            "body_encoding": "base64",
        },
    }
    payload.update(changes)
    return json.dumps(payload)


def decode(raw):
    channel = Connection(hostname="memory://").default_channel  # kombu's base64 codec, as the channel uses it
    return decode_payload(raw, decode_body=channel.decode_body, accept={"application/json"})


def test_a_good_envelope_decodes():
    assert decode(envelope())["headers"] == {"task": "x"}


@pytest.mark.parametrize(
    "raw, reason",
    [
        ("", "not JSON"),
        ('{"body": "e30=", ', "not JSON"),  # half written: celery/kombu#1551
        ('"a string"', "not an envelope"),
        (envelope(properties={"body_encoding": "base64"}), "no properties with a delivery tag"),
        (envelope(headers=["task"]), "not mappings"),
        (envelope(body=base64.b64encode(b"not json").decode()), "body not accepted"),
        (envelope(**{"content-type": "application/x-python-serialize"}), "body not accepted"),
        (envelope(body="%%%not base64%%%"), "body not"),
    ],
)
def test_an_undecodable_row_says_what_is_wrong_and_not_what_it_holds(raw, reason):
    with pytest.raises(UndecodableMessage) as caught:
        decode(raw)
    assert reason in str(caught.value)


def embedded_env(tmp_path) -> dict:
    """A development process on a SQLite database and the embedded broker, both in `tmp_path`."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "MAILROOM_ENV": "development",
            "MAILROOM_VAR_DIR": str(tmp_path),
            "MAILROOM_ENV_FILE": str(tmp_path / ".env"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


@pytest.mark.live
def test_a_worker_drops_a_corrupt_row_and_runs_the_next_good_message(tmp_path):
    env = embedded_env(tmp_path)
    log_path = tmp_path / "worker.log"
    marker = uuid.uuid4().hex
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "--loglevel",
                "INFO",
                "--concurrency",
                "1",
                "-I",
                "tests.worker_log_probe",
                "-n",
                f"broker-{marker[:8]}@%h",
            ],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: " ready." in log_path.read_text(errors="replace") or worker.poll() is not None,
            timeout=60,
            describe=lambda: log_path.read_text(errors="replace")[-2000:],
        )
        assert worker.poll() is None, log_path.read_text(errors="replace")
        broker = sqlite3.connect(tmp_path / "broker.sqlite3", timeout=30)
        queue_id = broker.execute("SELECT id FROM kombu_queue WHERE name = 'celery'").fetchone()[0]
        # What another writer could leave behind: a half-written row, and an envelope whose body holds a secret.
        for payload in ('{"body": "', envelope(body=base64.b64encode(f"secret-{marker}".encode()).decode())):
            broker.execute(
                "INSERT INTO kombu_message (visible, timestamp, payload, version, queue_id) "
                "VALUES (1, datetime('now'), ?, 1, ?)",
                (payload, queue_id),
            )
        broker.commit()
        broker.close()
        sender = subprocess.run(
            [
                PYTHON,
                "-c",
                "import django; django.setup(); from config.celery import app; "
                f"app.send_task('tests.worker_log_probe.log_text', ['after-{marker}'])",
            ],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert sender.returncode == 0, sender.stderr
        wait_for(
            lambda: f"probe: after-{marker}" in log_path.read_text(errors="replace"),
            timeout=30,
            describe=lambda: log_path.read_text(errors="replace")[-3000:],
        )
        time.sleep(1)  # a worker that stopped on the bad rows would be gone by now
        assert worker.poll() is None, log_path.read_text(errors="replace")
    finally:
        if worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        kill_group(worker.pid)
    log = log_path.read_text(errors="replace")
    drops = [line for line in log.splitlines() if "embedded broker: dropped message" in line]
    assert len(drops) == 2 and all(" WARNING " in line for line in drops), log
    assert f"secret-{marker}" not in log and base64.b64encode(f"secret-{marker}".encode()).decode() not in log
    assert "Unrecoverable error" not in log and "CRITICAL" not in log, log
    assert not sqlite3.connect(tmp_path / "broker.sqlite3").execute("SELECT COUNT(*) FROM kombu_message").fetchone()[0]


@pytest.mark.live
def test_several_producers_and_workers_lose_and_repeat_nothing():
    """bench/broker_embedded.py, small: 3 producer processes, 2 prefork workers, undecodable rows among them."""
    result = subprocess.run(
        [
            PYTHON,
            str(REPO_ROOT / "bench" / "broker_embedded.py"),
            "--producers",
            "3",
            "--messages",
            "300",
            "--workers",
            "2",
            "--concurrency",
            "2",
            "--corrupt",
            "8",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0, result.stdout + result.stderr
    assert figures == {
        **figures,
        "published": 900,
        "publish_failed": 0,
        "delivered": 900,
        "queued": 0,
        "lost": 0,
        "duplicated": 0,
        "crashed": 0,
        "errors": 0,
        "corrupt": 8,
        "dropped": 8,
    }, result.stdout

"""/healthz answers while the process is up; /readyz only when the database and the broker answer."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from django.conf import settings
from django.test import Client

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def serve():
    """Start gunicorn with the given environment overrides; stop it afterwards."""
    started = []

    def start(**env_overrides):
        port = free_port()
        env = {**os.environ, **env_overrides}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        process = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("gunicorn")),
                "config.wsgi",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                "1",
                "--no-control-socket",
                "--timeout",
                "30",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        started.append(process)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                requests.get(base + "/healthz", timeout=2)
                return base
            except (requests.ConnectionError, requests.Timeout):
                # Refused before gunicorn listens; accepted but unanswered while its worker still imports
                # the app (over a second on a busy machine).
                time.sleep(0.1)
        raise AssertionError("gunicorn did not start")

    yield start
    for process in started:
        process.terminate()
        process.wait(10)


def test_healthz_and_readyz_answer_200_when_everything_is_up(db):
    client = Client()
    assert client.get("/healthz").status_code == 200
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {"ready": True}


def test_readyz_is_503_when_the_broker_is_unreachable(db, serve):
    from django.db import connection

    closed = free_port()
    test_database = f"postgres://postgres@127.0.0.1:5432/{connection.settings_dict['NAME']}"
    base = serve(DATABASE_URL=test_database, CELERY_BROKER_URL=f"redis://127.0.0.1:{closed}/0")
    assert requests.get(base + "/healthz", timeout=5).status_code == 200
    response = requests.get(base + "/readyz", timeout=30)
    assert response.status_code == 503
    assert response.json()["problems"] == ["broker: OperationalError"]


def test_readyz_is_503_when_the_database_is_unreachable(serve):
    closed = free_port()
    base = serve(
        DATABASE_URL=f"postgres://postgres@127.0.0.1:{closed}/mailroom", CELERY_BROKER_URL=settings.CELERY_BROKER_URL
    )
    assert requests.get(base + "/healthz", timeout=5).status_code == 200
    response = requests.get(base + "/readyz", timeout=30)
    assert response.status_code == 503
    assert response.json()["problems"] == ["database: OperationalError"]

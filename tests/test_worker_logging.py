"""Workers log through the project's handlers: addresses masked, idle machinery quiet.

Celery replaces the root logger's handlers unless told not to, and with them the
filter that masks addresses. A real worker process is started with a probe task
that logs an address, and its captured log is read.
"""

import uuid

import pytest

from config.test_settings import redis_database
from tests.live import PYTHON, flushed_broker, live_processes, subprocess_env, wait_for  # noqa: F401  (fixtures)

# A Redis database of its own: the pipeline's live tests flush theirs.
PROBE_REDIS_DB = redis_database("probe")


@pytest.fixture
def probe_broker():
    with flushed_broker(PROBE_REDIS_DB) as broker:
        yield broker


pytestmark = pytest.mark.live


def test_a_worker_process_masks_addresses_and_stays_quiet_about_routine_tasks(
    transactional_db, probe_broker, live_processes, monkeypatch
):
    from celery import Celery

    # Celery prefers $CELERY_BROKER_URL (this process's own broker) to broker=.
    monkeypatch.setenv("CELERY_BROKER_URL", probe_broker.url)

    env = subprocess_env(probe_broker.url)
    worker = live_processes.start(
        "worker",
        [
            PYTHON,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--concurrency",
            "1",
            "--loglevel",
            "INFO",
            "-I",
            "tests.worker_log_probe",
            "-n",
            f"probe-{uuid.uuid4().hex[:8]}@%h",
            "--without-mingle",
            "--without-gossip",
        ],
        env,
    )
    sender = Celery(broker=probe_broker.url, set_as_current=False)
    marker = uuid.uuid4().hex[:8]
    sender.send_task("tests.worker_log_probe.log_text", [f"reply to jane.doe.{marker}@example.com"])
    sender.close()
    wait_for(
        lambda: "probe: reply to j***@e***.com" in worker.tail(200),
        timeout=60,
        interval=0.5,
        describe=lambda: worker.tail(60),
    )
    log = worker.log_path.read_text(errors="replace")
    assert f"jane.doe.{marker}@example.com" not in log
    assert "probe: reply to j***@e***.com" in log
    # At INFO, a task received/succeeded is not a line of its own (CELERY_LOG_LEVEL keeps them at WARNING).
    assert "Task tests.worker_log_probe.log_text" not in log and "Received task" not in log


def test_mailroom_var_dir_set_in_the_env_file_takes_effect(tmp_path):
    import subprocess

    from tests.live import REPO_ROOT

    env_file = tmp_path / "mailroom.env"
    env_file.write_text(f"MAILROOM_VAR_DIR={tmp_path / 'state'}\n")
    env = {k: v for k, v in subprocess_env().items() if k not in ("MAILROOM_VAR_DIR", "DATABASE_URL")}
    env["MAILROOM_ENV_FILE"] = str(env_file)
    shown = subprocess.run(
        [
            PYTHON,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.VAR_DIR); print(settings.DATABASES['default']['NAME'])",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert shown == [str(tmp_path / "state"), str(tmp_path / "state" / "mailroom.sqlite3")]

"""A task that only logs what it is given: loaded into a real worker (`celery worker -I ...`) by
tests/test_worker_logging.py, to see what the worker's log handlers do with an address."""

import logging

from celery import shared_task

logger = logging.getLogger("intake.probe")


@shared_task(name="tests.worker_log_probe.log_text")
def log_text(text: str) -> None:
    logger.warning("probe: %s", text)

"""Readiness: whether this process can serve (`GET /readyz`, intake.views).

The broker is the Celery app this process runs, `celery.current_app` (config/__init__.py makes
`config.celery.app` current when Django starts), so intake never imports `config`.
"""

from __future__ import annotations

from celery import current_app
from django.db import connection


def readiness_problems() -> list[str]:
    """What keeps this process from serving: an unreachable database or broker ([] when ready)."""
    problems = []
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        problems.append(f"database: {type(exc).__name__}")
    try:
        with current_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:
        problems.append(f"broker: {type(exc).__name__}")
    return problems

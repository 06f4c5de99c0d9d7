"""`manage.py` in a fresh process with production's environment (nothing of the suite's own)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
REAL_KEY = "q7Vd2-cJx9LwZr4Tn8YbHs1Pk6Gm3Fa0Ue5Oi_Ql2Ws7Ej4Rt9Yu6Ip3As8Df1Gh"

# The production environment of README "Running on PostgreSQL and Redis with several workers".
PRODUCTION_ENV = {
    "SECRET_KEY": REAL_KEY,
    "ALLOWED_HOSTS": "mailroom.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://mailroom.example.com",
    "MAILROOM_TRUST_X_FORWARDED_PROTO": "true",
    "SECURE_HSTS_PRELOAD": "true",
}


def clean_env(**extra) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MAILROOM_", "SECURE_", "SESSION_", "CSRF_"))
        and k not in ("SECRET_KEY", "DEBUG", "ALLOWED_HOSTS", "DJANGO_SETTINGS_MODULE")
    }
    env["MAILROOM_ENV_FILE"] = str(ROOT / "tests" / "no-such.env")
    env.update(extra)
    return env


def manage(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )

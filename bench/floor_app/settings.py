"""Minimal settings: no apps, no middleware, no logging config, one database (DATABASE_URL)."""

import os
from urllib.parse import urlsplit

_url = urlsplit(os.environ["DATABASE_URL"])

DEBUG = False
SECRET_KEY = "floor-bench-only"
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "floor_app.views"
USE_TZ = True
TIME_ZONE = "UTC"
DATA_UPLOAD_MAX_MEMORY_SIZE = 25 * 1024 * 1024 + 1
# The app's persistent connections (CONN_MAX_AGE 60), without its per-request health check.
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/").split("?")[0],
        "USER": _url.username or "postgres",
        "PASSWORD": _url.password or "",
        "HOST": _url.hostname or "127.0.0.1",
        "PORT": _url.port or 5432,
        "CONN_MAX_AGE": 60,
        "OPTIONS": {"application_name": "floor"},
    }
}

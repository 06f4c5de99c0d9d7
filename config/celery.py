import os

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("mailroom")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# `manage.py run_stack` names a file per worker: written once the worker consumes, whatever LOG_LEVEL hides.
READY_FILE_VAR = "MAILROOM_WORKER_READY_FILE"


@worker_ready.connect(dispatch_uid="config.celery.ready_file")
def _write_ready_file(**_):
    path = os.environ.get(READY_FILE_VAR)
    if path:
        with open(path, "w") as handle:
            handle.write(f"{os.getpid()}\n")

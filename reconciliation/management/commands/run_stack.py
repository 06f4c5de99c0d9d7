"""Run web, worker(s), beat and the outbox relay (and the LMTP listener when MAILROOM_LMTP_PORT is set) in the
foreground; Ctrl-C stops them all. With MAILROOM_DESTINATION_QUEUE set (the default on PostgreSQL) a second
worker, `--pool threads`, makes the external destination calls (ticketing.bulkhead).

A development tool (`make run`, which sets MAILROOM_ENV=development: plain HTTP on 127.0.0.1); the
children inherit this process's environment. The web's access log has no query strings (ACCESS_LOG_FORMAT).
"""
import os
import signal
import subprocess
import sys
import time
import urllib.request

from django.conf import settings
from django.core.management.base import BaseCommand

from intake.logging import ACCESS_LOG_FORMAT
from reconciliation.services import DEMO_PASSWORD_VAR


class Command(BaseCommand):
    help = ("Start web (gunicorn), a Celery worker (and a thread-pool one for destination calls when "
            "MAILROOM_DESTINATION_QUEUE is set), beat, the relay and, when MAILROOM_LMTP_PORT is set, the LMTP "
            "listener; stop all of them on Ctrl-C.")

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--web-workers", type=int, default=2)
        parser.add_argument("--worker-concurrency", type=int, default=2)

    def _commands(self, options):
        python = sys.executable
        bin_dir = os.path.dirname(python)
        celery = [python, "-m", "celery", "-A", "config"]
        return {
            "web": [os.path.join(bin_dir, "gunicorn"), "config.wsgi", "--bind", f"{options['host']}:{options['port']}",
                    "--workers", str(options["web_workers"]), "--access-logfile", "-",
                    "--access-logformat", ACCESS_LOG_FORMAT, "--no-control-socket"],
            **self._worker_commands(celery, options),
            "beat": celery + ["beat", "--loglevel", "INFO", "--scheduler",
                              "django_celery_beat.schedulers:DatabaseScheduler"],
            "relay": [python, "manage.py", "run_relay"],
            **self._lmtp_command(python),
        }

    def _worker_commands(self, celery, options):
        """Prefork for the CPU stages; with MAILROOM_DESTINATION_QUEUE set, a thread-pool worker for the
        external destination calls (I/O: ticketing.bulkhead). Without it one worker does everything."""
        worker = celery + ["worker", "--loglevel", "INFO", "--concurrency", str(options["worker_concurrency"])]
        queue = settings.MAILROOM_DESTINATION_QUEUE
        if not queue:
            return {"worker": worker}
        return {"worker": worker + ["-Q", settings.CELERY_TASK_DEFAULT_QUEUE, "-n", "worker@%h"],
                "calls": celery + ["worker", "--loglevel", "INFO", "--pool", "threads", "--concurrency",
                                   str(settings.MAILROOM_DESTINATION_THREADS), "-Q", queue, "-n", "calls@%h"]}

    def _lmtp_command(self, python):
        """The LMTP listener (manage.py run_lmtp), only when MAILROOM_LMTP_PORT is set."""
        port = os.environ.get("MAILROOM_LMTP_PORT", "").strip()
        if not port:
            return {}
        host = os.environ.get("MAILROOM_LMTP_HOST", "").strip() or "127.0.0.1"
        return {"lmtp": [python, "manage.py", "run_lmtp", "--host", host, "--port", port]}

    def _banner(self, options):
        base = f"http://{options['host']}:{options['port']}"
        password = os.environ.get(DEMO_PASSWORD_VAR, "(see .env)")
        self.stdout.write(self.style.SUCCESS("\nMailroom is starting (Ctrl-C stops everything)\n"))
        self.stdout.write(f"  admin:     {base}/admin/")
        self.stdout.write(f"  user:      admin\n  password:  {password}")
        self.stdout.write(f"  database:  {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}"
                          f"   broker: {settings.CELERY_BROKER_URL.split('://')[0]}")
        if os.environ.get("MAILROOM_LMTP_PORT", "").strip():
            host = os.environ.get("MAILROOM_LMTP_HOST", "").strip() or "127.0.0.1"
            self.stdout.write(f"  lmtp:      {host}:{os.environ['MAILROOM_LMTP_PORT'].strip()} (manage.py run_lmtp)")
        self.stdout.write("\n  send a signed sample email to the webhook:")
        self.stdout.write(f"    PORT={options['port']} .venv/bin/python manage.py send_test_email demo\n")
        self.stdout.flush()

    def _wait_until_serving(self, options, web, timeout: float = 20.0) -> None:
        """Print the copy-paste command only once it can work."""
        url = f"http://{options['host']}:{options['port']}/healthz"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and web.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=1):
                    return
            except OSError:
                time.sleep(0.2)

    def handle(self, *args, **options):
        if settings.CELERY_BROKER_URL.startswith("filesystem://"):
            for folder in ("data_folder_in", "processed_folder", "control_folder"):
                os.makedirs(settings.CELERY_BROKER_TRANSPORT_OPTIONS[folder], exist_ok=True)
        processes = {}
        stopping = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopping.append(True))
        try:
            for name, command in self._commands(options).items():
                # Each child in its own process group: Ctrl-C reaches us, and we stop them in order.
                processes[name] = subprocess.Popen(command, cwd=settings.BASE_DIR, start_new_session=True)
            self._wait_until_serving(options, processes["web"])
            self._banner(options)
            while not stopping:
                for name, process in processes.items():
                    if process.poll() is not None:
                        self.stderr.write(f"{name} exited with {process.returncode}; stopping the rest")
                        stopping.append(True)
                        break
                time.sleep(0.5)
        finally:
            for process in processes.values():
                if process.poll() is None:
                    process.terminate()  # the parent shuts its own children down (Celery: warm shutdown)
            deadline = time.monotonic() + 15
            for process in processes.values():
                try:
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
        self.stdout.write("stopped")

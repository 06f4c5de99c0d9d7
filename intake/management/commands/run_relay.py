import signal

from django.core.management.base import BaseCommand

from intake import relay


class Command(BaseCommand):
    help = "Publish committed outbox rows to Celery: at once on NOTIFY, and by a sweep every few seconds."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="publish what is pending now, then exit")
        parser.add_argument("--sweep-seconds", type=float, default=None)

    def handle(self, *args, **options):
        if options["once"]:
            self.stdout.write(f"published {relay.publish_all_pending()} outbox rows")
            return
        stopping = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopping.append(True))
        relay.run_relay(stop=lambda: bool(stopping), sweep_seconds=options["sweep_seconds"])

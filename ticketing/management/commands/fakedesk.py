"""`manage.py fakedesk`: run FakeDesk, the fault-injecting Zendesk stand-in, in the foreground.

The same server and options as `python -m fakedesk`; see the top-level `fakedesk`
package for the API and the faults. Runs until SIGTERM or Ctrl-C. This command
is the only module of the `ticketing` app that imports `fakedesk`.
"""

from argparse import Namespace

from django.core.management.base import BaseCommand

from fakedesk.cli import add_arguments, desk_from_options, run_until_signalled


class Command(BaseCommand):
    help = "Run FakeDesk, a fault-injecting Zendesk ticket API stand-in, until SIGTERM or Ctrl-C."
    # It touches neither the database nor the models: start even while they are being migrated.
    requires_system_checks = []

    def add_arguments(self, parser):
        add_arguments(parser)

    def handle(self, *args, **options):
        run_until_signalled(desk_from_options(Namespace(**options)), out=self.stdout)

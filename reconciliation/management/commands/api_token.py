"""`manage.py api_token <username>`: make a REST API token for the user and print it, once."""
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from reconciliation import services


class Command(BaseCommand):
    help = "Create a REST API token for a user and print it (shown once; only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username, **options):
        user = get_user_model()._default_manager.filter(**{get_user_model().USERNAME_FIELD: username}).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
        if not user.is_active:
            raise CommandError(f"user {username!r} is not active")
        self.stdout.write(services.do_issue_api_token(user))

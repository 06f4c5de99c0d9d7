"""`manage.py api_token <username> [--name N] [--expires-in-days D]`: make a REST API token for the user and
print it, once (the user issues it for themselves: `reconciliation.services.api_tokens`)."""

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from reconciliation import services


class Command(BaseCommand):
    help = "Create a REST API token for a user and print it (shown once; only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="what the token is for (shown in the console)")
        parser.add_argument(
            "--expires-in-days", type=int, default=None, help="refused after this many days (default: never expires)"
        )

    def handle(self, *args, username, name="", expires_in_days=None, **options):
        user = get_user_model()._default_manager.filter(**{get_user_model().USERNAME_FIELD: username}).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
        if not user.is_active:
            raise CommandError(f"user {username!r} is not active")
        try:
            token = services.do_issue_api_token(user, name=name, expires_in_days=expires_in_days)
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from None
        self.stdout.write(token)

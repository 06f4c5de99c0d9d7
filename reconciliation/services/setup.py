"""Demo set-up (`manage.py bootstrap_demo`, `make run`): a tenant, a mailbox, a destination and an admin.

Secrets go to the `.env` file, never to the database.
"""
import os
import secrets
from pathlib import Path

from django.contrib.auth import get_user_model
from django.db import transaction

from intake.models import Mailbox, Tenant
from ticketing.models import Destination

DEMO_SECRET_VAR = "MAILROOM_DEMO_WEBHOOK_SECRET"
DEMO_PASSWORD_VAR = "MAILROOM_DEMO_ADMIN_PASSWORD"


def ensure_env_secret(env_file: Path, name: str) -> str:
    """The value of `name` from the environment or `env_file`; generated and appended when missing."""
    value = os.environ.get(name)
    if value:
        return value
    value = secrets.token_urlsafe(24)
    with env_file.open("a") as handle:
        handle.write(f"{name}={value}\n")
    env_file.chmod(0o600)
    os.environ[name] = value
    return value


@transaction.atomic
def do_bootstrap_demo(env_file: Path, admin_username: str = "admin") -> dict:
    """A demo tenant, mailbox `demo`, the built-in default destination and an admin user.

    Secrets go to `env_file` (never the database); running it again changes nothing.
    """
    ensure_env_secret(env_file, DEMO_SECRET_VAR)
    password = ensure_env_secret(env_file, DEMO_PASSWORD_VAR)
    tenant, _ = Tenant.objects.get_or_create(slug="demo", defaults={"name": "Demo"})
    mailbox, _ = Mailbox.objects.get_or_create(slug="demo", defaults={
        "tenant": tenant, "address": "support@demo.mailroom.test", "provider": Mailbox.Provider.RAW,
        "webhook_secret_ref": f"env:{DEMO_SECRET_VAR}", "allowed_recipients": ["support@demo.mailroom.test"],
    })
    Destination.objects.get_or_create(tenant=tenant, slug="builtin", defaults={
        "kind": Destination.Kind.BUILTIN, "is_default": True})
    user_model = get_user_model()
    user = user_model.objects.filter(username=admin_username).first() or user_model(username=admin_username)
    user.is_staff = user.is_superuser = True
    user.set_password(password)
    user.save()
    tenant.members.add(user)
    return {"username": admin_username, "password": password, "mailbox": mailbox.slug}

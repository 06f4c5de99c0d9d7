"""Demo set-up (`manage.py bootstrap_demo`, `make run`): a tenant, a mailbox, a destination and an admin.

Secrets go to the `.env` file, never to the database.
"""
import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from intake.models import Mailbox, Tenant
from ticketing.models import Destination

DEMO_SECRET_VAR = "MAILROOM_DEMO_WEBHOOK_SECRET"
DEMO_PASSWORD_VAR = "MAILROOM_DEMO_ADMIN_PASSWORD"
DEMO_SECRET_REF = f"env:{DEMO_SECRET_VAR}"
PLATFORM_REFS_VAR = "MAILROOM_PLATFORM_SECRET_REFS"


def ensure_env_secret(env_file: Path, name: str, nbytes: int = 24) -> str:
    """The value of `name` from the environment or `env_file`; generated and appended when missing."""
    value = os.environ.get(name)
    if value:
        return value
    value = secrets.token_urlsafe(nbytes)
    with env_file.open("a") as handle:
        handle.write(f"{name}={value}\n")
    env_file.chmod(0o600)
    os.environ[name] = value
    return value


def ensure_platform_ref(env_file: Path, ref: str) -> bool:
    """List `ref` in MAILROOM_PLATFORM_SECRET_REFS through `env_file` (read when the next process starts).

    The demo's webhook secret is a platform reference, not in its tenant's scope (intake.secrets). False
    (and nothing written) when the variable is already set without it: the operator chose that list.
    """
    if ref in settings.MAILROOM_PLATFORM_SECRET_REFS or ref in os.environ.get(PLATFORM_REFS_VAR, "").split(","):
        return True
    if os.environ.get(PLATFORM_REFS_VAR):
        return False
    with env_file.open("a") as handle:
        handle.write(f"{PLATFORM_REFS_VAR}={ref}\n")
    env_file.chmod(0o600)
    os.environ[PLATFORM_REFS_VAR] = ref
    return True


@transaction.atomic
def do_bootstrap_demo(env_file: Path, admin_username: str = "admin") -> dict:
    """A demo tenant, mailbox `demo`, the built-in default destination and an admin user.

    Secrets go to `env_file` (never the database); running it again changes nothing.
    """
    # Django's own key: commands run from this checkout without MAILROOM_ENV=development (the printed
    # send_test_email, `manage.py shell`) start only with a real SECRET_KEY.
    ensure_env_secret(env_file, "SECRET_KEY", nbytes=50)
    ensure_env_secret(env_file, DEMO_SECRET_VAR)
    listed = ensure_platform_ref(env_file, DEMO_SECRET_REF)
    password = ensure_env_secret(env_file, DEMO_PASSWORD_VAR)
    tenant, _ = Tenant.objects.get_or_create(slug="demo", defaults={"name": "Demo"})
    mailbox, _ = Mailbox.objects.get_or_create(slug="demo", defaults={
        "tenant": tenant, "address": "support@demo.mailroom.test", "provider": Mailbox.Provider.RAW,
        "webhook_secret_ref": DEMO_SECRET_REF, "allowed_recipients": ["support@demo.mailroom.test"],
    })
    Destination.objects.get_or_create(tenant=tenant, slug="builtin", defaults={
        "kind": Destination.Kind.BUILTIN, "is_default": True})
    user_model = get_user_model()
    user = user_model.objects.filter(username=admin_username).first() or user_model(username=admin_username)
    user.is_staff = user.is_superuser = True
    user.set_password(password)
    user.save()
    tenant.members.add(user)
    return {"username": admin_username, "password": password, "mailbox": mailbox.slug, "secret_ref_listed": listed}

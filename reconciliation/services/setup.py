"""Demo set-up (`manage.py bootstrap_demo`, `make run`): a tenant, a mailbox, a destination and an admin.

Secrets go to the `.env` file, never to the database.
"""

import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from intake.domains import verify_domain
from intake.models import Mailbox, Tenant
from intake.secrets import ANY_ROW, parse_platform_refs
from ticketing.models import Destination

DEMO_SECRET_VAR = "MAILROOM_DEMO_WEBHOOK_SECRET"
DEMO_PASSWORD_VAR = "MAILROOM_DEMO_ADMIN_PASSWORD"
DEMO_SECRET_REF = f"env:{DEMO_SECRET_VAR}"
DEMO_DOMAIN = "demo.mailroom.test"  # verified for the demo tenant: mailboxes use only their tenant's domains
DEMO_ADDRESS = f"support@{DEMO_DOMAIN}"
DEMO_MAILBOX_SLUG = "demo"
DEMO_SECRET_OWNER = f"mailbox:{DEMO_MAILBOX_SLUG}"  # its binding (intake.secrets)
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


def ensure_platform_ref(env_file: Path, ref: str, owner: str) -> bool:
    """Bind `ref` to `owner` in MAILROOM_PLATFORM_SECRET_REFS through `env_file` (read when the next process
    starts): the demo's webhook secret is a platform reference, bound to the demo mailbox (intake.secrets).

    True when the list binds it already (to `owner` or `*`), or now does. The unbound entry this function wrote
    before bindings existed is rewritten in `env_file`. False (and nothing written) when the variable is set
    without the binding some other way: the operator chose that list.
    """
    current = os.environ.get(PLATFORM_REFS_VAR, "")
    parsed = parse_platform_refs([*settings.MAILROOM_PLATFORM_SECRET_REFS, *current.split(",")])
    owners = parsed.bindings.get(ref, frozenset())
    if owner in owners or (ANY_ROW in owners and ref not in parsed.unbound):
        return True
    entry = f"{ref}={owner}"
    if current == ref and env_file.exists():
        lines = env_file.read_text().splitlines(keepends=True)
        old_line = f"{PLATFORM_REFS_VAR}={ref}"
        if any(line.rstrip("\n") == old_line for line in lines):
            env_file.write_text(
                "".join(f"{PLATFORM_REFS_VAR}={entry}\n" if line.rstrip("\n") == old_line else line for line in lines)
            )
            os.environ[PLATFORM_REFS_VAR] = entry
            return True
    if current:
        return False
    with env_file.open("a") as handle:
        handle.write(f"{PLATFORM_REFS_VAR}={entry}\n")
    env_file.chmod(0o600)
    os.environ[PLATFORM_REFS_VAR] = entry
    return True


@transaction.atomic
def do_bootstrap_demo(env_file: Path, admin_username: str = "admin") -> dict:
    """A demo tenant, mailbox `demo`, the built-in default destination and an admin user.

    Secrets go to `env_file` (never the database); running it again changes nothing. The admin's password is
    set once, when the user is made (or when `env_file` lost it and a new one was generated): setting it on
    every run would change its hash and log every browser out.
    """
    # Django's own key: commands run from this checkout without MAILROOM_ENV=development (the printed
    # send_test_email, `manage.py shell`) start only with a real SECRET_KEY.
    ensure_env_secret(env_file, "SECRET_KEY", nbytes=50)
    ensure_env_secret(env_file, DEMO_SECRET_VAR)
    listed = ensure_platform_ref(env_file, DEMO_SECRET_REF, DEMO_SECRET_OWNER)
    password_is_new = not os.environ.get(DEMO_PASSWORD_VAR)
    password = ensure_env_secret(env_file, DEMO_PASSWORD_VAR)
    tenant, _ = Tenant.objects.get_or_create(slug="demo", defaults={"name": "Demo"})
    verify_domain(tenant=tenant, domain=DEMO_DOMAIN, verified_by="bootstrap_demo")
    mailbox, _ = Mailbox.objects.get_or_create(
        slug=DEMO_MAILBOX_SLUG,
        defaults={
            "tenant": tenant,
            "address": DEMO_ADDRESS,
            "provider": Mailbox.Provider.RAW,
            "webhook_secret_ref": DEMO_SECRET_REF,
            "allowed_recipients": [DEMO_ADDRESS],
        },
    )
    Destination.objects.get_or_create(
        tenant=tenant, slug="builtin", defaults={"kind": Destination.Kind.BUILTIN, "is_default": True}
    )
    user_model = get_user_model()
    user = user_model.objects.filter(username=admin_username).first() or user_model(username=admin_username)
    password_set = user.pk is None or password_is_new or not user.has_usable_password()
    if password_set:
        user.set_password(password)
    if password_set or not (user.is_staff and user.is_superuser):
        user.is_staff = user.is_superuser = True
        user.save()
    tenant.members.add(user)
    return {
        "username": admin_username,
        "password": password,
        "password_set": password_set,
        "mailbox": mailbox.slug,
        "secret_ref_listed": listed,
    }

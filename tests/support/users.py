"""Staff users: `make_user` (roles, tenants, permissions), API tokens, logging in, the roles' fixtures."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command

PASSWORD = "correct horse battery staple 42"


def make_user(username, groups=(), tenants=(), perms=(), **flags):
    """A staff user who logs in with PASSWORD: in the role groups `groups`, a member of `tenants`, with the
    extra permissions `perms` ("app_label.codename") and the user fields `flags` (is_superuser=True, ...).

    Read back from the database, so its permission cache starts empty.
    """
    from reconciliation.services import ensure_role_groups

    ensure_role_groups()
    user = get_user_model().objects.create_user(username, f"{username}@staff.test", PASSWORD, is_staff=True, **flags)
    user.groups.set(Group.objects.filter(name__in=groups))
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    for tenant in tenants:
        tenant.members.add(user)
    return get_user_model().objects.get(pk=user.pk)  # fresh permission cache


@pytest.fixture
def operator(tenant):
    return make_user("oper", groups=["operator"], tenants=[tenant])


@pytest.fixture
def security(tenant):
    return make_user("sec", groups=["security"], tenants=[tenant])


@pytest.fixture
def operator_client(client, operator):
    client.force_login(operator)
    return client


def token_for(user) -> str:
    out = io.StringIO()
    call_command("api_token", user.get_username(), stdout=out)
    return out.getvalue().strip()


def log_in(page, base, username):
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/")

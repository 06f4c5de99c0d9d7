"""Login throttling (django-axes): a user is locked out from an IP after MAILROOM_LOGIN_FAILURE_LIMIT failures."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

PASSWORD = "correct horse battery staple"
LOGIN = "/admin/login/?next=/admin/"


@pytest.fixture
def admin_user(db):
    return get_user_model().objects.create_superuser("ada", "ada@example.com", PASSWORD)


def attempt(client: Client, password: str):
    return client.post(LOGIN, {"username": "ada", "password": password, "next": "/admin/"})


def logged_in(client: Client) -> bool:
    return client.get("/admin/").status_code == 200


def test_the_configuration():
    assert settings.AUTHENTICATION_BACKENDS[0] == "axes.backends.AxesStandaloneBackend"
    assert settings.AXES_FAILURE_LIMIT == 5  # MAILROOM_LOGIN_FAILURE_LIMIT's default
    assert settings.AXES_LOCKOUT_PARAMETERS == [["username", "ip_address"]]
    assert settings.AXES_COOLOFF_TIME.total_seconds() == 30 * 60


def test_the_admin_login_locks_a_user_out_after_the_configured_failures(admin_user):
    from axes.models import AccessAttempt

    client = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        response = attempt(client, "wrong")
        assert response.status_code == 200 and not logged_in(client)  # the form again, with an error
    assert attempt(client, "wrong").status_code == 429  # the limit-th failure locks
    # Locked: the right password is refused too.
    response = attempt(client, PASSWORD)
    assert response.status_code == 429
    assert not logged_in(client)
    attempt_row = AccessAttempt.objects.get(username="ada", ip_address="203.0.113.7")
    assert attempt_row.failures_since_start >= settings.AXES_FAILURE_LIMIT

    # Per user and IP: the same user from another address, and another user from this one, still log in.
    other_ip = Client(REMOTE_ADDR="198.51.100.9")
    assert attempt(other_ip, PASSWORD).status_code == 302 and logged_in(other_ip)

    # Operators see attempts and lockouts in the admin.
    staff = Client()
    staff.force_login(admin_user)  # force_login does not go through the axes backend
    assert staff.get("/admin/axes/accessattempt/").status_code == 200
    assert "203.0.113.7" in staff.get("/admin/axes/accessattempt/").content.decode()


def test_a_success_before_the_limit_resets_the_count(admin_user):
    client = Client(REMOTE_ADDR="203.0.113.8")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt(client, "wrong")
    assert attempt(client, PASSWORD).status_code == 302
    client.logout()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt(client, "wrong").status_code == 200
    assert attempt(client, PASSWORD).status_code == 302


def test_the_failure_limit_is_a_setting(admin_user, settings):
    settings.AXES_FAILURE_LIMIT = 2
    client = Client(REMOTE_ADDR="203.0.113.9")
    assert attempt(client, "wrong").status_code == 200
    assert attempt(client, "wrong").status_code == 429
    assert attempt(client, PASSWORD).status_code == 429

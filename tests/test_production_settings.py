"""Production is the default: HTTPS-only switches on, and no start without a real SECRET_KEY.

Each case starts a fresh `manage.py` process with a clean environment (nothing of the suite's own
MAILROOM_ENV=development, no `.env`), as an operator's shell would.
"""

import json

from tests.support.production import PRODUCTION_ENV, REAL_KEY, clean_env, manage

SWITCHES = (
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_PROXY_SSL_HEADER",
    "CSRF_TRUSTED_ORIGINS",
)


def switches(env: dict) -> dict:
    code = (
        f"from django.conf import settings; import json; print(json.dumps({{n: getattr(settings, n, None) "
        f"for n in {SWITCHES!r}}}))"
    )
    result = manage(env, "shell", "-c", code)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_check_deploy_is_clean_in_the_documented_production_environment():
    result = manage(clean_env(**PRODUCTION_ENV), "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr


def test_production_defaults_are_https_only():
    shown = switches(clean_env(SECRET_KEY=REAL_KEY))
    assert shown["SECURE_SSL_REDIRECT"] is True
    assert shown["SECURE_HSTS_SECONDS"] >= 31536000 and shown["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is True
    assert shown["SECURE_HSTS_PRELOAD"] is False  # opt-in
    assert shown["SESSION_COOKIE_SECURE"] is True and shown["CSRF_COOKIE_SECURE"] is True
    assert shown["SECURE_PROXY_SSL_HEADER"] is None  # X-Forwarded-Proto is trusted only when told
    assert shown["CSRF_TRUSTED_ORIGINS"] == []
    proxied = switches(clean_env(**PRODUCTION_ENV))
    assert proxied["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert proxied["CSRF_TRUSTED_ORIGINS"] == ["https://mailroom.example.com"]
    assert proxied["SECURE_HSTS_PRELOAD"] is True
    # Each switch can be turned off on its own (e.g. TLS terminated elsewhere and no redirect wanted).
    assert switches(clean_env(SECRET_KEY=REAL_KEY, SECURE_SSL_REDIRECT="false"))["SECURE_SSL_REDIRECT"] is False


def test_development_is_plain_http():
    shown = switches(clean_env(MAILROOM_ENV="development"))
    assert shown["SECURE_SSL_REDIRECT"] is False and shown["SECURE_HSTS_SECONDS"] == 0
    assert shown["SESSION_COOKIE_SECURE"] is False and shown["CSRF_COOKIE_SECURE"] is False


def test_start_up_is_refused_without_a_real_secret_key():
    for env in (
        clean_env(),
        clean_env(SECRET_KEY=""),
        clean_env(SECRET_KEY="django-insecure-abc" + "x" * 50),
        clean_env(SECRET_KEY="insecure-development-key-set-SECRET_KEY-in-production"),
    ):
        result = manage(env, "check")
        assert result.returncode != 0
        assert "ImproperlyConfigured: SECRET_KEY is missing or a development key" in result.stderr, result.stderr
    # The same without a key is fine in development (make run, the test settings).
    assert manage(clean_env(MAILROOM_ENV="development"), "check").returncode == 0
    result = manage(clean_env(MAILROOM_ENV="staging", SECRET_KEY=REAL_KEY), "check")
    assert result.returncode != 0 and "MAILROOM_ENV must be" in result.stderr


def test_the_suite_and_its_child_processes_run_as_development():
    from django.conf import settings

    from tests.live import subprocess_env

    assert settings.MAILROOM_ENV == "development" and not settings.SECURE_SSL_REDIRECT
    assert subprocess_env()["MAILROOM_ENV"] == "development"

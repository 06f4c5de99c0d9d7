"""Settings, read from the environment and an optional `.env` (django-environ).

With nothing set, Mailroom runs on the embedded default: a SQLite database and a
SQLite Celery broker (config.broker) under `var/`. `DATABASE_URL` and `CELERY_BROKER_URL`
switch it to PostgreSQL and Redis/RabbitMQ.
"""

import ipaddress
import os
from datetime import timedelta
from pathlib import Path

import environ
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
# Read first: every setting below, MAILROOM_VAR_DIR included, may come from `.env`.
environ.Env.read_env(env.str("MAILROOM_ENV_FILE", default=str(BASE_DIR / ".env")), overwrite=False)
VAR_DIR = Path(env.str("MAILROOM_VAR_DIR", default=str(BASE_DIR / "var")))

DEBUG = env.bool("DEBUG", default=False)
# `production` (the default) or `development`: `make run` and the test settings set `development`, which
# allows the built-in development SECRET_KEY and turns the HTTPS-only defaults below off (plain HTTP on
# 127.0.0.1). Anything else must bring a real SECRET_KEY or it does not start.
MAILROOM_ENV = env.str("MAILROOM_ENV", default="production")
if MAILROOM_ENV not in ("production", "development"):
    raise ImproperlyConfigured(f"MAILROOM_ENV must be 'production' or 'development', not {MAILROOM_ENV!r}")
DEVELOPMENT_SECRET_KEY = "insecure-development-key-set-SECRET_KEY-in-production"
SECRET_KEY = env.str("SECRET_KEY", default="") or DEVELOPMENT_SECRET_KEY
if MAILROOM_ENV != "development" and (
    SECRET_KEY == DEVELOPMENT_SECRET_KEY or SECRET_KEY.startswith(("django-insecure-", "insecure-"))
):
    raise ImproperlyConfigured(
        "SECRET_KEY is missing or a development key. Set SECRET_KEY to a long random value (e.g. "
        "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`), or MAILROOM_ENV=development "
        "for a local development instance."
    )
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
# HTTPS-only defaults in production (DEBUG off, MAILROOM_ENV not development); each has its own switch.
_SECURE_DEFAULT = MAILROOM_ENV != "development" and not DEBUG
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=_SECURE_DEFAULT)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]  # load-balancer probes may speak plain HTTP
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000 if _SECURE_DEFAULT else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=_SECURE_DEFAULT)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)  # a commitment: opt in
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=_SECURE_DEFAULT)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=_SECURE_DEFAULT)
# Only behind a proxy that sets X-Forwarded-Proto itself (and strips a client's): otherwise spoofable.
if env.bool("MAILROOM_TRUST_X_FORWARDED_PROTO", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "config.apps.MailroomAdminConfig",  # django.contrib.admin with the Mailroom site (config.admin_site)
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI assets for /api/docs/, served from /static/
    "django_celery_beat",
    "axes",
    "intake",
    "ticketing",
    "reconciliation",
]

MIDDLEWARE = [
    # A request id for every log line of the request (X-Request-ID or a new one), webhooks included.
    "intake.middleware.RequestIdMiddleware",
    # Next: provider webhooks need none of the browser middleware below.
    "intake.middleware.WebhookShortcutMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # A strict Content-Security-Policy on every page (MAILROOM_CONTENT_SECURITY_POLICY).
    "intake.middleware.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: turns a lockout into its 429 answer.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'mailroom.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, worker, beat, relay) share the file: WAL lets
    # readers run beside the writer, IMMEDIATE takes the write lock up front so
    # two writers queue instead of deadlocking on a lock upgrade.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    }
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=60))
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
USING_POSTGRES = DATABASES["default"]["ENGINE"].startswith("django.db.backends.postgresql")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Login throttling (django-axes): after MAILROOM_LOGIN_FAILURE_LIMIT failed logins of one user from one
# IP address, that combination is locked out for MAILROOM_LOGIN_COOLOFF_MINUTES, a correct password
# included. Attempts and lockouts are in the admin (Axes); `manage.py axes_reset_username NAME` unlocks.
# The IP is REMOTE_ADDR. The axes backend comes first; `client.force_login` does not authenticate.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env.int("MAILROOM_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("MAILROOM_LOGIN_COOLOFF_MINUTES", default=30))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# One time format in every admin page: "2026-12-01 08:51 UTC" (config/formats/en/formats.py).
FORMAT_MODULE_PATH = "config.formats"

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# --- Mailroom -------------------------------------------------------------
MAILROOM_MAX_MESSAGE_BYTES = env.int("MAILROOM_MAX_MESSAGE_BYTES", default=25 * 1024 * 1024)
# The webhook reads the body itself and enforces the limit above.
DATA_UPLOAD_MAX_MEMORY_SIZE = MAILROOM_MAX_MESSAGE_BYTES + 1
MAILROOM_SIGNATURE_TOLERANCE_SECONDS = env.int("MAILROOM_SIGNATURE_TOLERANCE_SECONDS", default=300)
# Amazon SES inbound through SNS (intake.providers.sns): the signing certificate is fetched only over https from
# a host matching this pattern (SNS's own hosts; tests point it at 127.0.0.1), through the system trust store or
# MAILROOM_SNS_CA_BUNDLE; messages older than MAILROOM_SNS_MAX_AGE_SECONDS (SNS's longest HTTP retry window)
# are refused.
MAILROOM_SNS_CERT_HOST_PATTERN = env.str(
    "MAILROOM_SNS_CERT_HOST_PATTERN", default=r"^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$"
)
MAILROOM_SNS_CA_BUNDLE = env.str("MAILROOM_SNS_CA_BUNDLE", default="")
MAILROOM_SNS_MAX_AGE_SECONDS = env.int("MAILROOM_SNS_MAX_AGE_SECONDS", default=3600)
MAILROOM_SNS_TIMEOUT_SECONDS = env.float("MAILROOM_SNS_TIMEOUT_SECONDS", default=10.0)
# The egress guard (intake.egress): tenant-configured URLs and hosts (destinations, provider endpoints, IMAP,
# SNS) reach public addresses, and besides them only these networks (comma-separated CIDRs). Unset: loopback in
# development, nothing in production; set, even to an empty value: exactly that list.
_egress_networks = os.environ.get("MAILROOM_EGRESS_ALLOWED_NETWORKS")
if _egress_networks is None:
    _egress_networks = "127.0.0.0/8,::1" if MAILROOM_ENV == "development" else ""
MAILROOM_EGRESS_ALLOWED_NETWORKS = [item.strip() for item in _egress_networks.split(",") if item.strip()]
for _network in MAILROOM_EGRESS_ALLOWED_NETWORKS:
    try:
        ipaddress.ip_network(_network, strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"MAILROOM_EGRESS_ALLOWED_NETWORKS: {_network!r} is not a network "
            "(comma-separated CIDRs such as 10.20.0.0/16)"
        ) from None
# A routing rule's dry run (ticketing.dry_run) stops after this many seconds in all and says how far it got.
MAILROOM_DRY_RUN_SECONDS = env.float("MAILROOM_DRY_RUN_SECONDS", default=10.0)
# A REST destination's body template (ticketing.destinations.rest_templates) renders within this many seconds and
# this many characters beyond eight times the request's own text; past either, nothing is sent.
MAILROOM_REST_TEMPLATE_SECONDS = env.float("MAILROOM_REST_TEMPLATE_SECONDS", default=2.0)
MAILROOM_REST_TEMPLATE_MAX_CHARS = env.int("MAILROOM_REST_TEMPLATE_MAX_CHARS", default=1_000_000)
# An event in `received` with no progress for this long is enqueued again.
MAILROOM_STALE_EVENT_SECONDS = env.int("MAILROOM_STALE_EVENT_SECONDS", default=300)
# An event that workers took this many times without progress is a poison message (waiting in the
# broker is not a take).
MAILROOM_MAX_DISPATCHES = env.int("MAILROOM_MAX_DISPATCHES", default=10)
MAILROOM_CLAIM_SECONDS = env.int("MAILROOM_CLAIM_SECONDS", default=120)
# How long a worker may hold a thread (mailbox, thread_key) while it decides and writes.
MAILROOM_THREAD_LEASE_SECONDS = env.int("MAILROOM_THREAD_LEASE_SECONDS", default=60)
MAILROOM_RELAY_BATCH = env.int("MAILROOM_RELAY_BATCH", default=500)
MAILROOM_RELAY_GROUP = env.int("MAILROOM_RELAY_GROUP", default=50)
# A group's plain mail to the built-in store is written set-based (ticketing.batch); off: event by event.
MAILROOM_SET_BASED = env.bool("MAILROOM_SET_BASED", default=True)
MAILROOM_RELAY_SWEEP_SECONDS = env.float("MAILROOM_RELAY_SWEEP_SECONDS", default=2.0)
# After a wake-up the relay publishes at once when no task waits in the broker; while tasks wait (the
# workers are busy) it holds the rows until the queue empties, a group's worth of commits arrived, or this
# long, so that they go out as one group (intake.relay.gather).
MAILROOM_RELAY_HOLD_SECONDS = env.float("MAILROOM_RELAY_HOLD_SECONDS", default=1.0)
MAILROOM_OUTBOX_RETENTION_DAYS = env.int("MAILROOM_OUTBOX_RETENTION_DAYS", default=7)
# Raw messages (and so attachments) are purged after this many days (intake.retention); per tenant
# Tenant.settings["raw_retention_days"]. Metadata, states, mappings and the audit trail stay.
MAILROOM_RAW_RETENTION_DAYS = env.int("MAILROOM_RAW_RETENTION_DAYS", default=90)
MAILROOM_RETENTION_BATCH = env.int("MAILROOM_RETENTION_BATCH", default=500)
MAILROOM_RETENTION_MAX_BATCHES = env.int("MAILROOM_RETENTION_MAX_BATCHES", default=20)  # per tenant per run
# GET /metrics answers only `Authorization: Bearer <this>`; unset, the endpoint is a 404.
MAILROOM_METRICS_TOKEN = env.str("MAILROOM_METRICS_TOKEN", default="")
# Polling backoff after a provider failure: doubles per failure in a row, up to the maximum.
MAILROOM_POLL_BACKOFF_SECONDS = env.int("MAILROOM_POLL_BACKOFF_SECONDS", default=30)
MAILROOM_POLL_BACKOFF_MAX_SECONDS = env.int("MAILROOM_POLL_BACKOFF_MAX_SECONDS", default=3600)
MAILROOM_SWEEP_SECONDS = env.float("MAILROOM_SWEEP_SECONDS", default=10.0)
# How many items one bulk replay in the recovery queue may touch.
MAILROOM_BULK_REPLAY_CAP = env.int("MAILROOM_BULK_REPLAY_CAP", default=20)
# While paused, an event is looked at again this often (a resume enqueues it at once).
MAILROOM_PAUSE_RECHECK_SECONDS = env.int("MAILROOM_PAUSE_RECHECK_SECONDS", default=300)
# Where operators reach this instance: links to the admin in text we send elsewhere (a trimmed ticket). Unset:
# where `make run` serves (HOST, PORT), a wildcard bind (0.0.0.0, ::) read as this machine's loopback.
_public_host = env.str("HOST", default="").strip() or "127.0.0.1"
_public_host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(_public_host, _public_host)
if ":" in _public_host and not _public_host.startswith("["):
    _public_host = f"[{_public_host}]"  # an IPv6 literal in a URL
MAILROOM_PUBLIC_URL = (
    env.str("MAILROOM_PUBLIC_URL", default="").rstrip("/") or f"http://{_public_host}:{env.int('PORT', default=8000)}"
)
# The AI proposer (ticketing.classification.ai): an OpenAI-compatible /chat/completions endpoint; off without a URL.
# Escalation (reconciliation.services.escalation): hours an item may sit in the recovery queue before
# its owner (or, unassigned, the tenant's operators) is emailed. Looked up by "<state>/<reason>", then
# reason code, then state, then "default"; a tenant overrides with `Tenant.settings["escalate_after_hours"]`
# (a number for every item, or a dict with these keys).
MAILROOM_ESCALATE_AFTER_HOURS = {
    "malware": 1,
    "credentials": 2,
    "failed": 2,
    "unknown": 1,
    "quarantined": 4,
    "awaiting_review": 24,
    "default": 24,
}
# The daily digest of open items per tenant goes out at this hour (UTC).
MAILROOM_DIGEST_HOUR = env.int("MAILROOM_DIGEST_HOUR", default=7)
# The circuit breaker per destination (ticketing.breaker); a destination overrides with settings["breaker"].
MAILROOM_BREAKER = {
    "enabled": True,
    "credential_failures": 3,  # this many credentials failures in a row pause the destination
    "failure_rate": 0.5,  # ... as does this share of failed attempts
    "min_attempts": 10,  # ... over at least this many attempts
    "window_seconds": 600,  # ... in this window
}
MAILROOM_AI_BASE_URL = env.str("MAILROOM_AI_BASE_URL", default="")
MAILROOM_AI_MODEL = env.str("MAILROOM_AI_MODEL", default="")
MAILROOM_AI_API_KEY_REF = env.str("MAILROOM_AI_API_KEY_REF", default="")  # listed in MAILROOM_PLATFORM_SECRET_REFS
MAILROOM_AI_TIMEOUT_SECONDS = env.float("MAILROOM_AI_TIMEOUT_SECONDS", default=10.0)
MAILROOM_AI_MAX_INPUT_CHARS = env.int("MAILROOM_AI_MAX_INPUT_CHARS", default=8000)

# Secret references (intake.secrets): a tenant's rows name only its own secrets (env:MAILROOM_T_<SLUG>_*,
# files under MAILROOM_SECRETS_DIR/<slug>/, vault:<mount>/mailroom/<slug>/...#key); anything else only
# when listed here (comma-separated in the environment), best bound to the rows it serves:
# `<ref>=<owner>|...` with mailbox:<slug>, destination:<tenant>/<slug>, tenant:<slug> or *; a plain `<ref>`
# serves any row. Only a superuser sets one on a row (intake.secret_policy); the AI key resolves for the
# platform only.
MAILROOM_SECRETS_DIR = env.str("MAILROOM_SECRETS_DIR", default="")
MAILROOM_PLATFORM_SECRET_REFS = env.list("MAILROOM_PLATFORM_SECRET_REFS", default=[])
MAILROOM_SECRET_CACHE_SECONDS = env.int("MAILROOM_SECRET_CACHE_SECONDS", default=60)  # vault values, per process

# --- Outgoing mail (acknowledgments) ---------------------------------------
# EMAIL_URL, e.g. smtp://user:pass@smtp.example.com:587/?tls=True. Without it the
# embedded default writes acknowledgments to files under var/sent-mail.
if env.str("EMAIL_URL", default=""):
    vars().update(env.email_url("EMAIL_URL"))
else:
    EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    EMAIL_FILE_PATH = VAR_DIR / "sent-mail"
# Acknowledgments go only to authenticated senders (ticketing.acknowledgments), at most this many per tenant
# and per recipient domain in any hour (Tenant.settings ack_per_hour / ack_per_domain_per_hour override them).
MAILROOM_ACK_PER_HOUR = env.int("MAILROOM_ACK_PER_HOUR", default=500)
MAILROOM_ACK_PER_DOMAIN_PER_HOUR = env.int("MAILROOM_ACK_PER_DOMAIN_PER_HOUR", default=100)
# Whether a mailbox's `ack_policy: "always"` (acknowledge unauthenticated senders too) is honoured at all.
MAILROOM_ACK_ALLOW_UNAUTHENTICATED = env.bool("MAILROOM_ACK_ALLOW_UNAUTHENTICATED", default=False)
# The most characters an acknowledgment template's body may render to (ticketing.ack_templates); past it, none is sent.
MAILROOM_ACK_TEMPLATE_MAX_CHARS = env.int("MAILROOM_ACK_TEMPLATE_MAX_CHARS", default=20_000)
# How long an address that bounced an acknowledgment for good (5.x.x) gets no acknowledgment (ticketing.bounces).
MAILROOM_BOUNCE_MARK_DAYS = env.int("MAILROOM_BOUNCE_MARK_DAYS", default=30)
# An rspamd normal worker asked for a spam score of mail about to become a ticket (intake.spamcheck); "" = off.
# A platform address, never a tenant's: its score only decides whether an acknowledgment goes out.
MAILROOM_RSPAMD_URL = env.str("MAILROOM_RSPAMD_URL", default="")
MAILROOM_RSPAMD_TIMEOUT = env.float("MAILROOM_RSPAMD_TIMEOUT", default=5.0)

# --- Browser-facing edge ----------------------------------------------------
# The console's pages load only their own static files (intake.middleware.ContentSecurityPolicyMiddleware);
# empty: no header.
MAILROOM_CONTENT_SECURITY_POLICY = env.str(
    "MAILROOM_CONTENT_SECURITY_POLICY",
    default=(
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
)
# /api/schema/ and /api/docs/ without logging in: in development only, unless set.
MAILROOM_PUBLIC_API_SCHEMA = env.bool("MAILROOM_PUBLIC_API_SCHEMA", default=MAILROOM_ENV == "development")
# --- Malware scanning (clamd) -----------------------------------------------
# tcp://host:port or unix:///path/clamd.sock; "off" is an explicit, logged opt-out
# that only the embedded default (SQLite) takes unless told otherwise.
MAILROOM_CLAMD = env.str("MAILROOM_CLAMD", default="tcp://127.0.0.1:3310" if USING_POSTGRES else "off")
MAILROOM_CLAMD_TIMEOUT = env.float("MAILROOM_CLAMD_TIMEOUT", default=30.0)
# A decoded attachment larger than this is spooled to a temporary file (tempfile's directory) to be
# scanned and sent from there, deleted after use; smaller ones stay in memory (intake.mime.spool).
MAILROOM_SPOOL_THRESHOLD_BYTES = env.int("MAILROOM_SPOOL_THRESHOLD_BYTES", default=1024 * 1024)
# While clamd is unreachable an event waits and retries, then goes to review; it never passes unscanned.
MAILROOM_SCAN_ATTEMPTS = env.int("MAILROOM_SCAN_ATTEMPTS", default=5)
MAILROOM_SCAN_RETRY_SECONDS = env.int("MAILROOM_SCAN_RETRY_SECONDS", default=30)
MAILROOM_SMTP_TIMEOUT = env.float("MAILROOM_SMTP_TIMEOUT", default=10.0)
# Set on everything we send and recognised on everything we receive: our own mail is never a request.
MAILROOM_LOOP_HEADER = env.str("MAILROOM_LOOP_HEADER", default="X-Mailroom-Loop")
MAILROOM_INSTANCE_ID = env.str("MAILROOM_INSTANCE_ID", default="mailroom")

# --- Celery ---------------------------------------------------------------
# The embedded default's broker: a SQLite file under var/ (config.broker, kombu's SQLAlchemy transport made
# safe for several producers and consumers). Any other URL (redis://, amqp://) is used as kombu reads it.
EMBEDDED_BROKER_URL = f"sqlite:///{VAR_DIR / 'broker.sqlite3'}"
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=EMBEDDED_BROKER_URL)
CELERY_ACCEPT_CONTENT = ["json"]
if CELERY_BROKER_URL.startswith("filesystem:"):
    raise ImproperlyConfigured(
        "CELERY_BROKER_URL=filesystem:// is no longer supported: kombu's file-system transport can hand a "
        "consumer a half-written message (celery/kombu#1551). Unset CELERY_BROKER_URL for the embedded SQLite "
        "broker, or use redis:// or amqp://."
    )
if CELERY_BROKER_URL.startswith("sqlite:"):
    CELERY_BROKER_TRANSPORT = "config.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # How often an idle consumer looks for work (one indexed read): also the longest a new message waits for
        # an idle worker.
        "polling_interval": env.float("MAILROOM_BROKER_POLLING_SECONDS", default=0.1),
        "accept_content": CELERY_ACCEPT_CONTENT,  # what the worker accepts; anything else is dropped with a warning
    }
else:
    # An unacked task is redelivered after this long when a whole worker dies.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": env.int("MAILROOM_BROKER_VISIBILITY_TIMEOUT", default=3600),
        "unacked_restore_interval": 2,
        "unacked_restore_throttle": 1,
    }
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
# At-least-once: acknowledge after the task ran, run again if the worker died.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery would replace the root logger's handlers with its own, and with them the filter that
# masks addresses: workers and beat log through LOGGING below, like every other process.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_SERIALIZER = "json"
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
# django-celery-beat's DatabaseScheduler under a lock: a second beat stands by (intake.beat).
CELERY_BEAT_SCHEDULER = "intake.beat:LockedScheduler"
CELERY_TIMEZONE = TIME_ZONE
# Celery's Django fixup closes the DB connection after every task unless this
# is set; reconnecting per task halves throughput (see docs/performance.md).
CELERY_DB_REUSE_MAX = env.int("CELERY_DB_REUSE_MAX", default=1000)
# Bulkheads (ticketing.bulkhead): calls to external destinations go to their own queue, consumed by a
# thread-pool worker (I/O), so a stalling desk holds a thread, not a prefork slot. "" = inline in the
# per-event task: the embedded default (SQLite allows one writer; a thread pool would only queue on its lock).
MAILROOM_DESTINATION_QUEUE = env.str("MAILROOM_DESTINATION_QUEUE", default="destinations" if USING_POSTGRES else "")
MAILROOM_DESTINATION_THREADS = env.int("MAILROOM_DESTINATION_THREADS", default=32)  # that worker's --concurrency
# In-flight calls per destination, across every worker; Destination.settings["max_concurrency"] overrides.
MAILROOM_DESTINATION_MAX_CONCURRENCY = env.int("MAILROOM_DESTINATION_MAX_CONCURRENCY", default=8)
MAILROOM_DESTINATION_CAP_WAIT_SECONDS = env.float("MAILROOM_DESTINATION_CAP_WAIT_SECONDS", default=0.5)
CELERY_TASK_DEFAULT_QUEUE = "celery"
# Both queues declared: a worker started without -Q consumes both (one worker is enough); run_stack
# starts one per queue (-Q), prefork for the CPU stages and threads for the calls.
queue_names = list(dict.fromkeys(["celery", MAILROOM_DESTINATION_QUEUE or "celery"]))
# RabbitMQ (amqp://): quorum queues, replicated and durable (docs/deployment.md). They take publisher confirms
# and per-consumer QoS (Celery drops global QoS when it sees one); a countdown goes through RabbitMQ's native
# delayed delivery, which routes by topic, so each queue has a topic exchange of its own name.
MAILROOM_AMQP_QUORUM = env.bool(
    "MAILROOM_AMQP_QUORUM", default=CELERY_BROKER_URL.startswith(("amqp:", "amqps:", "pyamqp:"))
)
if MAILROOM_AMQP_QUORUM:
    CELERY_TASK_DEFAULT_EXCHANGE_TYPE = "topic"
    CELERY_TASK_QUEUES = [
        Queue(name, Exchange(name, type="topic"), routing_key=name, queue_arguments={"x-queue-type": "quorum"})
        for name in queue_names
    ]
    CELERY_BROKER_TRANSPORT_OPTIONS["confirm_publish"] = True
else:
    CELERY_TASK_QUEUES = [Queue(name) for name in queue_names]
CELERY_TASK_ROUTES = {"ticketing.tasks.call_destination": {"queue": MAILROOM_DESTINATION_QUEUE or "celery"}}
# Reconciliation (reconciliation.reconcilers; `manage.py reconcile`): a pass every this many seconds,
# over a sliding window, each reconciler bounded per scope and pass (the next pass resumes).
MAILROOM_RECONCILE_SECONDS = env.float("MAILROOM_RECONCILE_SECONDS", default=300.0)
MAILROOM_RECONCILE_WINDOW_DAYS = env.float("MAILROOM_RECONCILE_WINDOW_DAYS", default=3.0)
MAILROOM_RECONCILE_GRACE_SECONDS = env.int("MAILROOM_RECONCILE_GRACE_SECONDS", default=600)
MAILROOM_RECONCILE_LIMIT = env.int("MAILROOM_RECONCILE_LIMIT", default=2000)
MAILROOM_UNMAPPED_AFTER_MINUTES = env.int("MAILROOM_UNMAPPED_AFTER_MINUTES", default=15)  # Tenant.settings overrides
MAILROOM_OUTBOX_STUCK_SECONDS = env.int("MAILROOM_OUTBOX_STUCK_SECONDS", default=300)
CELERY_BEAT_SCHEDULE = {
    "relay-outbox": {"task": "intake.tasks.relay_outbox", "schedule": MAILROOM_RELAY_SWEEP_SECONDS * 5},
    "requeue-stale-events": {"task": "intake.tasks.requeue_stale_events", "schedule": MAILROOM_SWEEP_SECONDS},
    "purge-published-outbox": {"task": "intake.tasks.purge_published_outbox", "schedule": 3600.0},
    "purge-webhook-nonces": {"task": "intake.tasks.purge_webhook_nonces", "schedule": 3600.0},
    "purge-expired-bodies": {"task": "intake.tasks.purge_expired_bodies", "schedule": 3600.0},
    "expire-intent-claims": {"task": "ticketing.tasks.expire_claims", "schedule": 15.0},
    "enqueue-due-intents": {"task": "ticketing.tasks.enqueue_due_intents", "schedule": 2.0},
    "resolve-unknown-intents": {"task": "ticketing.tasks.resolve_unknown_intents", "schedule": 30.0},
    "renew-provider-subscriptions": {"task": "intake.tasks.renew_provider_subscriptions", "schedule": 900.0},
    "reconcile": {"task": "reconciliation.tasks.reconcile", "schedule": MAILROOM_RECONCILE_SECONDS},
}
# Escalation emails, the daily digest and the breaker's pruning (reconciliation.tasks, ticketing.tasks).
CELERY_BEAT_SCHEDULE.update(
    {
        "send-escalations": {"task": "reconciliation.tasks.send_escalations", "schedule": 60.0},
        "send-daily-digests": {
            "task": "reconciliation.tasks.send_daily_digests",
            "schedule": crontab(minute=0, hour=MAILROOM_DIGEST_HOUR),
        },
        "prune-breaker-attempts": {"task": "ticketing.tasks.prune_breaker_attempts", "schedule": 3600.0},
    }
)
# Bulk jobs over the queue's filter whose worker died mid-job resume from their cursor (reconciliation.tasks).
CELERY_BEAT_SCHEDULE["resume-bulk-jobs"] = {"task": "reconciliation.tasks.resume_bulk_jobs", "schedule": 30.0}
# Mailbox link health and quiet alarms (intake.mailbox_health, intake.quiet, ticketing.mailbox_alerts).
# A week before a mailbox's OAuth credentials expire, its tenant's admins are emailed (ticketing.credential_warnings).
CELERY_BEAT_SCHEDULE["warn-expiring-credentials"] = {
    "task": "ticketing.tasks.warn_expiring_credentials",
    "schedule": 3600.0,
}
CELERY_BEAT_SCHEDULE["check-mailbox-health"] = {"task": "ticketing.tasks.check_mailbox_health", "schedule": 300.0}
MAILROOM_MAILBOX_FAILING_AFTER = env.int("MAILROOM_MAILBOX_FAILING_AFTER", default=1)  # failed polls in a row
MAILROOM_MAILBOX_DOWN_AFTER = env.int("MAILROOM_MAILBOX_DOWN_AFTER", default=3)
MAILROOM_MAILBOX_DOWN_AFTER_MINUTES = env.float("MAILROOM_MAILBOX_DOWN_AFTER_MINUTES", default=30.0)
MAILROOM_MAILBOX_RECOVERED_SECONDS = env.float("MAILROOM_MAILBOX_RECOVERED_SECONDS", default=900.0)
MAILROOM_MAILBOX_ALERT_FAILING = env.bool("MAILROOM_MAILBOX_ALERT_FAILING", default=False)
MAILROOM_QUIET_MIN_HOURS = env.float("MAILROOM_QUIET_MIN_HOURS", default=6.0)
MAILROOM_QUIET_FACTOR = env.float("MAILROOM_QUIET_FACTOR", default=1.5)
MAILROOM_QUIET_MIN_PER_DAY = env.float("MAILROOM_QUIET_MIN_PER_DAY", default=5.0)
MAILROOM_QUIET_HISTORY_DAYS = env.float("MAILROOM_QUIET_HISTORY_DAYS", default=14.0)
MAILROOM_BULK_JOB_CHUNK = env.int("MAILROOM_BULK_JOB_CHUNK", default=50)  # items per chunk (one transaction)
MAILROOM_BULK_JOB_CLAIM_SECONDS = env.float("MAILROOM_BULK_JOB_CLAIM_SECONDS", default=120.0)  # a dead runner's wait

# --- Logging: never bodies, never full addresses ---------------------------
# Also never secrets: Authorization values, token=/key=/secret= parameters are redacted. LOG_FORMAT=json
# writes one JSON object per line (python-json-logger) with request_id (web) and task_id (Celery).
LOG_FORMAT = env.str("LOG_FORMAT", default="plain")
# One INFO line per stored or duplicate event for one event in N (1: all); 0: none (intake.logging).
MAILROOM_LOG_EVENT_SAMPLE = env.int("MAILROOM_LOG_EVENT_SAMPLE", default=0)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "mask_addresses": {"()": "intake.logging.MaskAddressesFilter"},
        "redact_secrets": {"()": "intake.logging.RedactSecretsFilter"},
        "log_context": {"()": "intake.logging.LogContextFilter"},
    },
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s %(task_id)s",
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
            "filters": ["log_context", "redact_secrets", "mask_addresses"],
        },
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "axes.apps": {"level": "WARNING"},  # a start-up banner per process; lockouts stay (axes.*)
        # aiosmtpd (run_lmtp) logs every command line at INFO (addresses) and DATA lines at DEBUG (bodies):
        # not ours to keep. Set here, not by the command, so that running it never changes another's logging.
        "mail.log": {"level": "WARNING"},
        # A line per due task (beat) and per task received/succeeded (worker) is noise at INFO:
        # an idle `make run` would print one every two seconds. CELERY_LOG_LEVEL=INFO brings them back.
        **{
            name: {"level": env.str("CELERY_LOG_LEVEL", default="WARNING")}
            for name in ("celery.beat", "celery.app.trace", "celery.worker.strategy")
        },
    },
}

REST_FRAMEWORK = {
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"],
    # The REST API (reconciliation.api, /api/v1/): hashed tokens, cursor pages, problem+json errors.
    "DEFAULT_AUTHENTICATION_CLASSES": ["reconciliation.api.authentication.ApiTokenAuthentication"],
    "DEFAULT_PAGINATION_CLASS": "reconciliation.api.pagination.ApiCursorPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "reconciliation.api.errors.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Mailroom API",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",  # drf-spectacular-sidecar: local assets, no CDN
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "EventStateEnum": "intake.models.InboxEvent.State",
        "IntentStateEnum": "ticketing.models.Intent.State",
    },
}

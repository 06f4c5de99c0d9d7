# The two commands of the README: `make run` and `make test`. In pieces: `make lint`, `make test-fast`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/mailroom

.PHONY: run test test-fast lint install bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

# The embedded default: a SQLite database and a SQLite broker (config/broker.py) under var/. A development
# instance (MAILROOM_ENV=development): plain HTTP on 127.0.0.1, port PORT (default 8000); bootstrap_demo writes a
# SECRET_KEY and the admin's password into .env once. run_stack keeps the processes up, logs each to
# var/log/<process>.log and prints the banner when the web and the worker are ready.
run: export MAILROOM_ENV := development
run: $(VENV)/.installed
	mkdir -p var
	$(BIN)/python manage.py migrate --noinput -v0
	$(BIN)/python manage.py collectstatic --noinput -v0
	$(BIN)/python manage.py bootstrap_demo
	exec $(BIN)/python manage.py run_stack

# The broker is config/test_settings.py's default (a Redis database per xdist worker) unless CELERY_BROKER_URL is set.
PYTEST := DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(BIN)/pytest

# Static checks: ruff's lint and format check (settings in pyproject.toml), the import layering of
# docs/design.md §3 (no upward import, no cycle), mypy with django-stubs (strict on the modules `[tool.mypy]
# files` lists), and no model change without its migration (a new AuditKind or ReasonCode included).
# .pre-commit-config.yaml runs the same checks.
LINT_ENV := MAILROOM_ENV=development DATABASE_URL=sqlite://:memory:
lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tools/check_layering.py
	$(LINT_ENV) $(BIN)/mypy
	$(LINT_ENV) $(BIN)/python manage.py makemigrations --check --dry-run

# Lint, then the whole suite on PostgreSQL with Redis as the broker. pytest exits 5 when
# it collects nothing, and make fails on any non-zero exit, so an empty run is red. The 25 slowest
# tests are listed at the end, so what the suite costs is seen on every run. pytest-xdist runs it in
# PYTEST_WORKERS processes (one per core here; PYTEST_WORKERS=0 runs it in one), a test file to a worker
# (`--dist loadfile`: a file's module fixtures start once); each worker has its own test database and Redis
# databases (config/test_settings.py). Measured on a 2-core machine: 20 min with 2 workers, 33 min in one.
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadfile
test: lint
	$(PYTEST) $(XDIST) --durations=25 $(PYTEST_ARGS)

# The tests that need no service but PostgreSQL, in under a minute (the whole suite: about 40): parsing,
# charsets and headers, real-world mail, validation, message keys, reply text, webhook signatures and
# inbound-parse payloads, leases, vocabulary, state doors, registries, layering, and the state machine and
# pipeline on the database (intents, the per-event and set-based paths side by side, poison counts). A list
# of modules, not a marker to put on tests: the list is read in one place, and no test file has to change.
# Inside these files, a test that uses a fixture starting clamd, Dovecot, Chromium or a live process is
# marked `services` by tests/conftest.py and deselected, as are `live` tests.
FAST_TESTS := tests/test_layering.py tests/test_mime.py tests/test_mime_headers.py tests/test_mime_parts.py \
	tests/test_real_mail_corpus.py tests/test_validation.py tests/test_message_identity.py \
	tests/test_reply_text.py tests/test_webhook.py tests/test_inbound_parse.py tests/test_leases.py \
	tests/test_vocabulary.py tests/test_state_doors.py tests/test_registries.py \
	tests/test_intents.py tests/test_batch.py tests/test_poison_counts_takes.py
test-fast: $(VENV)/.installed-test
	$(PYTEST) $(XDIST) -m "not live and not services" $(FAST_TESTS) $(PYTEST_ARGS)

bench: $(VENV)/.installed-test
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/e2e.py

clean:
	rm -rf var

# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/mailroom
TEST_BROKER_URL ?= redis://127.0.0.1:6379/15

.PHONY: run test install bench clean

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

# The embedded default: a SQLite file and a file-system broker under var/.
run: $(VENV)/.installed
	mkdir -p var
	$(BIN)/python manage.py migrate --noinput -v0
	$(BIN)/python manage.py collectstatic --noinput -v0
	$(BIN)/python manage.py bootstrap_demo
	exec $(BIN)/python manage.py run_stack

# The whole suite on PostgreSQL with Redis as the broker. pytest exits 5 when it
# collects nothing, and make fails on any non-zero exit, so an empty run is red.
test: $(VENV)/.installed-test
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} CELERY_BROKER_URL=$${CELERY_BROKER_URL:-$(TEST_BROKER_URL)} \
		$(BIN)/pytest $(PYTEST_ARGS)

bench: $(VENV)/.installed-test
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/e2e.py

clean:
	rm -rf var

# Surety: `make run` for a local stack, `make test` for the test suite. `make help` lists all.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
BENCH_ARGS ?=
TEST_DATABASE_URL := postgres://postgres@127.0.0.1:5432/postgres
# Two pytest workers on two cores. A third filled the idle CPU while the suite waits (decision
# 51), but each live stack holds about 18 PostgreSQL sessions and the tests that start servers of
# their own (make run, the shards, the pooler) many more: with three, runs met PostgreSQL's 100
# connections ("too many clients") in three of the last eight.
TEST_WORKERS := 2
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

export DEBIAN_FRONTEND := noninteractive
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Bytecode is cached (in __pycache__, ignored by git) even where the environment says not to:
# without it pytest rewrites every test module's asserts anew on each worker (7.5 s of a
# collection's 8 s) and each process a test starts compiles the project again (0.2 s each).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help install services static test test-fast run incident bench scale chaos check

help:
	@echo "make run       web app at http://127.0.0.1:8000 (PORT=... to change), two RQ workers and the sweeper, with demo data"
	@echo "make incident  stage the incident on the running stack: an agent killed and restarted 3 times, refunding with and without Surety"
	@echo "make test      the test suite on PostgreSQL and Redis, then in-process tests on SQLite (PYTEST_ARGS=... narrows it to PostgreSQL)"
	@echo "make test-fast the tests that need no live stack (no server, workers or browser): about a minute and a half on 2 cores"
	@echo "make install   virtualenv + Python deps, npm packages, Chromium for browser tests, PgBouncer"
	@echo "make services  make sure PostgreSQL and Redis are running"
	@echo "make bench     the benchmarks (BENCH_ARGS=... passed on); make bench scale: at 1M and at 10M actions"
	@echo "make chaos     the chaos tests at full scale"
	@echo "make check     Django's deployment checks under production settings"

# --- install: each step re-runs only when its inputs change -----------------------------
install: $(VENV)/.installed node_modules/.installed /usr/bin/chromium /usr/sbin/pgbouncer

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --no-input -q --upgrade pip

$(VENV)/.installed: pyproject.toml client/pyproject.toml | $(PY)
	$(PY) -m pip install --no-input -q -e '.[dev]'
	$(PY) -m pip install --no-input -q -e './client[mcp]'
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

# Browser tests drive Debian's Chromium through Playwright; never `playwright install`.
/usr/bin/chromium:
	$(SUDO) apt-get update -q
	$(SUDO) apt-get install -y -q -o DPkg::Lock::Timeout=300 chromium

# The tests behind a transaction-pooling PgBouncer (tests/pooler/) and `make bench BENCH_ARGS=--pooler`
# start Debian's pgbouncer themselves on a free port (a service the package may start, on 6432, is not used).
/usr/sbin/pgbouncer:
	$(SUDO) apt-get update -q
	$(SUDO) apt-get install -y -q -o DPkg::Lock::Timeout=300 pgbouncer

services:
	@bash scripts/services.sh

# The test servers run with DEBUG off, so static files are served from STATIC_ROOT. Collecting
# them is local development and signs nothing: DEBUG on gives it the development key (with DEBUG
# off, config.settings refuses to load without SECRET_KEY).
static: $(VENV)/.installed node_modules/.installed
	DEBUG=true $(PY) manage.py collectstatic --noinput -v 0

# --- test ----------------------------------------------------------------------------------
# pytest-django creates its own test_* databases next to the `postgres` one.
# Exit code 5 (no tests collected) is turned into a failure.
# Then the in-process tests that run on SQLite as well, the zero-configuration default.
SQLITE_TESTS := tests/ledger/test_sqlite_default.py tests/ledger/test_compiled.py \
  tests/ledger/test_replay_from_the_row.py tests/ledger/test_action_create_bad_input.py \
  tests/ledger/test_same_subject_in_the_database.py tests/approvals/test_limits_version.py \
  tests/ledger/test_dbrules.py tests/approvals/test_four_eyes_in_the_database.py \
  tests/approvals/test_whatif_agrees.py tests/approvals/test_analytics.py tests/dlq/test_archive_expired.py \
  tests/dlq/test_archive_tasks_and_versions.py tests/ledger/test_partitions.py tests/ledger/test_archive_trusted.py \
  tests/dlq/test_evidence_unsealed_archived.py tests/dlq/test_archive_bounds.py \
  tests/ledger/test_versions_in_the_database.py tests/ledger/test_audit_checkpoints_missing.py \
  tests/ledger/test_audit_label_hashed.py tests/ledger/test_done_by_hand_in_the_database.py \
  tests/dlq/test_archive_incidents.py tests/dlq/test_archive_chain_checks.py tests/ledger/test_marks_for_older_rows.py \
  tests/ledger/test_booking_reconfirm_in_the_database.py
test: install services static
	$(VENV)/bin/lint-imports
	@echo "DATABASE_URL=$(TEST_DATABASE_URL) $(VENV)/bin/pytest -n $(TEST_WORKERS) -p no:cacheprovider $(PYTEST_ARGS)"
	@DATABASE_URL=$(TEST_DATABASE_URL) $(VENV)/bin/pytest -n $(TEST_WORKERS) -p no:cacheprovider $(PYTEST_ARGS) || { \
	  rc=$$?; [ $$rc -ne 5 ] || echo "make test: pytest collected no tests" >&2; exit $$rc; }
	@if [ -z "$(PYTEST_ARGS)" ]; then \
	  echo "DATABASE_URL=sqlite:///:memory: $(VENV)/bin/pytest -n 2 -p no:cacheprovider $(SQLITE_TESTS)"; \
	  DATABASE_URL=sqlite:///:memory: $(VENV)/bin/pytest -n 2 -p no:cacheprovider -q $(SQLITE_TESTS); fi

# The tests marked neither `stack` (tests/conftest.py marks every test that needs a live stack)
# nor browser nor chaos, then the SQLite ones as `make test` runs them (none needs a stack).
FAST_MARKERS := not stack and not browser and not chaos
test-fast: install services static
	$(VENV)/bin/lint-imports
	@echo "DATABASE_URL=$(TEST_DATABASE_URL) $(VENV)/bin/pytest -n $(TEST_WORKERS) -p no:cacheprovider -m \"$(FAST_MARKERS)\" $(PYTEST_ARGS)"
	@DATABASE_URL=$(TEST_DATABASE_URL) $(VENV)/bin/pytest -n $(TEST_WORKERS) -p no:cacheprovider -m "$(FAST_MARKERS)" $(PYTEST_ARGS)
	@echo "DATABASE_URL=sqlite:///:memory: $(VENV)/bin/pytest -n 2 -p no:cacheprovider $(SQLITE_TESTS)"
	@DATABASE_URL=sqlite:///:memory: $(VENV)/bin/pytest -n 2 -p no:cacheprovider -q $(SQLITE_TESTS)

chaos: install services static
	CHAOS_SCALE=full DATABASE_URL=$(TEST_DATABASE_URL) \
	  $(VENV)/bin/pytest tests/chaos -m chaos -p no:cacheprovider $(PYTEST_ARGS)

# --- run -----------------------------------------------------------------------------------
# Only what the app needs: Chromium is for the browser tests. PORT=8001 moves the whole run.
run: $(VENV)/.installed node_modules/.installed services
	@bash scripts/run-local.sh

# The seed's incident on the stack `make run` started (the same PORT, DATABASE_URL and DEBUG, so
# the same development key; the command's SANDBOX_BASE_URL must be the stack's for its agent's
# refund grant to be promoted).
incident: $(VENV)/.installed
	@export PORT="$${PORT:-8000}" DJANGO_SETTINGS_MODULE="$${DJANGO_SETTINGS_MODULE:-config.local}" DEBUG="$${DEBUG:-true}" \
	  DATABASE_URL="$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/surety}"; \
	export SITE_URL="$${SITE_URL:-http://127.0.0.1:$$PORT}"; \
	export SANDBOX_BASE_URL="$${SANDBOX_BASE_URL:-$$SITE_URL/sandbox/v1}"; \
	$(PY) manage.py incident --url "$$SITE_URL"

bench: install services
	$(PY) -m bench $(filter scale,$(MAKECMDGOALS)) $(BENCH_ARGS)

# `make bench scale`: the figures at 1M and at 10M actions (bench/scale.py); `scale` is a word of bench's.
scale:
	@:

check: $(VENV)/.installed
	PRODUCTION=true DEBUG=false ALLOWED_HOSTS=example.com ALERT_EMAILS=operations@surety.internal \
	  CONNECTOR_REFUND=sandbox CONNECTOR_SEND_MESSAGE=sandbox CONNECTOR_CREATE_BOOKING=sandbox \
	  SECRET_KEY="$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(50))')" \
	  $(PY) manage.py check --deploy

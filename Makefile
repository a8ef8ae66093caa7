VENV ?= .venv
# `make matrix PY=3.13` names a Python version for the matrix; everywhere else PY is the venv's Python.
MATRIX_PY := $(if $(filter command line,$(origin PY)),$(PY))
override PY := $(VENV)/bin/python
PYTHON ?= python3
PYTEST_ARGS ?= -n 2

.PHONY: venv sync schema cli-surface api-check test test-server test-smoke test-django6 faults verify matrix mutate browser lint docs dist-check demo bench gate bench-capacity bench-steady bench-dashboard bench-unused bench-cells bench-migrate rehearse-upgrade dashboard clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

LINTED := src tests tools $(wildcard bench) examples conftest.py

# The blocking twin of the producer verbs, src/jobbus/producer/_sync.py, written from _async.py.
sync: venv
	$(PY) tools/generate_sync.py

# The database program, src/jobbus/sql/current.sql, read back from a database the migrations built, and
# the locks each migration takes, src/jobbus/sql/migration_locks.json, read from pg_locks while each is
# applied (on the tests' server: JOBBUS_TEST_DSN, else the embedded one). Run it after adding a migration.
schema: venv
	$(PY) tools/generate_schema.py
	$(PY) tools/generate_migration_locks.py

# The command line's commands and flags, docs/cli-surface.txt, listed from the click commands. Run it after
# changing a command or a flag; `make api-check` fails while the file is stale.
cli-surface: venv
	$(PY) tools/cli_surface.py

# The public surface (jobbus.__all__ and the public modules' names and signatures, read by griffe; the CLI's
# commands and flags) against the last release's commit in CHANGELOG.md: every change must be named by an
# entry of CHANGELOG.md's [Unreleased] (docs/stability.md). Needs the release's commit in the clone, no server.
api-check: venv
	$(PY) tools/api_check.py

lint: venv
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy $(LINTED)
	$(VENV)/bin/lint-imports
	$(PY) tools/generate_sync.py --check
	$(PY) tools/generate_schema.py --check-migrations
	$(PY) tools/generate_migration_locks.py --check-migrations

test: lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The tests that need a PostgreSQL server (marked server: auto_explain, PgBouncer over TCP); they skip
# on the embedded one. JOBBUS_TEST_DSN must point at the server.
test-server: venv
	@test -n "$$JOBBUS_TEST_DSN" || { echo "make test-server: set JOBBUS_TEST_DSN" >&2; exit 2; }
	$(VENV)/bin/pytest -m server $(PYTEST_ARGS)

# Django 6 needs Python 3.12: its own venv runs the Django tests with Django 6's django.tasks (`make test`
# runs them on Django 5.2 with the django-tasks backport). pyenv's 3.12 when there is one.
PYTHON312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
VENV_DJANGO6 ?= .venv-django6

$(VENV_DJANGO6)/.installed: pyproject.toml
	$(PYTHON312) -m venv $(VENV_DJANGO6)
	$(VENV_DJANGO6)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_DJANGO6)/bin/python -m pip install --quiet -e '.[django]' 'django>=6,<7' pydantic \
		pytest pytest-asyncio pytest-xdist pytest-timeout hypothesis sybil
	touch $@

test-django6: $(VENV_DJANGO6)/.installed
	$(VENV_DJANGO6)/bin/pytest $(PYTEST_ARGS) tests/contrib/test_django.py

# A small subset that runs in seconds.
test-smoke: venv
	$(VENV)/bin/pytest -m smoke $(PYTEST_ARGS)

# The fault-injection suite and the failover tests at full scale (CI runs them smaller with every test run).
faults: venv
	JOBBUS_FULL_FAULTS=1 $(VENV)/bin/pytest tests/faults tests/failover -n 2

# The model check's sweep: new seeds, each a random topology run by real workers under faults, until
# VERIFY_MINUTES are up; prints each seed's result and a summary (CI runs a few fixed seeds).
VERIFY_MINUTES ?= 20
verify: venv
	$(PY) -m tests.model --minutes $(VERIFY_MINUTES)

# The version matrix (tools/matrix.py): the database-facing suites on each PostgreSQL major 14-18 and
# each Python 3.11-3.13, each leg on a throwaway cluster of that major, and a real 13's refusal.
# PG=17 runs that major's legs, PY=3.13 that Python's, both that one pair.
PG ?=
MATRIX_ARGS ?=
matrix: venv
	$(PY) tools/matrix.py $(if $(PG),--pg $(PG)) $(if $(MATRIX_PY),--py $(MATRIX_PY)) $(MATRIX_ARGS)

# Each hand-written break of tools/mutations.py applied in turn to a scratch copy of the tree, its tests
# run there: exit 1 when a break passes every test named to catch it (a release runs it; not in CI).
# MUTATE_ARGS="--only NAME" for one break, "--list" to see them.
MUTATE_ARGS ?=
mutate: venv
	$(PY) tools/mutate.py $(MUTATE_ARGS)

# The full browser sweep (the normal suite runs a slice): Debian's chromium, screenshots in artifacts/screenshots/.
browser: venv
	JOBBUS_BROWSER_FULL=1 $(VENV)/bin/pytest tests/browser -m browser $(PYTEST_ARGS)

# The documentation site (mkdocs.yml) into site/; --strict fails on a broken link or page.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Build the sdist and wheel, twine check them, install the wheel into a fresh venv and run its demo.
dist-check: venv
	PY=$(PY) bash .ci/dist-check


# The demo needs only the embedded server and the dashboard: a venv of its own with those two extras
# (no development toolchain), so a fresh clone's `make demo` takes seconds. DEMO_ARGS=--dashboard keeps
# the dashboard up on the demo's data until Ctrl-C.
VENV_DEMO ?= .venv-demo
DEMO_ARGS ?=

# A venv without pip of its own, filled by uv (the one on PATH, or one pip puts into the venv): uv
# resolves and downloads in parallel, a cold install in a third of pip's time. When uv cannot be had
# or fails (an index only pip is configured for), $(PYTHON)'s pip installs (`--python`, pip 22.3+). No
# bytecode compiled ahead: Python compiles what it imports.
DEMO_PIP = $(PYTHON) -m pip --python $(VENV_DEMO)/bin/python install --quiet --disable-pip-version-check --no-compile
$(VENV_DEMO)/.installed: pyproject.toml
	$(PYTHON) -m venv --without-pip $(VENV_DEMO)
	uv=$$(command -v uv || { $(DEMO_PIP) uv >/dev/null 2>&1 && echo $(VENV_DEMO)/bin/uv; }); \
	{ [ -n "$$uv" ] && $$uv pip install --quiet --python $(VENV_DEMO)/bin/python -e '.[embedded,dashboard]'; } \
		|| $(DEMO_PIP) -e '.[embedded,dashboard]'
	touch $@

demo: $(VENV_DEMO)/.installed
	$(VENV_DEMO)/bin/jobbus demo $(DEMO_ARGS)

bench: venv
	$(PY) bench/run.py

# The per-job cost gate (bench/gate.py): Python function calls per job on a fixed in-process drain of
# 5,000 no-op jobs, and per job enqueued in bulk and one per call, against bench/gate-baseline.json;
# fails on a regression of more than 15 %, or when the drain leaves more than one object per job to
# the cyclic garbage collector (a reference cycle per attempt). Counts,
# not times: the machine's load does not move them. Needs JOBBUS_TEST_DSN (or the local server);
# GATE_ARGS=--update records a new baseline, GATE_ARGS=--show=40 prints where the calls come from.
GATE_ARGS ?=
gate: venv
	$(PY) -m bench.gate $(GATE_ARGS)

# The capacity scenarios at full size (1M queued / 10M finished rows; `make bench` runs them at --scale 0.1).
CAPACITY_ARGS ?=
bench-capacity: venv
	$(PY) bench/run.py --systems jobbus --scenario drain_procs --scenario backlog --scenario retention \
		--scale 1 --retention-budget 300 $(CAPACITY_ARGS)

# A steady stream of 1,000 jobs/s for 20 minutes with retention on (STEADY_ARGS="--minutes 5" to shorten;
# run it against a server with autovacuum on: BENCH_DSN=...).
STEADY_ARGS ?=
bench-steady: venv
	$(PY) bench/steady.py $(STEADY_ARGS)

# What the features a drain does not use cost it: one worker as shipped against the same worker without
# each unused feature's code, interleaved (UNUSED_ARGS="--jobs 20000 --rounds 2" for a short check).
UNUSED_ARGS ?=
bench-unused: venv
	$(PY) bench/unused_features.py $(UNUSED_ARGS)

# p95 of every dashboard page on a large table (BENCH_DASHBOARD_ARGS="--rows 1000000" for a smaller one).
# What serving 1, 2 and 3 cells costs one worker process (bench/cells.py; CELLS_ARGS="--jobs 20000 --rounds 1").
CELLS_ARGS ?=
bench-cells: venv
	$(PY) bench/cells.py $(CELLS_ARGS)

bench-dashboard: venv
	$(PY) bench/dashboard.py $(BENCH_DASHBOARD_ARGS)

# Each migration since the previous release applied under a producer and a worker on a table of 10M jobs:
# the locks it takes, the longest schedule and claim call, its duration (BENCH_MIGRATE_ARGS="--rows 1000000"
# for a smaller table; docs/schema.md keeps the table).
BENCH_MIGRATE_ARGS ?=
bench-migrate: venv
	$(PY) bench/migrate.py $(BENCH_MIGRATE_ARGS)

# The upgrade rehearsal (tools/rehearse_upgrade.py): the previous release's workers and producers under
# load while this release's `jobbus migrate` runs, then new workers replace them one by one; fails on a
# lost or twice-run job or an error of any process. Full size by default (1M finished rows, a minute of
# load); CI runs it small (REHEARSE_ARGS="--jobs 20000 --seconds 20"). On JOBBUS_TEST_DSN's server, else
# the embedded one; the previous release's wheel and venv are built once into .rehearse/.
REHEARSE_ARGS ?= --jobs 1000000 --seconds 60 --rate 100
rehearse-upgrade: venv
	$(PY) -m tools.rehearse_upgrade $(REHEARSE_ARGS)

dashboard: venv
	$(VENV)/bin/jobbus dashboard

clean:
	rm -rf $(VENV) $(VENV_DJANGO6) $(VENV_DEMO) .rehearse .pytest_cache .mypy_cache .ruff_cache .import_linter_cache dist site

VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
PYTEST_ARGS ?= -n 2

.PHONY: venv test test-smoke faults lint demo bench bench-capacity bench-steady clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

LINTED := src tests $(wildcard bench) conftest.py

lint: venv
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy $(LINTED)

test: lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The smoke subset, meant for the embedded server (JOBBUS_TEST_DSN unset).
test-smoke: venv
	$(VENV)/bin/pytest -m smoke $(PYTEST_ARGS)

# The fault-injection suite at full scale (CI runs it at a smaller scale with every test run).
faults: venv
	JOBBUS_FULL_FAULTS=1 $(VENV)/bin/pytest tests/faults -n 2

demo: venv
	$(VENV)/bin/jobbus demo

bench: venv
	$(PY) bench/run.py

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

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

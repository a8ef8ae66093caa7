VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
PYTEST_ARGS ?= -n 2

.PHONY: venv test test-smoke faults browser lint demo bench bench-dashboard dashboard clean

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

# The full browser sweep (the normal suite runs a slice): Debian's chromium, screenshots in artifacts/screenshots/.
browser: venv
	JOBBUS_BROWSER_FULL=1 $(VENV)/bin/pytest tests/browser -m browser $(PYTEST_ARGS)

demo: venv
	$(VENV)/bin/jobbus demo

bench: venv
	$(PY) bench/run.py

# p95 of every dashboard page on a large table (BENCH_DASHBOARD_ARGS="--rows 1000000" for a smaller one).
bench-dashboard: venv
	$(PY) bench/dashboard.py $(BENCH_DASHBOARD_ARGS)

dashboard: venv
	$(VENV)/bin/jobbus dashboard

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

"""The pytest plugin for code that enqueues jobs: a `jobbus_app` fixture on an isolated schema.

Installed with jobbus and loaded by pytest automatically (entry point ``pytest11``); a project that
disables plugin autoloading adds ``pytest_plugins = ["jobbus.testing"]`` to its root conftest.py.

- `jobbus_dsn` (session): the server the tests use: ``--jobbus-dsn``, the ``jobbus_dsn`` ini option,
  ``JOBBUS_TEST_DSN``, ``JOBBUS_DSN``, else the embedded server (``pip install 'jobbus[embedded]'``)
  with its data in ``.jobbus/pytest-pgdata`` under the rootdir.
- `jobbus_schema`: a schema of its own for each test, migrated before and dropped after it, so tests
  run in parallel (pytest-xdist) on one database and leave nothing behind.
- `jobbus_app`: the project's App (named by the ``jobbus_app`` ini option, ``module:attribute``)
  pointed at that schema for the test and restored after it, so its handlers and tasks are the
  real ones; without the option, a new `jobbus.App` on the schema. Open it with ``async with
  jobbus_app:`` in async tests (blocking code uses ``jobbus_app.sync``), and run what the code under
  test enqueued with ``await jobbus_app.drain()`` / ``jobbus_app.sync.drain()``.
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported by the fixtures, so that every pytest run that never uses them stays light
    from jobbus.app import App

__all__ = ["jobbus_app", "jobbus_dsn", "jobbus_schema", "load_app"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("jobbus")
    group.addoption("--jobbus-dsn", default=None, help="PostgreSQL server for the jobbus_app fixture's schemas")
    parser.addini("jobbus_dsn", "PostgreSQL server for the jobbus_app fixture's schemas", default="")
    parser.addini("jobbus_app", "module:attribute of the App that jobbus_app points at a test's schema", default="")


@pytest.fixture(scope="session")
def jobbus_dsn(request: pytest.FixtureRequest) -> str:
    """The PostgreSQL server of the tests (see the module's docstring for where it comes from)."""
    config = request.config
    given = (
        config.getoption("--jobbus-dsn")
        or config.getini("jobbus_dsn")
        or os.environ.get("JOBBUS_TEST_DSN")
        or os.environ.get("JOBBUS_DSN")
    )
    if given:
        return str(given)
    from jobbus.embedded import start_embedded

    return start_embedded(Path(config.rootpath) / ".jobbus" / "pytest-pgdata")


@pytest.fixture
def jobbus_schema(jobbus_dsn: str) -> Iterator[str]:
    """A migrated schema for this test alone, dropped after it."""
    import psycopg
    from psycopg import sql

    from jobbus import schema as schema_module

    name = f"jobbus_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(jobbus_dsn, autocommit=True) as conn:
        schema_module.migrate(conn, name)
    try:
        yield name
    finally:
        with psycopg.connect(jobbus_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def jobbus_app(request: pytest.FixtureRequest, jobbus_dsn: str, jobbus_schema: str) -> Iterator[App]:
    """The project's App (ini option ``jobbus_app``) or a new one, on this test's own schema."""
    from jobbus.app import App

    target = str(request.config.getini("jobbus_app"))
    if not target:
        app = App(dsn=jobbus_dsn, schema=jobbus_schema)
        try:
            yield app
        finally:
            app.sync.close()
        return
    app = load_app(target)
    previous = app.reconfigure(dsn=jobbus_dsn, schema=jobbus_schema, listen_dsn=None)
    try:
        yield app
    finally:
        app.sync.close()
        app.reconfigure(**previous.as_dict())


def load_app(target: str) -> App:
    """The App at ``module:attribute``."""
    from jobbus.app import App

    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise pytest.UsageError(f"jobbus_app = {target!r}: write it as module:attribute, e.g. myproject.jobs:app")
    found = getattr(importlib.import_module(module_name), attribute, None)
    if not isinstance(found, App):
        raise pytest.UsageError(f"jobbus_app = {target!r}: {module_name}.{attribute} is not a jobbus.App")
    return found

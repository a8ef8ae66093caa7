"""migrate and schema: idempotent migrations, and a printed script a worker accepts."""

from __future__ import annotations

import psycopg
import pytest

from jobbus import schema
from tests.cli import execute, job_status, jobbus, query_value


def test_migrate_twice_is_a_noop(empty_dsn: str) -> None:
    first = jobbus(empty_dsn, "migrate")
    assert first.returncode == 0, first.stderr
    assert f"now at version {schema.latest_version()}" in first.stdout
    second = jobbus(empty_dsn, "migrate")
    assert second.returncode == 0, second.stderr
    assert "nothing to do" in second.stdout
    assert query_value(empty_dsn, "SELECT count(*) FROM jobbus.migration") == schema.latest_version()


def test_the_schema_script_applies_to_an_empty_database_and_a_worker_accepts_it(empty_dsn: str) -> None:
    printed = jobbus(None, "schema")
    assert printed.returncode == 0, printed.stderr
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(printed.stdout.encode())

    job_id = jobbus(empty_dsn, "schedule", "noop").stdout.strip()
    worker = jobbus(empty_dsn, "worker", "--app", "tests.cli.apps:app", "--stop-when-empty")
    assert worker.returncode == 0, worker.stderr
    assert job_status(empty_dsn, job_id) == "completed"
    assert "nothing to do" in jobbus(empty_dsn, "migrate").stdout


def test_the_schema_script_honours_the_schema_name(empty_dsn: str) -> None:
    printed = jobbus(None, "schema", JOBBUS_SCHEMA="jobs_elsewhere")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(printed.stdout.encode())
    scheduled = jobbus(empty_dsn, "schedule", "noop", JOBBUS_SCHEMA="jobs_elsewhere")
    assert scheduled.returncode == 0, scheduled.stderr
    status = jobbus(empty_dsn, "status", "--json", JOBBUS_SCHEMA="jobs_elsewhere")
    assert '"queued": 1' in status.stdout
    assert jobbus(empty_dsn, "status").returncode == 78  # the default schema does not exist there


def test_the_dry_run_of_a_fresh_database_applies_as_printed(empty_dsn: str) -> None:
    dry = jobbus(empty_dsn, "migrate", "--dry-run", "--sql")
    assert dry.returncode == 0, dry.stderr
    assert query_value(empty_dsn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'jobbus'") == 0  # changed nothing
    with psycopg.connect(empty_dsn, autocommit=True) as conn, conn.transaction():
        conn.execute(dry.stdout.encode())
    again = jobbus(empty_dsn, "migrate")
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stdout
    assert query_value(empty_dsn, "SELECT max(version) FROM jobbus.migration") == schema.latest_version()
    assert "up to date" in jobbus(empty_dsn, "migrate", "--dry-run").stdout


def test_migrate_refuses_a_schema_newer_than_this_jobbus(dsn: str) -> None:
    newer = schema.latest_version() + 1
    execute(dsn, "INSERT INTO jobbus.migration (version, name) VALUES (%s, 'from_the_future')", newer)
    for args in (["migrate"], ["migrate", "--dry-run"], ["migrate", "--dry-run", "--sql"]):
        result = jobbus(dsn, *args)
        assert result.returncode == 78, (args, result.stdout, result.stderr)
        assert f"schema jobbus is at version {newer}, newer than this jobbus" in result.stderr
        assert "upgrade jobbus" in result.stderr
        assert "up to date" not in result.stdout
    assert query_value(dsn, "SELECT max(version) FROM jobbus.migration") == newer


@pytest.mark.parametrize("name", ["pg_jobs", "public", "information_schema"])
def test_reserved_schema_names_are_bad_usage(empty_dsn: str, name: str) -> None:
    for args in (["migrate", "--schema", name], ["schema", "--schema", name]):
        result = jobbus(empty_dsn, *args)
        assert result.returncode == 64, (args, result.stderr)
        assert f"schema {name!r} is reserved" in result.stderr
    configured = jobbus(empty_dsn, "migrate", JOBBUS_SCHEMA=name)  # a setting, not an argument
    assert configured.returncode == 78, configured.stderr
    assert "reserved" in configured.stderr
    assert query_value(empty_dsn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'pg_jobs'") == 0

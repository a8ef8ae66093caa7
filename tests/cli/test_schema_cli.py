"""migrate and schema: idempotent migrations, and a printed script a worker accepts."""

from __future__ import annotations

import psycopg

from jobbus import schema
from tests.cli import job_status, jobbus, query_value


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

import threading

import psycopg
import pytest

import jobbus
from jobbus import schema


def _tables(dsn: str, name: str = "jobbus") -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (name,)).fetchall()
    return {r[0] for r in rows}


def test_migrate_creates_everything_and_twice_is_a_no_op(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        first = schema.migrate(conn, "jobbus")
        second = schema.migrate(conn, "jobbus")
    assert [m.version for m in first] == [m.version for m in schema.migrations()]
    assert second == []
    assert {"job", "migration", "worker", "pause", "command"} <= _tables(empty_dsn)


@pytest.mark.smoke
def test_concurrent_migrations_apply_each_version_once(empty_dsn: str) -> None:
    results: list[list[schema.Migration]] = []
    errors: list[BaseException] = []

    def migrate() -> None:
        try:
            with psycopg.connect(empty_dsn, autocommit=True) as conn:
                results.append(schema.migrate(conn, "jobbus"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(len(r) for r in results) == [0, 0, 0, len(schema.migrations())]
    with psycopg.connect(empty_dsn) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM jobbus.migration ORDER BY 1")]
    assert versions == [m.version for m in schema.migrations()]


def test_missing_schema_raises_schema_error_saying_what_to_run(empty_dsn: str) -> None:
    app = jobbus.App(dsn=empty_dsn)
    with app.sync, pytest.raises(jobbus.SchemaError, match="jobbus migrate"):
        app.sync.check_schema()


async def test_older_schema_raises_schema_error_with_versions(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        schema.migrate(conn, "jobbus")
        conn.execute("DELETE FROM jobbus.migration WHERE version = %s", (schema.latest_version(),))
    async with jobbus.App(dsn=empty_dsn) as app:
        with pytest.raises(jobbus.SchemaError, match=f"this code needs {schema.latest_version()}"):
            await app.check_schema()


def test_schema_script_applies_to_an_empty_database_and_records_its_migrations(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(schema.script("jobbus").encode())
        assert schema.migrate(conn, "jobbus") == []
    app = jobbus.App(dsn=empty_dsn)
    with app.sync:
        assert app.sync.check_schema() == schema.latest_version()


def test_custom_schema_name_is_isolated(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        schema.migrate(conn, "tenant_a")
    app = jobbus.App(dsn=empty_dsn, schema="tenant_a")
    with app.sync:
        job_id = app.sync.schedule("t")
        assert app.sync.find(job_id) is not None
    assert "job" in _tables(empty_dsn, "tenant_a")
    assert _tables(empty_dsn, "jobbus") == set()


@pytest.mark.parametrize("name", ['x"; DROP SCHEMA public; --', "Upper", "1abc", "", "a" * 64, "a-b"])
def test_schema_names_that_are_not_plain_identifiers_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="schema"):
        schema.script(name)


def test_configuration_data_cannot_be_updated_but_execution_data_can(sync_app: jobbus.App, dsn: str) -> None:
    job_id = sync_app.sync.schedule("t", {"a": 1})
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation, match="immutable"):
            conn.execute("UPDATE jobbus.job SET configuration_data = '{\"a\": 2}' WHERE id = %s", (job_id,))
        conn.execute("UPDATE jobbus.job SET execution_data = '{\"offset\": 5}' WHERE id = %s", (job_id,))
    job = sync_app.sync.find(job_id)
    assert job is not None
    assert job.configuration_data == {"a": 1}
    assert job.execution_data == {"offset": 5}

import threading
import uuid

import psycopg
import pytest

import jobbus
from jobbus import JobRequest, schema


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


@pytest.mark.parametrize("written", ['{"a": 1.0, "b": [2]}', '{"a": 1, "b": [2.00]}', '{"a": 10e-1, "b": [2]}'])
def test_configuration_data_cannot_be_changed_to_a_number_jsonb_calls_equal(
    sync_app: jobbus.App, dsn: str, written: str
) -> None:
    """jsonb holds 1 and 1.0 equal, but a handler reads an int or a float: that is a change, refused. Writing
    back exactly what is stored (an ORM saving every column) changes nothing and is let through."""
    job_id = sync_app.sync.schedule("t", {"a": 1, "b": [2]})
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation, match="immutable"):
            conn.execute("UPDATE jobbus.job SET configuration_data = %s::jsonb WHERE id = %s", (written, job_id))
        conn.execute("UPDATE jobbus.job SET configuration_data = configuration_data WHERE id = %s", (job_id,))
        conn.execute('UPDATE jobbus.job SET configuration_data = \'{"b": [2], "a": 1}\' WHERE id = %s', (job_id,))
        stored = conn.execute("SELECT configuration_data::text FROM jobbus.job WHERE id = %s", (job_id,)).fetchone()
    assert stored == ('{"a": 1, "b": [2]}',)
    job = sync_app.sync.find(job_id)
    assert job is not None and job.configuration_data == {"a": 1, "b": [2]}
    assert type(job.configuration_data["a"]) is int


def test_current_code_reads_and_writes_jobs_on_the_previous_schema_version(empty_dsn: str) -> None:
    """During a rolling deploy new producers may run before `jobbus migrate`: the job paths still work."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        previous = schema.migrations()[:-1]
        conn.execute(
            b"CREATE SCHEMA jobbus; CREATE TABLE jobbus.migration (version int PRIMARY KEY, name text,"
            b" applied_at timestamptz DEFAULT now())"
        )
        for migration in previous:
            conn.execute(migration.render("jobbus").encode())
    app = jobbus.App(dsn=empty_dsn)
    with app.sync:
        job_id = app.sync.schedule("t", {"a": 1}, unique_key="k")
        assert app.sync.find(job_id) is not None
        assert app.sync.cancel(job_id) is jobbus.JobStatus.CANCELLED
        failed = app.sync.schedule("t")
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            conn.execute("UPDATE jobbus.job SET status = 'failed', finished_at = now() WHERE id = %s", (failed,))
        app.sync.retry(failed)
        assert app.sync.find(failed).status is jobbus.JobStatus.QUEUED  # type: ignore[union-attr]


@pytest.mark.parametrize("behind", [None, 13], ids=["no schema", "schema 13"])
def test_producers_on_an_outdated_schema_raise_schema_error_saying_to_migrate(
    empty_dsn: str, behind: int | None
) -> None:
    """A verb whose statement meets a missing table, column or function says what to run, instead of
    psycopg's UndefinedTable or UndefinedColumn (schema 13 has no expires_at)."""
    if behind is not None:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            conn.execute(
                b"CREATE SCHEMA jobbus; CREATE TABLE jobbus.migration (version int PRIMARY KEY, name text,"
                b" applied_at timestamptz DEFAULT now())"
            )
            for migration in schema.migrations()[:behind]:
                conn.execute(migration.render("jobbus").encode())
                record = "INSERT INTO jobbus.migration (version, name) VALUES (%s, %s)"
                conn.execute(record, (migration.version, migration.name))
    needed = "is missing: run `jobbus migrate`" if behind is None else f"at version {behind}, this code needs"
    app = jobbus.App(dsn=empty_dsn)
    with app.sync:
        with pytest.raises(jobbus.SchemaError, match=needed):
            app.sync.schedule("t", expires=60)
        with pytest.raises(jobbus.SchemaError, match=needed):
            app.sync.schedule_many([JobRequest("t", expires=60), JobRequest("u", expires=60)])
        if behind is None:
            with pytest.raises(jobbus.SchemaError, match=needed):
                app.sync.cancel(uuid.uuid4())
    with psycopg.connect(empty_dsn) as conn, pytest.raises(jobbus.SchemaError, match=needed):
        app.sync.schedule("t", expires=60, connection=conn)  # in the caller's transaction, now aborted


def test_a_server_older_than_postgresql_14_is_refused_naming_both_versions() -> None:
    with pytest.raises(jobbus.SchemaError, match=r"PostgreSQL 13\.18 is too old for jobbus: it needs PostgreSQL 14"):
        schema.check_server(130018)
    with pytest.raises(jobbus.SchemaError, match=r"PostgreSQL 9\.6 is too old"):
        schema.check_server(90624)
    schema.check_server(140000)


def test_old_code_accepts_a_newer_schema() -> None:
    schema.check_version("jobbus", schema.latest_version() + 1)  # additive migrations: no error


def test_migrations_after_the_first_never_block_writes_to_the_job_table(empty_dsn: str) -> None:
    """Later migrations must not take a lock that stops job writes (a plain CREATE INDEX or ALTER TABLE on
    a large job table would): a writer inserting all along, unable to wait 2 s for a lock, never fails."""
    import os

    rows = 1_000_000 if os.environ.get("JOBBUS_FULL_FAULTS") == "1" else 50_000
    first = schema.migrations()[0]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            b"CREATE SCHEMA jobbus; CREATE TABLE jobbus.migration (version int PRIMARY KEY, name text,"
            b" applied_at timestamptz DEFAULT now())"
        )
        conn.execute(first.render("jobbus").encode())
        conn.execute(b"INSERT INTO jobbus.migration (version, name) VALUES (1, 'job')")
        conn.execute(
            "INSERT INTO jobbus.job (id, type, status, max_attempts, finished_at)"
            " SELECT gen_random_uuid(), 't', 'completed', 3, now() FROM generate_series(1, %s)",
            (rows,),
        )
    stop = threading.Event()
    written: list[int] = []
    failures: list[BaseException] = []

    def write() -> None:
        try:
            with psycopg.connect(empty_dsn, autocommit=True, options="-c lock_timeout=2000") as writer:
                while not stop.is_set():
                    writer.execute("INSERT INTO jobbus.job (id, type, max_attempts) VALUES (gen_random_uuid(), 'w', 1)")
                    written.append(1)
        except BaseException as exc:
            failures.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            applied = schema.migrate(conn, "jobbus")
    finally:
        stop.set()
        writer.join()
    assert failures == []
    assert written
    assert [m.version for m in applied] == [m.version for m in schema.migrations()[1:]]


def test_dry_run_prints_pending_sql_and_applies_nothing(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        text = schema.pending_sql(conn, "jobbus")
        assert 'CREATE TABLE "jobbus".job' in text
        assert schema.current_version_sync(conn, "jobbus") == 0
        schema.migrate(conn, "jobbus")
        assert schema.pending_sql(conn, "jobbus") == ""


def test_pending_sql_on_an_empty_database_is_a_script_that_applies_on_its_own(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        pending = schema.pending_sql(conn, "jobbus")
        with conn.transaction():
            conn.execute(pending.encode())
        assert schema.migrate(conn, "jobbus") == []
        assert schema.current_version_sync(conn, "jobbus") == schema.latest_version()
        assert schema.pending_sql(conn, "jobbus") == ""


def test_pending_sql_from_an_older_version_applies_only_what_is_missing(empty_dsn: str) -> None:
    older = schema.migrations()[:-1]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(schema.script("jobbus").split(f"\n-- {schema.migrations()[-1].version:04d}_")[0].encode())
        assert schema.current_version_sync(conn, "jobbus") == older[-1].version
        pending = schema.pending_sql(conn, "jobbus")
        assert f"from version {older[-1].version} to {schema.latest_version()}" in pending
        assert all(f"-- {m.version:04d}_{m.name}" not in pending for m in older)
        with conn.transaction():
            conn.execute(pending.encode())
        assert schema.migrate(conn, "jobbus") == []
        assert schema.current_version_sync(conn, "jobbus") == schema.latest_version()


def test_a_schema_newer_than_the_code_is_not_migrated(dsn: str) -> None:
    newer = schema.latest_version() + 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO jobbus.migration (version, name) VALUES (%s, 'from_the_future')", (newer,))
        for attempt in (schema.migrate, schema.pending_sql):
            with pytest.raises(jobbus.SchemaError, match=f"at version {newer}, newer than this jobbus.*upgrade jobbus"):
                attempt(conn, "jobbus")
        assert schema.current_version_sync(conn, "jobbus") == newer
    app = jobbus.App(dsn=dsn)
    with app.sync:
        assert app.sync.check_schema() == newer  # running against it stays allowed (rolling upgrades)


def test_the_claim_keeps_its_planner_settings(empty_dsn: str) -> None:
    """The claim walks its indexes (no bitmap or sequential scan, whatever the statistics) and plans
    its statements once per connection: a later `CREATE OR REPLACE` of claim_jobs must restate both."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        schema.migrate(conn, "jobbus")
        (settings,) = conn.execute(
            "SELECT proconfig FROM pg_proc WHERE oid = 'jobbus.claim_jobs(text, integer, text[], text[],"
            " double precision, integer, text[], integer)'::regprocedure"
        ).fetchone()  # type: ignore[misc]
    assert {"enable_bitmapscan=off", "enable_seqscan=off", "plan_cache_mode=force_generic_plan"} <= set(settings)

"""`jobbus migrate` under traffic: recorded locks taken first, bounded waits, retries, its own exit code."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from tools import generate_migration_locks

from jobbus import schema
from jobbus.errors import MigrationLockError
from tests.cli import jobbus, query_value
from tests.processes import wait_until

#: The last migration of release 0.2.0, before the migrations that take their locks first.
PREVIOUS_RELEASE = 14
#: The last migration that builds indexes CONCURRENTLY on the job table (0026_view_indexes).
VIEW_INDEXES = 26
READ_AND_THINK = "SELECT (SELECT count(*) FROM jobbus.job WHERE id = %s), pg_sleep(0.02)"
INSERT = "INSERT INTO jobbus.job (id, type, max_attempts) VALUES (gen_random_uuid(), 'w', 3)"


def _at_version(dsn: str, version: int, finished_rows: int = 0) -> None:
    """The schema as migrations up to `version` left it, with `finished_rows` completed jobs."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        schema.migrate(conn, "jobbus", target=version)
        if finished_rows:
            conn.execute(
                "INSERT INTO jobbus.job (id, type, status, max_attempts, finished_at)"
                " SELECT gen_random_uuid(), 't', 'completed', 3, now() FROM generate_series(1, %s)",
                (finished_rows,),
            )


def _version(dsn: str) -> int:
    return int(query_value(dsn, "SELECT max(version) FROM jobbus.migration"))


def _invalid_indexes(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
            " JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE n.nspname = 'jobbus' AND NOT i.indisvalid"
        ).fetchall()
    return [row[0] for row in rows]


@contextmanager
def _holding(dsn: str, statement: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A session in an open transaction that ran `statement` (and so holds its locks) until the block ends."""
    with psycopg.connect(dsn, autocommit=True, application_name="held-by-test") as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute(statement.encode())
        try:
            yield holder
        finally:
            holder.execute("ROLLBACK")


def test_the_recorded_locks_are_what_pg_locks_shows_when_each_migration_is_applied(empty_dsn: str) -> None:
    observed = generate_migration_locks.observe(empty_dsn)
    assert list(observed) == [m.key for m in schema.migrations()]
    assert {key: list(locks) for key, locks in schema.lock_record().items()} == observed
    # What the up-front locks make of the record: the column added by 15 takes the table whole; the
    # statistics and back-filled failure groups of 25 block neither inserts nor claims.
    by_key = {m.key: m for m in schema.migrations()}
    assert by_key["0015_failure_groups"].locks_up_front() == [("job", "AccessExclusiveLock")]
    assert by_key["0025_view_statistics"].locks_up_front()[0] == ("job", "ShareUpdateExclusiveLock")


def test_the_covering_mode_lets_every_recorded_mode_follow_without_a_wait() -> None:
    assert schema.covering_mode(["RowExclusiveLock", "ShareUpdateExclusiveLock"]) == "ShareUpdateExclusiveLock"
    assert schema.covering_mode(["ShareLock", "RowExclusiveLock"]) == "ShareRowExclusiveLock"
    assert schema.covering_mode(["ShareUpdateExclusiveLock", "ShareLock"]) == "ShareRowExclusiveLock"
    assert schema.covering_mode(["AccessShareLock"]) == "AccessShareLock"
    assert schema.lock_mode_sql("ShareRowExclusiveLock") == "SHARE ROW EXCLUSIVE"
    with pytest.raises(ValueError, match="not a table lock mode"):
        schema.lock_mode_sql("SIReadLock")
    durable_waits = next(m for m in schema.migrations() if m.version == 13)
    plan = schema.lock_plan("jobs", [durable_waits]).splitlines()
    assert plan[0] == "0013_durable_waits (in one transaction)"
    assert "  jobs.event: ROW SHARE, ROW EXCLUSIVE, SHARE (taken first as SHARE ROW EXCLUSIVE); no rewrite" in plan
    assert "  jobs.job_parent: ACCESS EXCLUSIVE; no rewrite" in plan
    unrecorded = schema.Migration(schema.latest_version() + 1, "not_recorded_yet", "SELECT 1;\n")
    assert unrecorded.locks() is None and unrecorded.locks_up_front() == []
    assert schema.lock_plan("jobs", [unrecorded]).splitlines()[1] == (
        "  locks not recorded in sql/migration_locks.json: run `make schema`"
    )


def test_migrating_under_traffic_that_holds_the_job_table_never_deadlocks(empty_dsn: str) -> None:
    """Producers and workers of an older schema hold AccessShare (or RowShare) on the job table in open
    transactions, then write it: a migration that took one lock and then asked for a stronger one closed
    a cycle with them. Taking the strongest lock first, for a bounded time, leaves every statement of
    theirs to succeed."""
    _at_version(empty_dsn, 11, finished_rows=20_000)
    stop = threading.Event()
    failures: list[BaseException] = []
    done = {"produced": 0, "claimed": 0}
    longest = {"produced": 0.0, "claimed": 0.0}

    def produce() -> None:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    with (
                        conn.transaction()
                    ):  # reads the table, thinks 20 ms, then inserts: AccessShare, then RowExclusive
                        conn.execute(
                            "SELECT (SELECT count(*) FROM jobbus.job WHERE id = %s), pg_sleep(0.02)", (uuid.uuid4(),)
                        )
                        conn.execute(
                            "INSERT INTO jobbus.job (id, type, max_attempts) VALUES (gen_random_uuid(), 'w', 3)"
                        )
                except BaseException as exc:
                    failures.append(exc)
                    return
                done["produced"] += 1
                longest["produced"] = max(longest["produced"], time.monotonic() - started)

    def claim() -> None:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    with conn.transaction():  # RowShare with the row lock, then RowExclusive for the update
                        row = conn.execute(
                            "SELECT id, pg_sleep(0.02) FROM jobbus.job WHERE status = 'queued' AND type = 'w'"
                            " LIMIT 1 FOR UPDATE SKIP LOCKED"
                        ).fetchone()
                        if row is not None:
                            conn.execute(
                                "UPDATE jobbus.job SET status = 'completed', attempts = 1, finished_at = now()"
                                " WHERE id = %s",
                                (row[0],),
                            )
                except BaseException as exc:
                    failures.append(exc)
                    return
                done["claimed"] += row is not None
                longest["claimed"] = max(longest["claimed"], time.monotonic() - started)

    traffic = [threading.Thread(target=target) for target in (produce, produce, claim, claim)]
    for thread in traffic:
        thread.start()
    try:
        wait_until(lambda: done["claimed"] >= 5 or failures, what="traffic under way")
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            applied = schema.migrate(conn, "jobbus", lock_timeout=0.2, lock_wait=60)
        after = dict(done)
        wait_until(
            lambda: (done["produced"] > after["produced"] and done["claimed"] > after["claimed"]) or failures,
            what="traffic going on after the migration",
        )
    finally:
        stop.set()
        for thread in traffic:
            thread.join()
    assert failures == []
    assert [m.version for m in applied] == list(range(12, schema.latest_version() + 1))
    assert _version(empty_dsn) == schema.latest_version()
    # Each transaction waited for the migration at most a lock_timeout (0.2 s) per try: on a busy
    # machine, well under the second SPEC allows, think time included.
    assert max(longest.values()) < 1.5, longest


def test_a_lock_held_all_along_exits_73_naming_the_table_and_its_holder_and_a_released_one_lets_migrate_finish(
    empty_dsn: str,
) -> None:
    _at_version(empty_dsn, PREVIOUS_RELEASE)
    with _holding(empty_dsn, "LOCK TABLE jobbus.job IN ACCESS SHARE MODE") as holder:
        result = jobbus(empty_dsn, "migrate", "--lock-timeout", "0.1", "--lock-wait", "1")
        assert result.returncode == 73, (result.stdout, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "migration 0015_failure_groups could not take jobbus.job in ACCESS EXCLUSIVE mode" in result.stderr
        assert f"pid {holder.info.backend_pid} (AccessShareLock, idle in transaction" in result.stderr
        assert "application 'held-by-test'" in result.stderr
        assert "waiting for jobbus.job in ACCESS EXCLUSIVE mode for 0015_failure_groups" in result.stdout
        assert _version(empty_dsn) == PREVIOUS_RELEASE  # nothing of 15 applied

        # Tried again while the lock is still held: migrate retries, and finishes once it is released.
        lines: list[str] = []
        outcome: list[object] = []

        def migrate() -> None:
            with psycopg.connect(empty_dsn, autocommit=True) as conn:
                try:
                    outcome.append(
                        schema.migrate(conn, "jobbus", lock_timeout=0.1, lock_wait=60, progress=lines.append)
                    )
                except BaseException as exc:
                    outcome.append(exc)

        migrator = threading.Thread(target=migrate)
        migrator.start()
        wait_until(lambda: sum("waiting for jobbus.job" in line for line in lines) >= 2, what="two retries")
        # While it retries, an insert waits for at most one lock_timeout.
        with psycopg.connect(empty_dsn, autocommit=True) as writer:
            started = time.monotonic()
            writer.execute(INSERT)
            assert time.monotonic() - started < 1.0
    migrator.join()
    assert len(outcome) == 1 and isinstance(outcome[0], list), outcome
    assert _version(empty_dsn) == schema.latest_version()
    assert "applied 0015_failure_groups" in lines


def test_the_library_raises_migration_lock_error_with_the_table(empty_dsn: str) -> None:
    _at_version(empty_dsn, PREVIOUS_RELEASE)
    with (
        _holding(empty_dsn, "LOCK TABLE jobbus.job IN ROW EXCLUSIVE MODE"),
        psycopg.connect(empty_dsn, autocommit=True) as conn,
        pytest.raises(MigrationLockError) as raised,
    ):
        schema.migrate(conn, "jobbus", lock_timeout=0.05, lock_wait=0.3)
    assert (raised.value.table, raised.value.mode) == ("jobbus.job", "AccessExclusiveLock")
    assert "RowExclusiveLock" in raised.value.holders


def test_migrate_and_status_ignore_a_roles_statement_timeout(empty_dsn: str) -> None:
    """A role whose statement_timeout (50 ms) cuts short a scan of the table: migrate builds its indexes
    and status counts all the same."""
    _at_version(empty_dsn, PREVIOUS_RELEASE, finished_rows=300_000)
    role = f"jobbus_hurried_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER").format(sql.Identifier(role)))
        conn.execute(sql.SQL("ALTER ROLE {} SET statement_timeout = '50ms'").format(sql.Identifier(role)))
    as_role = make_conninfo(empty_dsn, user=role)
    try:
        with psycopg.connect(as_role, autocommit=True) as conn, pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT count(*), pg_sleep(0.1) FROM jobbus.job")  # the role's timeout bites
        migrated = jobbus(as_role, "migrate", timeout=300)
        assert migrated.returncode == 0, migrated.stderr
        assert _version(empty_dsn) == schema.latest_version()
        assert _invalid_indexes(empty_dsn) == []
        status = jobbus(as_role, "status", "--json", timeout=120)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["totals"]["completed"] > 10_000  # exact, or the bound of an estimate
    finally:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            # What its migrate created stays (a trigger of the table may use a function the role owns).
            conn.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_an_index_build_cancelled_half_way_is_dropped_and_built_again_by_the_next_migrate(empty_dsn: str) -> None:
    _at_version(empty_dsn, VIEW_INDEXES - 1, finished_rows=20_000)
    failed: list[BaseException] = []

    def migrate() -> None:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            try:
                schema.migrate(conn, "jobbus")
            except BaseException as exc:
                failed.append(exc)

    # An old snapshot the build waits out: it is cancelled while it waits, its index already in the catalog.
    with _holding(empty_dsn, "SELECT txid_current()"):
        migrator = threading.Thread(target=migrate)
        migrator.start()
        building = wait_until(
            lambda: query_value(
                empty_dsn,
                "SELECT pid FROM pg_stat_activity WHERE query ILIKE 'CREATE INDEX CONCURRENTLY%%'"
                " AND wait_event_type = 'Lock' AND datname = current_database()",
            ),
            what="an index build waiting for the old snapshot",
        )
        assert query_value(empty_dsn, "SELECT pg_cancel_backend(%s)", building)
        migrator.join()
    assert len(failed) == 1 and isinstance(failed[0], psycopg.errors.QueryCanceled), failed
    assert _invalid_indexes(empty_dsn) != []
    assert _version(empty_dsn) == VIEW_INDEXES - 1

    again = jobbus(empty_dsn, "migrate")
    assert again.returncode == 0, again.stderr
    assert _invalid_indexes(empty_dsn) == []
    assert _version(empty_dsn) == schema.latest_version()


def test_the_dry_run_prints_each_pending_migrations_locks_without_taking_any(empty_dsn: str) -> None:
    _at_version(empty_dsn, PREVIOUS_RELEASE)
    # An exclusive lock on the job table held all along: the dry run does not need the table.
    with _holding(empty_dsn, "LOCK TABLE jobbus.job IN ACCESS EXCLUSIVE MODE"):
        dry = jobbus(empty_dsn, "migrate", "--dry-run", timeout=30)
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[0] == "0015_failure_groups (in one transaction)"
    assert lines[1] == "  jobbus.job: ACCESS EXCLUSIVE; no rewrite"
    assert "0016_queue_tally (in one transaction)" in lines
    assert "  creates jobbus.queue_tally, jobbus.queue_tally_start" in lines
    concurrent = lines.index("0024_unstarted_expiry_index (statement by statement, CONCURRENTLY)")
    assert lines[concurrent + 1] == "  jobbus.job: SHARE UPDATE EXCLUSIVE; no rewrite"
    assert not any(line.startswith("0014_") for line in lines)
    assert sum(not line.startswith(" ") for line in lines) == schema.latest_version() - PREVIOUS_RELEASE
    assert _version(empty_dsn) == PREVIOUS_RELEASE

    script = jobbus(empty_dsn, "migrate", "--dry-run", "--sql")
    assert script.returncode == 0, script.stderr
    assert f"from version {PREVIOUS_RELEASE} to {schema.latest_version()}" in script.stdout
    assert 'ALTER TABLE "jobbus".job ADD COLUMN error_group text' in script.stdout
    refused = jobbus(empty_dsn, "migrate", "--sql")
    assert refused.returncode == 64
    assert "--sql goes with --dry-run" in refused.stderr


def test_an_index_build_that_waits_out_an_old_transaction_past_lock_wait_exits_73_naming_it(empty_dsn: str) -> None:
    _at_version(empty_dsn, VIEW_INDEXES - 1, finished_rows=5_000)
    with _holding(empty_dsn, "SELECT txid_current()") as holder:
        result = jobbus(empty_dsn, "migrate", "--lock-timeout", "0.5", "--lock-wait", "1")
        assert result.returncode == 73, (result.stdout, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "0026_view_indexes waited 1 s for jobbus.job and the transactions its index build waits out" in (
            result.stderr
        )
        assert f"pid {holder.info.backend_pid} (an open transaction, idle in transaction" in result.stderr
    assert _invalid_indexes(empty_dsn) != []
    again = jobbus(empty_dsn, "migrate")
    assert again.returncode == 0, again.stderr
    assert _invalid_indexes(empty_dsn) == []
    assert _version(empty_dsn) == schema.latest_version()

"""`jobbus doctor`: each check made to fail by making its problem happen, and the exit codes."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import doctor
from jobbus.store import WorkerStore, run_sync
from jobbus.store.doctor import ServerFacts
from tests.cli import UNREACHABLE_DSN, execute
from tests.cli import jobbus as run_jobbus
from tests.cluster import Cluster, throwaway_cluster
from tests.processes import query, wait_until
from tests.storehelpers import registration

CHECKS = ["server", "migrations", "replication", "connections", "autovacuum", "clock", "idle_transactions"]


def _doctor(dsn: str, lease_seconds: str | None = None) -> tuple[int, list[dict[str, Any]]]:
    if lease_seconds is None:
        result = run_jobbus(dsn, "doctor", "--json")
    else:
        result = run_jobbus(dsn, "doctor", "--json", JOBBUS_LEASE_SECONDS=lease_seconds)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def _by_check(findings: list[dict[str, Any]], check: str) -> list[dict[str, Any]]:
    return [f for f in findings if f["check"] == check]


def _workers() -> WorkerStore:
    return WorkerStore("jobbus", "jobbus_jobbus", "jobbus_jobbus_control")


def _register(dsn: str, worker_id: str, **changes: Any) -> None:
    """A worker's own registration statement, as a worker process sends it; it counts as live for a minute."""
    live = dataclasses.replace(registration(worker_id, uuid.uuid4()), dead_after_seconds=60.0, **changes)
    with psycopg.connect(dsn, autocommit=True) as conn:
        statement = _workers().register_worker(live)
        assert run_sync(conn, statement) is not None


def test_a_healthy_database_passes_every_check_with_one_line_each_and_exits_0(primary: Cluster) -> None:
    # A cluster of its own: the shared test server runs without autovacuum, which doctor reports.
    result = run_jobbus(primary.dsn, "doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[1] for line in lines[:-1]] == CHECKS
    assert all(line.startswith("ok ") for line in lines[:-1]), lines
    assert lines[-1] == "7 ok, 0 warning(s), 0 error(s)"
    code, findings = _doctor(primary.dsn)
    assert code == 0
    assert [f["check"] for f in findings] == CHECKS
    assert {f["level"] for f in findings} == {"ok"} and all(set(f) == {"check", "level", "message"} for f in findings)
    execute(primary.dsn, "ALTER SYSTEM SET autovacuum = off")
    execute(primary.dsn, "SELECT pg_reload_conf()")
    wait_until(lambda: _doctor(primary.dsn)[0] == 1, timeout=30, what="doctor to see autovacuum off")
    (autovacuum,) = _by_check(_doctor(primary.dsn)[1], "autovacuum")
    assert autovacuum["level"] == "warning" and autovacuum["message"].startswith("autovacuum is off for the server")


def test_a_pending_migration_is_an_error_naming_it_and_the_fix(dsn: str) -> None:
    execute(dsn, "DELETE FROM jobbus.migration WHERE version = (SELECT max(version) FROM jobbus.migration)")
    latest = jobbus.schema.latest_version()
    code, findings = _doctor(dsn)
    assert code == 1
    (migrations,) = _by_check(findings, "migrations")
    assert migrations["level"] == "error"
    assert f"at version {latest - 1}, 1 migration(s) pending ({latest}): run `jobbus migrate`" in migrations["message"]


def test_a_missing_schema_is_an_error_and_an_unreachable_database_exits_69(empty_dsn: str) -> None:
    code, findings = _doctor(empty_dsn)
    assert code == 1
    assert _by_check(findings, "migrations")[0]["message"] == "schema jobbus is missing: run `jobbus migrate`"
    unreachable = run_jobbus(UNREACHABLE_DSN, "doctor")
    assert unreachable.returncode == 69, unreachable.stderr
    assert unreachable.stderr.startswith("error: cannot reach the database")


def test_a_session_idle_in_a_transaction_longer_than_the_lease_is_named_with_its_pid(dsn: str) -> None:
    with psycopg.connect(dsn) as idle:
        idle.execute("SELECT 1")  # opens the transaction, then leaves it open
        pid = idle.info.backend_pid
        wait_until(
            lambda: query(
                dsn,
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND now() - state_change > interval '1.5 seconds'",
                (pid,),
            ),
            timeout=10,
            what="the session to be idle in its transaction for 1.5 s",
        )
        code, findings = _doctor(dsn, lease_seconds="1")
    assert code == 1
    (idle_finding,) = _by_check(findings, "idle_transactions")
    assert idle_finding["level"] == "warning"
    assert f"session {pid} (user postgres" in idle_finding["message"]
    assert "longer than the lease (1 s)" in idle_finding["message"]
    assert f"pg_terminate_backend({pid})" in idle_finding["message"]
    _, later = _doctor(dsn, lease_seconds="1")
    assert _by_check(later, "idle_transactions")[0]["level"] == "ok", "the session ended with its transaction"


def test_a_worker_heartbeat_from_a_skewed_clock_is_reported_with_the_skew(dsn: str) -> None:
    _register(dsn, "on-time")
    _register(dsn, "skewed")
    instance = query(dsn, "SELECT instance_id FROM jobbus.worker WHERE id = 'skewed'")[0][0]
    heartbeat = _workers().touch_worker(
        worker_id="skewed",
        instance_id=instance,
        state="running",
        in_flight=0,
        completed=0,
        failed=0,
        acked_generation=0,
    )
    ahead = dataclasses.replace(
        heartbeat, params={**heartbeat.params, "clock_at": datetime.now(UTC) + timedelta(seconds=5)}
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert run_sync(conn, ahead) is False
    code, findings = _doctor(dsn)
    assert code == 1
    (clock,) = _by_check(findings, "clock")
    assert clock["level"] == "warning"
    assert "worker skewed (host h) has a clock 5.0 s ahead of the database's" in clock["message"]
    assert "NTP" in clock["message"]


def test_live_workers_pools_larger_than_max_connections_are_an_error(dsn: str) -> None:
    max_connections, reserved = (
        int(v)
        for v in query(
            dsn, "SELECT current_setting('max_connections'), current_setting('superuser_reserved_connections')"
        )[0]
    )
    budget = max_connections - reserved
    _register(dsn, "small", pool_size=25)
    _, findings = _doctor(dsn)
    (connections,) = _by_check(findings, "connections")
    assert connections["level"] == "ok"
    assert connections["message"].startswith(f"1 live worker(s) may open 25 connections, of the {budget}")
    _register(dsn, "large", pool_size=budget)
    code, findings = _doctor(dsn)
    assert code == 1
    (connections,) = _by_check(findings, "connections")
    assert connections["level"] == "error"
    assert (
        f"2 live worker(s) may open {budget + 25} connections, of the {budget} the server allows"
        in connections["message"]
    )
    assert "raise max_connections" in connections["message"]


def test_autovacuum_turned_off_on_the_job_table_is_reported_with_the_statement_that_fixes_it(
    primary: Cluster,
) -> None:
    execute(primary.dsn, "ALTER TABLE jobbus.job SET (autovacuum_enabled = false)")
    code, findings = _doctor(primary.dsn)
    assert code == 1
    (autovacuum,) = _by_check(findings, "autovacuum")
    assert autovacuum["level"] == "warning"
    assert "ALTER TABLE jobbus.job RESET (autovacuum_enabled)" in autovacuum["message"]
    execute(primary.dsn, "ALTER TABLE jobbus.job RESET (autovacuum_enabled)")
    assert _doctor(primary.dsn)[0] == 0


def test_a_server_older_than_14_is_an_error_naming_the_minimum() -> None:
    old = ServerFacts(130011, "13.11", 100, 3, True, True, True)
    finding = doctor.check_server(old)
    assert (finding.level, finding.message) == (
        "error",
        "PostgreSQL 13.11 is too old: jobbus needs PostgreSQL 14 or newer; upgrade the server",
    )


async def test_a_running_worker_reports_its_pool_and_a_clock_in_step_with_the_database(dsn: str) -> None:
    app = jobbus.App(dsn=dsn)

    @app.job("noop")
    async def noop(job: jobbus.JobExecution) -> None:
        return None

    async with app:
        worker = jobbus.Worker(app)
        task = worker.start()
        await worker.ready()
        findings = {f.check: f for f in await doctor.examine(app)}
        worker.request_stop()
        assert await task == 0
    pools = 4 + 2 * app.settings.pool_max_size + 1  # its two pools, the App's pool, its LISTEN connection
    assert findings["connections"].message.startswith(f"1 live worker(s) may open {pools} connections")
    assert (findings["clock"].level, findings["clock"].message) == (
        "ok",
        "1 live worker(s) within 1 s of the database's clock",
    )


@contextlib.contextmanager
def _standby_of(primary: Cluster, name: str) -> Iterator[Cluster]:
    """A streaming standby of `primary`, made with pg_basebackup -R, known to the primary as `name`."""
    root = Path(tempfile.mkdtemp(prefix="jobbus-standby-"))
    root.chmod(0o777)
    standby = Cluster(root)
    try:
        standby._pg("pg_basebackup", "-D", str(standby.data), "-R", "-X", "stream", "-d", primary.dsn)
        with (standby.data / "postgresql.conf").open("a") as conf:
            conf.write(f"port = {standby.port}\nunix_socket_directories = '{root}'\n")
        with (standby.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres application_name={name}'\n"
            )
        standby.start()
        yield standby
    finally:
        standby.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def primary() -> Iterator[Cluster]:
    with throwaway_cluster() as cluster:
        with psycopg.connect(cluster.dsn, autocommit=True) as conn:
            jobbus.schema.migrate(conn, "jobbus")
        yield cluster


def _sync_state(dsn: str, name: str) -> str | None:
    rows = query(
        dsn, "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s AND state = 'streaming'", (name,)
    )
    return str(rows[0][0]) if rows else None


def test_an_asynchronous_standby_is_a_warning_and_a_synchronous_one_is_ok(primary: Cluster) -> None:
    code, findings = _doctor(primary.dsn)
    assert _by_check(findings, "replication")[0]["message"].startswith("no standby streams from this server")
    with _standby_of(primary, "replica1"):
        wait_until(lambda: _sync_state(primary.dsn, "replica1") == "async", timeout=60, what="the standby to stream")
        code, findings = _doctor(primary.dsn)
        assert code == 1
        (replication,) = _by_check(findings, "replication")
        assert replication["level"] == "warning"
        assert replication["message"].startswith(
            "standby replica1 is asynchronous: a failover to it can lose acknowledged enqueues and outcomes"
        )
        execute(primary.dsn, "ALTER SYSTEM SET synchronous_standby_names = 'replica1'")
        execute(primary.dsn, "SELECT pg_reload_conf()")
        wait_until(
            lambda: _sync_state(primary.dsn, "replica1") == "sync", timeout=30, what="the standby to be synchronous"
        )
        code, findings = _doctor(primary.dsn)
        (replication,) = _by_check(findings, "replication")
        assert (replication["level"], replication["message"]) == (
            "ok",
            "standby replica1 is synchronous: a failover to it loses no acknowledged work",
        )
        assert code == 0, findings

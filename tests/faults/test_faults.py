"""Fault injection: workers killed, frozen and cut off, the server restarted, crashed and starved.

Each scenario prints a `FAULT FIGURES` line (jobs, faults, duplicates, lost, recovery time) and
appends it to .jobbus/fault-figures.jsonl; docs/reliability.md tabulates a full run
(`make faults`, JOBBUS_FULL_FAULTS=1). The default scale is the subset CI runs every time.
"""

from __future__ import annotations

import contextlib
import random
import signal
import time

import psycopg
import pytest

import jobbus
from jobbus.store import run_sync
from tests.faults.harness import (
    FAST_LEASE,
    Figures,
    Fleet,
    books,
    cluster_with_schema,
    completed,
    scale,
    schedule,
    time_to_progress,
)
from tests.processes import wait_until
from tests.storehelpers import claim_statement

CONCURRENCY = 4


def test_sigkill_random_workers_repeatedly() -> None:
    kills = scale(20, 60)
    figures = Figures("SIGKILL a random worker every 300 ms (restarted under its id)", scale(1500, 5000))
    with cluster_with_schema() as cluster:
        ids = schedule(cluster.dsn, figures.jobs, sleep=0.02)
        start = time.monotonic()
        fleet = Fleet(cluster.dsn, 3, "--concurrency", str(CONCURRENCY), env=FAST_LEASE)
        try:
            wait_until(lambda: completed(cluster.dsn) > 50, 60, "the fleet to start")
            for n in range(kills):
                fleet.signal_one(f"w{random.randrange(3)}", signal.SIGKILL)
                figures.faults += 1
                time.sleep(0.3)
                if n % 5 == 4:
                    figures.max_recovery_seconds = max(
                        figures.max_recovery_seconds, time_to_progress(cluster.dsn, figures.jobs)
                    )
            wait_until(lambda: completed(cluster.dsn) == figures.jobs, 180, "every job to complete")
        finally:
            fleet.stop()
        figures.seconds = round(time.monotonic() - start, 1)
        figures.notes["restarts"] = fleet.restarts
        books(cluster.dsn, ids, figures, max_duplicates=figures.faults * CONCURRENCY)


def test_sigstop_past_the_lease_then_sigcont() -> None:
    freezes = scale(3, 8)
    figures = Figures("SIGSTOP a worker past its lease, then SIGCONT", scale(800, 3000))
    with cluster_with_schema() as cluster:
        ids = schedule(cluster.dsn, figures.jobs, sleep=0.05)
        start = time.monotonic()
        fleet = Fleet(cluster.dsn, 2, "--concurrency", str(CONCURRENCY), env=FAST_LEASE)
        try:
            wait_until(lambda: completed(cluster.dsn) > 20, 60, "the fleet to start")
            for n in range(freezes):
                victim = f"w{n % 2}"
                fleet.signal_one(victim, signal.SIGSTOP)
                figures.faults += 1
                time.sleep(3.0)  # lease is 2 s: the other worker recovers and re-runs its jobs
                fleet.signal_one(victim, signal.SIGCONT)
                time.sleep(0.5)
            wait_until(lambda: completed(cluster.dsn) == figures.jobs, 180, "every job to complete")
            figures.max_recovery_seconds = 3.0
        finally:
            codes = fleet.stop()
        figures.seconds = round(time.monotonic() - start, 1)
        assert codes == [0, 0], "frozen workers resume and stop cleanly"
        books(cluster.dsn, ids, figures, max_duplicates=figures.faults * CONCURRENCY)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgres_restart_and_crash_while_busy(mode: str) -> None:
    restarts = scale(2, 5)
    figures = Figures(f"PostgreSQL {mode} {'restart' if mode == 'fast' else 'crash'} while busy", scale(1000, 4000))
    with cluster_with_schema() as cluster:
        ids = schedule(cluster.dsn, figures.jobs, sleep=0.02)
        start = time.monotonic()
        fleet = Fleet(cluster.dsn, 2, "--concurrency", str(CONCURRENCY))
        try:
            for n in range(restarts):
                target = figures.jobs * (n + 1) // (restarts + 2)
                wait_until(lambda: completed(cluster.dsn) >= target, 120, "progress before the fault")  # noqa: B023
                cluster.restart(mode)
                figures.faults += 1
                figures.max_recovery_seconds = max(
                    figures.max_recovery_seconds, time_to_progress(cluster.dsn, figures.jobs)
                )
            wait_until(lambda: completed(cluster.dsn) == figures.jobs, 180, "every job to complete")
        finally:
            codes = fleet.stop()
        figures.seconds = round(time.monotonic() - start, 1)
        figures.notes["worker_restarts"] = fleet.restarts
        assert fleet.restarts == 0, "no worker may die of a database restart"
        assert codes == [0, 0]
        books(cluster.dsn, ids, figures, max_duplicates=figures.faults * 2 * CONCURRENCY)


def test_terminate_every_jobbus_backend_repeatedly() -> None:
    rounds = scale(15, 50)
    figures = Figures("pg_terminate_backend on every jobbus connection, every 300 ms", scale(1000, 4000))
    with cluster_with_schema() as cluster:
        ids = schedule(cluster.dsn, figures.jobs, sleep=0.02)
        start = time.monotonic()
        fleet = Fleet(cluster.dsn, 2, "--concurrency", str(CONCURRENCY))
        try:
            wait_until(lambda: completed(cluster.dsn) > 20, 60, "the fleet to start")
            with psycopg.connect(cluster.dsn, autocommit=True) as admin:
                for _ in range(rounds):
                    killed = admin.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                        " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
                    ).fetchone()
                    figures.faults += int(killed[0]) if killed else 0
                    time.sleep(0.3)
            figures.max_recovery_seconds = time_to_progress(cluster.dsn, figures.jobs)
            wait_until(lambda: completed(cluster.dsn) == figures.jobs, 180, "every job to complete")
        finally:
            codes = fleet.stop()
        figures.seconds = round(time.monotonic() - start, 1)
        assert fleet.restarts == 0 and codes == [0, 0]
        books(cluster.dsn, ids, figures, max_duplicates=rounds * 2 * CONCURRENCY)


def test_connection_slots_exhausted_and_statement_timeouts() -> None:
    figures = Figures("server connection slots exhausted; statement_timeout 1 ms", scale(1000, 3000))
    with cluster_with_schema() as cluster:
        ids = schedule(cluster.dsn, figures.jobs, sleep=0.05)
        start = time.monotonic()
        fleet = Fleet(cluster.dsn, 2, "--concurrency", str(CONCURRENCY))
        hogs: list[psycopg.Connection[tuple[object, ...]]] = []
        try:
            wait_until(lambda: completed(cluster.dsn) > 20, 60, "the fleet to start")
            with psycopg.connect(cluster.dsn, autocommit=True) as admin:
                # 1. Cut the workers off, then take every connection slot they could reconnect to.
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
                )
                for _ in range(3):  # workers reconnect fast: grab what they freed, a few times over
                    while True:
                        try:
                            hogs.append(psycopg.connect(cluster.dsn, application_name="hog"))
                        except psycopg.OperationalError:
                            break
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
                        " AND application_name <> 'hog'"
                    )
                figures.faults += 1
                time.sleep(3)
                for hog in hogs:
                    hog.close()
                figures.notes["slots_taken"] = len(hogs)
                figures.max_recovery_seconds = time_to_progress(cluster.dsn, figures.jobs)
                # 2. Every statement of every new connection times out after 1 ms for a while.
                admin.execute("ALTER DATABASE postgres SET statement_timeout = '1ms'")
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
                )
                figures.faults += 1
                time.sleep(2)
                admin.execute("ALTER DATABASE postgres RESET statement_timeout")
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
                )
            wait_until(lambda: completed(cluster.dsn) == figures.jobs, 180, "every job to complete")
        finally:
            for hog in hogs:
                hog.close()
            codes = fleet.stop()
        figures.seconds = round(time.monotonic() - start, 1)
        assert fleet.restarts == 0 and codes == [0, 0]
        books(cluster.dsn, ids, figures, max_duplicates=3 * 2 * CONCURRENCY)


def test_long_transaction_holding_back_xmin_during_a_burst() -> None:
    figures = Figures("a transaction holds back the xmin horizon during a burst", scale(3000, 20000))
    with cluster_with_schema() as cluster:
        baseline_ids = schedule(cluster.dsn, figures.jobs // 2, sleep=0)
        fleet = Fleet(cluster.dsn, 1, "--concurrency", "20")
        try:
            start = time.monotonic()
            wait_until(lambda: completed(cluster.dsn) == len(baseline_ids), 180, "the baseline burst")
            baseline_rate = len(baseline_ids) / (time.monotonic() - start)
            with psycopg.connect(cluster.dsn) as holder:
                holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                holder.execute("SELECT count(*) FROM jobbus.job").fetchone()  # takes and keeps a snapshot
                figures.faults += 1
                ids = schedule(cluster.dsn, figures.jobs - len(baseline_ids), sleep=0)
                start = time.monotonic()
                wait_until(lambda: completed(cluster.dsn) == figures.jobs, 300, "the burst under a held snapshot")
                held_rate = len(ids) / (time.monotonic() - start)
                with psycopg.connect(cluster.dsn, autocommit=True) as probe:
                    plan = _claim_plan(probe, jobbus.App(dsn=cluster.dsn))
                    dead = probe.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'job'").fetchone()
        finally:
            fleet.stop()
        figures.seconds = round(time.monotonic() - start, 1)
        figures.notes = {
            "baseline_jobs_per_s": round(baseline_rate),
            "held_snapshot_jobs_per_s": round(held_rate),
            "dead_tuples_after": int(dead[0]) if dead else None,
        }
        assert "job_queue_claim_idx" in plan and "Seq Scan on job" not in plan, plan
        assert held_rate > baseline_rate * 0.25, figures.notes
        books(cluster.dsn, baseline_ids + ids, figures, max_duplicates=0)


def test_poison_job_fails_after_max_attempts_instead_of_crash_looping_the_fleet() -> None:
    figures = Figures("a poison job that kills its worker every time", 200)
    with cluster_with_schema() as cluster:
        app = jobbus.App(dsn=cluster.dsn)
        with app.sync:
            poison = app.sync.schedule("poison", max_attempts=3)
        ids = schedule(cluster.dsn, figures.jobs, sleep=0.01)
        start = time.monotonic()
        fleet = Fleet(cluster.dsn, 2, "--concurrency", str(CONCURRENCY), env=FAST_LEASE)
        try:
            wait_until(lambda: completed(cluster.dsn) == figures.jobs, 180, "every healthy job to complete")
            with app.sync:
                wait_until(
                    lambda: (j := app.sync.find(poison)) is not None and j.status is jobbus.JobStatus.FAILED,
                    60,
                    "the poison job to fail",
                )
                job = app.sync.find(poison)
        finally:
            fleet.stop()
        figures.faults = fleet.restarts
        figures.seconds = round(time.monotonic() - start, 1)
        assert job is not None and job.attempts == 3
        assert "died" in (job.last_error or ""), job.last_error
        books(cluster.dsn, ids, figures, max_duplicates=3 * CONCURRENCY)


def _claim_plan(conn: psycopg.Connection[tuple[object, ...]], app: jobbus.App) -> str:
    """The plan the claim function's inner statement runs with, through auto_explain notices."""
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET auto_explain.log_level = 'notice'")
    statement = claim_statement(app, conn, 10, types=["record"], worker_id="x", lease_seconds=1.0)
    with contextlib.suppress(_Rollback), conn.transaction():
        run_sync(conn, statement)
        raise _Rollback
    conn.execute("SET auto_explain.log_min_duration = -1")
    return "\n".join(notices)


class _Rollback(Exception):
    pass

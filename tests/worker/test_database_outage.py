"""A worker survives its database going away: restart, crash, killed backends. Nothing is lost.

These tests restart and crash a throwaway cluster of their own, never the shared server.
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest

import jobbus
from jobbus import schema
from tests.cluster import Cluster, throwaway_cluster
from tests.processes import executions, finish, prepare, query, wait_until, workers


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with throwaway_cluster() as c:
        with psycopg.connect(c.dsn, autocommit=True) as conn:
            schema.migrate(conn, "jobbus")
        prepare(c.dsn)
        yield c


def _completed(dsn: str) -> int:
    try:
        return int(query(dsn, "SELECT count(*) FROM jobbus.job WHERE status = 'completed'")[0][0])
    except psycopg.OperationalError:
        return -1


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_worker_survives_a_database_restart_and_every_job_completes(cluster: Cluster, mode: str) -> None:
    app = jobbus.App(dsn=cluster.dsn)
    with app.sync:
        ids = app.sync.schedule_many("record", [{"sleep": 0.02} for _ in range(300)], max_attempts=25)
    with workers(cluster.dsn, 1, "--concurrency", "5") as (worker,):
        wait_until(lambda: _completed(cluster.dsn) >= 30, what="some jobs to complete")
        cluster.restart(mode)
        wait_until(lambda: _completed(cluster.dsn) >= 150, timeout=90, what="progress after the first restart")
        cluster.restart(mode)
        wait_until(lambda: _completed(cluster.dsn) == 300, timeout=120, what="every job to complete")
        assert worker.poll() is None, "the worker must survive"
        worker.send_signal(signal.SIGTERM)
        code, out = finish(worker)
    assert code == 0, out[-3000:]
    assert Counter(s for (s,) in query(cluster.dsn, "SELECT status FROM jobbus.job")) == Counter(completed=300)
    runs = Counter(job_id for job_id, _, _ in executions(cluster.dsn))
    assert set(runs) == set(ids)
    # Re-runs happen only for jobs in flight when the server went away: at most concurrency per fault.
    assert sum(n - 1 for n in runs.values()) <= 2 * 5
    outages = Counter(re.findall(r"^\S+ \S+ WARNING [\w.]+: (.+?) lost the database \(", out, re.MULTILINE))
    assert outages, out[-3000:]
    # One line per outage and component, not a flood: two restarts, at most two lines per component.
    assert max(outages.values()) <= 2, outages


def test_worker_survives_terminated_backends(cluster: Cluster) -> None:
    app = jobbus.App(dsn=cluster.dsn)
    with app.sync:
        app.sync.schedule_many("record", [{"sleep": 0.02} for _ in range(200)], max_attempts=25)
    with workers(cluster.dsn, 2, "--concurrency", "4") as procs:
        for _ in range(10):
            time.sleep(0.3)
            query(
                cluster.dsn,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND datname = current_database() AND backend_type = 'client backend'",
            )
        wait_until(lambda: _completed(cluster.dsn) == 200, timeout=120, what="every job to complete")
        assert all(p.poll() is None for p in procs)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        assert [finish(p)[0] for p in procs] == [0, 0]


def test_worker_starting_while_its_connections_are_killed_keeps_starting(cluster: Cluster) -> None:
    app = jobbus.App(dsn=cluster.dsn)
    with app.sync:
        app.sync.schedule_many("record", [{} for _ in range(20)], max_attempts=25)
    with (
        workers(cluster.dsn, 1, "--stop-when-empty") as (worker,),
        psycopg.connect(cluster.dsn, autocommit=True) as admin,
    ):
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and worker.poll() is None:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND datname = current_database() AND backend_type = 'client backend'"
            )
        code, out = finish(worker, timeout=120)
    assert code == 0, out[-3000:]
    assert _completed(cluster.dsn) == 20


def test_a_stop_issued_right_after_an_outage_reaches_the_worker_and_waits_for_it(cluster: Cluster) -> None:
    """The database was away longer than the worker's lease: its row looks silent, yet the worker lives.
    `stop --all --wait` must address it, and report success only once it applied the stop."""
    import subprocess
    import sys

    from tests.processes import ROOT

    env = {"JOBBUS_LEASE_SECONDS": "2", "JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "0.3"}
    with workers(cluster.dsn, 1, "--worker-id", "pod-out", env=env) as (worker,):
        wait_until(lambda: _registered(cluster.dsn), what="the worker to register")
        cluster.stop("fast")
        time.sleep(3)  # longer than the lease: the registry row goes silent
        cluster.start()
        cluster.wait_ready()
        stop = subprocess.run(
            [sys.executable, "-m", "jobbus", "stop", "--all", "--wait", "--timeout", "30", "--dsn", cluster.dsn],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        code, out = finish(worker, timeout=30)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "addressed to 1 worker(s): pod-out" in stop.stdout and "acknowledged by: pod-out" in stop.stdout
    assert code == 0, out


def _registered(dsn: str) -> bool:
    try:
        return bool(query(dsn, "SELECT 1 FROM jobbus.worker WHERE id = 'pod-out'"))
    except psycopg.OperationalError:
        return False


def test_idle_workers_stop_promptly_on_sigterm_while_their_database_is_down(cluster: Cluster) -> None:
    """Nothing in flight, the server stopped: SIGTERM ends each worker (the leader and a follower)
    within its bounded housekeeping, exit 0, instead of waiting out connection timeouts (35 s)."""
    with workers(cluster.dsn, 2) as procs:
        wait_until(lambda: len(_workers(cluster.dsn)) == 2, what="the workers to register")
        time.sleep(1.0)
        cluster.stop("fast")
        time.sleep(3.0)  # well into the outage: every loop of the workers is waiting for the database
        for worker in procs:
            worker.send_signal(signal.SIGTERM)
        started = time.monotonic()
        results = [finish(worker, timeout=90) for worker in procs]
        took = time.monotonic() - started
    assert [code for code, _ in results] == [0, 0], [out[-3000:] for _, out in results]
    # The housekeeping is bounded by 5 s; generous beside it, far below the connection timeouts.
    assert took < 15, f"took {took:.1f} s to exit: {results[0][1][-3000:]}"


def _workers(dsn: str) -> list[str]:
    try:
        return [str(r[0]) for r in query(dsn, "SELECT id FROM jobbus.worker")]
    except psycopg.OperationalError:
        return []

"""Chains (`then=`): the follow-up is written exactly once, in the transaction that records `completed`."""

from __future__ import annotations

import random
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import JobRequest, JobStatus
from jobbus.store import run_sync
from tests.processes import query, start_worker, workers
from tests.storehelpers import claim, write
from tests.workflow_apps import prepare


def _jobs(dsn: str, job_type: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT id, status, configuration_data, queue, priority FROM jobbus.job WHERE type = %s", (job_type,)
        ).fetchall()


async def test_follow_up_is_scheduled_when_the_job_completes(app: jobbus.App, dsn: str) -> None:
    then = JobRequest("next", {"step": 2}, queue="q2", priority=5, then=JobRequest("last", {"step": 3}))
    await app.schedule("t", {"step": 1}, then=then)
    assert _jobs(dsn, "next") == []
    with psycopg.connect(dsn, autocommit=True) as conn:
        (first,) = claim(app, conn)
        assert write(app, conn, first, JobStatus.COMPLETED)
        ((_, status, configuration, queue, priority),) = _jobs(dsn, "next")
        assert (status, configuration, queue, priority) == ("queued", {"step": 2}, "q2", 5)
        assert _jobs(dsn, "last") == []
        (second,) = claim(app, conn, types=("next",), queues=("q2",))
        assert write(app, conn, second, JobStatus.COMPLETED)
    assert [row[2] for row in _jobs(dsn, "last")] == [{"step": 3}]


@pytest.mark.parametrize("status", [JobStatus.FAILED, JobStatus.CANCELLED])
async def test_no_follow_up_on_failure_or_cancellation(app: jobbus.App, dsn: str, status: JobStatus) -> None:
    await app.schedule("t", then=JobRequest("next"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        (job,) = claim(app, conn)
        assert write(app, conn, job, status, error="no")
    queued = await app.schedule("t", then=JobRequest("next"))
    assert await app.cancel(queued) is JobStatus.CANCELLED
    assert _jobs(dsn, "next") == []


async def test_a_retried_outcome_write_schedules_the_follow_up_once(app: jobbus.App, dsn: str) -> None:
    await app.schedule("t", then=JobRequest("next"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        (job,) = claim(app, conn)
        assert write(app, conn, job, JobStatus.COMPLETED)
        assert not write(app, conn, job, JobStatus.COMPLETED)  # the same outcome, sent again
    assert len(_jobs(dsn, "next")) == 1


async def test_a_repeated_insert_statement_writes_the_follow_up_once(app: jobbus.App, dsn: str) -> None:
    """The batcher (or a lost connection) may send an insert again: neither job nor follow-up doubles."""
    spec = app.build_job_spec(JobRequest("t", then=JobRequest("next")))
    spec2 = app.build_job_spec(JobRequest("t", then=JobRequest("next")))
    with psycopg.connect(dsn, autocommit=True) as conn:
        for specs in ([spec], [spec], [spec, spec2], [spec, spec2]):
            run_sync(conn, app.store.insert_jobs(specs))
        assert conn.execute("SELECT count(*) FROM jobbus.job_follow_up").fetchone() == (2,)
        for job in claim(app, conn, limit=2):
            assert write(app, conn, job, JobStatus.COMPLETED)
    assert len(_jobs(dsn, "next")) == 2


async def test_large_batches_with_follow_ups_do_not_take_the_copy_path(app: jobbus.App, dsn: str) -> None:
    ids = await app.schedule_many([JobRequest("t", {"i": i}, then=JobRequest("next", {"i": i})) for i in range(1200)])
    assert len(set(ids)) == 1200
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobbus.job_follow_up").fetchone() == (1200,)
    ids = await app.schedule_many("t", [{"i": i} for i in range(1100)], then=JobRequest("next"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(DISTINCT spec->>'id') FROM jobbus.job_follow_up").fetchone() == (2300,)


def test_completion_raced_by_lease_recovery_writes_the_follow_up_exactly_once(sync_app: jobbus.App, dsn: str) -> None:
    """Twenty rounds of an outcome write and a lease recovery sent at the same instant for an expired lease:
    whichever wins, a job has at most one follow-up, and exactly one once it has completed."""
    app = sync_app
    ids = app.sync.schedule_many([JobRequest("t", {"i": i}, then=JobRequest("next", {"i": i})) for i in range(20)])
    won: list[bool] = []
    with psycopg.connect(dsn, autocommit=True) as a, psycopg.connect(dsn, autocommit=True) as b:
        for _ in range(20):
            (job,) = claim(app, a)
            a.execute(
                "UPDATE jobbus.job SET lease_expires_at = clock_timestamp() + interval '20 ms' WHERE id = %s", (job.id,)
            )
            barrier = threading.Barrier(2)

            def complete(job: Any = job, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                time.sleep(random.uniform(0, 0.04))
                won.append(write(app, a, job, JobStatus.COMPLETED))

            thread = threading.Thread(target=complete)
            thread.start()
            barrier.wait()
            time.sleep(random.uniform(0, 0.04))
            run_sync(b, app.store.recover_expired_leases())
            thread.join()
        # whatever lost its lease is recovered and completed now, by a fresh attempt
        time.sleep(0.05)
        run_sync(b, app.store.recover_expired_leases())
        while jobs := claim(app, a, limit=20):
            for job in jobs:
                assert write(app, a, job, JobStatus.COMPLETED)
    follow_ups = [row[2]["i"] for row in _jobs(dsn, "next")]
    assert sorted(follow_ups) == list(range(20))
    assert all(isinstance(i, uuid.UUID) for i in ids)
    assert len(won) == 20


def test_follow_ups_are_written_once_by_worker_processes_killed_mid_flight(dsn: str, sync_app: jobbus.App) -> None:
    """200 chained jobs on two worker processes; five of them SIGKILL their worker in their first attempt
    (its other jobs in flight are recovered when their leases expire). Every job completes with exactly
    one follow-up."""
    prepare(dsn)
    count = 200
    requests = [
        JobRequest("wf.chained", {"n": n, "crash_once": n % 40 == 7}, then=JobRequest("wf.noop", {"value": n}))
        for n in range(count)
    ]
    ids = sync_app.sync.schedule_many(requests)
    args = ("--app", "tests.workflow_apps:app", "--concurrency", "8", "--log-level", "WARNING")
    env = {"JOBBUS_LEASE_SECONDS": "2", "JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "0.5"}
    procs = [start_worker(dsn, *args, env=env) for _ in range(2)]
    try:
        deadline = time.monotonic() + 120
        while (
            query(dsn, "SELECT count(*) FROM jobbus.job WHERE status <> 'completed'")[0][0]
            or len(_jobs(dsn, "wf.noop")) < count
        ):
            assert time.monotonic() < deadline, "the chains did not finish"
            for i, proc in enumerate(procs):
                if proc.poll() is not None:  # killed by its own job: start another
                    procs[i] = start_worker(dsn, *args, env=env)
            time.sleep(0.2)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    follow_ups = sorted(row[2]["value"] for row in _jobs(dsn, "wf.noop"))
    assert follow_ups == list(range(count))
    ((again,),) = query(dsn, "SELECT count(*) FROM jobbus.job WHERE type = 'wf.chained' AND attempts > 1")
    assert again >= 5  # the five that killed their worker, and any job in flight beside them
    assert len(ids) == count


def test_follow_ups_are_written_once_while_every_backend_is_terminated_repeatedly(
    dsn: str, sync_app: jobbus.App
) -> None:
    """300 chained jobs on two worker processes while every other backend of the database is terminated
    every 0.3 s: outcome writes are cut off mid-flight and sent again (fenced). Each job completes with
    exactly one follow-up."""
    prepare(dsn)
    count = 300
    sync_app.sync.schedule_many(
        [JobRequest("wf.chained", {"n": n}, then=JobRequest("wf.noop", {"value": n})) for n in range(count)]
    )
    sync_app.sync.close()
    args = ("--app", "tests.workflow_apps:app", "--concurrency", "10", "--log-level", "WARNING")
    env = {"JOBBUS_LEASE_SECONDS": "3", "JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "0.5"}
    with psycopg.connect(dsn, autocommit=True) as killer, workers(dsn, 2, *args, env=env) as procs:
        deadline = time.monotonic() + 120
        terminated = 0
        while (
            len(_jobs(dsn, "wf.noop")) < count
            or query(dsn, "SELECT count(*) FROM jobbus.job WHERE status <> 'completed'")[0][0]
        ):
            assert time.monotonic() < deadline, "the chains did not finish"
            if time.monotonic() < deadline - 110:  # ten seconds of terminations, then let it finish
                rows = killer.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchall()
                terminated += len(rows)
            time.sleep(0.3)
        assert all(proc.poll() is None for proc in procs), "a worker exited"
    assert terminated > 0
    assert sorted(row[2]["value"] for row in _jobs(dsn, "wf.noop")) == list(range(count))

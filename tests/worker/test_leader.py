"""One leader at a time, failover when it dies, dead workers' jobs back in seconds, retention, samples."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import JobStatus
from tests.conftest import FAST
from tests.processes import ROOT, eventually, executions, finish, prepare, query, start_worker, status_of, wait_until

QUICK = {
    "JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "0.5",
    "JOBBUS_WORKER_DEAD_AFTER_SECONDS": "3",
}


@pytest.fixture
def db(dsn: str) -> str:
    prepare(dsn)
    return dsn


def leaders(dsn: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "jobbus", "workers", "--json", "--dsn", dsn],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return [w["id"] for w in json.loads(result.stdout) if w["leader"]]


def test_one_leader_at_a_time_and_another_takes_over_when_it_is_killed(db: str) -> None:
    procs = {f"w{n}": start_worker(db, "--worker-id", f"w{n}", env=QUICK) for n in range(3)}
    try:
        first = wait_until(lambda: leaders(db), what="a leader")
        assert len(first) == 1
        procs[first[0]].kill()
        procs[first[0]].wait()
        killed_at = time.monotonic()
        second = wait_until(lambda: [w for w in leaders(db) if w != first[0]], timeout=20, what="a new leader")
        took = time.monotonic() - killed_at
        assert len(second) == 1 and took < 10, (second, took)
        # A leader that stops cleanly hands the lease back at once.
        procs[second[0]].send_signal(signal.SIGTERM)
        assert finish(procs[second[0]])[0] == 0
        third = wait_until(lambda: [w for w in leaders(db) if w not in (first[0], second[0])], timeout=5)
        assert len(third) == 1
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_a_killed_workers_jobs_run_again_within_seconds_not_after_the_lease(db: str, sync_app: jobbus.App) -> None:
    """Default lease (300 s), a worker id never seen again: the leader declares it dead and takes its
    jobs back after `worker_dead_after_seconds` (3 s here, 15 s by default)."""
    job_id = sync_app.sync.schedule("record", {"sleep": 60, "first_only": True})
    doomed = start_worker(db, "--worker-id", "pod-7f9c", env=QUICK)
    try:
        wait_until(lambda: executions(db, job_id), what="the first attempt to start")
        survivor = start_worker(db, "--worker-id", "pod-a1b2", env=QUICK)
        wait_until(lambda: "pod-a1b2" in leaders(db) or leaders(db) == ["pod-7f9c"], what="both registered")
        doomed.kill()
        doomed.wait()
        killed_at = time.monotonic()
        wait_until(lambda: status_of(db, job_id) == "completed", timeout=30, what="the job to run again")
        took = time.monotonic() - killed_at
        survivor.send_signal(signal.SIGTERM)
        code, out = finish(survivor)
    finally:
        doomed.kill()
        survivor.kill()
    assert code == 0, out
    assert took < 15, f"took {took:.1f} s"
    assert [attempt for _, attempt, _ in executions(db, job_id)] == [1, 2]
    job = sync_app.sync.find(job_id)
    assert job is not None and "declared dead" in (job.last_error or "")
    assert "worker pod-7f9c declared dead" in out


async def test_retention_deletes_expired_finished_jobs_and_keeps_the_rest(dsn: str) -> None:
    app = jobbus.App(
        dsn=dsn,
        retention_completed_seconds=3600,
        retention_cancelled_seconds=None,
        retention_failed_seconds=60,
        **FAST,
    )

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        return None

    async with app:
        ids = await app.schedule_many("t", [{} for _ in range(8)])
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for job_id, status, age in zip(
                ids,
                ["completed", "completed", "failed", "failed", "cancelled", "cancelled", "queued", "completed"],
                ["2 hours", "10 minutes", "2 minutes", "10 seconds", "30 days", "1 second", "3 hours", "3 hours"],
                strict=True,
            ):
                await conn.execute(
                    f"UPDATE jobbus.job SET status = %s, finished_at = CASE WHEN %s <> 'queued'"
                    f" THEN now() - interval '{age}' END WHERE id = %s",
                    (status, status, job_id),
                )
        worker = jobbus.Worker(app)
        task = worker.start()
        await eventually(lambda: _at_most(app, 5), timeout=15, what="the expired jobs to be deleted")
        worker.request_stop()
        await task
        left = {j.id for j in await app.list_jobs()}
    # deleted: completed 2 h (kept 1 h), failed 2 min (kept 60 s), completed 3 h
    assert left == {ids[1], ids[3], ids[4], ids[5], ids[6]}


@pytest.mark.parametrize("keep", [3600.0, None])
async def test_retention_deletes_old_events_and_finished_groups(dsn: str, keep: float | None) -> None:
    """`retention_event_seconds`: events emitted longer ago and groups whose callback was scheduled longer
    ago are deleted by the leader (in batches smaller than the backlog); newer ones, and groups still
    waiting for members, are kept. None keeps everything."""
    app = jobbus.App(dsn=dsn, retention_event_seconds=keep, **FAST)

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        return None

    async with app:
        for n in range(1203):
            await app.emit_event(f"old-{n}") if n < 1200 else await app.emit_event(f"new-{n}")
        finished, _ = await app.schedule_group([jobbus.JobRequest("t")], then=jobbus.JobRequest("t"))
        recent, _ = await app.schedule_group([jobbus.JobRequest("t")], then=jobbus.JobRequest("t"))
        later = jobbus.JobRequest("t", available_at=timedelta(hours=1))
        pending, _ = await app.schedule_group([later], then=jobbus.JobRequest("t"))
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                "UPDATE jobbus.event SET emitted_at = now() - interval '2 hours' WHERE key LIKE 'old-%%'"
            )
            await conn.execute(
                "UPDATE jobbus.job_group SET scheduled_at = now() - interval '2 hours', remaining = 0"
                " WHERE group_id = %s",
                (finished,),
            )
            await conn.execute(
                "UPDATE jobbus.job_group SET scheduled_at = now() - interval '1 minute', remaining = 0"
                " WHERE group_id = %s",
                (recent,),
            )
        worker = jobbus.Worker(app)
        task = worker.start()

        def events() -> int:
            return int(query(dsn, "SELECT count(*) FROM jobbus.event")[0][0])

        if keep is not None:
            await eventually(lambda: events() == 3, timeout=30, what="the old events to be deleted")
            await eventually(
                lambda: query(dsn, "SELECT count(*) FROM jobbus.job_group")[0][0] == 2,
                timeout=30,
                what="the finished group to be deleted",
            )
        else:
            await eventually(lambda: worker.leadership.is_leader, what="leadership")
            (cleaner,) = [service for service in worker.leadership.maintainer.services if service.name == "cleaner"]
            await cleaner.run_once()  # a whole round, on top of the leader's own
        worker.request_stop()
        await task
    groups = {row[0] for row in query(dsn, "SELECT group_id FROM jobbus.job_group")}
    if keep is None:
        assert events() == 1203 and groups == {finished, recent, pending}
    else:
        kept = sorted(row[0] for row in query(dsn, "SELECT key FROM jobbus.event"))
        assert kept == ["new-1200", "new-1201", "new-1202"]
        assert groups == {recent, pending}


async def test_retention_of_a_large_backlog_never_makes_a_claim_wait(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """100k expired finished jobs are deleted while a worker drains; claims must never wait on a lock
    (lock_timeout 100 ms on every session of the database would turn any wait into a logged error)."""
    name = query(dsn, "SELECT current_database()")[0][0]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobbus.job (id, type, status, max_attempts, finished_at)"
            " SELECT gen_random_uuid(), 'old', 'completed', 1, now() - interval '2 days'"
            " FROM generate_series(1, 100000)"
        )
        conn.execute(f'ALTER DATABASE "{name}" SET lock_timeout = 100')
    app = jobbus.App(dsn=dsn, **FAST)

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        await asyncio.sleep(0.001)

    caplog.set_level(logging.WARNING, logger="jobbus.worker")
    async with app:
        ids = await app.schedule_many("t", [{} for _ in range(3000)])
        worker = jobbus.Worker(app, concurrency=20)
        task = worker.start()
        await eventually(
            lambda: query(dsn, "SELECT count(*) FROM jobbus.job WHERE type = 'old'")[0][0] == 0, timeout=60
        )
        await eventually(lambda: _completed(app, ids), timeout=60, what="the drain")
        worker.request_stop()
        await task
    assert query(dsn, "SELECT count(*) FROM jobbus.job WHERE type = 'old'")[0][0] == 0
    assert query(dsn, "SELECT count(*) FROM jobbus.job WHERE status = 'completed'")[0][0] == 3000
    # "lock timeout" (the server's words for a wait cut short), not "lock": the watchdog's "the event loop is
    # blocked" is about this test's own blocking queries on a busy machine.
    waits = [
        r.getMessage() for r in caplog.records if "lock timeout" in r.getMessage() or "transient" in r.getMessage()
    ]
    assert waits == []


async def test_the_leader_samples_every_queue_for_metrics_and_the_dashboard(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, stats_interval_seconds=0.3, **FAST)

    @app.job("t", queue="mail")
    async def handler(job: jobbus.JobExecution) -> None:
        return None

    async with app:
        await app.schedule_many("t", [{} for _ in range(5)])
        await app.schedule("t", queue="later", available_at=timedelta(hours=1))
        worker = jobbus.Worker(app, queues=["mail"])
        task = worker.start()
        sampled = "SELECT queue, sum(completed), max(scheduled) FROM jobbus.queue_stat GROUP BY queue ORDER BY 1"
        await eventually(lambda: ("mail", 5) in [(r[0], r[1]) for r in query(dsn, sampled)], timeout=10)
        rows = query(dsn, sampled)
        worker.request_stop()
        await task
    assert ("mail", 5) in [(r[0], r[1]) for r in rows]
    assert ("later", 0, 1) in [tuple(r) for r in rows]


async def _at_most(app: jobbus.App, count: int) -> bool:
    return len(await app.list_jobs()) <= count


async def _completed(app: jobbus.App, ids: list[Any]) -> bool:
    jobs = [await app.find(i) for i in ids]
    return all(j is not None and j.status is JobStatus.COMPLETED for j in jobs)

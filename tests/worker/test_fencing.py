"""Fencing from the inside: a worker that cannot renew stops its handlers' outcomes; its own writes never
deadlock; a producer's open transaction never blocks it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

import jobbus
from jobbus import JobStatus, control
from tests.conftest import FAST
from tests.processes import eventually, until_stop_requested


async def _status(app: jobbus.App, job_id: uuid.UUID) -> JobStatus | None:
    job = await app.find(job_id)
    return job.status if job else None


async def _until(app: jobbus.App, job_id: uuid.UUID, *statuses: JobStatus, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while (status := await _status(app, job_id)) not in statuses:
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} is {status}, expected {statuses}")
        await asyncio.sleep(0.02)


def _observer(app: jobbus.App, seen: list[tuple[int, bool, bool]]) -> None:
    @app.job("observer")
    async def observer(job: jobbus.JobExecution) -> str:
        """The first attempt works until told to stop and notes what it was told; later ones finish."""
        if job.attempt > 1:
            return "finished"
        await until_stop_requested(job)
        seen.append((job.attempt, job.cancellation_requested, job.lease_lost))
        return "stopped"


async def test_a_worker_cut_off_from_its_registry_fences_its_handlers_and_writes_no_result(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, heartbeat_interval_seconds=0.2, worker_dead_after_seconds=1.5, **FAST)
    seen: list[tuple[int, bool, bool]] = []
    _observer(app, seen)
    async with app, await psycopg.AsyncConnection.connect(dsn) as blocker:
        job_id = await app.schedule("observer")
        worker = jobbus.Worker(app, worker_id="cut-off")
        task = worker.start()
        await _until(app, job_id, JobStatus.RUNNING)
        # The registry refresh now waits on this lock: to the worker, the database is away.
        await blocker.execute("SELECT 1 FROM jobbus.worker WHERE id = 'cut-off' FOR UPDATE")
        started = time.monotonic()
        await _until(app, job_id, JobStatus.QUEUED)
        fenced_after = time.monotonic() - started
        await blocker.rollback()
        await _until(app, job_id, JobStatus.COMPLETED)  # the fence lifts once the worker is heard again
        worker.request_stop()
        await task
        job = await app.find(job_id)
    assert seen[0] == (1, True, True)  # told to stop, and told that its lease may be gone
    assert 0.8 < fenced_after < 5
    assert job is not None and job.result == "finished" and job.attempts == 2
    assert "lost the database" in (job.last_error or "")


async def test_a_handler_past_its_lease_deadline_is_told_and_nothing_of_it_is_written(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, lease_seconds=1.5, heartbeat_interval_seconds=0.2, worker_dead_after_seconds=10, **FAST)
    seen: list[tuple[int, bool, bool]] = []
    _observer(app, seen)
    async with app, await psycopg.AsyncConnection.connect(dsn) as blocker:
        job_id = await app.schedule("observer")
        worker = jobbus.Worker(app)
        task = worker.start()
        await _until(app, job_id, JobStatus.RUNNING)
        # Lease renewals of this job now wait on its row lock, as if the database were unreachable.
        await blocker.execute("SELECT 1 FROM jobbus.job WHERE id = %s FOR UPDATE", (job_id,))
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:  # noqa: ASYNC110 - waiting on another task's list
            await asyncio.sleep(0.05)
        await blocker.rollback()
        await _until(app, job_id, JobStatus.COMPLETED)  # recovered after its lease, run again
        worker.request_stop()
        await task
        job = await app.find(job_id)
    assert seen and seen[0] == (1, True, True)
    assert job is not None and job.result == "finished" and job.attempts == 2
    assert "lease expired" in (job.last_error or "")


async def test_a_handler_is_not_started_once_its_claim_waited_past_the_renewal_it_needs(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The event loop blocked (as by a frozen process) between a claim and its handler's start: the
    lease might expire before its first renewal, so the job is given back unstarted, and run at once by
    the next claim, its attempt not counted."""
    app = jobbus.App(dsn=dsn, lease_seconds=1.5, worker_dead_after_seconds=10, **FAST)
    entered: list[int] = []
    started: list[int] = []

    @contextlib.asynccontextmanager
    async def scope(job: jobbus.JobExecution) -> AsyncIterator[None]:
        entered.append(job.attempt)
        if len(entered) == 1:
            time.sleep(0.8)  # noqa: ASYNC251 - the loop is blocked on purpose: no renewal can run
        yield

    app.job_scope = scope

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> str:
        started.append(len(entered))
        return "done"

    caplog.set_level(logging.WARNING, logger="jobbus.worker")
    async with app:
        job_id = await app.schedule("t")
        due = (await app.find(job_id)).available_at  # type: ignore[union-attr]
        assert await asyncio.wait_for(jobbus.Worker(app, stop_when_empty=True).run(), 20) == 0
        job = await app.find(job_id)
    assert started == [2]  # not in the claim that waited; in the next one
    assert job is not None and (job.status, job.attempts, job.result) == (JobStatus.COMPLETED, 1, "done")
    assert job.available_at == due  # given back in its place (a periodic job's tick stays its tick)
    assert any(f"job {job_id}: its handler was not started" in r.getMessage() for r in caplog.records)


async def test_a_claim_answered_after_its_lease_ended_runs_nothing_of_it(dsn: str) -> None:
    """A claim the database answers later than the lease (an overloaded server; here a trigger sleeps in
    the first claim's update) returns a lease already over, since leases date from the claim's start:
    nothing of it runs; the job is recovered and run once."""
    app = jobbus.App(dsn=dsn, lease_seconds=1, worker_dead_after_seconds=10, **FAST)
    started: list[int] = []

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> str:
        started.append(job.attempt)
        return "done"

    async with app, await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "CREATE FUNCTION jobbus.slow_first_claim() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(2); RETURN NEW; END $$"
        )
        await conn.execute(
            "CREATE TRIGGER slow_first_claim BEFORE UPDATE ON jobbus.job FOR EACH ROW "
            "WHEN (OLD.status = 'queued' AND NEW.status = 'running' AND NEW.attempts = 1) "
            "EXECUTE FUNCTION jobbus.slow_first_claim()"
        )
        job_id = await app.schedule("t")
        worker = jobbus.Worker(app)
        task = worker.start()
        await _until(app, job_id, JobStatus.COMPLETED)
        worker.request_stop()
        assert await asyncio.wait_for(task, 20) == 0
        job = await app.find(job_id)
    assert started == [2]  # the late claim ran nothing; the job's recovery ran it once
    assert job is not None and (job.status, job.result) == (JobStatus.COMPLETED, "done")


async def test_renewals_and_outcome_batches_never_deadlock_on_shared_rows(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Lease renewals every 20 ms over hundreds of jobs whose outcomes are written in batches meanwhile."""
    app = jobbus.App(dsn=dsn, heartbeat_interval_seconds=0.02, worker_dead_after_seconds=1, **FAST)

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        await asyncio.sleep(0.01 * (job.configuration["n"] % 7))

    caplog.set_level(logging.WARNING, logger="jobbus.worker")
    async with app:
        await app.schedule_many("t", [{"n": n} for n in range(3000)])
        assert await jobbus.Worker(app, concurrency=100, stop_when_empty=True).run() == 0
        done = await app.list_jobs(status="completed", limit=10_000)
    assert len(done) == 3000 and all(j.attempts == 1 for j in done)
    assert not [r for r in caplog.records if "eadlock" in r.getMessage() or "transient" in r.getMessage()]


async def test_a_producer_transaction_on_a_running_jobs_key_never_blocks_its_worker(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, heartbeat_interval_seconds=0.1, **FAST)

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> str:
        await asyncio.sleep(0.5)  # several lease renewals while the producer's transaction is open
        await job.checkpoint({"halfway": True})
        await asyncio.sleep(0.3)
        return "done"

    async with app:
        job_id = await app.schedule("t", unique_key="order:1")
        worker = jobbus.Worker(app, stop_when_empty=True)
        task = worker.start()
        await _until(app, job_id, JobStatus.RUNNING)
        async with await psycopg.AsyncConnection.connect(dsn) as producer:
            assert await app.schedule("t", unique_key="order:1", connection=producer) == job_id
            # the transaction stays open while the worker renews, checkpoints and completes the job
            assert await asyncio.wait_for(task, 10) == 0
            job = await app.find(job_id)
            assert job is not None and (job.status, job.result) == (JobStatus.COMPLETED, "done")
            await producer.commit()


async def test_concurrent_batches_with_overlapping_unique_keys_do_not_deadlock(app: jobbus.App) -> None:
    import random

    keys = [f"k{n}" for n in range(60)]

    async def batch(seed: int) -> list[uuid.UUID]:
        shuffled = random.Random(seed).sample(keys, len(keys))
        return await app.schedule_many([jobbus.JobRequest("t", {"seed": seed}, unique_key=k) for k in shuffled])

    for round_ in range(5):
        results = await asyncio.gather(*(batch(round_ * 10 + n) for n in range(6)))
        by_key: dict[str, set[uuid.UUID]] = {}
        for seed_ids, seed in zip(results, range(6), strict=True):
            shuffled = random.Random(round_ * 10 + seed).sample(keys, len(keys))
            for key, job_id in zip(shuffled, seed_ids, strict=True):
                by_key.setdefault(key, set()).add(job_id)
        assert all(len(ids) == 1 for ids in by_key.values())  # one active job per key, whoever won


@pytest.mark.parametrize("length", [20, 63])
async def test_schema_names_up_to_the_longest_allowed_enqueue_notify_and_steer(admin_dsn: str, length: int) -> None:
    from tests.dbserver import fresh_database

    name = ("s" * length)[:length]
    with fresh_database(admin_dsn, None) as dsn:
        app = jobbus.App(dsn=dsn, schema=name, **FAST)
        app.sync.migrate()
        app.sync.close()
        assert len(app.store.channel.encode()) <= 63 and len(app.store.control_channel.encode()) <= 63
        assert app.store.channel != app.store.control_channel

        @app.job("t")
        async def handler(job: jobbus.JobExecution) -> int:
            return 1

        async with app:
            worker = jobbus.Worker(app, poll_interval=30)  # a wake-up can only come from a notification
            task = worker.start()
            await worker.ready()
            await asyncio.sleep(0.3)
            job_id = await app.schedule("t")
            await asyncio.wait_for(_until(app, job_id, JobStatus.COMPLETED), 10)
            issued = await control.stop(app, all=True)
            report = await control.wait_for_acks(app, issued, timeout=10)
            assert report.complete
            assert await asyncio.wait_for(task, 10) == 0


async def test_lease_renewals_and_checkpoints_are_hot_updates(dsn: str) -> None:
    """No index covers what a renewal or a checkpoint changes, so PostgreSQL can update those rows in place
    (HOT) without touching an index. Whether it does also depends on room in the page and on what other
    transactions still see, so the bound is loose; an index on a lease column would take it to zero."""
    app = jobbus.App(dsn=dsn, heartbeat_interval_seconds=0.05, **FAST)

    @app.job("long")
    async def long(job: jobbus.JobExecution) -> None:
        for step in range(10):
            await asyncio.sleep(0.1)
            await job.checkpoint({"step": step})

    async with app:
        await app.schedule_many("long", [{} for _ in range(20)])
        assert await jobbus.Worker(app, concurrency=20, stop_when_empty=True).run() == 0
    # The worker's connections are closed: their statistics are flushed (PostgreSQL 15 and later) or on
    # their way to the statistics collector (14, which reports them within half a second).
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:

        async def counts() -> tuple[int, int] | None:
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            cur = await conn.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                " WHERE schemaname = 'jobbus' AND relname = 'job'"
            )
            row = await cur.fetchone()
            return (int(row[0]), int(row[1])) if row is not None and row[0] > 400 else None

        if conn.info.server_version >= 150000:
            await conn.execute("SELECT pg_stat_force_next_flush()")
        updates, hot = await eventually(counts, what="the worker's updates in pg_stat_user_tables")
    status_changes = 2 * 20  # each job's claim and outcome
    others = updates - status_changes
    print(f"HOT: {hot} of the {others} renewals and checkpoints ({hot / others:.1%})")  # docs/capacity.md quotes it
    assert updates > 400  # 20 jobs × 10 checkpoints, plus about 20 renewals each
    assert hot >= 0.5 * (updates - status_changes), (updates, hot)

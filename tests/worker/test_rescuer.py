"""The rescuer never takes a job from a live worker: only jobs that started before their worker was
declared dead are taken back, in the statement that declares it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

import jobbus
from jobbus.models import ClaimedJob
from jobbus.store import Claim, Statement, WorkerStore, run_async
from jobbus.worker.services.rescuer import Rescuer
from tests.processes import eventually
from tests.storehelpers import registration

T = TypeVar("T")
WORKER = "w-back"
PAIRS = [("default", "t")]


def _app(dsn: str) -> jobbus.App:
    app = jobbus.App(dsn=dsn, poll_interval_seconds=0.2)

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        return None

    return app


def _runner(app: jobbus.App) -> Callable[[Statement[Any]], Awaitable[Any]]:
    async def run(statement: Statement[T]) -> T:
        async with app.pool.connection() as conn:
            return await run_async(conn, statement)

    return run


async def _claim(app: jobbus.App) -> ClaimedJob:
    statement = app.store.claim_jobs(
        worker_id=WORKER, limit=1, pairs=PAIRS, lease_seconds=300.0, max_payload_bytes=1_048_576
    )
    claim: Claim = await _runner(app)(statement)
    claimed = claim.jobs
    assert len(claimed) == 1
    return claimed[0]


async def _silent_worker_holding_a_job(app: jobbus.App, workers: WorkerStore, instance_id: uuid.UUID) -> uuid.UUID:
    """A registered worker, silent for an hour, holding one job it claimed ten minutes ago."""
    run = _runner(app)
    assert await run(workers.register_worker(registration(WORKER, instance_id))) is not None
    old = await app.schedule("t", {"n": "old"})
    await _claim(app)
    async with app.pool.connection() as conn:
        await conn.execute("UPDATE jobbus.job SET started_at = now() - interval '10 minutes' WHERE id = %s", (old,))
        await conn.execute("UPDATE jobbus.worker SET last_seen_at = now() - interval '1 hour' WHERE id = %s", (WORKER,))
    return old


def _rescuer(app: jobbus.App) -> Rescuer:
    worker = jobbus.Worker(app, worker_id="the-leader")
    (rescuer,) = [s for s in worker.leadership.maintainer.services if isinstance(s, Rescuer)]
    return rescuer


async def _touch(run: Callable[[Statement[Any]], Awaitable[Any]], workers: WorkerStore, instance_id: uuid.UUID) -> Any:
    return await run(
        workers.touch_worker(
            worker_id=WORKER,
            instance_id=instance_id,
            state="running",
            in_flight=1,
            completed=0,
            failed=0,
            acked_generation=0,
        )
    )


async def _lease_is_live(app: jobbus.App, claimed: ClaimedJob) -> bool:
    live = await _runner(app)(app.store.heartbeat_leases({claimed.id: claimed.lease_token}, 300.0))
    return claimed.id in live


async def test_a_worker_back_right_after_its_declaration_keeps_the_job_it_claims_then(dsn: str) -> None:
    """The interleaving, forced: the worker is declared dead, then refreshes its row and claims a job,
    then the rescuer goes on. The job claimed after the declaration stays the worker's; the one it
    held from before is taken back."""
    app = _app(dsn)
    async with app:
        rescuer = _rescuer(app)
        instance_id = uuid.uuid4()
        old = await _silent_worker_holding_a_job(app, rescuer.workers, instance_id)
        await app.schedule("t", {"n": "new"})
        run = _runner(app)
        claimed: list[ClaimedJob] = []

        async def interleaved(statement: Statement[T]) -> T:
            result: T = await run(statement)
            if not claimed:  # right after the rescuer's first statement, the declaration
                assert (await app.find(old)) is not None
                await _touch(run, rescuer.workers, instance_id)
                claimed.append(await _claim(app))
            return result

        rescuer._run = interleaved
        await rescuer.run_once()

        taken = await app.find(old)
        assert taken is not None and taken.status is jobbus.JobStatus.QUEUED
        assert "declared dead" in (taken.last_error or "")
        fresh = await app.find(claimed[0].id)
        assert fresh is not None and fresh.status is jobbus.JobStatus.RUNNING
        assert fresh.lease_token == claimed[0].lease_token
        assert await _lease_is_live(app, claimed[0])


async def test_a_refresh_that_waited_for_the_declaration_hears_of_it_and_a_claim_meanwhile_is_kept(
    dsn: str,
) -> None:
    """The declaration holds the worker's row: the worker claims a job while it runs, its refresh waits
    for it and then says the worker was declared dead; the claimed job is not touched."""
    app = _app(dsn)
    async with app:
        workers = _rescuer(app).workers
        instance_id = uuid.uuid4()
        old = await _silent_worker_holding_a_job(app, workers, instance_id)
        await app.schedule("t", {"n": "new"})
        statement = workers.declare_dead_workers()
        async with await psycopg.AsyncConnection.connect(dsn) as leader:  # one open transaction
            await run_async(leader, statement)
            claimed = await _claim(app)
            refresh = _touch(_runner(app), workers, instance_id)
            waiting = asyncio.ensure_future(refresh)
            await asyncio.sleep(0.5)
            assert not waiting.done()  # the declaration holds the row
            await leader.commit()
            assert await waiting is True  # was declared dead: its old jobs were taken back
        taken = await app.find(old)
        assert taken is not None and taken.status is jobbus.JobStatus.QUEUED
        assert await _lease_is_live(app, claimed)
        rows = await _runner(app)(workers.declare_dead_workers())
        assert rows == []  # it spoke again: not declared a second time


async def test_a_declared_worker_that_holds_nothing_is_reported_once(dsn: str) -> None:
    app = _app(dsn)
    async with app:
        workers = _rescuer(app).workers
        run = _runner(app)
        assert await run(workers.register_worker(registration(WORKER, uuid.uuid4()))) is not None
        async with app.pool.connection() as conn:
            await conn.execute("UPDATE jobbus.worker SET last_seen_at = now() - interval '1 minute'")
        (dead,) = await run(workers.declare_dead_workers())
        assert (dead.worker_id, dead.recovered) == (WORKER, [])
        assert 55 < dead.silent_seconds < 120
        assert await run(workers.declare_dead_workers()) == []


async def test_a_new_process_under_the_id_reclaims_only_what_started_before_it_registered(dsn: str) -> None:
    app = _app(dsn)
    async with app:
        workers = _rescuer(app).workers
        run = _runner(app)
        old = await _silent_worker_holding_a_job(app, workers, uuid.uuid4())
        successor = uuid.uuid4()
        assert await run(workers.register_worker(registration(WORKER, successor))) is not None  # takes over the id
        await app.schedule("t", {"n": "new"})
        claimed = await _claim(app)  # under the same worker id, after the successor registered
        recovered = await run(workers.reclaim_predecessor_jobs(WORKER, successor))
        assert [job.job_id for job in recovered] == [old]
        assert "new process took over its id" in recovered[0].error
        assert await _lease_is_live(app, claimed)
        # An instance that no longer holds the id reclaims nothing.
        assert await run(workers.reclaim_predecessor_jobs(WORKER, uuid.uuid4())) == []


async def _until_waiting_for_a_lock(app: jobbus.App, pid: int) -> None:
    async def waiting() -> bool:
        async with app.pool.connection() as conn:
            cursor = await conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,))
            return await cursor.fetchone() == ("Lock",)

    await eventually(waiting, timeout=10, what="the declaration to wait for the worker's row")


async def test_a_job_reclaimed_while_the_declaration_waits_for_the_worker_row_is_left_to_its_new_attempt(
    dsn: str,
) -> None:
    """The declaration waits for the worker's row (a refresh holds it) while the job's lease expires, is
    recovered and the same worker id claims it again: the declaration, going on, re-reads the job and
    finds an attempt that started after its instant, which it leaves to its lease."""
    app = _app(dsn)
    async with app:
        workers = _rescuer(app).workers
        run = _runner(app)
        job_id = await _silent_worker_holding_a_job(app, workers, uuid.uuid4())
        async with (
            await psycopg.AsyncConnection.connect(dsn) as holder,
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as leader,
        ):
            await holder.execute("SELECT 1 FROM jobbus.worker WHERE id = %s FOR UPDATE", (WORKER,))
            declaring = asyncio.ensure_future(run_async(leader, workers.declare_dead_workers()))
            await _until_waiting_for_a_lock(app, leader.info.backend_pid)
            async with app.pool.connection() as conn:
                await conn.execute(
                    "UPDATE jobbus.job SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (job_id,)
                )
            recovered = await run(app.store.recover_expired_leases())
            assert [job.job_id for job in recovered] == [job_id]
            again = await _claim(app)  # a new attempt under the same worker id
            assert (again.id, again.attempts) == (job_id, 2)
            await holder.commit()
            (dead,) = await declaring
        assert (dead.worker_id, dead.recovered) == (WORKER, [])
        job = await app.find(job_id)
        assert job is not None and job.status is jobbus.JobStatus.RUNNING
        assert job.lease_token == again.lease_token
        assert await _lease_is_live(app, again)

"""The producer's decisions: free slots, backpressure from unwritten outcomes, `--limit`, and when a drain is done."""

from __future__ import annotations

import asyncio
import uuid

import psycopg

import jobbus
from jobbus import JobStatus
from jobbus.worker.producer import OUTCOMES_PER_SLOT
from tests.processes import eventually


async def _statuses(app: jobbus.App, ids: list[uuid.UUID]) -> list[JobStatus]:
    jobs = [await app.find(job_id) for job_id in ids]
    return [job.status for job in jobs if job is not None]


async def _completed(app: jobbus.App, job_id: uuid.UUID) -> bool:
    return await _statuses(app, [job_id]) == [JobStatus.COMPLETED]


async def test_an_outcome_being_written_holds_no_slot_but_a_backlog_of_them_stops_the_claims(dsn: str) -> None:
    """Concurrency 1: a job whose outcome cannot be written yet frees its slot for the next claim, and
    once `OUTCOMES_PER_SLOT` outcomes wait, no job is claimed although the slot is free."""
    app = jobbus.App(dsn=dsn, poll_interval_seconds=0.05)
    backlog = OUTCOMES_PER_SLOT
    started = {n: asyncio.Event() for n in range(backlog + 1)}
    may_return = asyncio.Event()

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        n = int(job.configuration["n"])
        started[n].set()
        if n == 0:
            await may_return.wait()

    async with app:
        # Higher priority first: the jobs are claimed in the order of n.
        ids = [await app.schedule("t", {"n": n}, priority=100 - n) for n in range(backlog + 1)]
        worker = jobbus.Worker(app, concurrency=1)
        task = worker.start()
        await asyncio.wait_for(started[0].wait(), 10)
        async with await psycopg.AsyncConnection.connect(dsn) as locker:
            # Job 0's row locked: its outcome, written once its handler returns, waits for the lock.
            await locker.execute("SELECT 1 FROM jobbus.job WHERE id = %s FOR UPDATE", (ids[0],))
            may_return.set()
            await asyncio.wait_for(started[backlog - 1].wait(), 10)  # the slot was claimed again and again
            await asyncio.sleep(1.0)  # every one returned: their outcomes wait behind job 0's write
            assert not started[backlog].is_set()
            assert await _statuses(app, ids) == [JobStatus.RUNNING] * backlog + [JobStatus.QUEUED]
            await locker.rollback()
        await asyncio.wait_for(started[backlog].wait(), 10)  # the outcomes are written: claims go on
        worker.request_drain()
        assert await asyncio.wait_for(task, 10) == 0
        assert await _statuses(app, ids) == [JobStatus.COMPLETED] * (backlog + 1)


async def test_a_limit_caps_the_claims_whatever_the_free_slots(app: jobbus.App) -> None:
    ran: list[int] = []

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        ran.append(int(job.configuration["n"]))

    ids = [await app.schedule("t", {"n": n}) for n in range(6)]
    worker = jobbus.Worker(app, concurrency=4, limit=3)
    assert await asyncio.wait_for(worker.run(), 10) == 0
    assert len(ran) == 3 and worker.completed == 3
    assert sorted(await _statuses(app, ids)) == sorted([JobStatus.COMPLETED] * 3 + [JobStatus.QUEUED] * 3)


async def test_a_drain_looks_at_the_table_before_it_concludes_that_nothing_is_left(dsn: str) -> None:
    """Without notifications and with a long poll interval, the producer's list of non-empty queues is
    stale: a job of a type it has not seen queued must still be found before the drain ends."""
    app = jobbus.App(dsn=dsn, transaction_pooling=True, poll_interval_seconds=60)  # no LISTEN: polling only
    ran: list[str] = []

    async def handler(job: jobbus.JobExecution) -> None:
        ran.append(job.type)

    app.job("a")(handler)
    app.job("b")(handler)

    async with app:
        seen = await app.schedule("a")
        worker = jobbus.Worker(app, concurrency=2)
        task = worker.start()
        await eventually(lambda: ran == ["a"], timeout=10, what="the first job")  # the queues were read
        await eventually(lambda: _completed(app, seen), timeout=10, what="its outcome")
        unseen = await app.schedule("b")  # heard by no one, and the next poll is a minute away
        worker.request_drain()
        assert await asyncio.wait_for(task, 10) == 0
        assert ran == ["a", "b"]
        assert await _statuses(app, [seen, unseen]) == [JobStatus.COMPLETED] * 2

"""Cancellation is cooperative first: a running handler sees `cancellation_requested` and returns; an
async handler still running `cancel_grace_seconds` after the request has its task cancelled. Either
way the job ends `cancelled`."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import jobbus
from jobbus import JobStatus
from tests.conftest import FAST

#: Cancellation flags are read at every renewal: a short heartbeat makes them seen quickly.
QUICK = {**FAST, "heartbeat_interval_seconds": 0.2, "worker_dead_after_seconds": 3.0}


@pytest.fixture
async def quick_app(dsn: str) -> AsyncIterator[jobbus.App]:
    application = jobbus.App(dsn=dsn, **QUICK)
    async with application:
        yield application


def _app(dsn: str, **settings: Any) -> jobbus.App:
    return jobbus.App(dsn=dsn, **(QUICK | settings))


async def _cancel_while_running(app: jobbus.App, job_id: uuid.UUID, started: asyncio.Event) -> None:
    await asyncio.wait_for(started.wait(), 20)
    assert await app.cancel(job_id) is JobStatus.RUNNING


async def _run_until_finished(app: jobbus.App, job_id: uuid.UUID, started: asyncio.Event) -> jobbus.Job:
    worker = jobbus.Worker(app, stop_when_empty=True)
    task = worker.start()
    await _cancel_while_running(app, job_id, started)
    assert await asyncio.wait_for(task, 60) == 0
    job = await app.find(job_id)
    assert job is not None
    return job


async def test_a_handler_that_sees_the_request_cleans_up_and_returns_and_the_job_is_cancelled(
    quick_app: jobbus.App,
) -> None:
    started = asyncio.Event()
    cleaned: list[str] = []

    @quick_app.job("tidy")
    async def tidy(job: jobbus.JobExecution) -> str:
        started.set()
        while not job.cancellation_requested:  # noqa: ASYNC110 - a handler polls its flag between steps
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)  # cleanup that awaits: flushing a buffer, closing a session
        await job.checkpoint({"cleaned": True})  # still holds its lease: fenced writes work
        cleaned.append("done")
        return "stopped early"

    job_id = await quick_app.schedule("tidy")
    job = await _run_until_finished(quick_app, job_id, started)
    assert cleaned == ["done"]
    assert job.status is JobStatus.CANCELLED and job.result is None
    assert job.execution_data == {"cleaned": True}


def _deaf(app: jobbus.App) -> tuple[asyncio.Event, list[float], list[float]]:
    """A handler "deaf" that notes when it first sees the request and when its task is cancelled, and
    otherwise ignores the request for a minute: (started, seen, interrupted)."""
    started = asyncio.Event()
    seen: list[float] = []
    interrupted: list[float] = []

    @app.job("deaf")
    async def deaf(job: jobbus.JobExecution) -> None:
        started.set()
        try:
            for _ in range(3000):
                if job.cancellation_requested and not seen:
                    seen.append(time.monotonic())
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            interrupted.append(time.monotonic())
            raise

    return started, seen, interrupted


async def test_an_async_handler_that_ignores_the_request_is_cancelled_after_the_grace(dsn: str) -> None:
    app = _app(dsn, cancel_grace_seconds=1)
    started, seen, interrupted = _deaf(app)

    async with app:
        job_id = await app.schedule("deaf")
        job = await _run_until_finished(app, job_id, started)
    assert job.status is JobStatus.CANCELLED
    assert len(seen) == 1 and len(interrupted) == 1
    # It was told first and given its grace (1 s, counted from before it could see the flag).
    assert interrupted[0] - seen[0] > 0.5


async def test_without_a_grace_an_async_handler_is_never_forced_and_still_ends_cancelled(dsn: str) -> None:
    app = _app(dsn, cancel_grace_seconds=None)
    started = asyncio.Event()
    outcome: list[str] = []

    @app.job("slow_to_stop")
    async def slow_to_stop(job: jobbus.JobExecution) -> str:
        started.set()
        while not job.cancellation_requested:  # noqa: ASYNC110 - a handler polls its flag between steps
            await asyncio.sleep(0.02)
        try:
            await asyncio.sleep(3)  # finishes what it was doing, however long it takes
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        outcome.append("returned")
        return "finished anyway"

    async with app:
        job_id = await app.schedule("slow_to_stop")
        job = await _run_until_finished(app, job_id, started)
    assert outcome == ["returned"]
    assert job.status is JobStatus.CANCELLED and job.result is None


async def test_a_sync_handler_is_never_forced_and_ends_cancelled_when_it_returns(dsn: str) -> None:
    app = _app(dsn, cancel_grace_seconds=0)
    started = asyncio.Event()
    loop_started: list[asyncio.AbstractEventLoop] = []
    outcome: list[str] = []

    @app.job("sync_deaf")
    def sync_deaf(job: jobbus.SyncJobExecution) -> str:
        loop_started[0].call_soon_threadsafe(started.set)
        while not job.cancellation_requested:
            time.sleep(0.02)
        time.sleep(1.5)  # ignores the request for a while: a thread cannot be interrupted
        outcome.append("returned")
        return "finished anyway"

    async with app:
        loop_started.append(asyncio.get_running_loop())
        job_id = await app.schedule("sync_deaf")
        job = await _run_until_finished(app, job_id, started)
    assert outcome == ["returned"]
    assert job.status is JobStatus.CANCELLED and job.result is None


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_a_handler_that_returns_before_its_worker_reads_the_request_still_ends_cancelled(
    dsn: str, flavour: str
) -> None:
    """The request lands between two renewals (an hour apart here) and the handler returns without
    having looked: `cancel()` said the job would stop, so it ends cancelled, keeps no result, schedules
    no follow-up, and listeners hear `JobCancelled`, not `JobCompleted`."""
    app = _app(dsn, heartbeat_interval_seconds=3600, lease_seconds=7200, worker_dead_after_seconds=3 * 3600)
    started = asyncio.Event()
    release = threading.Event()
    heard: list[str] = []
    app.on(jobbus.JobCompleted)(lambda event: heard.append("completed"))
    app.on(jobbus.JobCancelled)(lambda event: heard.append("cancelled"))

    if flavour == "async":

        @app.job("unaware")
        async def unaware(job: jobbus.JobExecution) -> str:
            started.set()
            await asyncio.to_thread(release.wait, 20)
            return "done"

    else:

        @app.job("unaware")
        def unaware_sync(job: jobbus.SyncJobExecution) -> str:
            loop.call_soon_threadsafe(started.set)
            release.wait(20)
            return "done"

    async with app:
        loop = asyncio.get_running_loop()
        job_id = await app.schedule("unaware", then=jobbus.JobRequest("after"))
        worker = jobbus.Worker(app, stop_when_empty=True)
        task = worker.start()
        await _cancel_while_running(app, job_id, started)
        release.set()
        assert await asyncio.wait_for(task, 60) == 0
        job = await app.find(job_id)
        follow_ups = await app.list_jobs(type="after")
    assert job is not None and (job.status, job.result) == (JobStatus.CANCELLED, None)
    assert job.history[-1]["outcome"] == "cancelled"
    assert follow_ups == []
    assert heard == ["cancelled"]


async def test_the_grace_is_counted_from_the_request_not_from_when_the_worker_read_it(dsn: str) -> None:
    """The request lands right after a renewal, so the worker reads it a heartbeat (2 s) later: the
    handler, which ignores it, is still cancelled `cancel_grace_seconds` (3.5 s) after the request, not
    3.5 s after the worker read it."""
    app = _app(
        dsn, heartbeat_interval_seconds=2, lease_seconds=60, worker_dead_after_seconds=10, cancel_grace_seconds=3.5
    )
    started, seen, interrupted = _deaf(app)

    async with app:
        job_id = await app.schedule("deaf")
        worker = jobbus.Worker(app, stop_when_empty=True)
        task = worker.start()
        await asyncio.wait_for(started.wait(), 20)
        job = await app.find(job_id)
        assert job is not None
        renewed = job.lease_expires_at
        while job is not None and job.lease_expires_at == renewed:  # wait for the next renewal
            await asyncio.sleep(0.01)
            job = await app.find(job_id)
        requested = time.monotonic()
        assert await app.cancel(job_id) is JobStatus.RUNNING
        assert await asyncio.wait_for(task, 60) == 0
        job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.CANCELLED
    assert len(seen) == 1 and len(interrupted) == 1
    assert seen[0] - requested > 1.0  # read at the next renewal, about 2 s later
    assert 3.4 < interrupted[0] - requested < 4.4

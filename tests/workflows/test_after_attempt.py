"""Nothing runs after its attempt (SPEC 16): a step, sleep, event wait, spawn or wait for children called
once the attempt is over (a task or thread the handler leaked, a handler that swallowed the park) raises
`LeaseLostError` before running anything, and writes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import pytest

import jobbus
from jobbus import JobStatus
from tests.worker.test_runtime import drain

CALLS: dict[str, Callable[[Any, list[str]], Any]] = {
    "step": lambda job, ran: job.step("late", lambda: ran.append("late")),
    "sleep": lambda job, ran: job.sleep("late", 0),
    "wait_for_event": lambda job, ran: job.wait_for_event("late", timeout=0),
    "spawn": lambda job, ran: job.spawn("child"),
    "wait_for_children": lambda job, ran: job.wait_for_children(),
}


#: The fenced writes, which a leaked thread may try too.
WRITES: dict[str, Callable[[Any, list[str]], Any]] = {
    "checkpoint": lambda job, ran: job.checkpoint({"late": True}),
    "progress": lambda job, ran: job.progress(1, 2),
    "heartbeat": lambda job, ran: job.heartbeat(),
}


def _leak(
    call: Callable[[Any, list[str]], Any],
    job: Any,
    ran: list[str],
    go: threading.Event,
    outcome: list[BaseException | None],
) -> threading.Thread:
    """Start a thread as a handler that leaks one: once `go` is set it makes `call` and notes what it
    raised (None: nothing)."""

    def late() -> None:
        go.wait(30)
        try:
            call(job, ran)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=late)
    thread.start()
    return thread


async def _children(app: jobbus.App) -> list[jobbus.Job]:
    return await app.list_jobs(type="child")


@pytest.mark.parametrize("call", sorted(CALLS))
async def test_a_task_leaked_by_an_async_handler_runs_nothing_after_the_attempt(app: jobbus.App, call: str) -> None:
    ran: list[str] = []
    go = asyncio.Event()
    leaked: list[asyncio.Task[Any]] = []

    @app.job("child")
    async def child(job: jobbus.JobExecution) -> None:
        ran.append("child")

    @app.job("leaky")
    async def leaky(job: jobbus.JobExecution) -> str:
        async def late() -> Any:
            await go.wait()
            return await CALLS[call](job, ran)

        leaked.append(asyncio.create_task(late()))
        return "returned"

    job_id = await app.schedule("leaky")
    await drain(app)
    done = await app.wait(job_id, timeout=30)
    go.set()
    with pytest.raises(jobbus.LeaseLostError, match="attempt 1 is over"):
        await asyncio.wait_for(leaked[0], 30)
    job = await app.find(job_id)
    assert job is not None and (job.status, job.result, job.steps) == (JobStatus.COMPLETED, "returned", {})
    assert done.status is JobStatus.COMPLETED
    assert ran == [] and await _children(app) == []


async def test_a_task_leaked_as_the_handler_returns_runs_no_step(app: jobbus.App) -> None:
    """The leaked task starts while the worker writes the outcome (the lease still valid): it is refused too."""
    ran: list[str] = []
    leaked: list[asyncio.Task[Any]] = []

    @app.job("leaky")
    async def leaky(job: jobbus.JobExecution) -> str:
        leaked.append(asyncio.create_task(job.step("late", lambda: ran.append("late"))))
        return "returned"

    job_id = await app.schedule("leaky")
    await drain(app)
    with pytest.raises(jobbus.LeaseLostError):
        await asyncio.wait_for(leaked[0], 30)
    job = await app.wait(job_id, timeout=30)
    assert (job.status, job.steps, ran) == (JobStatus.COMPLETED, {}, [])


@pytest.mark.parametrize("call", sorted(CALLS))
async def test_an_async_handler_that_swallows_the_park_runs_nothing_after_it(app: jobbus.App, call: str) -> None:
    ran: list[str] = []
    refused: list[BaseException] = []

    @app.job("child")
    async def child(job: jobbus.JobExecution) -> None:
        ran.append("child")

    @app.job("swallow")
    async def swallow(job: jobbus.JobExecution) -> str:
        with contextlib.suppress(BaseException):  # the hostile case: the park is swallowed
            await job.sleep("nap", 3600)
        try:
            await CALLS[call](job, ran)
        except jobbus.LeaseLostError as exc:
            refused.append(exc)
        return "swallowed"

    job_id = await app.schedule("swallow")
    await drain(app)
    assert len(refused) == 1 and "is over" in str(refused[0])
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.QUEUED  # still parked for its hour
    assert set(job.steps) == {"sleep:nap"}
    assert ran == [] and await _children(app) == []


@pytest.mark.parametrize("call", sorted(CALLS))
async def test_a_thread_leaked_by_a_sync_handler_runs_nothing_after_the_attempt(app: jobbus.App, call: str) -> None:
    ran: list[str] = []
    go = threading.Event()
    outcome: list[BaseException | None] = []
    threads: list[threading.Thread] = []

    @app.job("child")
    def child(job: jobbus.SyncJobExecution) -> None:
        ran.append("child")

    @app.job("leaky")
    def leaky(job: jobbus.SyncJobExecution) -> str:
        threads.append(_leak(CALLS[call], job, ran, go, outcome))
        return "returned"

    job_id = await app.schedule("leaky")
    await drain(app)
    await app.wait(job_id, timeout=30)
    go.set()
    await asyncio.to_thread(threads[0].join, 30)
    assert len(outcome) == 1 and isinstance(outcome[0], jobbus.LeaseLostError), outcome
    job = await app.find(job_id)
    assert job is not None and (job.status, job.steps) == (JobStatus.COMPLETED, {})
    assert ran == [] and await _children(app) == []


@pytest.mark.parametrize("call", sorted([*CALLS, *WRITES]))
def test_a_thread_that_outlives_its_workers_event_loop_runs_nothing_and_is_told_the_lease_is_lost(
    dsn: str, call: str
) -> None:
    """The worker is gone and its event loop closed when the leaked thread calls: `LeaseLostError`, as
    while the worker ran, not the loop's RuntimeError."""
    app = jobbus.App(dsn=dsn)
    ran: list[str] = []
    go = threading.Event()
    outcome: list[BaseException | None] = []
    threads: list[threading.Thread] = []

    @app.job("leaky")
    def leaky(job: jobbus.SyncJobExecution) -> None:
        threads.append(_leak({**CALLS, **WRITES}[call], job, ran, go, outcome))

    async def run_worker() -> None:
        async with app:
            await app.schedule("leaky")
            assert await jobbus.Worker(app, stop_when_empty=True).run() == 0

    asyncio.run(run_worker())  # its loop is closed when this returns
    go.set()
    threads[0].join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], jobbus.LeaseLostError), outcome
    assert ran == []
    with app.sync:
        (job,) = app.sync.list_jobs()
    assert (job.status, job.steps, job.execution_data) == (JobStatus.COMPLETED, {}, {})


async def test_a_sync_handler_that_swallows_the_park_runs_no_step_after_it(app: jobbus.App) -> None:
    ran: list[str] = []
    refused: list[BaseException] = []

    @app.job("swallow")
    def swallow(job: jobbus.SyncJobExecution) -> str:
        with contextlib.suppress(BaseException):  # the hostile case: the park is swallowed
            job.wait_for_event("never", timeout=3600)
        try:
            job.step("after", lambda: ran.append("after"))
        except jobbus.LeaseLostError as exc:
            refused.append(exc)
        return "swallowed"

    job_id = await app.schedule("swallow")
    await drain(app)
    assert len(refused) == 1 and ran == []
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.QUEUED and set(job.steps) == {"event:never"}

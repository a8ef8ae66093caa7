"""How attempts end when handlers, payloads and job scopes misbehave: in-process regression tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import JobStatus, control
from tests.conftest import FAST
from tests.processes import until_stop_requested


async def drain(app: jobbus.App, **options: Any) -> int:
    options = {"stop_when_empty": True, "concurrency": 4} | options
    return await jobbus.Worker(app, **options).run()


async def execute(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(query.encode(), params or None)
        return await cursor.fetchall() if cursor.description else []


async def test_a_cancelled_error_the_worker_did_not_cause_is_a_failed_attempt(app: jobbus.App) -> None:
    runs: list[int] = []

    @app.job("escapes")
    async def escapes(job: jobbus.JobExecution) -> None:
        runs.append(job.attempt)
        inner = asyncio.create_task(asyncio.sleep(10))
        await asyncio.sleep(0)
        inner.cancel()
        await inner  # the inner task's CancelledError escapes the handler

    job_id = await app.schedule("escapes", max_attempts=2)
    assert await drain(app) == 0
    job = await app.find(job_id)
    assert job is not None and (job.status, job.attempts) == (JobStatus.FAILED, 2)
    assert runs == [1, 2]
    assert "CancelledError" in (job.last_error or "") and "did not cancel it" in (job.last_error or "")


@pytest.mark.parametrize(
    "exc",
    [KeyboardInterrupt(), SystemExit(3), GeneratorExit(), type("Custom", (BaseException,), {})("odd")],
    ids=["KeyboardInterrupt", "SystemExit", "GeneratorExit", "custom-BaseException"],
)
async def test_every_base_exception_from_a_handler_is_a_failed_attempt_not_a_dead_worker(
    app: jobbus.App, exc: BaseException
) -> None:
    @app.job("raises")
    async def raises(job: jobbus.JobExecution) -> None:
        raise exc

    @app.job("sync_raises")
    def sync_raises(job: jobbus.SyncJobExecution) -> None:
        raise exc

    @app.job("innocent")
    async def innocent(job: jobbus.JobExecution) -> str:
        return "fine"

    ids = [await app.schedule(t, max_attempts=1) for t in ("raises", "sync_raises", "innocent")]
    assert await drain(app) == 0
    raised, sync_raised, fine = [await app.find(i) for i in ids]
    for job in (raised, sync_raised):
        assert job is not None and job.status is JobStatus.FAILED
        assert type(exc).__name__ in (job.last_error or "") and "does not stop the worker" in (job.last_error or "")
    assert fine is not None and (fine.status, fine.result) == (JobStatus.COMPLETED, "fine")


@pytest.mark.parametrize(
    "delay",
    [-1, float("nan"), timedelta(days=400), "soon", None],
    ids=["negative", "nan", "over-a-year", "not-a-duration", "none"],
)
async def test_a_snooze_with_an_impossible_delay_is_a_failed_attempt_that_names_the_delay(
    app: jobbus.App, delay: Any
) -> None:
    @app.job("snoozes")
    async def snoozes(job: jobbus.JobExecution) -> None:
        raise jobbus.Snooze(delay)

    @app.job("snoozes_once")
    def snoozes_once(job: jobbus.SyncJobExecution) -> str:
        if not job.execution_data:
            job.checkpoint({"snoozed": True})
            raise jobbus.Snooze(0)
        return "after a snooze"

    bad_id = await app.schedule("snoozes", max_attempts=1)
    good_id = await app.schedule("snoozes_once", max_attempts=1)
    assert await drain(app) == 0
    bad, good = await app.find(bad_id), await app.find(good_id)
    assert bad is not None and (bad.status, bad.attempts) == (JobStatus.FAILED, 1)
    assert "InvalidJobError" in (bad.last_error or "") and "Snooze delay must be" in (bad.last_error or "")
    assert good is not None and (good.status, good.attempts, good.result) == (JobStatus.COMPLETED, 1, "after a snooze")
    assert [entry["outcome"] for entry in good.history] == ["snoozed", "completed"]


@pytest.mark.parametrize(
    ("result", "reason"),
    [("\ud800", "surrogate"), (float("nan"), "NaN"), ({"x": float("inf")}, "Infinity"), ("x" * 2_000_000, "bytes")],
    ids=["lone-surrogate", "nan", "infinity", "too-large"],
)
async def test_an_unstorable_result_fails_its_job_alone_and_the_batch_is_written(
    app: jobbus.App, result: Any, reason: str
) -> None:
    @app.job("bad")
    async def bad(job: jobbus.JobExecution) -> Any:
        await asyncio.sleep(0.05)  # finish together with the good ones: one outcome batch
        return result

    @app.job("good")
    async def good(job: jobbus.JobExecution) -> int:
        await asyncio.sleep(0.05)
        return 1

    bad_id = await app.schedule("bad", max_attempts=3)
    good_ids = await app.schedule_many("good", [{}, {}])
    assert await drain(app, concurrency=3) == 0
    job = await app.find(bad_id)
    assert job is not None and (job.status, job.attempts) == (JobStatus.FAILED, 1)  # not retryable
    assert "return value" in (job.last_error or "") and reason in (job.last_error or "")
    for good_id in good_ids:
        done = await app.find(good_id)
        assert done is not None and (done.status, done.result) == (JobStatus.COMPLETED, 1)


async def test_a_row_the_database_refuses_fails_alone_and_the_others_of_its_batch_are_written(
    app: jobbus.App,
) -> None:
    """The completer's own defence, below the worker's checks: the database refuses one outcome."""
    from jobbus.store import Outcome
    from jobbus.worker.completer import Completer
    from tests.storehelpers import claim

    ids = await app.schedule_many("t", [{}, {}, {}])
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        claimed = {c.id: c for c in claim(app, conn, 3)}
    failures: list[str] = []

    async def run(statement: Any) -> Any:
        async with app.pool.connection() as conn:
            return await jobbus.store.run_async(conn, statement)

    completer = Completer(app.store, run, write_lock=asyncio.Lock(), on_fatal=lambda c, e: failures.append(c))
    completer.start()
    outcomes = [
        Outcome(job_id, claimed[job_id].lease_token, JobStatus.COMPLETED, result_json=text)
        for job_id, text in zip(ids, ['{"ok": 1}', '"\\ud800"', '{"ok": 3}'], strict=True)
    ]
    results = await asyncio.gather(*(completer.write(o, time.monotonic() + 60) for o in outcomes))
    await completer.close(5)
    assert failures == []
    assert results[0] == (JobStatus.COMPLETED, None) and results[2] == (JobStatus.COMPLETED, None)
    written, refusal = results[1]
    assert written is JobStatus.FAILED and refusal is not None and "could not be stored" in refusal
    first, refused, third = [await app.find(i) for i in ids]
    assert first is not None and (first.status, first.result) == (JobStatus.COMPLETED, {"ok": 1})
    assert third is not None and (third.status, third.result) == (JobStatus.COMPLETED, {"ok": 3})
    assert refused is not None and refused.status is JobStatus.FAILED and refused.last_error == refusal


def _undecodable_depth() -> int:
    """A nesting this Python cannot decode and PostgreSQL still parses: 3,000 levels are past the
    recursion limit of Python 3.11 and 3.12, not 3.13's (about 10,000); 12,000 are past every supported
    Python's and within what PostgreSQL parses with its default max_stack_depth of 2 MB."""
    for depth in (3000, 12000):
        try:
            json.loads("[" * depth + "]" * depth)
        except RecursionError:
            return depth
    raise AssertionError("this Python decodes JSON nested 12,000 levels deep")


async def test_a_configuration_nested_too_deeply_fails_its_job_and_the_claimed_batch_runs(
    app: jobbus.App, dsn: str
) -> None:
    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> str:
        return "ran"

    depth = _undecodable_depth()
    deep = "[" * depth + "]" * depth  # what any producer outside Python can write
    deep_id = uuid.uuid4()
    await execute(
        dsn,
        "INSERT INTO jobbus.job (id, type, max_attempts, configuration_data) VALUES (%s, 't', 3, %s::jsonb)",
        deep_id,
        json.dumps({"tree": "PLACEHOLDER"}).replace('"PLACEHOLDER"', deep),
    )
    others = await app.schedule_many("t", [{}, {}])
    assert await drain(app) == 0
    job = await app.find(deep_id)  # reading the row back works too
    assert job is not None and (job.status, job.attempts) == (JobStatus.FAILED, 1)
    assert "cannot be decoded" in (job.last_error or "") and "nested too deeply" in (job.last_error or "")
    for other in others:
        done = await app.find(other)
        assert done is not None and done.status is JobStatus.COMPLETED


async def test_a_configuration_larger_than_the_worker_accepts_is_never_loaded(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, max_payload_bytes=100_000, **FAST)

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> int:
        return len(job.configuration)

    big = json.dumps({f"k{i}": uuid.uuid4().hex * 4 for i in range(5000)})  # ~700 KB, barely compressible
    async with app:
        big_id = uuid.uuid4()
        await execute(
            dsn,
            "INSERT INTO jobbus.job (id, type, max_attempts, configuration_data) VALUES (%s, 't', 3, %s::jsonb)",
            big_id,
            big,
        )
        small = await app.schedule("t", {"a": 1})
        assert await drain(app) == 0
        job, done = await app.find(big_id), await app.find(small)
    assert job is not None and job.status is JobStatus.FAILED
    assert "over this worker's max_payload_bytes (100000)" in (job.last_error or "")
    assert done is not None and (done.status, done.result) == (JobStatus.COMPLETED, 1)


async def test_a_handler_that_returns_during_the_shutdown_grace_has_its_result_recorded(app: jobbus.App) -> None:
    started = asyncio.Event()

    @app.job("unaware")
    async def unaware(job: jobbus.JobExecution) -> str:
        started.set()
        await asyncio.sleep(0.3)  # never looks at cancellation_requested: it just finishes its work
        return "done"

    @app.job("aware")
    async def aware(job: jobbus.JobExecution) -> str:
        started.set()
        await until_stop_requested(job)
        return "stopped early"

    unaware_id = await app.schedule("unaware")
    aware_id = await app.schedule("aware")
    worker = jobbus.Worker(app, concurrency=2, shutdown_timeout=0.2)
    task = worker.start()
    await started.wait()
    await asyncio.sleep(0.05)
    worker.request_stop()
    assert await task == 0
    finished, released = await app.find(unaware_id), await app.find(aware_id)
    assert finished is not None and (finished.status, finished.result) == (JobStatus.COMPLETED, "done")
    assert released is not None and (released.status, released.attempts) == (JobStatus.QUEUED, 0)


async def test_a_job_scope_holding_every_pool_connection_does_not_starve_the_worker(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, pool_max_size=2, heartbeat_interval_seconds=0.1, **FAST)

    @contextlib.asynccontextmanager
    async def scope(job: jobbus.JobExecution) -> AsyncIterator[Any]:
        async with app.pool.connection() as conn:  # a DB session per job, from the App's own pool
            yield conn

    app.job_scope = scope

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> int:
        await job.checkpoint({"step": 1})
        await asyncio.sleep(0.3)  # several heartbeats while every App connection is held
        return 1

    async with app:
        ids = await app.schedule_many("t", [{} for _ in range(6)])
        assert await asyncio.wait_for(drain(app, concurrency=6), 30) == 0
        jobs = [await app.find(i) for i in ids]
    assert all(j is not None and j.status is JobStatus.COMPLETED and j.attempts == 1 for j in jobs)


async def test_a_cancellation_asked_for_wins_over_a_failure_and_recovery_announces_what_it_decided(
    app: jobbus.App, dsn: str
) -> None:
    seen: list[tuple[str, uuid.UUID]] = []
    for event_type in (jobbus.JobRetried, jobbus.JobFailed, jobbus.JobCancelled):

        @app.on(event_type)
        def record(event: jobbus.JobEvent) -> None:
            seen.append((type(event).__name__, event.job_id))

    @app.job("raises_after_cancel")
    async def raises_after_cancel(job: jobbus.JobExecution) -> None:
        await until_stop_requested(job)
        raise RuntimeError("interrupted")

    job_id = await app.schedule("raises_after_cancel", max_attempts=3)
    worker = jobbus.Worker(app, stop_when_empty=True)
    task = worker.start()
    await _until(lambda: _status(app, job_id), JobStatus.RUNNING)
    assert await app.cancel(job_id) is JobStatus.RUNNING
    assert await asyncio.wait_for(task, 20) == 0
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.CANCELLED

    # Expired leases: recovery retries, fails or cancels, and says so to listeners.
    retried, failed, cancelled = await app.schedule_many("t", [{}, {}, {}])
    await execute(
        dsn,
        "UPDATE jobbus.job SET status = 'running', attempts = CASE WHEN id = %s THEN 3 ELSE 1 END, max_attempts = 3,"
        " lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second', worker_id = 'gone',"
        " cancellation_requested_at = CASE WHEN id = %s THEN now() END WHERE id = ANY(%s)",
        failed,
        cancelled,
        [retried, failed, cancelled],
    )

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        await asyncio.sleep(5)  # the retried job runs again: keep it busy while we look

    worker = jobbus.Worker(app)
    task = worker.start()
    await _until(lambda: _status(app, failed), JobStatus.FAILED)
    worker.request_stop()
    await task
    assert ("JobRetried", retried) in seen and ("JobFailed", failed) in seen and ("JobCancelled", cancelled) in seen


async def test_a_paused_worker_that_should_stop_when_empty_stops_once_idle(app: jobbus.App) -> None:
    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        return None

    await app.schedule("t")
    await control.pause(app, all=True)
    assert await asyncio.wait_for(drain(app), 10) == 0  # nothing is available to a paused worker
    worker = jobbus.Worker(app)
    task = worker.start()
    await worker.ready()
    worker.request_drain()
    assert await asyncio.wait_for(task, 10) == 0
    assert [j.status for j in await app.list_jobs()] == [JobStatus.QUEUED]


async def test_an_embedding_host_starts_drains_and_stops_a_worker_through_its_handle(app: jobbus.App) -> None:
    seen: list[tuple[Any, ...]] = []

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        seen.append((job.created_at, job.available_at, job.id))

    first = await app.schedule("t")
    delayed = await app.schedule("t", available_at=timedelta(milliseconds=300))
    worker = jobbus.Worker(app, concurrency=2)
    task = worker.start()
    await worker.ready()
    await _until(lambda: _status(app, delayed), JobStatus.COMPLETED)
    worker.request_drain()
    assert await asyncio.wait_for(task, 10) == 0
    assert worker.completed == 2
    by_id = {job_id: (created, available) for created, available, job_id in seen}
    created, available = by_id[first]
    assert available == created  # available at once
    created, available = by_id[delayed]
    assert timedelta(milliseconds=250) < available - created < timedelta(seconds=5)

    stopping = jobbus.Worker(app)
    task = stopping.start()
    await stopping.ready()
    stopping.request_stop(75)
    assert await asyncio.wait_for(task, 10) == 75


async def _status(app: jobbus.App, job_id: uuid.UUID) -> JobStatus | None:
    job = await app.find(job_id)
    return job.status if job else None


async def _until(probe: Any, expected: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while (value := await probe()) != expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"still {value!r}, expected {expected!r}")
        await asyncio.sleep(0.02)

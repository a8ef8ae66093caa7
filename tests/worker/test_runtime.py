"""The worker in-process: outcomes, retries, results, sync handlers, scopes, events and wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import JobStatus


async def drain(app: jobbus.App, **options: Any) -> int:
    options = {"stop_when_empty": True, "concurrency": 4, "install_signal_handlers": False} | options
    return await app.run_worker(**options)


@pytest.mark.smoke
async def test_async_handler_result_checkpoint_and_progress_are_stored(app: jobbus.App) -> None:
    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> dict[str, Any]:
        assert job.configuration == {"n": 2}
        assert (job.attempt, job.max_attempts, job.type, job.queue) == (1, 3, "t", "default")
        await job.checkpoint({"offset": 1})
        await job.checkpoint({"offset": 2})
        await job.progress(2, 4)
        await job.heartbeat()
        return {"double": job.configuration["n"] * 2}

    job_id = await app.schedule("t", {"n": 2})
    assert await drain(app) == 0
    job = await app.find(job_id)
    assert job is not None
    assert (job.status, job.result, job.attempts) == (JobStatus.COMPLETED, {"double": 4}, 1)
    assert job.execution_data == {"offset": 2}  # checkpoint replaces, progress is beside it
    assert (job.progress_current, job.progress_total) == (2, 4)
    assert job.finished_at is not None and job.lease_token is None


async def test_sync_handler_runs_in_a_thread_with_blocking_methods(app: jobbus.App) -> None:
    import threading

    main_thread = threading.get_ident()

    @app.job("s")
    def handler(job: jobbus.SyncJobExecution) -> int:
        assert threading.get_ident() != main_thread
        job.checkpoint({"step": 1})
        job.progress(1)
        assert job.execution_data == {"step": 1}
        return int(job.configuration["n"]) + 1

    ids = await app.schedule_many("s", [{"n": n} for n in range(10)])
    assert await drain(app) == 0
    jobs = [await app.find(i) for i in ids]
    assert [j.result for j in jobs if j] == [n + 1 for n in range(10)]
    assert all(j and j.execution_data == {"step": 1} and j.progress_current == 1 for j in jobs)


async def test_async_handlers_share_the_workers_one_event_loop_up_to_its_concurrency(app: jobbus.App) -> None:
    """SPEC 1, cooperative runtime: no fork pool and no thread per async job; `concurrency` bounds them."""
    import os
    import threading

    loop, process, thread = asyncio.get_running_loop(), os.getpid(), threading.get_ident()
    running: list[int] = [0, 0]  # now, peak
    seen: set[tuple[int, int, bool]] = set()

    @app.job("a")
    async def handler(job: jobbus.JobExecution) -> None:
        seen.add((os.getpid(), threading.get_ident(), asyncio.get_running_loop() is loop))
        running[0] += 1
        running[1] = max(running[1], running[0])
        await asyncio.sleep(0.2)
        running[0] -= 1

    ids = await app.schedule_many("a", [{} for _ in range(12)])
    assert await drain(app, concurrency=3) == 0
    assert seen == {(process, thread, True)}
    assert running[1] == 3
    jobs = [await app.find(i) for i in ids]
    assert all(job is not None and job.status is JobStatus.COMPLETED for job in jobs)


async def test_none_result_is_not_stored_and_unserialisable_result_fails_clearly(app: jobbus.App) -> None:
    @app.job("none")
    async def none(job: jobbus.JobExecution) -> None:
        return None

    @app.job("weird")
    async def weird(job: jobbus.JobExecution) -> object:
        return object()

    a = await app.schedule("none")
    b = await app.schedule("weird", max_attempts=3)
    await drain(app)
    job_a, job_b = await app.find(a), await app.find(b)
    assert job_a is not None and (job_a.status, job_a.result) == (JobStatus.COMPLETED, None)
    assert job_b is not None and job_b.status is JobStatus.FAILED
    assert job_b.attempts == 1
    assert "not JSON serialisable" in (job_b.last_error or "")


async def test_exceptions_retry_until_max_attempts_then_fail_with_the_last_line(app: jobbus.App) -> None:
    calls: list[int] = []

    @app.job("flaky")
    async def flaky(job: jobbus.JobExecution) -> str:
        calls.append(job.attempt)
        if job.attempt < 3:
            raise ConnectionError(f"attempt {job.attempt} failed")
        return "ok"

    @app.job("broken")
    async def broken(job: jobbus.JobExecution) -> None:
        raise ValueError("always broken")

    @app.job("fatal")
    async def fatal(job: jobbus.JobExecution) -> None:
        raise jobbus.NonRetryableError("bad input, do not retry")

    flaky_id = await app.schedule("flaky", max_attempts=3)
    broken_id = await app.schedule("broken", max_attempts=2)
    fatal_id = await app.schedule("fatal", max_attempts=5)
    await drain(app)
    f, b, n = [await app.find(i) for i in (flaky_id, broken_id, fatal_id)]
    assert f is not None and (f.status, f.attempts, f.result) == (JobStatus.COMPLETED, 3, "ok")
    assert f.last_error == "ConnectionError: attempt 2 failed"
    assert calls == [1, 2, 3]
    assert b is not None and (b.status, b.attempts, b.last_error) == (JobStatus.FAILED, 2, "ValueError: always broken")
    assert n is not None and (n.status, n.attempts) == (JobStatus.FAILED, 1)
    assert n.last_error == "jobbus.errors.NonRetryableError: bad input, do not retry"


async def test_retry_delay_follows_the_backoff_formula(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, retry_base_delay_seconds=100, retry_max_delay_seconds=1000, retry_jitter=0.2)

    @app.job("fails")
    async def fails(job: jobbus.JobExecution) -> None:
        raise RuntimeError("no")

    async with app:
        job_id = await app.schedule("fails", max_attempts=10)
        for failed_attempt in (1, 2, 3, 4, 5):
            assert await drain(app, limit=1) == 0
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                cur = await conn.execute(
                    "SELECT extract(epoch FROM available_at - now()), status, attempts FROM jobbus.job WHERE id = %s",
                    (job_id,),
                )
                row = await cur.fetchone()
                assert row is not None
                delay, status, attempts = float(row[0]), row[1], row[2]
                await conn.execute("UPDATE jobbus.job SET available_at = now() WHERE id = %s", (job_id,))
            nominal = min(1000, 100 * 2 ** (failed_attempt - 1))
            assert (status, attempts) == ("queued", failed_attempt)
            assert nominal * 0.8 - 5 <= delay <= nominal * 1.2


async def test_job_scope_wraps_the_outcome_write_once_per_job(app: jobbus.App, dsn: str) -> None:
    log: list[tuple[str, uuid.UUID, str]] = []

    async def status(job_id: uuid.UUID) -> str:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            row = await (await conn.execute("SELECT status FROM jobbus.job WHERE id = %s", (job_id,))).fetchone()
        return str(row[0]) if row else "?"

    @contextlib.asynccontextmanager
    async def scope(job: jobbus.JobExecution) -> AsyncIterator[dict[str, Any]]:
        log.append(("enter", job.id, await status(job.id)))
        yield {"session": job.id}
        log.append(("exit", job.id, await status(job.id)))

    app.job_scope = scope

    @app.job("scoped")
    async def scoped(job: jobbus.JobExecution) -> None:
        assert job.scope == {"session": job.id}
        log.append(("run", job.id, "running"))

    ids = await app.schedule_many("scoped", [{}, {}, {}])
    await drain(app, concurrency=1)
    for job_id in ids:
        assert [(event, s) for event, i, s in log if i == job_id] == [
            ("enter", "running"),
            ("run", "running"),
            ("exit", "completed"),
        ]


async def test_scope_that_fails_to_enter_fails_the_attempt_not_the_worker(app: jobbus.App) -> None:
    @contextlib.asynccontextmanager
    async def scope(job: jobbus.JobExecution) -> AsyncIterator[None]:
        if job.attempt == 1:
            raise OSError("cannot open session")
        yield

    app.job_scope = scope

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> str:
        return "ran"

    job_id = await app.schedule("t")
    assert await drain(app) == 0
    job = await app.find(job_id)
    assert job is not None and (job.status, job.attempts, job.result) == (JobStatus.COMPLETED, 2, "ran")
    assert job.last_error == "entering the job scope failed: OSError: cannot open session"


async def test_lifecycle_events_fire_after_each_outcome(app: jobbus.App, caplog: pytest.LogCaptureFixture) -> None:
    events: list[tuple[str, uuid.UUID]] = []

    for event_type in (jobbus.JobStarted, jobbus.JobCompleted, jobbus.JobRetried, jobbus.JobFailed):

        @app.on(event_type)
        async def record(event: jobbus.JobEvent) -> None:
            events.append((type(event).__name__, event.job_id))

    @app.on(jobbus.JobCompleted)
    def broken_listener(event: jobbus.JobCompleted) -> None:
        raise RuntimeError("listener exploded")

    @app.job("ok")
    async def ok(job: jobbus.JobExecution) -> None:
        return None

    @app.job("bad")
    async def bad(job: jobbus.JobExecution) -> None:
        raise RuntimeError("x")

    good = await app.schedule("ok")
    failing = await app.schedule("bad", max_attempts=2)
    await drain(app, concurrency=1)
    assert [name for name, i in events if i == good] == ["JobStarted", "JobCompleted"]
    assert [name for name, i in events if i == failing] == ["JobStarted", "JobRetried", "JobStarted", "JobFailed"]
    assert "listener exploded" in caplog.text
    job = await app.find(good)
    assert job is not None and job.status is JobStatus.COMPLETED


async def test_worker_claims_only_types_it_handles_and_its_queues(app: jobbus.App) -> None:
    @app.job("mine")
    async def mine(job: jobbus.JobExecution) -> None:
        return None

    handled = await app.schedule("mine", queue="a")
    other_queue = await app.schedule("mine", queue="b")
    unknown_type = await app.schedule("someone.elses", queue="a")
    await drain(app, queues=["a"])
    statuses = [(await app.find(i)) for i in (handled, other_queue, unknown_type)]
    assert [j.status for j in statuses if j] == [JobStatus.COMPLETED, JobStatus.QUEUED, JobStatus.QUEUED]


async def test_notification_wakes_an_idle_worker_long_before_its_poll_interval(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, poll_interval_seconds=60)
    done = asyncio.Event()

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        done.set()

    async with app:
        worker = asyncio.create_task(app.run_worker(concurrency=1, limit=1, install_signal_handlers=False))
        await asyncio.sleep(1.0)  # idle, listening
        await app.schedule("t")
        await asyncio.wait_for(done.wait(), timeout=20)  # far less than the 60 s poll interval
        assert await asyncio.wait_for(worker, timeout=20) == 0


async def test_worker_refuses_a_missing_schema(empty_dsn: str) -> None:
    app = jobbus.App(dsn=empty_dsn)

    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        return None

    with pytest.raises(jobbus.SchemaError, match="jobbus migrate"):
        await app.run_worker(install_signal_handlers=False)


async def test_worker_registers_itself_and_marks_itself_stopped(app: jobbus.App, dsn: str) -> None:
    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        return None

    await app.schedule_many("t", [{}, {}])
    await drain(app, worker_id="w-registry", concurrency=2)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT host, pid, types, concurrency, state, completed, failed, stopped_at IS NOT NULL"
            " FROM jobbus.worker WHERE id = 'w-registry'"
        )
        row = await cur.fetchone()
    assert row is not None
    import os

    assert row[1:] == (os.getpid(), ["t"], 2, "stopped", 2, 0, True)


async def test_delayed_jobs_wait_for_their_time(app: jobbus.App) -> None:
    @app.job("t")
    async def handler(job: jobbus.JobExecution) -> None:
        return None

    later = await app.schedule("t", available_at=timedelta(hours=1))
    await drain(app)
    job = await app.find(later)
    assert job is not None and job.status is JobStatus.QUEUED


async def test_checkpoints_and_results_over_the_payload_limit_fail_clearly(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, max_payload_bytes=4096)
    refused: list[str] = []

    @app.job("big_checkpoint")
    async def big_checkpoint(job: jobbus.JobExecution) -> None:
        try:
            await job.checkpoint({"blob": "x" * 5000})
        except ValueError as exc:
            refused.append(str(exc))

    @app.job("big_result")
    async def big_result(job: jobbus.JobExecution) -> str:
        return "x" * 5000

    async with app:
        a = await app.schedule("big_checkpoint")
        b = await app.schedule("big_result", max_attempts=3)
        await drain(app)
        job_a, job_b = await app.find(a), await app.find(b)
    assert refused and "max_payload_bytes" in refused[0]
    assert job_a is not None and (job_a.status, job_a.execution_data) == (JobStatus.COMPLETED, {})
    assert job_b is not None and (job_b.status, job_b.attempts) == (JobStatus.FAILED, 1)
    assert "max_payload_bytes" in (job_b.last_error or "")


async def test_heartbeats_after_the_outcome_is_written_report_no_lost_lease(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Between the outcome write and the end of the job (here a slow scope exit) the lease is gone on
    purpose: the monitor must not call that a lost lease."""

    @contextlib.asynccontextmanager
    async def slow_exit(job: jobbus.JobExecution) -> AsyncIterator[None]:
        yield
        await asyncio.sleep(0.05)

    app = jobbus.App(dsn=dsn, heartbeat_interval_seconds=0.01, job_scope=slow_exit)

    @app.job("quick")
    async def quick(job: jobbus.JobExecution) -> None:
        await asyncio.sleep(0.001)

    async with app:
        await app.schedule_many("quick", [{} for _ in range(300)])
        assert await drain(app, concurrency=50) == 0
        assert len(await app.list_jobs(status="completed", limit=5000)) == 300
    assert "lease lost" not in caplog.text

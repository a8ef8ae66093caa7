"""Durable steps: run once, result kept per (job, name), the write fenced by the attempt's lease."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import JobRequest, JobStatus
from jobbus.execution import JobExecution
from jobbus.store import Statement, run_sync
from tests.cli import jobbus as jobbus_cli
from tests.processes import finish, query, start_worker, status_of, wait_until, workers
from tests.storehelpers import claim, expire_lease
from tests.worker.test_runtime import drain
from tests.workflow_apps import prepare

SHORT_LEASE = {"JOBBUS_LEASE_SECONDS": "2", "JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "0.5"}


async def test_a_later_attempt_gets_stored_steps_back_without_running_them(app: jobbus.App, dsn: str) -> None:
    calls: list[str] = []

    def charge(amount: int) -> dict[str, int]:
        calls.append("charge")
        return {"charged": amount}

    async def ship() -> str:
        calls.append("ship")
        return "shipped"

    @app.job("order", max_attempts=3)
    async def order(job: jobbus.JobExecution) -> list[Any]:
        receipt = await job.step("charge", charge, 42)
        if job.attempt == 1:
            raise RuntimeError("crash between the steps")
        return [receipt, await job.step("ship", ship), await job.step("nothing", lambda: None)]

    job_id = await app.schedule("order")
    await drain(app)
    job = await app.wait(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED and job.attempts == 2
    assert job.result == [{"charged": 42}, "shipped", None]
    assert calls == ["charge", "ship"]
    assert job.steps == {"charge": {"charged": 42}, "ship": "shipped", "nothing": None}
    shown = jobbus_cli(dsn, "jobs", "show", str(job_id)).stdout
    assert "steps:" in shown and "charge" in shown and '{"charged": 42}' in shown


async def test_sync_handlers_have_a_blocking_step(app: jobbus.App) -> None:
    calls: list[int] = []

    def add(a: int, b: int) -> int:
        calls.append(1)
        return a + b

    @app.job("sync-order")
    def order(job: jobbus.SyncJobExecution) -> int:
        total: int = job.step("add", add, 2, 3)
        if job.attempt == 1:
            raise RuntimeError("again")
        return total

    job_id = await app.schedule("sync-order")
    await drain(app)
    job = await app.wait(job_id, timeout=10)
    assert (job.status, job.result, job.steps, calls) == (JobStatus.COMPLETED, 5, {"add": 5}, [1])


async def test_step_results_must_be_json_and_names_text(app: jobbus.App) -> None:
    @app.job("bad")
    async def bad(job: jobbus.JobExecution) -> None:
        with pytest.raises(ValueError, match="step name"):
            await job.step("", lambda: 1)
        with pytest.raises(ValueError, match="reserved"):
            await job.step("sleep:x", lambda: 1)
        with pytest.raises(ValueError, match="200 characters"):
            await job.step("x" * 201, lambda: 1)
        await job.step("set", lambda: {1, 2})

    job_id = await app.schedule("bad", max_attempts=1)
    await drain(app)
    job = await app.wait(job_id, timeout=10)
    assert job.status is JobStatus.FAILED and "not JSON serialisable" in (job.last_error or "")
    assert job.steps == {}


def test_a_stale_attempt_cannot_store_a_step(sync_app: jobbus.App, dsn: str) -> None:
    """Attempt 1 loses its lease and attempt 2 claims the job: attempt 1's step write is rejected with
    LeaseLostError and attempt 2's result stands."""
    app = sync_app
    job_id = app.sync.schedule("t")
    with psycopg.connect(dsn, autocommit=True) as conn:

        async def run(statement: Statement[Any]) -> Any:
            return run_sync(conn, statement)

        (first,) = claim(app, conn)
        expire_lease(conn, job_id)
        run_sync(conn, app.store.recover_expired_leases())
        (second,) = claim(app, conn)
        stale = JobExecution(first, app.store, run, 60, app.settings.max_payload_bytes)
        current = JobExecution(second, app.store, run, 60, app.settings.max_payload_bytes)

        async def scenario() -> None:
            assert await current.step("charge", lambda: "by attempt 2") == "by attempt 2"
            with pytest.raises(jobbus.LeaseLostError, match="lease"):
                await stale.step("refund", lambda: "by attempt 1")
            assert stale.lease_lost

        asyncio.run(scenario())
    job = app.sync.find(job_id)
    assert job is not None and job.steps == {"charge": "by attempt 2"}


@pytest.fixture
def db(dsn: str) -> str:
    prepare(dsn)
    return dsn


def _effects(dsn: str, job_id: uuid.UUID) -> list[tuple[str, int]]:
    return [
        (name, attempt)
        for name, attempt in query(
            dsn, "SELECT name, attempt FROM public.effects WHERE job_id = %s ORDER BY at", (job_id,)
        )
    ]


def _kill_then_take_over(db: str, job_id: uuid.UUID, after: list[tuple[str, int]]) -> None:
    with workers(db, 1, "--app", "tests.workflow_apps:app", env=SHORT_LEASE) as (first,):
        wait_until(lambda: _effects(db, job_id) == after, what="the first attempt to reach its pause")
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert status_of(db, job_id) == "running"
    second = start_worker(db, app="tests.workflow_apps:app", env=SHORT_LEASE)
    try:
        wait_until(lambda: status_of(db, job_id) == "completed", timeout=60, what="the second attempt")
    finally:
        second.kill()
        second.wait()


def test_sigkill_between_a_steps_side_effect_and_its_stored_result_runs_the_step_again(
    db: str, sync_app: jobbus.App
) -> None:
    job_id = sync_app.sync.schedule("wf.steps", {"pause_in": "charge"})
    _kill_then_take_over(db, job_id, [("charge", 1)])
    assert _effects(db, job_id) == [("charge", 1), ("charge", 2), ("ship", 2)]  # at-least-once
    job = sync_app.sync.find(job_id)
    assert job is not None
    assert job.steps == {"charge": "charge done in attempt 2", "ship": "ship done in attempt 2"}


def test_sigkill_after_a_step_was_stored_does_not_run_it_again(db: str, sync_app: jobbus.App) -> None:
    job_id = sync_app.sync.schedule("wf.steps", {"pause_after": "charge"})
    _kill_then_take_over(db, job_id, [("charge", 1)])
    assert _effects(db, job_id) == [("charge", 1), ("ship", 2)]
    job = sync_app.sync.find(job_id)
    assert job is not None and job.status is JobStatus.COMPLETED
    assert job.result == {"charge": "charge done in attempt 1", "ship": "ship done in attempt 2"}


def test_a_stopped_worker_past_its_lease_does_not_overwrite_the_new_attempts_step(
    db: str, sync_app: jobbus.App
) -> None:
    """Attempt 1 is frozen (SIGSTOP) inside its step after the side effect; attempt 2, on another worker,
    stores the step and completes. Resumed, the stale attempt stores nothing and logs the lost lease."""
    job_id = sync_app.sync.schedule("wf.slowstep")
    with workers(db, 1, "--app", "tests.workflow_apps:app", env=SHORT_LEASE) as (stale,):
        wait_until(lambda: _effects(db, job_id), what="attempt 1 inside its step")
        stale.send_signal(signal.SIGSTOP)
        fresh = start_worker(db, app="tests.workflow_apps:app", env=SHORT_LEASE)
        try:
            wait_until(lambda: status_of(db, job_id) == "completed", timeout=30, what="attempt 2")
        finally:
            fresh.kill()
            fresh.wait()
        stale.send_signal(signal.SIGCONT)
        time.sleep(4)  # the stale step's function returns; its write is refused
        assert stale.poll() is None
        stale.send_signal(signal.SIGTERM)
        code, out = finish(stale)
    assert code == 0 and "lease" in out
    job = sync_app.sync.find(job_id)
    assert job is not None
    assert (job.status, job.result, job.steps) == (
        JobStatus.COMPLETED,
        "charge by attempt 2",
        {"charge": "charge by attempt 2"},
    )
    assert [attempt for _, attempt in _effects(db, job_id)] == [1, 2]


async def test_pruned_jobs_take_their_workflow_rows_with_them_and_truncate_still_works(
    app: jobbus.App, dsn: str
) -> None:
    @app.job("pruned")
    async def pruned(job: jobbus.JobExecution) -> None:
        await job.step("s", lambda: 1)
        await job.spawn("child")

    await app.schedule("pruned", then=JobRequest("next"))
    await drain(app)
    tables = ("job_step", "job_follow_up", "job_child")
    counts = [query(dsn, f"SELECT count(*) FROM jobbus.{table}")[0][0] for table in tables]
    assert counts == [2, 1, 1]  # the step and the spawn's record, the follow-up, the child
    assert await app.prune(timedelta(0)) == 1
    counts = [query(dsn, f"SELECT count(*) FROM jobbus.{table}")[0][0] for table in tables]
    assert counts == [0, 0, 1]  # the child (queued, not pruned) keeps its parent link
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE jobbus.job")

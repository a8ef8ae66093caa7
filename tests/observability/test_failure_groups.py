"""Failure groups are written when a job fails: by the worker's outcome and by every recovery that fails a
job, cleared by a manual retry; failed rows without one (older ones) group with those that have it."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import views
from jobbus.redaction import MASK
from jobbus.store import WorkerStore, run_sync
from jobbus.store.views import Count
from tests.storehelpers import claim, expire_lease, registration


@pytest.fixture
def conn(dsn: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as connection:
        yield connection


def _group(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> tuple[str, str | None, str | None]:
    row = conn.execute("SELECT status, last_error, error_group FROM jobbus.job WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def _failing(app: jobbus.App) -> list[str]:
    """A handler that fails each attempt, with "user N not found ..." until the list says otherwise."""
    raising = ["lookup"]

    @app.job("report.render")
    async def render(job: jobbus.JobExecution) -> None:
        if raising[0] == "lookup":
            raise LookupError(f"user {job.configuration['user']} not found in 'accounts-{job.attempt}'")
        raise ConnectionError("renderer busy for 30 s")

    return raising


async def test_a_failure_the_worker_writes_stores_its_group(app: jobbus.App, conn: Any) -> None:
    _failing(app)
    job_id = await app.schedule("report.render", {"user": 123}, max_attempts=2)
    assert await app.drain() == {"retried": 1, "failed": 1}
    assert _group(conn, job_id) == (
        "failed",
        "LookupError: user 123 not found in 'accounts-2'",
        "LookupError: user <n> not found in <str>",
    )


async def test_a_failure_group_holds_no_secret_of_the_error_it_folds(app: jobbus.App, conn: Any) -> None:
    @app.job("login")
    async def login(job: jobbus.JobExecution) -> None:
        raise PermissionError(f"user {job.configuration['user']} refused: password=SVgroup Authorization: Bearer SVb")

    job_id = await app.schedule("login", {"user": 7}, max_attempts=1)
    assert await app.drain() == {"failed": 1}
    assert _group(conn, job_id) == (
        "failed",
        f"PermissionError: user 7 refused: password={MASK} Authorization: Bearer {MASK}",
        f"PermissionError: user <n> refused: password={MASK} Authorization: Bearer {MASK}",
    )


async def test_a_job_the_worker_completes_or_retries_has_no_group(app: jobbus.App, conn: Any) -> None:
    @app.job("flaky")
    async def flaky(job: jobbus.JobExecution) -> None:
        if job.attempt == 1:
            raise RuntimeError("first attempt 1 fails")

    job_id = await app.schedule("flaky", max_attempts=2)
    assert await app.drain() == {"retried": 1, "completed": 1}
    assert _group(conn, job_id) == ("completed", "RuntimeError: first attempt 1 fails", None)


def test_a_job_whose_lease_expired_on_its_last_attempt_stores_its_group(sync_app: jobbus.App, conn: Any) -> None:
    job_id = sync_app.sync.schedule("t", max_attempts=2)
    for attempt in (1, 2):
        claim(sync_app, conn, worker_id="w7")
        expire_lease(conn, job_id)
        run_sync(conn, sync_app.store.recover_expired_leases())
        status, _, group = _group(conn, job_id)
        assert (status, group is None) == (("queued", True) if attempt == 1 else ("failed", False))
    assert _group(conn, job_id) == (
        "failed",
        "lease expired: worker w7 stopped heartbeating (died or lost its connection) during attempt 2 of 2",
        "lease expired: worker w7 stopped heartbeating (died or lost its connection) during attempt <n> of <n>",
    )


def _workers(app: jobbus.App) -> WorkerStore:
    return WorkerStore(app.settings.schema, app.store.channel, app.store.control_channel)


def _silent_worker_holding_its_last_attempt(app: jobbus.App, conn: Any, workers: WorkerStore, name: str) -> uuid.UUID:
    """A registered worker, silent for an hour, holding a job on its only attempt since a minute ago."""
    assert run_sync(conn, workers.register_worker(registration(name, uuid.uuid4()))) is not None
    job_id = app.sync.schedule("t", max_attempts=1)
    claim(app, conn, worker_id=name)
    conn.execute("UPDATE jobbus.job SET started_at = now() - interval '1 minute' WHERE id = %s", (job_id,))
    conn.execute("UPDATE jobbus.worker SET last_seen_at = now() - interval '1 hour' WHERE id = %s", (name,))
    return job_id


def test_a_job_of_a_worker_declared_dead_on_its_last_attempt_stores_its_group(sync_app: jobbus.App, conn: Any) -> None:
    workers = _workers(sync_app)
    job_id = _silent_worker_holding_its_last_attempt(sync_app, conn, workers, "w-gone")
    run_sync(conn, workers.declare_dead_workers())
    status, error, group = _group(conn, job_id)
    assert status == "failed"
    assert error is not None and error.startswith("worker w-gone died during attempt 1 of 1 (declared dead after ")
    assert group == "worker w-gone died during attempt <n> of <n> (declared dead after <n> s of silence)"


def test_a_job_left_behind_under_a_worker_id_taken_over_stores_its_group(sync_app: jobbus.App, conn: Any) -> None:
    workers = _workers(sync_app)
    job_id = _silent_worker_holding_its_last_attempt(sync_app, conn, workers, "w-pod")
    successor = uuid.uuid4()
    assert run_sync(conn, workers.register_worker(registration("w-pod", successor))) is not None
    run_sync(conn, workers.reclaim_predecessor_jobs("w-pod", successor))
    assert _group(conn, job_id) == (
        "failed",
        "worker w-pod died during attempt 1 of 1 (reclaimed when a new process took over its id)",
        "worker w-pod died during attempt <n> of <n> (reclaimed when a new process took over its id)",
    )


async def test_a_manual_retry_clears_the_group_and_the_next_failure_writes_its_own(app: jobbus.App, conn: Any) -> None:
    raising = _failing(app)
    job_id = await app.schedule("report.render", {"user": 7}, max_attempts=1)
    await app.drain()
    assert _group(conn, job_id)[2] == "LookupError: user <n> not found in <str>"
    await app.retry(job_id)
    assert _group(conn, job_id) == ("queued", "LookupError: user 7 not found in 'accounts-1'", None)
    raising[0] = "timeout"
    await app.drain()
    assert _group(conn, job_id) == (
        "failed",
        "ConnectionError: renderer busy for 30 s",
        "ConnectionError: renderer busy for <n> s",
    )


async def test_failed_rows_without_a_group_group_with_rows_that_have_one(app: jobbus.App, conn: Any) -> None:
    _failing(app)
    stored = await app.schedule_many("report.render", [{"user": n} for n in (1, 2)], max_attempts=1)
    await app.drain()
    older = await app.schedule_many("report.render", [{"user": n} for n in (3, 4, 5)], max_attempts=1)
    conn.execute(  # failed as a release before failure groups left them: no group stored
        "UPDATE jobbus.job SET status = 'failed', attempts = 1, finished_at = now(), "
        "last_error = format('LookupError: user %%s not found in ''accounts-1''', configuration_data ->> 'user') "
        "WHERE id = ANY(%s)",
        (older,),
    )
    assert [_group(conn, i)[2] is None for i in [*stored, *older]] == [False, False, True, True, True]
    (group,) = await views.failure_groups(app)
    assert (group.pattern, group.count, group.error_class) == (
        "LookupError: user <n> not found in <str>",
        Count(5),
        "LookupError",
    )
    assert await views.retry_failure_group(app, group.pattern) == (5, 0)
    assert {job.id for job in await app.list_jobs(status="queued")} == {*stored, *older}

"""`App.wait`: the terminal job, woken by notification through one listening connection per App."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import psycopg
import pytest

import jobbus
from jobbus import JobStatus
from jobbus.store.statements import channel_name
from tests.processes import workers
from tests.storehelpers import claim, write


async def test_wait_returns_the_completed_job_with_its_result(app: jobbus.App, dsn: str) -> None:
    job_id = await app.schedule("t", {"n": 1})
    waiter = asyncio.create_task(app.wait(job_id, timeout=30))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    with psycopg.connect(dsn, autocommit=True) as conn:
        (claimed,) = claim(app, conn)
        assert write(app, conn, claimed, JobStatus.COMPLETED, result_json='{"ok": true}')
    job = await waiter
    assert (job.id, job.status, job.result) == (job_id, JobStatus.COMPLETED, {"ok": True})


async def test_a_waiter_is_woken_by_the_notification_long_before_a_poll_would_come(dsn: str) -> None:
    """SPEC 13: `wait` is woken by the finishing transaction's notification; with a 60 s poll interval a
    poll could not have answered within seconds."""
    app = jobbus.App(dsn=dsn, poll_interval_seconds=60)
    async with app:
        job_id = await app.schedule("t")
        waiter = asyncio.create_task(app.wait(job_id, timeout=120))
        await asyncio.sleep(1.0)  # the waiter read the job and listens
        assert not waiter.done()
        with psycopg.connect(dsn, autocommit=True) as conn:
            (claimed,) = claim(app, conn)
            assert write(app, conn, claimed, JobStatus.COMPLETED, result_json="7")
        job = await asyncio.wait_for(waiter, timeout=20)  # a third of the poll interval
    assert (job.status, job.result) == (JobStatus.COMPLETED, 7)


async def test_wait_returns_at_once_for_a_finished_job_and_refuses_unknown_ids(app: jobbus.App) -> None:
    job_id = await app.schedule("t")
    assert await app.cancel(job_id) is JobStatus.CANCELLED
    assert (await app.wait(job_id)).status is JobStatus.CANCELLED
    with pytest.raises(jobbus.InvalidStateError):
        await app.wait(uuid.uuid4(), timeout=1)


async def test_wait_raises_the_builtin_timeout_error(app: jobbus.App) -> None:
    job_id = await app.schedule("t")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="still queued"):
        await app.wait(job_id, timeout=0.3)
    assert time.monotonic() - started < 5


async def test_a_thousand_waiters_share_one_listening_connection(app: jobbus.App, dsn: str) -> None:
    """1,000 coroutines wait on one App; a worker process then runs the jobs. The App holds its pool and one
    listening connection, and every waiter wakes with its job's result."""
    ids = await app.schedule_many("wf.noop", [{"value": i} for i in range(1000)])
    waiters = [asyncio.create_task(app.wait(job_id, timeout=120)) for job_id in ids]
    await asyncio.sleep(1.0)  # every waiter has read its job and waits
    assert not any(w.done() for w in waiters)
    with psycopg.connect(dsn, autocommit=True) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()  # type: ignore[misc]
    assert count <= app.settings.pool_max_size + 1  # the pool, and one connection that LISTENs
    with workers(dsn, 1, "--app", "tests.workflow_apps:app", "--concurrency", "50", "--log-level", "WARNING"):
        done = await asyncio.wait_for(asyncio.gather(*waiters), 90)
    assert [job.result for job in done] == list(range(1000))
    assert {job.status for job in done} == {JobStatus.COMPLETED}


def test_sync_wait(sync_app: jobbus.App, dsn: str) -> None:
    job_id = sync_app.sync.schedule("t")

    def finish() -> None:
        time.sleep(0.3)
        with psycopg.connect(dsn, autocommit=True) as conn:
            (claimed,) = claim(sync_app, conn)
            write(sync_app, conn, claimed, JobStatus.FAILED, error="boom")

    thread = threading.Thread(target=finish)
    thread.start()
    job = sync_app.sync.wait(job_id, timeout=30)
    thread.join()
    assert (job.status, job.last_error) == (JobStatus.FAILED, "boom")
    with pytest.raises(TimeoutError):
        sync_app.sync.wait(sync_app.sync.schedule("t"), timeout=0.2)


async def test_wait_polls_without_a_listening_connection(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, transaction_pooling=True, poll_interval_seconds=0.1)
    async with app:
        job_id = await app.schedule("t")
        waiter = asyncio.create_task(app.wait(job_id, timeout=30))
        await asyncio.sleep(0.2)
        await app.cancel(job_id)
        assert (await waiter).status is JobStatus.CANCELLED


@pytest.mark.parametrize("schema", ["jobbus", "tenant_" + "x" * 60])
async def test_the_database_names_the_done_channel_as_the_app_does(app: jobbus.App, dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        (name,) = conn.execute("SELECT jobbus.channel_name(%s, '_done')", (schema,)).fetchone()  # type: ignore[misc]
    assert name == channel_name(schema, "_done")


async def test_a_waiter_outlives_the_loss_of_the_listening_connection(app: jobbus.App, dsn: str) -> None:
    job_id = await app.schedule("t")
    waiter = asyncio.create_task(app.wait(job_id, timeout=60))
    await asyncio.sleep(0.3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        killed = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN%%'"
        ).fetchall()
        assert killed == [(True,)]
        await asyncio.sleep(0.5)  # the listener reconnects (and wakes its waiters to read again)
        (claimed,) = claim(app, conn)
        assert write(app, conn, claimed, JobStatus.COMPLETED)
    assert (await waiter).status is JobStatus.COMPLETED


async def test_a_deduplicated_job_adds_no_follow_up(app: jobbus.App, dsn: str) -> None:
    first = await app.schedule("t", unique_key="k", then=jobbus.JobRequest("next", {"from": "first"}))
    assert await app.schedule("t", unique_key="k", then=jobbus.JobRequest("next", {"from": "second"})) == first
    with psycopg.connect(dsn, autocommit=True) as conn:
        (claimed,) = claim(app, conn)
        assert write(app, conn, claimed, JobStatus.COMPLETED)
    assert [job.configuration_data for job in await app.list_jobs(type="next")] == [{"from": "first"}]


async def test_a_job_finished_and_deleted_before_the_waiter_read_it_is_named_so(app: jobbus.App, dsn: str) -> None:
    """Completed and deleted in one transaction (retention at its shortest): the waiter says that it
    finished and was deleted, not that it never existed."""
    job_id = await app.schedule("t")
    waiter = asyncio.create_task(app.wait(job_id, timeout=60))
    await asyncio.sleep(0.5)
    assert not waiter.done()
    with psycopg.connect(dsn) as conn:
        (claimed,) = claim(app, conn)
        assert write(app, conn, claimed, JobStatus.COMPLETED)
        conn.execute("DELETE FROM jobbus.job WHERE id = %s", (job_id,))
        conn.commit()
    with pytest.raises(jobbus.InvalidStateError, match="finished and was deleted"):
        await waiter
    with pytest.raises(jobbus.InvalidStateError, match="finished and was deleted"):
        await app.wait(job_id, timeout=5)
    with pytest.raises(jobbus.InvalidStateError, match="does not exist"):
        await app.wait(uuid.uuid4(), timeout=5)


def test_the_sync_waiter_names_a_job_finished_and_deleted_too(sync_app: jobbus.App, dsn: str) -> None:
    job_id = sync_app.sync.schedule("t")
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            sync_app.sync.wait(job_id, timeout=60)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.5)
    with psycopg.connect(dsn) as conn:
        (claimed,) = claim(sync_app, conn)
        assert write(sync_app, conn, claimed, JobStatus.COMPLETED)
        conn.execute("DELETE FROM jobbus.job WHERE id = %s", (job_id,))
        conn.commit()
    thread.join(60)
    assert len(raised) == 1 and isinstance(raised[0], jobbus.InvalidStateError)
    assert "finished and was deleted" in str(raised[0])


@pytest.mark.parametrize("finished", [1, 199, 200, 201, 450])
@pytest.mark.parametrize("with_follow_up", [False, True], ids=["plain", "a-follow-up-exists"])
async def test_one_statement_notifies_every_id_it_finished_at_most_200_a_notification(
    app: jobbus.App, dsn: str, finished: int, with_follow_up: bool
) -> None:
    """The `_done` payloads of one statement that finishes `finished` jobs: together every id once, each
    within 200 ids (PostgreSQL refuses a payload of 8,000 bytes or more), with and without follow-ups
    (the trigger builds the ids two ways)."""
    ids = await app.schedule_many("t", [{}] * finished)
    if with_follow_up:
        await app.schedule("t", then=jobbus.JobRequest("t"))
    with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn, autocommit=True) as conn:
        listener.execute(f'LISTEN "{channel_name("jobbus", "_done")}"')
        conn.execute(
            "UPDATE jobbus.job SET status = 'cancelled', finished_at = now(), last_error = 'cancelled'"
            " WHERE id = ANY(%s)",
            (ids,),
        )
        payloads = [n.payload for n in listener.notifies(timeout=2.0)]
    notified = [uuid.UUID(text) for payload in payloads for text in payload.split(",")]
    assert sorted(notified) == sorted(ids)
    assert len(payloads) == -(-finished // 200)
    assert all(len(payload.encode()) < 8000 for payload in payloads)

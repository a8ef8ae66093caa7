"""`App.delete` and `App.run_now` (SPEC 17): what each accepts, what each refuses, and the workflow bookkeeping
a deleted job leaves consistent (its group's callback, a parent waiting for it)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import InvalidStateError, JobRequest, JobStatus
from jobbus.requests import spec_json
from jobbus.store import Outcome, run_sync
from tests.processes import query
from tests.storehelpers import claim, write


def _exists(dsn: str, job_id: uuid.UUID) -> bool:
    return bool(query(dsn, "SELECT 1 FROM jobbus.job WHERE id = %s", (job_id,)))


async def test_delete_removes_queued_and_terminal_jobs_and_refuses_running_and_unknown(
    app: jobbus.App, dsn: str
) -> None:
    done_ids = [await app.schedule("t", {"n": n}) for n in range(2, 5)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        completed, failed, cancelled = sorted(claim(app, conn, limit=3), key=lambda j: done_ids.index(j.id))
        write(app, conn, completed, JobStatus.COMPLETED)
        write(app, conn, failed, JobStatus.FAILED, error="no")
        await app.cancel(cancelled.id)  # asked while running ...
        write(app, conn, cancelled, JobStatus.CANCELLED)  # ... and acknowledged
        running_id = await app.schedule("t", {"n": 5})
        (running,) = claim(app, conn)
    assert running.id == running_id
    queued = await app.schedule("t", {"n": 1})
    statuses = dict(query(dsn, "SELECT id, status FROM jobbus.job"))
    assert sorted(statuses.values()) == ["cancelled", "completed", "failed", "queued", "running"]
    for job_id in (queued, *done_ids):
        await app.delete(job_id)
        assert not _exists(dsn, job_id)
    with pytest.raises(InvalidStateError, match="running"):
        await app.delete(running_id)
    assert (await app.find(running_id)).status is JobStatus.RUNNING  # type: ignore[union-attr]
    with pytest.raises(InvalidStateError, match="does not exist"):
        await app.delete(queued)
    with pytest.raises(InvalidStateError, match="does not exist"):
        await app.delete(uuid.uuid4())


async def test_delete_takes_the_jobs_steps_and_workflow_rows_with_it(app: jobbus.App, dsn: str) -> None:
    job_id = await app.schedule("t", then=JobRequest("after"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        (job,) = claim(app, conn)
        run_sync(conn, app.store.record_step(job.id, job.lease_token, "charge", '{"ok": true}'))
        write(app, conn, job, JobStatus.FAILED, error="no")
    await app.delete(job_id)
    for table in ("job_step", "job_follow_up"):
        assert query(dsn, f"SELECT count(*) FROM jobbus.{table} WHERE job_id = %s", (job_id,)) == [(0,)], table
    assert await app.list_jobs(type="after") == []


async def test_a_deleted_queued_member_counts_as_done_for_its_groups_callback(app: jobbus.App, dsn: str) -> None:
    """The callback fires once, when the last member still in the group ends, whether the last to go is
    deleted or finished; a member deleted after it finished changes nothing."""
    _, (first, second, third) = await app.schedule_group(
        [JobRequest("t", {"i": i}) for i in range(3)], then=JobRequest("merge", {})
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        (running,) = claim(app, conn)
        assert running.id == first
        write(app, conn, running, JobStatus.COMPLETED)
        await app.delete(first)  # finished: already counted
        await app.delete(second)  # queued: counts as ending now
        assert await app.list_jobs(type="merge") == []
        await app.delete(third)  # the last: the callback is due
    (callback,) = await app.list_jobs(type="merge")
    assert callback.status is JobStatus.QUEUED
    assert query(dsn, "SELECT count(*) FROM jobbus.job WHERE type = 't'") == [(0,)]


async def test_a_group_whose_only_members_are_deleted_still_gets_its_callback_once(app: jobbus.App) -> None:
    _, ids = await app.schedule_group([JobRequest("t", {"i": i}) for i in range(4)], then=JobRequest("merge", {}))
    await asyncio.gather(*(app.delete(job_id) for job_id in ids))
    assert len(await app.list_jobs(type="merge")) == 1


async def test_a_deleted_queued_job_does_not_schedule_its_follow_up(app: jobbus.App) -> None:
    job_id = await app.schedule("t", then=JobRequest("after"))
    await app.delete(job_id)
    assert await app.list_jobs(type="after") == []


def test_a_parent_waiting_for_a_deleted_child_wakes(sync_app: jobbus.App, dsn: str) -> None:
    app = sync_app
    app.sync.schedule("parent")
    with psycopg.connect(dsn, autocommit=True) as conn:
        (parent,) = claim(app, conn, types=("parent",))
        kept, deleted = (
            run_sync(
                conn,
                app.store.spawn_child(
                    parent.id, parent.lease_token, f"spawn:{n}", spec_json(app.build_job_spec(JobRequest("child")))
                ),
            )[1]
            for n in (1, 2)
        )
        assert kept and deleted
        assert run_sync(conn, app.store.wait_for_children(parent.id, parent.lease_token)) == "parked"
        (child,) = claim(app, conn, types=("child",))
        assert child.id == kept
        run_sync(conn, app.store.record_outcomes([Outcome(child.id, child.lease_token, JobStatus.COMPLETED)]))
        assert query(dsn, "SELECT available_at > now() FROM jobbus.job WHERE id = %s", (parent.id,)) == [(True,)]
        app.sync.delete(deleted)
        assert query(dsn, "SELECT status, available_at <= now() FROM jobbus.job WHERE id = %s", (parent.id,)) == [
            ("queued", True)
        ]
        children = (
            "SELECT c.child_id FROM jobbus.job_child AS c JOIN jobbus.job AS j ON j.id = c.child_id"
            " WHERE c.parent_id = %s"
        )
        assert query(dsn, children, (parent.id,)) == [(kept,)]


def test_delete_waits_for_a_claim_in_flight_and_never_deletes_a_running_job(sync_app: jobbus.App, dsn: str) -> None:
    """A delete and a claim of the same job at the same instant, 30 rounds: either the job is gone and no
    worker holds it, or it is running and the delete was refused."""
    app = sync_app
    for _ in range(30):
        job_id = app.sync.schedule("t")
        barrier = threading.Barrier(2)
        outcome: list[str] = []

        def delete(barrier: threading.Barrier = barrier, outcome: list[str] = outcome, job_id: Any = job_id) -> None:
            barrier.wait()
            try:
                app.sync.delete(job_id)
                outcome.append("deleted")
            except InvalidStateError:
                outcome.append("refused")

        thread = threading.Thread(target=delete)
        thread.start()
        with psycopg.connect(dsn, autocommit=True) as conn:
            barrier.wait()
            claimed = claim(app, conn)
            thread.join()
            if outcome == ["deleted"]:
                assert not _exists(dsn, job_id)
                if claimed:  # claimed and deleted: impossible unless the delete lost the row lock
                    pytest.fail("a claimed job was deleted")
            else:
                assert outcome == ["refused"] and [j.id for j in claimed] == [job_id]
                write(app, conn, claimed[0], JobStatus.COMPLETED)
                app.sync.delete(job_id)


async def test_run_now_makes_a_queued_job_available_and_refuses_the_rest(app: jobbus.App, dsn: str) -> None:
    later = await app.schedule("t", available_at=timedelta(hours=2))
    await app.run_now(later)
    assert query(dsn, "SELECT available_at <= now() FROM jobbus.job WHERE id = %s", (later,)) == [(True,)]
    await app.run_now(later)  # already available: still fine
    with psycopg.connect(dsn, autocommit=True) as conn:
        (job,) = claim(app, conn)
        with pytest.raises(InvalidStateError, match="running; only queued"):
            await app.run_now(job.id)
        write(app, conn, job, JobStatus.COMPLETED)
    with pytest.raises(InvalidStateError, match="completed; only queued"):
        await app.run_now(later)
    with pytest.raises(InvalidStateError, match="does not exist"):
        await app.run_now(uuid.uuid4())


def test_sync_twins(sync_app: jobbus.App, dsn: str) -> None:
    later = sync_app.sync.schedule("t", available_at=timedelta(hours=2))
    sync_app.sync.run_now(later)
    assert query(dsn, "SELECT available_at <= now() FROM jobbus.job WHERE id = %s", (later,)) == [(True,)]
    sync_app.sync.delete(later)
    assert not _exists(dsn, later)
    with pytest.raises(InvalidStateError):
        sync_app.sync.run_now(later)
    with pytest.raises(InvalidStateError):
        sync_app.sync.delete(later)


def test_delete_joins_the_callers_transaction(sync_app: jobbus.App, dsn: str) -> None:
    """With `connection=`-less calls the App's pool commits; the store's chain in a caller's open
    transaction is undone with it (a savepoint, not a commit of its own)."""
    job_id = sync_app.sync.schedule("t")
    with psycopg.connect(dsn) as conn:
        assert run_sync(conn, sync_app.store.delete_job(job_id)) is JobStatus.QUEUED
        assert not query(dsn, "SELECT 1 FROM jobbus.job WHERE id = %s AND status = 'cancelled'", (job_id,))
        conn.rollback()
    assert query(dsn, "SELECT status FROM jobbus.job WHERE id = %s", (job_id,)) == [("queued",)]

"""Durable waits: a wait parks the job (slot and lease given back, the attempt not counted); the handler
runs again from the top when the job is due, and completed steps, sleeps and waits return at once."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import JobStatus
from jobbus.store import MaintenanceStore, run_async
from jobbus.worker.runtime import Worker
from tests.processes import eventually, query, wait_until, workers
from tests.workflow_apps import prepare


@contextlib.asynccontextmanager
async def running(app: jobbus.App, concurrency: int = 4) -> AsyncIterator[Worker]:
    worker = Worker(app, concurrency=concurrency, install_signal_handlers=False)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)


async def _parked(app: jobbus.App, job_id: Any) -> jobbus.Job | None:
    job = await app.find(job_id)
    if job and job.status is JobStatus.QUEUED and job.history and job.history[-1]["outcome"] == "waiting":
        return job
    return None


async def test_sleep_parks_the_job_and_resumes_after_its_delay_without_counting_an_attempt(app: jobbus.App) -> None:
    runs: list[int] = []
    effects: list[str] = []

    @app.job("cool")
    async def cool(job: jobbus.JobExecution) -> str:
        runs.append(job.attempt)
        await job.step("charge", lambda: effects.append("charge"))
        await job.sleep("cool-off", timedelta(seconds=1))
        await job.sleep("zero", 0)
        return "done"

    job_id = await app.schedule("cool")
    async with running(app):
        parked = await eventually(lambda: _parked(app, job_id), what="the job parked")
        assert parked.attempts == 0 and parked.lease_token is None
        job = await app.wait(job_id, timeout=20)
    assert (job.status, job.result, job.attempts) == (JobStatus.COMPLETED, "done", 1)
    assert runs == [1, 1] and effects == ["charge"]
    assert set(job.steps) == {"charge", "sleep:cool-off", "sleep:zero"}
    assert [entry["outcome"] for entry in job.history] == ["waiting", "completed"]


@pytest.mark.parametrize("emitted_first", [False, True])
async def test_wait_for_event_gets_the_first_payload_emitted_before_or_after(
    app: jobbus.App, emitted_first: bool
) -> None:
    @app.job("pay")
    async def pay(job: jobbus.JobExecution) -> Any:
        return await job.wait_for_event(f"order:{job.configuration['order']}:paid", timeout=60)

    if emitted_first:
        assert await app.emit_event("order:7:paid", {"amount": 10})
    job_id = await app.schedule("pay", {"order": 7})
    async with running(app):
        if not emitted_first:
            await eventually(lambda: _parked(app, job_id), what="the job parked")
            assert await app.emit_event("order:7:paid", {"amount": 10})
        job = await app.wait(job_id, timeout=20)
    assert not await app.emit_event("order:7:paid", {"amount": 99})  # the first emit is kept
    assert (job.status, job.result, job.attempts) == (JobStatus.COMPLETED, {"amount": 10}, 1)
    assert job.steps["event:order:7:paid"] == {"payload": {"amount": 10}}
    assert [entry["outcome"] for entry in job.history] == (["completed"] if emitted_first else ["waiting", "completed"])


async def test_wait_for_event_times_out_inside_the_handler(app: jobbus.App) -> None:
    @app.job("late")
    async def late(job: jobbus.JobExecution) -> str:
        try:
            await job.wait_for_event("never", timeout=timedelta(seconds=0.5))
        except TimeoutError:
            return "gave up"
        return "paid"

    job_id = await app.schedule("late")
    async with running(app):
        job = await app.wait(job_id, timeout=20)
    assert (job.status, job.result, job.attempts) == (JobStatus.COMPLETED, "gave up", 1)
    assert job.steps["event:never"] == {"timed_out": True}
    assert await app.emit_event("never")  # an emit after the timeout changes nothing
    assert (await app.find(job_id)).result == "gave up"  # type: ignore[union-attr]


async def test_spawned_children_are_scheduled_once_and_their_parent_waits_for_all(app: jobbus.App) -> None:
    runs: list[str] = []

    @app.job("parent")
    async def parent(job: jobbus.JobExecution) -> list[Any]:
        runs.append("parent")
        ids = [await job.spawn("child", {"n": n}) for n in range(3)]
        children = await job.wait_for_children()
        assert [c.id for c in children] == sorted(ids)
        return sorted([c.status.value, c.result] for c in children)

    @app.job("child", max_attempts=1)
    async def child(job: jobbus.JobExecution) -> int:
        await asyncio.sleep(0.3)
        if job.configuration["n"] == 2:
            raise RuntimeError("child 2 fails")
        return int(job.configuration["n"])

    job_id = await app.schedule("parent")
    async with running(app):
        job = await app.wait(job_id, timeout=30)
    assert job.status is JobStatus.COMPLETED and job.attempts == 1
    assert job.result == [["completed", 0], ["completed", 1], ["failed", None]]
    children = await app.list_jobs(type="child")
    assert len(children) == 3 and {c.parent_id for c in children} == {job_id}
    assert runs == ["parent", "parent"]


async def test_sync_handlers_wait_too(app: jobbus.App) -> None:
    @app.job("sync-wait")
    def sync_wait(job: jobbus.SyncJobExecution) -> Any:
        job.sleep("nap", 0.2)
        child = job.spawn("sync-child", {"n": 5})
        (done,) = job.wait_for_children()
        assert done.id == child and done.parent_id == job.id
        return [job.wait_for_event("go"), done.result]

    @app.job("sync-child")
    def sync_child(job: jobbus.SyncJobExecution) -> int:
        return int(job.configuration["n"]) * 2

    job_id = await app.schedule("sync-wait")
    async with running(app):
        await asyncio.sleep(0.5)
        await app.emit_event("go", [1, 2])
        job = await app.wait(job_id, timeout=20)
    assert (job.status, job.result, job.attempts) == (JobStatus.COMPLETED, [[1, 2], 10], 1)


def test_events_emitted_before_during_and_after_the_waits_of_two_worker_processes(
    dsn: str, sync_app: jobbus.App
) -> None:
    """300 jobs wait for their own event; a third of the events are emitted before the jobs exist, the rest
    while two worker processes claim, wait and park them. Every job gets its payload: no wake-up is lost."""
    app = sync_app
    count = 300
    for n in range(0, count, 3):
        assert app.sync.emit_event(f"pay:{n}", {"n": n})
    ids = app.sync.schedule_many("wf.pay", [{"n": n} for n in range(count)])
    with workers(dsn, 2, "--app", "tests.workflow_apps:app", "--concurrency", "20", "--log-level", "WARNING") as procs:
        for n in range(count):
            if n % 3:
                app.sync.emit_event(f"pay:{n}", {"n": n})
            if n % 50 == 0:
                time.sleep(0.05)
        done = [app.sync.wait(job_id, timeout=120) for job_id in ids]
        assert all(proc.poll() is None for proc in procs)
    assert [job.result for job in done] == [{"n": n} for n in range(count)]
    assert {job.status for job in done} == {JobStatus.COMPLETED}
    assert {job.attempts for job in done} == {1}


async def test_event_keys_and_payloads_are_checked(app: jobbus.App) -> None:
    with pytest.raises(ValueError, match="event key"):
        await app.emit_event("k" * 201)
    with pytest.raises(jobbus.InvalidJobError, match="payload"):
        await app.emit_event("k", {"bad": float("nan")})
    assert await app.emit_event("k") and not await app.emit_event("k", 1)


def test_a_sleeping_workflow_outlives_its_worker_and_its_children_run_on_two_processes(
    dsn: str, sync_app: jobbus.App
) -> None:
    """The worker that parked the job in its sleep is SIGKILLed; two fresh worker processes resume it, run
    its 20 children and finish it: the step ran once, each child was spawned once, one attempt counted."""
    prepare(dsn)
    job_id = sync_app.sync.schedule("wf.fanout", {"sleep": 2, "children": 20})
    args = ("--app", "tests.workflow_apps:app", "--log-level", "WARNING")
    with workers(dsn, 1, *args) as (first,):
        wait_until(lambda: _effect_names(dsn, job_id) == ["charge"], what="the charge step")
        wait_until(lambda: query(dsn, "SELECT status FROM jobbus.job WHERE id = %s", (job_id,)) == [("queued",)])
        first.send_signal(signal.SIGKILL)
        first.wait()
    with workers(dsn, 2, *args, "--concurrency", "5"):
        job = sync_app.sync.wait(job_id, timeout=60)
    assert (job.status, job.result, job.attempts) == (JobStatus.COMPLETED, sum(range(20)), 1)
    assert _effect_names(dsn, job_id) == ["charge", "finish"]
    assert query(dsn, "SELECT count(*) FROM jobbus.job WHERE type = 'wf.noop'") == [(20,)]
    # Parked in its sleep, then in its wait unless the other process ran all 20 children before it got there.
    assert [entry["outcome"] for entry in job.history] in (
        ["waiting", "waiting", "completed"],
        ["waiting", "completed"],
    )


def _effect_names(dsn: str, job_id: Any) -> list[str]:
    return [name for (name,) in query(dsn, "SELECT name FROM public.effects WHERE job_id = %s ORDER BY at", (job_id,))]


def test_a_parent_parking_as_its_last_child_ends_is_never_left_asleep(sync_app: jobbus.App, dsn: str) -> None:
    """50 rounds: a parent's wait_for_children and its only child's outcome sent at the same instant by two
    connections. Whichever goes first, the parent either goes on at once or is parked and woken."""
    from jobbus.requests import JobRequest, spec_json
    from jobbus.store import Outcome, run_sync
    from tests.storehelpers import claim

    app = sync_app
    for _ in range(50):
        app.sync.schedule("parent")
        with psycopg.connect(dsn, autocommit=True) as a, psycopg.connect(dsn, autocommit=True) as b:
            (parent,) = claim(app, a, types=("parent",))
            spec = spec_json(app.build_job_spec(JobRequest("child")))
            assert run_sync(a, app.store.spawn_child(parent.id, parent.lease_token, "spawn:1", spec))[0] == "ready"
            (child,) = claim(app, a, types=("child",))
            barrier = threading.Barrier(2)
            states: list[str] = []

            def park(barrier: threading.Barrier = barrier, parent: Any = parent, states: list[str] = states) -> None:
                barrier.wait()
                states.append(run_sync(b, app.store.wait_for_children(parent.id, parent.lease_token)))

            thread = threading.Thread(target=park)
            thread.start()
            barrier.wait()
            run_sync(a, app.store.record_outcomes([Outcome(child.id, child.lease_token, JobStatus.COMPLETED)]))
            thread.join()
            (status, due) = query(
                dsn, "SELECT status, available_at <= now() FROM jobbus.job WHERE id = %s", (parent.id,)
            )[0]
            if states == ["parked"]:
                assert (status, due) == ("queued", True), "the parent was left asleep"
            else:
                assert states == ["ready"] and status == "running"
                run_sync(a, app.store.record_outcomes([Outcome(parent.id, parent.lease_token, JobStatus.COMPLETED)]))
            a.execute("DELETE FROM jobbus.job")


async def test_wait_for_children_answers_the_same_after_retention_deleted_the_children(
    app: jobbus.App, dsn: str
) -> None:
    """Spawn two children, wait for them, then sleep durably while retention deletes the children: every
    later run of the handler gets the same children (ids, statuses, results) back; a second wait of the
    run keeps its own answer."""
    answers: list[list[tuple[Any, str, Any]]] = []

    @app.job("kid", max_attempts=1)
    async def kid(job: jobbus.JobExecution) -> int:
        if job.configuration["n"] == 2:
            raise jobbus.NonRetryableError("the second child fails")
        return int(job.configuration["n"]) * 10

    @app.job("parent")
    async def parent(job: jobbus.JobExecution) -> list[Any]:
        first = [await job.spawn("kid", {"n": 1}), await job.spawn("kid", {"n": 2})]
        children = await job.wait_for_children()
        answer = [(child.id, child.status.value, child.result) for child in children]
        answers.append(answer)
        assert sorted(first) == [child.id for child in children]
        await job.sleep("past-retention", 2)
        await job.spawn("kid", {"n": 3})
        everyone = await job.wait_for_children()
        shown = [[str(child_id), status, result] for child_id, status, result in answer]
        return [shown, [[str(child.id), child.status.value, child.result] for child in everyone]]

    job_id = await app.schedule("parent")
    async with running(app):

        async def asleep() -> bool:
            job = await app.find(job_id)
            return bool(job and job.history and job.history[-1].get("waiting_for") == "sleep:past-retention")

        await eventually(asleep, what="the parent asleep after its children")
        with psycopg.connect(dsn, autocommit=True) as conn:
            deleted = conn.execute("DELETE FROM jobbus.job WHERE type = 'kid'").rowcount
        assert deleted == 2
        job = await app.wait(job_id, timeout=30)
    assert job.status is JobStatus.COMPLETED, job.last_error
    first, everyone = job.result
    assert len(answers) >= 2 and all(answer == answers[0] for answer in answers)
    assert sorted((status, result) for _, status, result in answers[0]) == [("completed", 10), ("failed", None)]
    assert [[str(i), s, r] for i, s, r in answers[0]] == first
    # The second wait ran after the deletion: only the third child is left to report.
    assert [(status, result) for _, status, result in everyone] == [("completed", 30)]
    kept = await app.find(job_id)
    assert kept is not None and kept.steps.keys() == job.steps.keys()  # the answers are not steps


@pytest.mark.parametrize("deleted_by", ["retention", "prune"])
async def test_children_finished_long_before_their_parent_runs_again_are_kept_for_its_wait(
    app: jobbus.App, dsn: str, deleted_by: str
) -> None:
    """The parent's queue is not served while its children finish, and retention (or `prune`) runs past
    their age before the parent's wait has answered: the finished children are kept while their parent
    is not finished, so `wait_for_children()` answers with every child; once the parent has finished,
    they go."""

    @app.job("kid", queue="kids", max_attempts=1)
    async def kid(job: jobbus.JobExecution) -> int:
        if job.configuration["n"] == 2:
            raise jobbus.NonRetryableError("the second child fails")
        return int(job.configuration["n"])

    @app.job("parent", queue="parents")
    async def parent(job: jobbus.JobExecution) -> list[Any]:
        await job.spawn("kid", {"n": 1})
        await job.spawn("kid", {"n": 2})
        children = await job.wait_for_children()
        return sorted([child.status.value, child.result] for child in children)

    async def delete_finished() -> int:
        if deleted_by == "prune":
            return await app.prune(timedelta(0), ["completed", "failed"])
        maintenance = MaintenanceStore(app.settings.schema)
        async with app.pool.connection() as conn:
            return sum(
                [
                    await run_async(conn, maintenance.delete_finished_jobs(status, 0.0, 1000))
                    for status in ("completed", "failed")
                ]
            )

    job_id = await app.schedule("parent")
    assert await Worker(app, queues=["parents"], stop_when_empty=True).run() == 0
    assert await Worker(app, queues=["kids"], stop_when_empty=True).run() == 0
    assert sorted(job.status.value for job in await app.list_jobs(type="kid")) == ["completed", "failed"]
    assert await delete_finished() == 0
    assert await Worker(app, queues=["parents"], stop_when_empty=True).run() == 0
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.COMPLETED, job
    assert job.result == [["completed", 1], ["failed", None]]
    assert await delete_finished() == 3
    assert await app.list_jobs() == []


@pytest.mark.parametrize("then", ["snooze", "retry"])
async def test_a_timed_out_event_wait_leaves_nothing_a_later_emit_could_wake(
    app: jobbus.App, dsn: str, then: str
) -> None:
    """After its wait timed out, the job snoozes (or fails and waits for its retry backoff) for an hour: an
    emit of the key afterwards must not make it available at once."""

    @app.job("late", max_attempts=2, backoff=lambda attempt, error: 3600)
    async def late(job: jobbus.JobExecution) -> str:
        try:
            await job.wait_for_event("late-key", timeout=0.5)
        except TimeoutError:
            if then == "snooze":
                raise jobbus.Snooze(3600) from None
            raise
        return "woken"

    job_id = await app.schedule("late")
    async with running(app):

        async def backed_off() -> jobbus.Job | None:
            job = await app.find(job_id)
            outcomes = [entry["outcome"] for entry in job.history] if job else []
            return job if job and job.status is JobStatus.QUEUED and outcomes[-1:] != ["waiting"] and outcomes else None

        before = await eventually(backed_off, what="the job snoozed or retrying after its wait timed out")
        assert await app.emit_event("late-key", "too late")
        after = await app.find(job_id)
    assert after is not None and after.status is JobStatus.QUEUED
    assert after.available_at == before.available_at  # still an hour away
    assert query(dsn, "SELECT count(*) FROM jobbus.event_wait")[0][0] == 0


async def test_an_event_emitted_after_the_waits_timeout_does_not_answer_it_however_late_the_job_runs(
    app: jobbus.App,
) -> None:
    """The wait's deadline passes while its job waits for a worker (its queue is busy or not served), then
    the event is emitted: when the handler runs again its wait times out; the event came too late. An
    event emitted before the deadline answers a wait that resumes after it."""
    answers: dict[str, Any] = {}

    @app.job("waiter")
    async def waiter(job: jobbus.JobExecution) -> None:
        key = str(job.configuration["key"])
        try:
            answers[key] = await job.wait_for_event(key, timeout=1)
        except TimeoutError:
            answers[key] = "timed out"

    ids = [await app.schedule("waiter", {"key": key}) for key in ("late", "in-time")]
    assert await Worker(app, stop_when_empty=True).run() == 0  # both park until their deadline
    assert await app.emit_event("in-time", "came in time")
    await asyncio.sleep(2)  # past the deadlines, no worker running
    assert await app.emit_event("late", "came too late")
    assert await Worker(app, stop_when_empty=True).run() == 0
    assert answers == {"late": "timed out", "in-time": "came in time"}
    jobs = [await app.find(job_id) for job_id in ids]
    assert all(job is not None and job.status is JobStatus.COMPLETED for job in jobs)

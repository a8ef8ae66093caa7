"""Batch handlers: `@app.job(type, batch_size=N, batch_wait=...)` is called with a `JobBatch` of up to N
jobs of its type claimed together; each job keeps its own lease, cancellation, timeout, retries and
outcome."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jobbus
from jobbus import JobStatus
from jobbus.errors import InvalidJobError
from jobbus.store import Claim, JobStore, Statement
from jobbus.worker import claimer
from tests.conftest import FAST
from tests.processes import eventually

QUICK = {**FAST, "heartbeat_interval_seconds": 0.2, "worker_dead_after_seconds": 3.0}


@contextlib.asynccontextmanager
async def plain_scope(job: jobbus.JobExecution) -> AsyncIterator[None]:
    yield None


#: How a batch runs: in one task for the whole batch (nothing of a job's own around its handler), or a task
#: per job (a job scope to enter for each job).
RUNS = pytest.mark.parametrize("per_job", [False, True], ids=["one task", "a task per job"])


def runs(per_job: bool) -> dict[str, Any]:
    """The App options that make a batch run in one task or a task per job."""
    return {"job_scope": plain_scope} if per_job else {}


async def drain(app: jobbus.App, **options: Any) -> int:
    worker = jobbus.Worker(app, stop_when_empty=True, **options)
    return await asyncio.wait_for(worker.run(), 60)


async def taken(app: jobbus.App, job_id: uuid.UUID) -> bool:
    """Claimed (running, or already completed with its batch)."""
    job = await app.find(job_id)
    return job is not None and job.status in (JobStatus.RUNNING, JobStatus.COMPLETED)


async def statuses(app: jobbus.App, ids: list[uuid.UUID]) -> list[JobStatus]:
    jobs = [await app.find(job_id) for job_id in ids]
    return [job.status for job in jobs if job is not None]


async def test_a_batch_handler_gets_up_to_batch_size_jobs_of_its_type_claimed_together(app: jobbus.App) -> None:
    sizes: list[int] = []
    seen: list[int] = []

    @app.job("collect", batch_size=4)
    async def collect(batch: jobbus.JobBatch[jobbus.JobExecution]) -> None:
        assert isinstance(batch, jobbus.JobBatch)
        sizes.append(len(batch))
        seen.extend(job.configuration["n"] for job in batch)

    ids = await app.schedule_many("collect", [{"n": n} for n in range(10)])
    assert await drain(app, concurrency=10) == 0
    assert sorted(seen) == list(range(10))
    assert max(sizes) <= 4 and sorted(sizes, reverse=True)[:2] == [4, 4]
    assert await statuses(app, ids) == [JobStatus.COMPLETED] * 10


async def test_a_list_completes_each_job_with_its_item_and_an_exception_item_fails_that_job_alone(
    app: jobbus.App,
) -> None:
    calls: list[list[int]] = []

    @app.job("square", batch_size=5, max_attempts=2)
    async def square(batch: jobbus.JobBatch[jobbus.JobExecution]) -> list[Any]:
        calls.append([job.configuration["n"] for job in batch])
        return [
            ValueError(f"odd {job.configuration['n']} on attempt {job.attempt}")
            if job.configuration["n"] == 3
            else job.configuration["n"] ** 2
            for job in batch
        ]

    ids = await app.schedule_many("square", [{"n": n} for n in range(5)])
    assert await drain(app) == 0
    jobs = [await app.find(job_id) for job_id in ids]
    assert [job.status for job in jobs if job] == [JobStatus.COMPLETED] * 3 + [JobStatus.FAILED, JobStatus.COMPLETED]
    assert [job.result for job in jobs if job] == [0, 1, 4, None, 16]
    failed = jobs[3]
    assert failed is not None and failed.attempts == 2  # retried alone, by its own max_attempts
    assert failed.last_error is not None and "odd 3 on attempt 2" in failed.last_error
    assert calls[0] == [0, 1, 2, 3, 4] and [3] in calls[1:]
    others = [job for job in jobs if job and job.id != failed.id]
    assert all(job.attempts == 1 for job in others)


async def test_raising_fails_every_job_of_the_batch_one_attempt_each(app: jobbus.App) -> None:
    attempts: list[int] = []

    @app.job("flaky", batch_size=3, max_attempts=3)
    async def flaky(batch: jobbus.JobBatch[jobbus.JobExecution]) -> None:
        attempts.append(batch[0].attempt)
        if batch[0].attempt < 3:
            raise RuntimeError("the store is down")

    ids = await app.schedule_many("flaky", [{}, {}, {}])
    assert await drain(app) == 0
    jobs = [await app.find(job_id) for job_id in ids]
    assert all(job is not None and job.status is JobStatus.COMPLETED and job.attempts == 3 for job in jobs)
    assert all(
        job is not None and [entry["outcome"] for entry in job.history] == ["retried", "retried", "completed"]
        for job in jobs
    )
    assert all(job is not None and "the store is down" in job.history[0]["error"] for job in jobs)


async def test_a_list_of_the_wrong_length_fails_every_job_with_an_error_that_says_so(app: jobbus.App) -> None:
    @app.job("short", batch_size=3, max_attempts=1)
    async def short(batch: jobbus.JobBatch[jobbus.JobExecution]) -> list[int]:
        return [1]

    @app.job("odd", batch_size=3, max_attempts=1)
    async def odd(batch: jobbus.JobBatch[jobbus.JobExecution]) -> dict[str, int]:
        return {"a": 1}

    short_ids = await app.schedule_many("short", [{}, {}, {}])
    odd_ids = await app.schedule_many("odd", [{}, {}])
    assert await drain(app) == 0
    for job_id in short_ids:
        job = await app.find(job_id)
        assert job is not None and job.status is JobStatus.FAILED and job.last_error is not None
        assert "returned a list of 1 items for a batch of 3 jobs" in job.last_error
    for job_id in odd_ids:
        job = await app.find(job_id)
        assert job is not None and job.status is JobStatus.FAILED and job.last_error is not None
        assert "returned dict for a batch of 2 jobs" in job.last_error


async def test_a_sync_batch_handler_runs_in_a_worker_thread(app: jobbus.App) -> None:
    threads: list[str] = []

    @app.job("sync.sum", batch_size=10)
    def total(batch: jobbus.JobBatch[jobbus.SyncJobExecution]) -> list[int]:
        threads.append(threading.current_thread().name)
        assert all(isinstance(job, jobbus.SyncJobExecution) for job in batch)
        batch[0].checkpoint({"seen": len(batch)})  # a blocking, fenced write from the thread
        return [job.configuration["n"] + 1 for job in batch]

    ids = await app.schedule_many("sync.sum", [{"n": n} for n in range(6)])
    assert await drain(app) == 0
    jobs = [await app.find(job_id) for job_id in ids]
    assert [job.result for job in jobs if job] == [1, 2, 3, 4, 5, 6]
    assert threads == ["jobbus-job_0"] or all(name.startswith("jobbus-job") for name in threads)
    first = jobs[0]
    assert first is not None and first.execution_data == {"seen": 6}


async def test_batch_wait_collects_jobs_scheduled_after_the_first_was_claimed(app: jobbus.App) -> None:
    sizes: list[int] = []

    @app.job("late", batch_size=5, batch_wait=timedelta(seconds=10))
    async def late(batch: jobbus.JobBatch[jobbus.JobExecution]) -> None:
        sizes.append(len(batch))

    first = await app.schedule("late")
    worker = jobbus.Worker(app, stop_when_empty=True, concurrency=4)
    task = worker.start()
    await eventually(lambda: taken(app, first), what="the first job claimed, its batch waiting for more")
    later = []
    for _ in range(4):  # one by one: the waiting batch takes each as it comes, not the worker's other slots
        later.append(await app.schedule("late"))
        await eventually(lambda: taken(app, later[-1]), what="the job taken by the waiting batch")
    assert await asyncio.wait_for(task, 30) == 0
    assert sizes == [5]
    assert await statuses(app, [first, *later]) == [JobStatus.COMPLETED] * 5


async def test_batch_wait_runs_a_short_batch_once_the_wait_passed(app: jobbus.App) -> None:
    sizes: list[int] = []

    @app.job("lonely", batch_size=50, batch_wait=0.5)
    async def lonely(batch: jobbus.JobBatch[jobbus.JobExecution]) -> None:
        sizes.append(len(batch))

    ids = await app.schedule_many("lonely", [{}, {}])
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await drain(app) == 0
    assert sizes == [2]
    assert loop.time() - started >= 0.5
    assert await statuses(app, ids) == [JobStatus.COMPLETED] * 2


async def test_a_batch_takes_one_local_slot_and_plain_jobs_of_the_same_worker_run_beside_it(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, **QUICK)
    async with app:
        running = 0
        most = 0
        release = asyncio.Event()

        @app.job("bulk", batch_size=20, queue="bulk")
        async def bulk(batch: jobbus.JobBatch[jobbus.JobExecution]) -> None:
            nonlocal running, most
            running += 1
            most = max(most, running)
            await release.wait()
            running -= 1

        plain_done: list[int] = []

        @app.job("plain")
        async def plain(job: jobbus.JobExecution) -> None:
            plain_done.append(1)
            if len(plain_done) == 5:
                release.set()

        bulk_ids = await app.schedule_many("bulk", [{} for _ in range(40)])
        plain_ids = await app.schedule_many("plain", [{} for _ in range(5)])
        # concurrency 3: two batches of 20 take two slots, the third slot runs the plain jobs one by one
        assert await drain(app, concurrency=3, queues=["bulk", "default"]) == 0
        assert most == 2
        assert await statuses(app, bulk_ids + plain_ids) == [JobStatus.COMPLETED] * 45


@RUNS
async def test_a_cancelled_job_of_a_batch_is_recorded_cancelled_and_the_others_complete(
    dsn: str, per_job: bool
) -> None:
    app = jobbus.App(dsn=dsn, **QUICK, cancel_grace_seconds=0.5, **runs(per_job))
    async with app:
        started = asyncio.Event()
        seen: list[bool] = []

        @app.job("slow", batch_size=3)
        async def slow(batch: jobbus.JobBatch[jobbus.JobExecution]) -> list[str]:
            started.set()
            while not batch[1].cancellation_requested:  # noqa: ASYNC110 - a handler polls its flag
                await asyncio.sleep(0.02)
            seen.append(batch[1].cancellation_requested)
            return ["a", "b", "c"]

        ids = await app.schedule_many("slow", [{}, {}, {}])
        worker = jobbus.Worker(app, stop_when_empty=True)
        task = worker.start()
        await asyncio.wait_for(started.wait(), 20)
        assert await app.cancel(ids[1]) is JobStatus.RUNNING
        assert await asyncio.wait_for(task, 30) == 0
        assert seen == [True]
        jobs = [await app.find(job_id) for job_id in ids]
        assert [job.status for job in jobs if job] == [JobStatus.COMPLETED, JobStatus.CANCELLED, JobStatus.COMPLETED]
        assert [job.result for job in jobs if job] == ["a", None, "c"]


@RUNS
async def test_a_job_cancelled_past_its_grace_ends_alone_while_the_call_goes_on(dsn: str, per_job: bool) -> None:
    app = jobbus.App(dsn=dsn, **QUICK, cancel_grace_seconds=0.2, **runs(per_job))
    async with app:
        started = asyncio.Event()
        go_on = asyncio.Event()

        @app.job("deaf", batch_size=2)
        async def deaf(batch: jobbus.JobBatch[jobbus.JobExecution]) -> list[int]:
            started.set()
            await go_on.wait()
            return [1, 2]

        ids = await app.schedule_many("deaf", [{}, {}])
        worker = jobbus.Worker(app, stop_when_empty=True)
        task = worker.start()
        await asyncio.wait_for(started.wait(), 20)
        assert await app.cancel(ids[0]) is JobStatus.RUNNING

        async def cancelled() -> bool:
            job = await app.find(ids[0])
            return job is not None and job.status is JobStatus.CANCELLED

        await eventually(cancelled, what="the cancelled job recorded")
        other = await app.find(ids[1])
        assert other is not None and other.status is JobStatus.RUNNING
        go_on.set()
        assert await asyncio.wait_for(task, 30) == 0
        assert await statuses(app, ids) == [JobStatus.CANCELLED, JobStatus.COMPLETED]


@RUNS
async def test_each_job_of_a_batch_announces_its_own_events_before_the_worker_ends(dsn: str, per_job: bool) -> None:
    async with jobbus.App(dsn=dsn, **FAST, **runs(per_job)) as app:
        seen: list[tuple[str, uuid.UUID, Any]] = []

        @app.on(jobbus.JobStarted)
        async def started(event: jobbus.JobStarted) -> None:
            seen.append(("started", event.job_id, event.attempt))

        @app.on(jobbus.JobCompleted)
        async def completed(event: jobbus.JobCompleted) -> None:
            await asyncio.sleep(0.01)  # a listener that takes its time: the worker waits for it
            seen.append(("completed", event.job_id, event.result))

        @app.on(jobbus.JobFailed)
        def failed(event: jobbus.JobFailed) -> None:
            seen.append(("failed", event.job_id, event.error))

        @app.job("announced", batch_size=3, max_attempts=1)
        async def announced(batch: jobbus.JobBatch[jobbus.JobExecution]) -> list[object]:
            return ["a", ValueError("not this one"), "c"]

        ids = await app.schedule_many("announced", [{}, {}, {}])
        assert await drain(app) == 0
        assert sorted(entry for entry in seen if entry[0] == "started") == sorted(
            ("started", job_id, 1) for job_id in ids
        )
        assert sorted(entry for entry in seen if entry[0] != "started") == sorted(
            [("completed", ids[0], "a"), ("failed", ids[1], "ValueError: not this one"), ("completed", ids[2], "c")]
        )
        for job_id in ids:  # each job's start is announced before its end
            kinds = [kind for kind, seen_id, _ in seen if seen_id == job_id]
            assert kinds[0] == "started" and len(kinds) == 2


@RUNS
async def test_a_job_cancelled_while_its_batch_waits_for_more_ends_alone_before_the_call(
    dsn: str, per_job: bool
) -> None:
    app = jobbus.App(dsn=dsn, **QUICK, cancel_grace_seconds=0.1, **runs(per_job))
    async with app:
        calls: list[list[uuid.UUID]] = []

        @app.job("gathered", batch_size=5, batch_wait=3)
        async def gathered(batch: jobbus.JobBatch[jobbus.JobExecution]) -> None:
            calls.append([job.id for job in batch])

        ids = await app.schedule_many("gathered", [{}, {}])
        worker = jobbus.Worker(app, stop_when_empty=True)
        task = worker.start()

        async def both_taken() -> bool:
            return all([await taken(app, job_id) for job_id in ids])

        await eventually(both_taken, what="both jobs claimed into the waiting batch")
        assert await app.cancel(ids[0]) is JobStatus.RUNNING

        async def cancelled() -> bool:
            return await statuses(app, ids[:1]) == [JobStatus.CANCELLED]

        await eventually(cancelled, what="the cancelled job recorded while its batch waits")
        assert calls == []
        assert await asyncio.wait_for(task, 30) == 0
        assert calls == [[ids[1]]]
        assert await statuses(app, ids) == [JobStatus.CANCELLED, JobStatus.COMPLETED]


@RUNS
async def test_each_job_of_a_batch_times_out_by_its_own_timeout_and_the_call_is_cancelled_with_the_last(
    dsn: str, per_job: bool
) -> None:
    async with jobbus.App(dsn=dsn, **FAST, **runs(per_job)) as app:
        await _each_job_times_out_by_its_own_timeout(app)


async def _each_job_times_out_by_its_own_timeout(app: jobbus.App) -> None:
    cancelled: list[bool] = []

    @app.job("stuck", batch_size=2, max_attempts=1)
    async def stuck(batch: jobbus.JobBatch[jobbus.JobExecution]) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    ids = [
        await app.schedule("stuck", timeout=timedelta(seconds=0.3)),
        await app.schedule("stuck", timeout=timedelta(seconds=0.8)),
    ]
    assert await drain(app) == 0
    assert cancelled == [True]
    jobs = [await app.find(job_id) for job_id in ids]
    assert [job.status for job in jobs if job] == [JobStatus.FAILED, JobStatus.FAILED]
    assert [job.last_error for job in jobs if job] == ["timed out after 0.3 s", "timed out after 0.8 s"]


async def test_a_typed_batch_task_gets_the_batch_and_its_items_are_stored_as_task_results(app: jobbus.App) -> None:
    @app.task("docs.index", batch_size=10)
    async def index(batch: jobbus.JobBatch[jobbus.JobExecution]) -> list[object]:
        return [
            {"id": job.configuration["id"]} if job.configuration["id"] != 2 else jobbus.NonRetryableError("no")
            for job in batch
        ]

    assert index.batch
    with pytest.raises(TypeError, match="is a batch task"):
        await index.defer(1)  # type: ignore[arg-type]
    ids = await app.schedule_many("docs.index", [{"id": n} for n in range(4)])
    assert await drain(app) == 0
    jobs = [await app.find(job_id) for job_id in ids]
    assert [job.status for job in jobs if job] == [JobStatus.COMPLETED] * 2 + [JobStatus.FAILED, JobStatus.COMPLETED]
    assert [job.result for job in jobs if job] == [{"id": 0}, {"id": 1}, None, {"id": 3}]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 0}, "batch_size must be an integer from 1"),
        ({"batch_size": True}, "batch_size must be an integer from 1"),
        ({"batch_size": 2.5}, "batch_size must be an integer from 1"),
        ({"batch_size": 2, "batch_wait": -1}, "batch_wait must be 0"),
        ({"batch_size": 2, "batch_wait": "1s"}, "batch_wait must be seconds"),
        ({"batch_wait": 1}, "batch_wait is for batch handlers"),
    ],
)
def test_bad_batch_options_are_refused_with_what_to_give_and_nothing_is_registered(
    dsn: str, options: dict[str, Any], message: str
) -> None:
    app = jobbus.App(dsn=dsn)
    with pytest.raises(InvalidJobError, match=message):
        app.job("bad", **options)(lambda batch: None)
    with pytest.raises(InvalidJobError, match=message):
        app.task("bad.task", **options)(lambda batch: None)
    assert "bad" not in app.registry.handlers and "bad.task" not in app.registry.handlers


@pytest.mark.parametrize("in_parts", [False, True], ids=["one statement", "claims in parts"])
async def test_queue_limits_stay_exact_with_batch_claims_across_workers(
    dsn: str, in_parts: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue limit of 3 jobs, and of 1 per key, holds across two workers whose batch handler asks for 5:
    the batches are only smaller. In parts, each claim of 10 jobs is two statements at once, racing
    each other and the other worker's for the limit."""
    if in_parts:
        monkeypatch.setattr(claimer, "CLAIM_PART_JOBS", 5)
    app = jobbus.App(dsn=dsn, **QUICK)
    async with app:
        await app.set_queue("capped", concurrency=3)
        await app.set_queue("keyed", concurrency_per_key=1)
        running: dict[str, list[str | None]] = {"capped": [], "keyed": []}
        most = {"capped": 0, "keyed": 0}
        doubled_keys: list[list[str | None]] = []

        async def work(batch: jobbus.JobBatch[jobbus.JobExecution]) -> None:
            queue = batch[0].queue
            keys = [job.configuration.get("key") for job in batch]
            running[queue].extend(keys)
            most[queue] = max(most[queue], len(running[queue]))
            if queue == "keyed" and len(set(running[queue])) != len(running[queue]):
                doubled_keys.append(list(running[queue]))
            await asyncio.sleep(0.1)
            for key in keys:
                running[queue].remove(key)

        app.job("capped.work", batch_size=5, batch_wait=0.2, queue="capped")(work)
        app.job("keyed.work", batch_size=5, queue="keyed")(work)
        ids = await app.schedule_many("capped.work", [{} for _ in range(15)])
        ids += await app.schedule_many(
            [
                jobbus.JobRequest("keyed.work", {"key": f"k{n % 3}"}, queue="keyed", concurrency_key=f"k{n % 3}")
                for n in range(12)
            ]
        )
        workers = [jobbus.Worker(app, stop_when_empty=True, concurrency=2) for _ in range(2)]
        codes = await asyncio.wait_for(asyncio.gather(*(worker.run() for worker in workers)), 60)
        assert codes == [0, 0]
        assert most["capped"] == 3 and most["keyed"] <= 3
        assert doubled_keys == []
        assert await statuses(app, ids) == [JobStatus.COMPLETED] * 27


def record_claim_limits(monkeypatch: pytest.MonkeyPatch, fail_once: int | None = None) -> list[int]:
    """Each claim statement's `limit`, in the order made; with `fail_once`, the first statement for that
    many jobs fails (division by zero) instead of claiming."""
    limits: list[int] = []
    original = JobStore.claim_jobs

    def claim_jobs(self: JobStore, **options: Any) -> Any:
        limits.append(options["limit"])
        if fail_once is not None and options["limit"] == fail_once and limits.count(fail_once) == 1:
            return Statement("SELECT 1 / 0", {}, lambda rows, count: Claim([]))
        return original(self, **options)

    monkeypatch.setattr(JobStore, "claim_jobs", claim_jobs)
    return limits


def parted_batches(app: jobbus.App, monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """A batch handler of 5 for "parted", its claims of 20 jobs or more in parts; counts each job's runs."""
    monkeypatch.setattr(claimer, "CLAIM_PART_JOBS", 10)
    runs: Counter[int] = Counter()

    @app.job("parted", batch_size=5)
    async def parted(batch: jobbus.JobBatch[jobbus.JobExecution]) -> None:
        runs.update(job.configuration["n"] for job in batch)

    return runs


async def test_a_large_batch_claim_goes_out_in_parts_and_each_job_runs_once(
    app: jobbus.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two statements in flight for one claim of 4 batches of 5 (parts from 2 batches here): they skip each
    other's rows, and every job runs once, in a batch of its type."""
    limits = record_claim_limits(monkeypatch)
    runs = parted_batches(app, monkeypatch)
    ids = await app.schedule_many("parted", [{"n": n} for n in range(203)])
    assert await drain(app, concurrency=4) == 0
    assert runs == Counter(range(203))
    assert limits[:2] == [10, 10]  # the first claim: 20 jobs, in two parts
    assert await statuses(app, ids) == [JobStatus.COMPLETED] * 203


async def test_a_failed_part_of_a_claim_leaves_the_other_parts_jobs_to_run(
    app: jobbus.App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    limits = record_claim_limits(monkeypatch, fail_once=10)
    runs = parted_batches(app, monkeypatch)
    ids = await app.schedule_many("parted", [{"n": n} for n in range(60)])
    assert await drain(app, concurrency=4) == 0
    assert limits[:2] == [10, 10]
    assert "one part of a claim failed (division by zero); the other parts' jobs run" in caplog.text
    assert runs == Counter(range(60))  # the failed part's jobs were claimed again, once
    jobs = [await app.find(job_id) for job_id in ids]
    assert [(job.status, job.attempts) for job in jobs if job is not None] == [(JobStatus.COMPLETED, 1)] * 60


async def test_max_jobs_bounds_the_jobs_of_batches_too(app: jobbus.App) -> None:
    sizes: list[int] = []

    @app.job("bounded", batch_size=10)
    async def bounded(batch: jobbus.JobBatch[jobbus.JobExecution]) -> None:
        sizes.append(len(batch))

    await app.schedule_many("bounded", [{} for _ in range(25)])
    assert await app.drain(max_jobs=7) == {"completed": 7}
    assert sizes == [7]


async def test_a_stop_calls_a_waiting_batch_at_once_with_what_it_has_and_the_worker_exits_0(app: jobbus.App) -> None:
    sizes: list[int] = []

    @app.job("patient", batch_size=10, batch_wait=timedelta(minutes=10))
    async def patient(batch: jobbus.JobBatch[jobbus.JobExecution]) -> None:
        sizes.append(len(batch))

    ids = await app.schedule_many("patient", [{}, {}])
    worker = jobbus.Worker(app)
    task = worker.start()
    await eventually(lambda: taken(app, ids[1]), what="both jobs claimed into the waiting batch")
    assert sizes == []
    worker.request_stop()
    assert await asyncio.wait_for(task, 30) == 0
    assert sizes == [2]
    assert await statuses(app, ids) == [JobStatus.COMPLETED] * 2


async def test_the_job_scope_is_entered_for_each_job_of_a_batch_and_exited_after_its_outcome(dsn: str) -> None:
    entered: list[uuid.UUID] = []
    exited: list[tuple[uuid.UUID, str | None]] = []

    @contextlib.asynccontextmanager
    async def scope(job: jobbus.JobExecution) -> AsyncIterator[str]:
        entered.append(job.id)
        try:
            yield f"session for {job.id}"
        except Exception as exc:
            exited.append((job.id, type(exc).__name__))
            raise
        exited.append((job.id, None))

    app = jobbus.App(dsn=dsn, **FAST, job_scope=scope)
    async with app:
        seen: list[str] = []

        @app.job("scoped", batch_size=3, max_attempts=1)
        async def scoped(batch: jobbus.JobBatch[jobbus.JobExecution]) -> list[object]:
            seen.extend(job.scope for job in batch)
            return [ValueError("no") if n == 1 else n for n, _ in enumerate(batch)]

        ids = await app.schedule_many("scoped", [{}, {}, {}])
        assert await app.drain(concurrency=1) == {"completed": 2, "failed": 1}
        assert sorted(entered) == sorted(ids) and seen == [f"session for {job_id}" for job_id in ids]
        assert sorted(exited) == sorted([(ids[0], None), (ids[1], "ValueError"), (ids[2], None)])


PLAN = st.fixed_dictionaries(
    {
        "jobs": st.lists(st.sampled_from(["ok", "ok", "fails once", "raises once"]), min_size=1, max_size=25),
        "batch_size": st.integers(1, 8),
        "concurrency": st.integers(1, 4),
        "sync": st.booleans(),
        "per_job": st.booleans(),
    }
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=PLAN)
def test_any_mix_of_items_and_raises_gives_each_job_exactly_the_attempts_its_calls_gave_it(
    dsn: str, plan: dict[str, Any]
) -> None:
    """Each call holds at most batch_size jobs, each once; a job is completed with its own item once it
    returned one; each call it was in is one attempt, and every call before its last either raised (a job
    planned to raise does so on its first attempt, failing its whole batch) or gave it its failed item."""
    job_type = f"prop.{uuid.uuid4().hex[:8]}"
    calls: list[tuple[list[uuid.UUID], bool]] = []

    def answer(jobs: list[Any]) -> list[Any]:
        raises = any(job.configuration["plan"] == "raises once" and job.attempt == 1 for job in jobs)
        calls.append(([job.id for job in jobs], raises))
        if raises:
            raise RuntimeError("the batch raised")
        return [
            ValueError("its item failed")
            if job.configuration["plan"] == "fails once" and job.attempt == 1
            else job.configuration["n"] * 10
            for job in jobs
        ]

    async def run() -> list[jobbus.Job]:
        app = jobbus.App(dsn=dsn, **FAST, **runs(plan["per_job"]))
        async with app:
            if plan["sync"]:
                app.job(job_type, batch_size=plan["batch_size"], max_attempts=20)(lambda batch: answer(list(batch)))
            else:

                async def handler(batch: jobbus.JobBatch[jobbus.JobExecution]) -> list[Any]:
                    return answer(list(batch))

                app.job(job_type, batch_size=plan["batch_size"], max_attempts=20)(handler)
            ids = await app.schedule_many(job_type, [{"n": n, "plan": p} for n, p in enumerate(plan["jobs"])])
            await app.drain(types=[job_type], concurrency=plan["concurrency"])
            jobs = [await app.find(job_id) for job_id in ids]
            return [job for job in jobs if job is not None]

    jobs = asyncio.run(run())
    assert all(len(ids) <= plan["batch_size"] and len(set(ids)) == len(ids) for ids, _ in calls)
    for job in jobs:
        assert (job.status, job.result) == (JobStatus.COMPLETED, job.configuration_data["n"] * 10)
        mine = [raised for ids, raised in calls if job.id in ids]
        assert job.attempts == len(mine) and not mine[-1]
        plan_of_job = job.configuration_data["plan"]
        for attempt, raised in enumerate(mine[:-1], start=1):
            assert raised or (attempt == 1 and plan_of_job == "fails once"), (plan_of_job, mine)
        if plan_of_job == "fails once" and not mine[0]:
            assert len(mine) >= 2
        if plan_of_job == "raises once":
            assert mine[0] and len(mine) >= 2


@RUNS
async def test_a_sync_batch_handler_overrunning_a_jobs_timeout_has_that_job_recorded_timed_out(
    dsn: str, per_job: bool
) -> None:
    async with jobbus.App(dsn=dsn, **FAST, **runs(per_job)) as app:
        await _sync_overrun_recorded_timed_out(app)


async def _sync_overrun_recorded_timed_out(app: jobbus.App) -> None:
    told: list[bool] = []

    @app.job("sync.slow", batch_size=2, max_attempts=1)
    def slow(batch: jobbus.JobBatch[jobbus.SyncJobExecution]) -> list[str]:
        deadline = time.monotonic() + 5
        while not batch[0].cancellation_requested and time.monotonic() < deadline:
            time.sleep(0.02)  # a thread cannot be stopped: it looks at its job's flag
        told.append(batch[0].cancellation_requested)
        return ["late", "fine"]

    ids = [
        await app.schedule("sync.slow", timeout=timedelta(seconds=0.3)),
        await app.schedule("sync.slow"),
    ]
    assert await drain(app) == 0
    assert told == [True]
    jobs = [await app.find(job_id) for job_id in ids]
    assert [job.status for job in jobs if job] == [JobStatus.FAILED, JobStatus.COMPLETED]
    assert [job.last_error for job in jobs if job] == ["timed out after 0.3 s", None]
    assert [job.result for job in jobs if job] == [None, "fine"]

"""What a handler logs during an attempt is kept with that attempt in its history entry (SPEC 22):
its own lines only, bounded with the tail kept, redacted, written with the outcome and fenced like it."""

from __future__ import annotations

import asyncio
import logging
import random
import subprocess
import sys
import threading
import time
import tracemalloc
import uuid
from datetime import datetime
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus import JobStatus
from jobbus.joblog import LINE_OVERHEAD, MAX_LINE_BYTES, MAX_LOG_BYTES, AttemptLog
from jobbus.redaction import MASK
from jobbus.worker.joblogs import line_of
from tests.processes import eventually

shop = logging.getLogger("tests.shop")


@pytest.fixture(autouse=True)
def _info_level(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)


async def drain(app: jobbus.App, **options: Any) -> int:
    options = {"stop_when_empty": True, "concurrency": 4} | options
    return await jobbus.Worker(app, **options).run()


def messages(entry: dict[str, Any]) -> list[str]:
    return [line["message"] for line in entry.get("logs", [])]


async def test_job_logger_and_standard_logging_are_kept_with_the_attempt_and_still_logged(
    app: jobbus.App, caplog: pytest.LogCaptureFixture
) -> None:
    @app.job("report")
    async def report(job: jobbus.JobExecution) -> str:
        job.logger.info("rendering %s", job.configuration["name"])
        shop.warning("the printer is slow")
        logging.getLogger("jobbus.store").warning("a library line, not the job's")
        return "done"

    job_id = await app.schedule("report", {"name": "q3"})
    assert await drain(app) == 0
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.COMPLETED
    (entry,) = job.history
    assert [(line["level"], line["message"]) for line in entry["logs"]] == [
        ("INFO", "rendering q3"),
        ("WARNING", "the printer is slow"),
    ]
    for line in entry["logs"]:
        assert set(line) == {"at", "level", "message"}
        # As instants: the entry's `at` is written by the server, in its session's time zone.
        assert datetime.fromisoformat(line["at"]) <= datetime.fromisoformat(entry["at"])
    assert "logs_dropped" not in entry
    # Capturing adds: the application's handlers got every record as before, with the job's fields.
    shown = {r.getMessage(): r for r in caplog.records}
    assert shown["rendering q3"].name == "jobbus.job" and shown["rendering q3"].__dict__["job_id"] == str(job_id)
    assert "the printer is slow" in shown and "a library line, not the job's" in shown


async def test_each_attempt_keeps_its_own_lines_and_exceptions_are_redacted(app: jobbus.App) -> None:
    @app.job("flaky")
    async def flaky(job: jobbus.JobExecution) -> None:
        job.logger.info("attempt %d begins", job.attempt)
        if job.attempt < 3:
            try:
                raise ConnectionError("cannot reach postgresql://shop:hunter2@db/shop")
            except ConnectionError:
                shop.exception("upstream down (api_key=ak_live_9)")
            raise RuntimeError(f"attempt {job.attempt} failed")

    job_id = await app.schedule("flaky", max_attempts=3)
    assert await drain(app) == 0
    job = await app.find(job_id)
    assert job is not None
    assert job.status is JobStatus.COMPLETED
    assert [entry["outcome"] for entry in job.history] == ["retried", "retried", "completed"]
    for number, entry in enumerate(job.history, start=1):
        logged = messages(entry)
        assert logged[0] == f"attempt {number} begins"
        if number < 3:
            assert len(logged) == 2
            assert logged[1].startswith(f"upstream down (api_key={MASK})\nTraceback (most recent call last):")
            assert f"postgresql://shop:{MASK}@db/shop" in logged[1]
            assert "hunter2" not in logged[1] and "ak_live_9" not in logged[1]
            assert entry["logs"][1]["level"] == "ERROR"
        else:
            assert len(logged) == 1


async def test_a_sync_handler_keeps_what_its_thread_logs(app: jobbus.App) -> None:
    @app.job("sync.report")
    def sync_report(job: jobbus.SyncJobExecution) -> None:
        job.logger.info("from the job's logger")
        shop.info("from the thread: %s", threading.current_thread().name)
        raise jobbus.NonRetryableError("given up")

    job_id = await app.schedule("sync.report")
    assert await drain(app) == 0
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.FAILED
    logged = messages(job.history[-1])
    assert logged[0] == "from the job's logger"
    assert logged[1].startswith("from the thread: jobbus-job")
    assert "traceback" in job.history[-1]  # with the outcome's other fields, in its entry


@pytest.mark.timeout(120)
async def test_concurrent_attempts_never_see_each_others_lines(app: jobbus.App) -> None:
    """Many attempts, async and sync, log interleaved (each yields between lines): each job holds exactly
    its own lines, in order, and nothing else logged meanwhile (the worker's own lines, another task's)."""

    @app.job("chatty")
    async def chatty(job: jobbus.JobExecution) -> None:
        me = job.configuration["n"]
        for i in range(5):
            shop.info("job %d line %d", me, i)
            await asyncio.sleep(random.random() / 100)
            job.logger.info("job %d logger %d", me, i)

    @app.job("chatty.sync")
    def chatty_sync(job: jobbus.SyncJobExecution) -> None:
        me = job.configuration["n"]
        for i in range(5):
            shop.info("job %d line %d", me, i)
            time.sleep(random.random() / 200)
            job.logger.info("job %d logger %d", me, i)

    stop = asyncio.Event()

    async def bystander() -> None:  # a task of the application's, not of any job
        while not stop.is_set():
            shop.info("bystander")
            await asyncio.sleep(0.001)

    ids = {}
    for n in range(120):
        ids[n] = await app.schedule("chatty" if n % 3 else "chatty.sync", {"n": n})
    other = asyncio.create_task(bystander())
    try:
        assert await drain(app, concurrency=40) == 0
    finally:
        stop.set()
        await other
    for n, job_id in ids.items():
        job = await app.find(job_id)
        assert job is not None and job.status is JobStatus.COMPLETED
        expected = [text for i in range(5) for text in (f"job {n} line {i}", f"job {n} logger {i}")]
        assert messages(job.history[-1]) == expected, n


async def test_a_batch_handler_logs_to_each_job_and_a_jobs_logger_to_that_job_alone(app: jobbus.App) -> None:
    @app.job("emails", batch_size=5, batch_wait=0.5)
    async def emails(jobs: jobbus.JobBatch[jobbus.JobExecution]) -> list[Any]:
        shop.info("sending %d emails", len(jobs))
        for job in jobs:
            job.logger.info("sent to %s", job.configuration["to"])
        return [None for _ in jobs]

    ids = [await app.schedule("emails", {"to": f"user{n}@example.com"}) for n in range(5)]
    assert await drain(app) == 0
    for n, job_id in enumerate(ids):
        job = await app.find(job_id)
        assert job is not None and job.status is JobStatus.COMPLETED
        logged = messages(job.history[-1])
        assert logged[-1] == f"sent to user{n}@example.com"
        assert len(logged) == 2 and logged[0].startswith("sending ")


async def test_a_sync_batch_handler_logs_to_each_job(app: jobbus.App) -> None:
    @app.job("emails.sync", batch_size=3, batch_wait=0.5)
    def emails_sync(jobs: jobbus.JobBatch[jobbus.SyncJobExecution]) -> None:
        shop.info("a sync batch of %d", len(jobs))
        raise RuntimeError("the mail server refused")

    ids = [await app.schedule("emails.sync", max_attempts=1) for _ in range(3)]
    assert await drain(app) == 0
    for job_id in ids:
        job = await app.find(job_id)
        assert job is not None and job.status is JobStatus.FAILED
        assert messages(job.history[-1])[0].startswith("a sync batch of ")


@pytest.mark.timeout(180)
async def test_a_hostile_handler_keeps_64_kib_of_its_newest_lines(app: jobbus.App) -> None:
    """100 MB of lines and a 10 MB message: the entry keeps the newest lines within 64 KiB, says how many
    were dropped, and each line is cut to its bound."""

    @app.job("flood")
    async def flood(job: jobbus.JobExecution) -> None:
        chunk = "y" * 10_000
        for i in range(10_000):
            shop.info("%d %s", i, chunk)
        shop.warning("z" * 10_000_000)
        shop.info("the last line token=abc123")

    job_id = await app.schedule("flood")
    assert await drain(app) == 0
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.COMPLETED
    entry = job.history[-1]
    lines = entry["logs"]
    kept = sum(len(line["message"].encode()) + LINE_OVERHEAD for line in lines)
    assert kept <= MAX_LOG_BYTES
    assert lines[-1]["message"] == f"the last line token={MASK}"
    assert lines[-2]["message"].startswith("zzz") and lines[-2]["message"].endswith(
        f"(cut to {MAX_LINE_BYTES:,} bytes)"
    )
    assert len(lines[-2]["message"].encode()) <= MAX_LINE_BYTES
    assert entry["logs_dropped"] == 10_002 - len(lines)


def test_capturing_a_flood_costs_bounded_memory() -> None:
    """The capture's own memory: 100 MB of records and one 10 MB message leave at most the bound kept."""
    log = AttemptLog()
    chunk = "v" * 5_000
    big = "w" * 10_000_000
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(20_000):
            log.add(*line_of(shop.makeRecord(shop.name, logging.INFO, __file__, 1, "%d %s", (i, chunk), None)))
        log.add(*line_of(shop.makeRecord(shop.name, logging.INFO, __file__, 1, big, (), None)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - base < 1024 * 1024
    lines, dropped = log.close()
    assert dropped == 20_001 - len(lines) and lines[-1]["message"].startswith("www")
    assert sum(len(line["message"].encode()) + LINE_OVERHEAD for line in lines) <= MAX_LOG_BYTES


async def test_lines_after_the_attempt_and_of_a_lost_lease_are_not_kept(app: jobbus.App) -> None:
    leaked: list[asyncio.Task[None]] = []

    @app.job("leaky")
    async def leaky(job: jobbus.JobExecution) -> None:
        async def later() -> None:
            await asyncio.sleep(0.2)
            shop.info("after the attempt")

        shop.info("during the attempt")
        leaked.append(asyncio.create_task(later()))

    @app.job("stale")
    async def stale(job: jobbus.JobExecution) -> None:
        shop.info("a line of an attempt whose lease is taken")
        async with await psycopg.AsyncConnection.connect(app.dsn, autocommit=True) as conn:
            await conn.execute("UPDATE jobbus.job SET lease_token = %s WHERE id = %s", (uuid.uuid4(), job.id))

    leaky_id = await app.schedule("leaky")
    stale_id = await app.schedule("stale")
    worker = jobbus.Worker(app, stop_when_empty=True, concurrency=2)
    task = worker.start()
    await asyncio.wait_for(asyncio.gather(*await eventually(lambda: leaked, what="the leaked task")), 10)
    worker.request_stop()
    await task
    job = await app.find(leaky_id)
    assert job is not None and messages(job.history[-1]) == ["during the attempt"]
    stale_job = await app.find(stale_id)
    assert stale_job is not None and stale_job.status is JobStatus.RUNNING  # nothing written: the fence held
    assert all("logs" not in entry for entry in stale_job.history)


async def test_workflow_steps_log_into_their_attempt_and_a_parked_attempt_keeps_its_lines(app: jobbus.App) -> None:
    """A step's lines are its attempt's; an attempt that parks in a durable wait keeps what it logged in
    its `waiting` entry, and the attempt that resumes keeps its own lines in its own entry."""

    @app.job("onboard")
    async def onboard(job: jobbus.JobExecution) -> str:
        async def create_account() -> str:
            shop.info("creating the account (attempt %d)", job.attempt)
            return "acct-1"

        account: str = await job.step("account", create_account)
        job.logger.info("before the nap")
        await job.sleep("nap", 0.3)
        job.logger.info("after the nap, account %s", account)
        return account

    @app.job("onboard.sync")
    def onboard_sync(job: jobbus.SyncJobExecution) -> None:
        shop.info("sync before the event wait")
        sent = job.wait_for_event("welcome-sent", timeout=60)
        shop.info("sync after the event wait: %s", sent)

    job_id = await app.schedule("onboard")
    sync_id = await app.schedule("onboard.sync")
    worker = jobbus.Worker(app, concurrency=4)
    task = worker.start()

    async def finished() -> bool:
        found = [await app.find(job_id), await app.find(sync_id)]
        return all(job is not None and job.status is JobStatus.COMPLETED for job in found)

    async def parked() -> bool:
        job = await app.find(sync_id)
        return job is not None and bool(job.history) and job.history[-1]["outcome"] == "waiting"

    await eventually(parked, what="the sync handler parked")
    await app.emit_event("welcome-sent", {"to": "ada"})
    await eventually(finished, what="both workflows completed")
    worker.request_stop()
    assert await task == 0
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.COMPLETED
    assert [entry["outcome"] for entry in job.history] == ["waiting", "completed"]
    assert messages(job.history[0]) == ["creating the account (attempt 1)", "before the nap"]
    # The handler runs again from its start; its stored step does not.
    assert messages(job.history[1]) == ["before the nap", "after the nap, account acct-1"]
    synced = await app.find(sync_id)
    assert synced is not None and synced.status is JobStatus.COMPLETED
    assert [messages(entry) for entry in synced.history] == [
        ["sync before the event wait"],
        ["sync before the event wait", "sync after the event wait: {'to': 'ada'}"],
    ]


async def test_a_timed_out_attempt_keeps_its_lines(app: jobbus.App) -> None:
    @app.job("slow")
    async def slow(job: jobbus.JobExecution) -> None:
        job.logger.warning("starting a long call")
        await asyncio.sleep(30)

    job_id = await app.schedule("slow", timeout=0.2, max_attempts=1)
    assert await drain(app) == 0
    job = await app.find(job_id)
    assert job is not None and job.status is JobStatus.FAILED
    assert job.history[-1]["error"].startswith("timed out")
    assert messages(job.history[-1]) == ["starting a long call"]


def test_an_application_without_logging_configured_still_sees_its_warnings(dsn: str) -> None:
    """Python prints a warning no handler takes (`logging.lastResort`): the capture on the root logger
    does not take that away, for the handler's records as for the application's others."""
    script = f"""
import asyncio, logging
import jobbus

app = jobbus.App(dsn={dsn!r})

@app.job("warns")
async def warns(job):
    logging.getLogger("shop").warning("the handler's warning")
    job.logger.error("the job logger's error")

async def main():
    async with app:
        await app.schedule("warns")
        await jobbus.Worker(app, stop_when_empty=True).run()
        job = (await app.list_jobs())[0]
        print(len(job.history[-1]["logs"]))

asyncio.run(main())
logging.getLogger("shop").warning("a warning after the worker")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
    assert done.stderr.splitlines()[-3:] == [
        "the handler's warning",
        "the job logger's error",
        "a warning after the worker",
    ]

"""Apps that worker subprocesses load with `--app tests.apps:app`.

Handlers record every execution in the table `executions` of the job's database, so tests can count
exactly how often each job ran and in which process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg

import jobbus

EXECUTIONS_DDL = """
CREATE TABLE IF NOT EXISTS public.executions (
    job_id uuid NOT NULL,
    attempt integer NOT NULL,
    pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

app = jobbus.App(retry_base_delay_seconds=0, retry_max_delay_seconds=0, poll_interval_seconds=0.2)


async def _record(job: jobbus.JobExecution) -> None:
    async with await psycopg.AsyncConnection.connect(app.dsn, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO public.executions (job_id, attempt, pid) VALUES (%s, %s, %s)",
            (job.id, job.attempt, os.getpid()),
        )


@app.job("record")
async def record(job: jobbus.JobExecution) -> dict[str, Any]:
    """Record the execution; sleep `sleep` seconds (on the first attempt only if `first_only`)."""
    await _record(job)
    sleep = float(job.configuration.get("sleep", 0))
    if sleep and (job.attempt == 1 or not job.configuration.get("first_only")):
        await asyncio.sleep(sleep)
    return {"pid": os.getpid(), "attempt": job.attempt}


@app.job("cooperative")
async def cooperative(job: jobbus.JobExecution) -> str:
    """Work in small steps until done or asked to stop, checkpointing the step reached."""
    await _record(job)
    steps = int(job.configuration.get("steps", 600))
    for step in range(int(job.execution_data.get("step", 0)), steps):
        if job.cancellation_requested:
            return "stopped"
        await asyncio.sleep(0.05)
        if step % 10 == 0:
            await job.checkpoint({"step": step})
    return "done"


def _tick(job: jobbus.JobExecution | jobbus.SyncJobExecution) -> None:
    """A side effect outside the database (a line in a file): what fencing cannot undo."""
    with Path(job.configuration["path"]).open("a") as ticks:
        ticks.write(f"{job.id} {job.attempt} {os.getpid()} {time.time()!r}\n")


@app.job("ticker")
async def ticker(job: jobbus.JobExecution) -> None:
    """A side effect every 50 ms, ignoring cancellation: only the worker cancelling its task stops it."""
    while True:
        _tick(job)
        await asyncio.sleep(0.05)


@app.job("ticker_sync")
def ticker_sync(job: jobbus.SyncJobExecution) -> None:
    """A side effect every 50 ms in a thread, until `cancellation_requested`."""
    while not job.cancellation_requested:
        _tick(job)
        time.sleep(0.05)


@app.job("stubborn")
async def stubborn(job: jobbus.JobExecution) -> str:
    """Ignores cancellation: only task cancellation at shutdown ends it."""
    await _record(job)
    await asyncio.sleep(float(job.configuration.get("sleep", 60)))
    return "finished"


@app.job("stubborn_sync")
def stubborn_sync(job: jobbus.SyncJobExecution) -> str:
    """A blocking handler that ignores cancellation (a thread cannot be interrupted)."""
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO public.executions (job_id, attempt, pid) VALUES (%s, %s, %s)",
            (job.id, job.attempt, os.getpid()),
        )
    time.sleep(float(job.configuration.get("sleep", 60)))
    return "finished"


@app.job("hog")
async def hog(job: jobbus.JobExecution) -> None:
    """Allocates memory and keeps it, to trip --memory-limit."""
    await _record(job)
    _kept.append(bytearray(int(job.configuration.get("bytes", 64 * 2**20))))


_kept: list[bytearray] = []


@app.job("poison")
async def poison(job: jobbus.JobExecution) -> None:
    """Crashes its worker process every time, like a segfaulting C extension or an OOM kill."""
    await _record(job)
    os.kill(os.getpid(), signal.SIGKILL)


@app.job("record_batch", batch_size=5, batch_wait=0.5)
async def record_batch(batch: jobbus.JobBatch[jobbus.JobExecution]) -> list[dict[str, Any]]:
    """A batch handler: records each job's execution; sleeps `sleep` seconds (the largest of its jobs')
    on a batch whose jobs are all on their first attempt."""
    for job in batch:
        await _record(job)
    sleep = max(float(job.configuration.get("sleep", 0)) for job in batch)
    if sleep and all(job.attempt == 1 for job in batch):
        await asyncio.sleep(sleep)
    return [{"pid": os.getpid(), "attempt": job.attempt} for job in batch]


def make_app() -> jobbus.App:
    """`--app tests.apps:make_app`: a callable returning the App."""
    return app


@contextlib.asynccontextmanager
async def lifespan() -> AsyncIterator[jobbus.App]:
    """`--app tests.apps:lifespan`: owns a resource for the whole run and records entering and leaving."""
    async with await psycopg.AsyncConnection.connect(app.dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS public.lifecycle (event text, at timestamptz DEFAULT now())")
        await conn.execute("INSERT INTO public.lifecycle (event) VALUES ('enter')")
        try:
            yield app
        finally:
            await conn.execute("INSERT INTO public.lifecycle (event) VALUES ('exit')")

"""Apps for periodic jobs, timeouts, snooze and backoff, loaded by worker subprocesses
(`--app tests.time_apps:app`). Every execution is recorded in `public.executions`."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta

import psycopg

import jobbus
from tests.apps import EXECUTIONS_DDL

app = jobbus.App(retry_base_delay_seconds=0, retry_max_delay_seconds=0, poll_interval_seconds=0.2)
# In a queue the workers of the tick test do not serve: a job the killed leader was running would be
# requeued with a new `available_at`, which is how that test reads a job's tick.
app.periodic("every-second", type="tick", every=timedelta(seconds=1), overlap=True, queue="ticks")

__all__ = ["EXECUTIONS_DDL", "app"]


def _record(job_id: object, attempt: int) -> None:
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO public.executions (job_id, attempt, pid) VALUES (%s, %s, %s)", (job_id, attempt, os.getpid())
        )


@app.job("tick")
async def tick(job: jobbus.JobExecution) -> None:
    await asyncio.to_thread(_record, job.id, job.attempt)


@app.job("slow_async", timeout=0.5)
async def slow_async(job: jobbus.JobExecution) -> str:
    await asyncio.to_thread(_record, job.id, job.attempt)
    await asyncio.sleep(30 if job.attempt == 1 else 0)
    return "in time"


@app.job("slow_sync", timeout=timedelta(milliseconds=500))
def slow_sync(job: jobbus.SyncJobExecution) -> str:
    _record(job.id, job.attempt)
    if job.attempt == 1:
        time.sleep(1.5)  # a thread cannot be stopped: it overruns its timeout
    return "in time"


@app.job("not_yet")
async def not_yet(job: jobbus.JobExecution) -> str:
    await asyncio.to_thread(_record, job.id, job.attempt)
    seen = int(job.execution_data.get("seen", 0))
    if seen < 2:
        await job.checkpoint({"seen": seen + 1})
        raise jobbus.Snooze(timedelta(milliseconds=200))
    return f"ready after {seen} snoozes"


@app.job("flaky_backoff", max_attempts=3, backoff=lambda attempt, error: 0.4 * attempt)
async def flaky_backoff(job: jobbus.JobExecution) -> str:
    await asyncio.to_thread(_record, job.id, job.attempt)
    if job.attempt < 3:
        raise ConnectionError(f"attempt {job.attempt}")
    return "third time"

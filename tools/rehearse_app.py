"""The upgrade rehearsal's handler app, written against the API both the previous release and this one offer.

Workers of either release run it (`jobbus worker --app tools.rehearse_app:app`, the repository root as the
working directory). Each attempt first records its start in `public.rehearsal_start`, on the database's
clock, so that the rehearsal can compare the handler runs with the attempts and outcomes the job rows
hold; then a job asked to fail its first attempt does so, and the others sleep a few milliseconds and
complete. `REHEARSAL_ROLE` (`old` or `new`) names the release a worker runs; `JOBBUS_DSN` the database.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import psycopg

import jobbus

#: The one job type the rehearsal's producers schedule.
JOB_TYPE = "rehearsal.work"

#: The side table of handler starts; the rehearsal creates it before any worker starts.
STARTS_DDL = """
CREATE TABLE IF NOT EXISTS public.rehearsal_start (
    job_id     uuid        NOT NULL,
    attempt    integer     NOT NULL,
    role       text        NOT NULL,
    pid        integer     NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

# Retries after a short backoff, so that a job failed on purpose finishes while the rehearsal runs.
app = jobbus.App(retry_base_delay_seconds=0.2, retry_max_delay_seconds=1.0)


class PlannedRetry(Exception):
    """Raised by the first attempt of a job scheduled with `fail_first`: its retry is expected."""


class _StartLog:
    """One connection per worker process, opened at the first attempt, that records attempt starts."""

    def __init__(self) -> None:
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()

    async def record(self, job: jobbus.JobExecution) -> None:
        async with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(os.environ["JOBBUS_DSN"], autocommit=True)
            await self._conn.execute(
                "INSERT INTO public.rehearsal_start (job_id, attempt, role, pid) VALUES (%s, %s, %s, %s)",
                (job.id, job.attempt, os.environ.get("REHEARSAL_ROLE", "unknown"), os.getpid()),
            )


_starts = _StartLog()


@app.job(JOB_TYPE)
async def work(job: jobbus.JobExecution) -> dict[str, int]:
    await _starts.record(job)
    if job.configuration.get("fail_first") and job.attempt == 1:
        raise PlannedRetry(f"job {job.configuration.get('n')} fails its first attempt on purpose")
    await asyncio.sleep(float(job.configuration.get("sleep_ms", 0)) / 1000)
    return {"attempt": job.attempt}

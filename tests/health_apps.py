"""The app that health-endpoint tests run in worker subprocesses (`--app tests.health_apps:app`)."""

from __future__ import annotations

import asyncio
import time

import jobbus

#: A heartbeat of 0.5 s: /livez turns 503 after half a second of a blocked loop, /readyz after a second
#: without the database.
app = jobbus.App(poll_interval_seconds=0.2, heartbeat_interval_seconds=0.5, worker_dead_after_seconds=2)


@app.job("block_loop")
async def block_loop(job: jobbus.JobExecution) -> None:
    """The mistake the liveness probe exists for: a blocking call inside an async handler."""
    time.sleep(float(job.configuration["seconds"]))  # noqa: ASYNC251 - the blocking call under test


@app.job("nap")
async def nap(job: jobbus.JobExecution) -> None:
    """Runs for a while without blocking anything, ignoring cancellation (a stop waits for it)."""
    await asyncio.sleep(float(job.configuration["seconds"]))

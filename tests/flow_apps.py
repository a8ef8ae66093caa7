"""The app worker subprocesses load for flow-control tests (`--app tests.flow_apps:app`): short jobs
whose start and end times are the job rows' own `started_at` and `finished_at`."""

from __future__ import annotations

import asyncio
import random

import jobbus

app = jobbus.App(retry_base_delay_seconds=0, retry_max_delay_seconds=0, poll_interval_seconds=0.05)


@app.job("work", queue="limited")
async def work(job: jobbus.JobExecution) -> None:
    await asyncio.sleep(random.uniform(0.005, float(job.configuration.get("max_sleep", 0.03))))


@app.job("free", queue="free")
async def free(job: jobbus.JobExecution) -> None:
    await asyncio.sleep(0.002)

"""The app that observability tests (metrics, tracing, the dashboard) run in worker processes:
`--app tests.observability.apps:app`."""

from __future__ import annotations

import asyncio
from typing import Any

import jobbus

app = jobbus.App(retry_base_delay_seconds=0, retry_max_delay_seconds=0, poll_interval_seconds=0.2)


class ReportMissingError(Exception):
    """What `broken` raises: failures group by this class and its message."""


@app.job("ok", queue="mail")
async def ok(job: jobbus.JobExecution) -> dict[str, Any]:
    await asyncio.sleep(float(job.configuration.get("sleep", 0)))
    return {"sent": job.configuration.get("to")}


@app.job("flaky", queue="mail")
async def flaky(job: jobbus.JobExecution) -> str:
    """Fails its first attempt, succeeds on the next."""
    if job.attempt == 1:
        raise ConnectionError("smtp timed out")
    return "sent"


@app.job("broken", queue="reports", max_attempts=2)
async def broken(job: jobbus.JobExecution) -> None:
    raise ReportMissingError(f"report {job.configuration.get('report', 0)} is missing")


@app.job("slow", queue="reports")
async def slow(job: jobbus.JobExecution) -> str:
    """Runs until cancelled (or for `seconds`), checking its flag between small steps."""
    for _ in range(int(float(job.configuration.get("seconds", 600)) * 20)):
        if job.cancellation_requested:
            return "stopped"
        await asyncio.sleep(0.05)
    return "done"


@app.job("flow", queue="flows")
async def flow(job: jobbus.JobExecution) -> dict[str, Any]:
    """A workflow: a durable step, `children` children (each `child_sleep` seconds), then their outcome."""
    fetched = await job.step("fetch", lambda: {"rows": 12})
    for n in range(int(job.configuration.get("children", 3))):
        await job.spawn("ok", {"to": f"child{n}@example.com", "sleep": job.configuration.get("child_sleep", 0)})
    children = await job.wait_for_children()
    return {"rows": fetched["rows"], "children": sorted(child.status.value for child in children)}

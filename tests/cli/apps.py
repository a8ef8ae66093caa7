"""Apps that CLI tests load in worker subprocesses: ``jobbus worker --app tests.cli.apps:app``.

The job row itself records what happened (status, attempts, worker_id), so the handlers stay trivial.
"""

from __future__ import annotations

import asyncio
from typing import Any

import jobbus

app = jobbus.App(
    retry_base_delay_seconds=0,
    retry_max_delay_seconds=0,
    poll_interval_seconds=0.2,
    heartbeat_interval_seconds=0.3,
)


@app.job("noop")
async def noop(job: jobbus.JobExecution) -> dict[str, Any]:
    return {"ok": True, "attempt": job.attempt}


@app.job("sleep")
async def sleep(job: jobbus.JobExecution) -> str:
    """Sleep `seconds` in small steps; return early when cancellation is requested."""
    deadline = asyncio.get_running_loop().time() + float(job.configuration.get("seconds", 1.0))
    while asyncio.get_running_loop().time() < deadline:
        if job.cancellation_requested:
            return "stopped early"
        await asyncio.sleep(0.05)
    return "slept"


@app.job("fail")
async def fail(job: jobbus.JobExecution) -> None:
    raise RuntimeError(f"boom on attempt {job.attempt}")


def broken_factory() -> jobbus.App:
    """An --app factory that blows up: the worker exits 70 (internal error)."""
    raise RuntimeError("the factory exploded")


not_an_app = 42

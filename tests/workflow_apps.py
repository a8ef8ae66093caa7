"""Workflow handlers that worker subprocesses load with `--app tests.workflow_apps:app`.

Side effects are rows of `public.effects` (created by `prepare`), written in their own transaction, so a
test can tell whether a step's function ran again after its worker was killed.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from typing import Any

import psycopg

import jobbus

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS public.effects (
    job_id uuid NOT NULL,
    name text NOT NULL,
    attempt integer NOT NULL,
    pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

app = jobbus.App(retry_base_delay_seconds=0, retry_max_delay_seconds=0, poll_interval_seconds=0.2)


def prepare(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(EFFECTS_DDL)


async def effect(job: jobbus.JobExecution, name: str) -> None:
    async with await psycopg.AsyncConnection.connect(app.dsn, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO public.effects (job_id, name, attempt, pid) VALUES (%s, %s, %s, %s)",
            (job.id, name, job.attempt, os.getpid()),
        )


@app.job("wf.noop")
async def noop(job: jobbus.JobExecution) -> Any:
    return job.configuration.get("value")


@app.job("wf.fail", max_attempts=1)
async def fail(job: jobbus.JobExecution) -> None:
    raise jobbus.NonRetryableError("this member fails")


@app.job("wf.steps")
async def steps(job: jobbus.JobExecution) -> dict[str, Any]:
    """Two steps with side effects; `pause_in` / `pause_after` name a step to pause inside (after its
    side effect, before its result is stored) or after (its result stored), for a test to SIGKILL."""
    pause_in = job.configuration.get("pause_in")
    pause_after = job.configuration.get("pause_after")

    async def side_effect(name: str) -> str:
        await effect(job, name)
        if name == pause_in and job.attempt == 1:
            await asyncio.sleep(60)
        return f"{name} done in attempt {job.attempt}"

    results = {}
    for name in ("charge", "ship"):
        results[name] = await job.step(name, side_effect, name)
        if name == pause_after and job.attempt == 1:
            await asyncio.sleep(60)
    return results


@app.job("wf.pay")
async def pay(job: jobbus.JobExecution) -> Any:
    """Wait for the payment event of order `n` (a short random pause first widens the race with emits)."""
    await asyncio.sleep(random.uniform(0, 0.02))
    return await job.wait_for_event(f"pay:{job.configuration['n']}", timeout=300)


@app.job("wf.slowstep")
async def slow_step(job: jobbus.JobExecution) -> Any:
    """One step whose function takes 3 s in the first attempt (long enough to stop its worker inside)."""

    async def charge() -> str:
        await effect(job, "charge")
        if job.attempt == 1:
            await asyncio.sleep(3)
        return f"charge by attempt {job.attempt}"

    return await job.step("charge", charge)


@app.job("wf.chained")
async def chained(job: jobbus.JobExecution) -> Any:
    """Record the run; the first attempt of `crash_once` jobs kills its own worker (SIGKILL) first."""
    await effect(job, "run")
    if job.configuration.get("crash_once") and job.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return job.configuration.get("n")


@app.job("wf.fanout")
async def fanout(job: jobbus.JobExecution) -> Any:
    """Charge once, sleep, spawn `children` children, wait for them and sum their results."""
    await job.step("charge", effect, job, "charge")
    await job.sleep("cool-off", float(job.configuration.get("sleep", 0.5)))
    for n in range(int(job.configuration["children"])):
        await job.spawn("wf.noop", {"value": n})
    children = await job.wait_for_children()
    await effect(job, "finish")
    return sum(child.result for child in children)

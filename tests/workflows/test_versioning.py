"""The versioning rule: steps, sleeps, event waits and spawns are keyed by name (a spawn by what it spawns),
never by position. A deploy that changes a handler while its jobs are mid-flight strands none of them:
a step reached under a new name runs, a step the new code no longer calls is ignored (its result kept),
and a step kept under its name returns what the old code stored."""

from __future__ import annotations

from typing import Any

import jobbus
from jobbus import JobStatus
from tests.conftest import FAST
from tests.processes import eventually
from tests.workflows.test_waits import _parked, running


async def test_a_deploy_that_adds_removes_and_changes_steps_resumes_mid_flight_jobs(app: jobbus.App, dsn: str) -> None:
    calls: list[str] = []

    def run(name: str) -> Any:
        calls.append(name)
        return name

    @app.job("order")
    async def v1(job: jobbus.JobExecution) -> Any:
        await job.step("charge", run, "charge v1")
        await job.step("reserve", run, "reserve v1")
        await job.spawn("child", {"n": 1})
        await job.wait_for_event("paid")  # the deploy happens while the job waits here
        return "v1"

    job_id = await app.schedule("order")
    async with running(app):
        await eventually(lambda: _parked(app, job_id), what="the job parked by v1")

    new = jobbus.App(dsn=dsn, **FAST)

    @new.job("order")
    async def v2(job: jobbus.JobExecution) -> Any:
        charged = await job.step("charge", run, "charge v2")  # kept: returns what v1 stored
        await job.step("notify", run, "notify v2")  # new: runs
        await job.spawn("audit", {"n": 0})  # a new spawn before the old one does not take its child
        await job.spawn("child", {"n": 1})
        paid = await job.wait_for_event("paid")
        return [charged, paid]  # "reserve" is no longer called: its stored result is ignored

    @new.job("child")
    async def child(job: jobbus.JobExecution) -> None:
        return None

    @new.job("audit")
    async def audit(job: jobbus.JobExecution) -> None:
        return None

    async with new:
        await new.emit_event("paid", "yes")
        async with running(new):
            job = await new.wait(job_id, timeout=20)
        children = await new.list_jobs(type=["child", "audit"])
    assert (job.status, job.result) == (JobStatus.COMPLETED, ["charge v1", "yes"])
    assert calls == ["charge v1", "reserve v1", "notify v2"]
    assert job.steps["reserve"] == "reserve v1"
    assert sorted(c.type for c in children) == ["audit", "child"]  # the old child was not spawned twice

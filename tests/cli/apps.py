"""Apps that CLI tests load in worker subprocesses: ``jobbus worker --app tests.cli.apps:app``.

The job row itself records what happened (status, attempts, worker_id), so the handlers stay trivial.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import jobbus

#: A DSN with a password, for tests that prove no output ever shows it.
SECRET_DSN = "postgresql://app:hunter2-s3cret@db.internal:5432/app"

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


@app.job("leak")
async def leak(job: jobbus.JobExecution) -> None:
    raise RuntimeError(f"could not reach {SECRET_DSN} (password=hunter2-s3cret)")


#: Error messages with a secret of every shape the worker masks; each secret starts with "SV" and is
#: unique, so a test finds any that leaks. The last is 600 KiB of what once froze the worker.
SECRET_MESSAGES = [
    "token=SVtoken01",
    "api_key=SVkey02 and client_secret=SVsecret03",
    "upstream refused Authorization: Bearer SVbearer04 (and Authorization: Basic SVbasic05)",
    'login failed for password="correct SVhorse06 battery"',
    'the API answered {"password": "a SVjson07 c", "user": "bob"}',
    "cannot reach postgresql://billing:SVdsn08@db.internal/billing",
    "GET https://api.example.com/v1/items?access_token=SVquery09&page=2 failed",
    "the proxy sent Bearer SVbare10 along",
    "api_key=SVhead11 " + "a://b:" * 50_000 + '{"url":"https://h:443/x"},' * 12_000 + " token=SVtail12",
]


@app.job("leak_shapes")
async def leak_shapes(job: jobbus.JobExecution) -> None:
    """Raises one of `SECRET_MESSAGES` (its index is the configuration's `case`), caused by another."""
    message = SECRET_MESSAGES[int(job.configuration["case"])]
    try:
        raise ConnectionError(f"first try: {message}")
    except ConnectionError as exc:
        raise ValueError(message) from exc


def broken_factory() -> jobbus.App:
    """An --app factory that blows up: the worker exits 70 (internal error)."""
    raise RuntimeError("the factory exploded")


def leaky_factory() -> jobbus.App:
    """An --app factory whose error quotes a DSN with its password."""
    raise RuntimeError(f"the factory exploded connecting to {SECRET_DSN}")


def app_with_its_own_dsn() -> jobbus.App:
    """An App given `dsn=` as a keyword (taken from APP_DSN), with a `noop` handler."""
    own = jobbus.App(dsn=os.environ["APP_DSN"], poll_interval_seconds=0.2)
    own.job("noop")(noop)
    return own


not_an_app = 42


#: An app with a periodic job of a type that none of its handlers serves (a typo).
typo_app = jobbus.App(poll_interval_seconds=0.2)


@typo_app.job("reports.render")
async def render(job: jobbus.JobExecution) -> None:
    return None


typo_app.periodic("nightly-report", type="report.render", every=3600)

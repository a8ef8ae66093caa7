"""Hostile handlers and the innocent jobs that run beside them (`--app tests.hostile.apps:app`).

Every execution is recorded with its start and end in `public.runs`, and what leaked code observed
afterwards in `public.leaks`, in the job's own database.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg

import jobbus

DDL = """
CREATE TABLE IF NOT EXISTS public.runs (
    job_id uuid NOT NULL, attempt int NOT NULL, pid int NOT NULL,
    started timestamptz NOT NULL DEFAULT clock_timestamp(), finished timestamptz
);
CREATE TABLE IF NOT EXISTS public.leaks (job_id uuid NOT NULL, what text NOT NULL);
"""

app = jobbus.App(retry_base_delay_seconds=0, retry_max_delay_seconds=0, poll_interval_seconds=0.2)


def _sql(query: str, *params: Any) -> None:
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        conn.execute(query.encode(), params)


async def _asql(query: str, *params: Any) -> None:
    async with await psycopg.AsyncConnection.connect(app.dsn, autocommit=True) as conn:
        await conn.execute(query.encode(), params)


async def _started(job: jobbus.JobExecution) -> None:
    await _asql("INSERT INTO public.runs (job_id, attempt, pid) VALUES (%s, %s, %s)", job.id, job.attempt, os.getpid())


async def _finished(job: jobbus.JobExecution) -> None:
    await _asql(
        "UPDATE public.runs SET finished = clock_timestamp() WHERE job_id = %s AND attempt = %s", job.id, job.attempt
    )


@contextlib.asynccontextmanager
async def _scope(job: jobbus.JobExecution) -> AsyncIterator[Any]:
    """Like a DB session per job: holds one of the App's pool connections for the whole attempt."""
    if job.configuration.get("hold_pool"):
        async with app.pool.connection() as conn:
            yield conn
    else:
        yield None


app.job_scope = _scope


@app.job("innocent")
async def innocent(job: jobbus.JobExecution) -> str:
    await _started(job)
    await asyncio.sleep(float(job.configuration.get("sleep", 0.05)))
    await _finished(job)
    return "fine"


class Custom(BaseException):
    pass


RAISED: dict[str, BaseException] = {
    "KeyboardInterrupt": KeyboardInterrupt(),
    "SystemExit": SystemExit(3),
    "GeneratorExit": GeneratorExit(),
    "Custom": Custom("not an Exception"),
}


@app.job("raise")
async def raise_(job: jobbus.JobExecution) -> None:
    await _started(job)
    kind = job.configuration["kind"]
    if kind == "CancelledError":
        inner = asyncio.create_task(asyncio.sleep(10))
        await asyncio.sleep(0)
        inner.cancel()
        await inner
    raise RAISED[kind]


@app.job("raise_sync")
def raise_sync(job: jobbus.SyncJobExecution) -> None:
    _sql("INSERT INTO public.runs (job_id, attempt, pid) VALUES (%s, %s, %s)", job.id, job.attempt, os.getpid())
    raise RAISED[job.configuration["kind"]]


def huge_message(size: int) -> str:
    """About `size` characters of what once froze the worker's event loop for minutes (`a://b:` over
    and over, compact JSON full of URLs), with a secret at its start, in its middle and at its end;
    each secret starts with "SV"."""
    url = '{"id":1,"url":"https://api.example.com:443/v1/items/1?page=2","next":"http://h:8080/2"},'
    half = size // 2
    body = ("a://b:" * (half // 6)) + " token=SVmiddle " + (url * (half // len(url)))
    return f"api_key=SVstart {body} postgresql://app:SVdsn@db/app client_secret=SVend"


@app.job("raise_huge")
async def raise_huge(job: jobbus.JobExecution) -> None:
    await _started(job)
    raise ValueError(huge_message(int(job.configuration["size"])))


def _circular() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


RESULTS: dict[str, Any] = {
    "surrogate": {"text": "\ud800"},
    "nan": float("nan"),
    "infinity": [float("-inf")],
    "huge": "x" * 3_000_000,
    "object": object(),
    "circular": None,  # built per call
    "int-keys": {1: "one"},
}


@app.job("return")
async def return_(job: jobbus.JobExecution) -> Any:
    await _started(job)
    kind = job.configuration["kind"]
    return _circular() if kind == "circular" else RESULTS[kind]


@app.job("block_loop")
async def block_loop(job: jobbus.JobExecution) -> str:
    """The classic mistake: a blocking call inside an async handler."""
    await _started(job)
    if job.attempt == 1:
        time.sleep(float(job.configuration["seconds"]))  # noqa: ASYNC251 - the mistake under test
    await _finished(job)
    return "unblocked"


@app.job("leak_task")
async def leak_task(job: jobbus.JobExecution) -> str:
    """Leaves a task behind that writes through the job after the attempt is over."""

    async def later() -> None:
        await asyncio.sleep(0.5)
        try:
            await job.checkpoint({"late": True})
        except jobbus.LeaseLostError as exc:
            await _asql("INSERT INTO public.leaks VALUES (%s, %s)", job.id, f"refused: {exc}")
        else:
            await _asql("INSERT INTO public.leaks VALUES (%s, 'accepted')", job.id)

    await _started(job)
    _kept.append(asyncio.get_running_loop().create_task(later()))
    return "left a task behind"


_kept: list[asyncio.Task[None]] = []


@app.job("leak_thread")
def leak_thread(job: jobbus.SyncJobExecution) -> str:
    """Leaves a thread behind that writes through the job after the attempt is over."""

    def later() -> None:
        time.sleep(0.5)
        try:
            job.checkpoint({"late": True})
        except jobbus.LeaseLostError as exc:
            _sql("INSERT INTO public.leaks VALUES (%s, %s)", job.id, f"refused: {exc}")
        else:
            _sql("INSERT INTO public.leaks VALUES (%s, 'accepted')", job.id)

    _sql("INSERT INTO public.runs (job_id, attempt, pid) VALUES (%s, %s, %s)", job.id, job.attempt, os.getpid())
    threading.Thread(target=later, daemon=True).start()
    return "left a thread behind"


@app.job("stubborn")
async def stubborn(job: jobbus.JobExecution) -> str:
    """Ignores both the cancellation flag and the cancellation of its task."""
    await _started(job)
    deadline = time.monotonic() + float(job.configuration.get("seconds", 60))
    while time.monotonic() < deadline:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.05)
    await _finished(job)
    return "finally done"

"""Real worker processes for multi-process tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from tests.apps import EXECUTIONS_DDL

ROOT = Path(__file__).resolve().parent.parent


def prepare(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(EXECUTIONS_DDL)


def start_worker(
    dsn: str, *args: str, env: dict[str, str] | None = None, app: str = "tests.apps:app"
) -> subprocess.Popen[str]:
    environment = {**os.environ, "JOBBUS_DSN": dsn, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "jobbus", "worker", "--app", app, "--poll-interval", "0.2", *args],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@contextmanager
def workers(
    dsn: str, count: int, *args: str, env: dict[str, str] | None = None, app: str = "tests.apps:app"
) -> Iterator[list[subprocess.Popen[str]]]:
    procs = [start_worker(dsn, *args, env=env, app=app) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait()


def wait_until(predicate: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def query(dsn: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql.encode(), params).fetchall()


def status_of(dsn: str, job_id: uuid.UUID) -> str:
    return str(query(dsn, "SELECT status FROM jobbus.job WHERE id = %s", (job_id,))[0][0])


def executions(dsn: str, job_id: uuid.UUID | None = None) -> list[tuple[Any, ...]]:
    if job_id is None:
        return query(dsn, "SELECT job_id, attempt, pid FROM public.executions ORDER BY at")
    return query(dsn, "SELECT job_id, attempt, pid FROM public.executions WHERE job_id = %s ORDER BY at", (job_id,))


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


async def until_stop_requested(job: Any, poll: float = 0.02) -> None:
    """What a cooperative handler does: work in small steps until the job is asked to stop."""
    import asyncio

    while not job.cancellation_requested:  # noqa: ASYNC110 - a handler polls its flag between steps
        await asyncio.sleep(poll)


async def eventually(probe: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
    """Await `probe()` (sync or async) until it returns something true; AssertionError after `timeout`."""
    import asyncio
    import inspect

    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)

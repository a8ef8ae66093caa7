"""An App with cells that worker subprocesses load with `--app tests.cell_apps:app`.

The cells come from `JOBBUS_TEST_CELLS` (`name=dsn` pairs separated by `;`), one ordinary App per cell
with the same handlers. The handler records each execution in the table `executions` of its cell's
database (with the cell's name in `pid`'s place: the process id), so tests count what ran where.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

import psycopg

import jobbus

SETTINGS: dict[str, Any] = {
    "retry_base_delay_seconds": 0,
    "retry_max_delay_seconds": 0,
    "poll_interval_seconds": 0.2,
}


class CellsApp(jobbus.App):
    """An App whose `cells` are the given Apps (the worker side reads nothing else of it)."""

    def __init__(self, cells: Mapping[str, jobbus.App]) -> None:
        super().__init__(**SETTINGS)
        self._cells = dict(cells)

    @property
    def cells(self) -> Mapping[str, jobbus.App]:
        return self._cells


def cell_app(dsn: str) -> jobbus.App:
    cell = jobbus.App(dsn=dsn, **SETTINGS)

    @cell.job("record")
    async def record(job: jobbus.JobExecution) -> int:
        """Record the execution, then work in small steps for `seconds` unless asked to stop."""
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                "INSERT INTO public.executions (job_id, attempt, pid) VALUES (%s, %s, %s)",
                (job.id, job.attempt, os.getpid()),
            )
        deadline = asyncio.get_running_loop().time() + float(job.configuration.get("seconds", 0))
        while asyncio.get_running_loop().time() < deadline and not job.cancellation_requested:  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # a cooperative handler polls its flag between steps
        return os.getpid()

    return cell


def _cells_from_environment() -> dict[str, jobbus.App]:
    pairs = [pair for pair in os.environ.get("JOBBUS_TEST_CELLS", "").split(";") if pair]
    return {name: cell_app(dsn) for name, _, dsn in (pair.partition("=") for pair in pairs)}


def _app() -> jobbus.App:
    cells = _cells_from_environment()
    return CellsApp(cells) if cells else cell_app(os.environ.get("JOBBUS_DSN", ""))


app = _app()

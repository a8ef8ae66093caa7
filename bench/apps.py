"""The jobbus app every benchmark runs: one no-op handler that notes when it started.

    JOBBUS_DSN=postgresql://... python -m jobbus worker --app bench.apps:app --stop-when-empty

With `BENCH_STAMPS_FILE` set, the process writes the count and the first/last handler start
(`time.time()`) to that file when it exits, so `bench/run.py` can compute the steady drain rate of
several worker processes started through the real CLI.
"""

from __future__ import annotations

import atexit
import os
import time
import uuid

import jobbus
from bench.harness import BENCH_ENCRYPTION_KEY, NOOP, dump_stamps

#: time.time() at each handler start (drain runs).
STARTS: list[float] = []
#: job id -> time.perf_counter() at handler start (latency runs).
STARTED_AT: dict[uuid.UUID, float] = {}


async def noop(job: jobbus.JobExecution) -> None:
    STARTS.append(time.time())


async def noop_by_id(job: jobbus.JobExecution) -> None:
    """The latency runs' no-op, which also notes when each job started. A drain's no-op keeps nothing
    per job but its start time: the benchmark's own bookkeeping stays out of the worker's figures."""
    STARTED_AT[job.id] = time.perf_counter()
    STARTS.append(time.time())


async def noop_batch(batch: jobbus.JobBatch[jobbus.JobExecution]) -> None:
    """The batched drain's no-op: a batch handler noting one start per job of its batch."""
    STARTS.extend([time.time()] * len(batch))


def make_app(
    dsn: str | None = None, *, by_id: bool = False, batch_size: int | None = None, encrypted: bool = False
) -> jobbus.App:
    """The benchmark app; without `dsn`, JOBBUS_DSN (and the other JOBBUS_* settings) apply. With
    `batch_size`, the no-op is a batch handler of that size; `encrypted` seals payloads with
    `BENCH_ENCRYPTION_KEY`."""
    app = jobbus.App(dsn=dsn, encryption_keys=(BENCH_ENCRYPTION_KEY,)) if encrypted else jobbus.App(dsn=dsn)
    if batch_size:
        app.job(NOOP, batch_size=batch_size)(noop_batch)
        return app
    app.job(NOOP)(noop_by_id if by_id else noop)
    return app


app = make_app()


def _dump_at_exit() -> None:
    path = os.environ.get("BENCH_STAMPS_FILE")
    if path:
        dump_stamps(path, STARTS)


if os.environ.get("BENCH_STAMPS_FILE"):
    atexit.register(_dump_at_exit)

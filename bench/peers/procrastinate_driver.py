# mypy: ignore-errors
"""The procrastinate driver: runs in bench/.venv-peers, one operation per invocation.

Uses procrastinate's public API as its docs show it: `App(connector=PsycopgConnector(conninfo=...))`,
`@app.task`, `defer_async` for one job, `batch_defer_async` for many, `run_worker_async` for the worker
(`wait=False` stops it once the queue is caught up; cancelling the task stops a waiting worker
gracefully) and `schema_manager.apply_schema_async()` for the schema. Defaults otherwise
(finished jobs are kept, like jobbus keeps them).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import contextlib

import harness
from procrastinate_app import make_app as _app

FILL_CHUNK = 10_000
WARM_UP = 20


async def setup(args):
    app, _ = _app(args.dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
    return {"installed": True}


async def enqueue_single(args):
    app, noop = _app(args.dsn)
    async with app.open_async():
        for _ in range(WARM_UP):
            await noop.defer_async()
        await asyncio.sleep(harness.wait_until(args.start_at))
        started = time.time()
        for _ in range(args.jobs):
            await noop.defer_async()
        ended = time.time()
    return harness.enqueue_result(args.jobs, started, ended)


async def enqueue_concurrent(args):
    """`--concurrency` coroutines share one App (its connector's pool), one `defer_async` per job."""
    app, noop = _app(args.dsn)
    left = args.jobs

    async def producer():
        nonlocal left
        while left > 0:
            left -= 1
            await noop.defer_async()

    async with app.open_async():
        await asyncio.gather(*(noop.defer_async() for _ in range(args.concurrency)))
        await asyncio.sleep(harness.wait_until(args.start_at))
        started = time.time()
        await asyncio.gather(*(producer() for _ in range(args.concurrency)))
        ended = time.time()
    return harness.enqueue_result(args.jobs, started, ended)


async def enqueue_bulk(args):
    app, noop = _app(args.dsn)
    async with app.open_async():
        await noop.batch_defer_async(*([{}] * WARM_UP))
        started = time.perf_counter()
        ids = await noop.batch_defer_async(*([{}] * args.jobs))
        elapsed = time.perf_counter() - started
    assert len(ids) == args.jobs
    return {"rate": args.jobs / elapsed, "seconds": elapsed}


async def fill(args):
    """With `--limit keys=N`, each job takes one of N `lock`s: procrastinate runs one job per lock at a time."""
    limit = harness.parse_limit(args.limit)
    if limit is not None and limit[0] != "keys":
        raise SystemExit("procrastinate has no fleet-wide limit per queue")
    app, noop = _app(args.dsn)
    async with app.open_async():
        if limit is not None:
            for index in range(args.jobs):
                await noop.configure(lock=f"k{index % limit[1]}").defer_async()
            return {"jobs": args.jobs}
        left = args.jobs
        while left > 0:
            chunk = min(left, FILL_CHUNK)
            await noop.batch_defer_async(*([{}] * chunk))
            left -= chunk
    return {"jobs": args.jobs}


async def drain(args):
    stamps = []
    app, _ = _app(args.dsn, lambda job: stamps.append(time.time()))
    async with app.open_async():
        started = time.time()
        await app.run_worker_async(concurrency=args.concurrency, wait=False, install_signal_handlers=False)
        ended = time.time()
    return harness.drain_result(stamps, started, ended)


async def latency(args):
    started_at = {}
    done = asyncio.Event()

    def on_start(job):
        started_at[job.id] = time.perf_counter()
        if len(started_at) >= args.jobs:
            done.set()

    app, noop = _app(args.dsn, on_start)
    sent = {}
    async with app.open_async():
        worker = asyncio.create_task(
            app.run_worker_async(concurrency=args.concurrency, wait=True, install_signal_handlers=False)
        )
        await asyncio.sleep(harness.IDLE_SECONDS)
        start = time.perf_counter()
        for index in range(args.jobs):
            await asyncio.sleep(harness.paced(start, index, args.interval))
            before = time.perf_counter()
            job_id = await noop.defer_async()
            sent[job_id] = before
        await asyncio.wait_for(done.wait(), timeout=60)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(worker, timeout=30)
    latencies = [started_at[job_id] - at for job_id, at in sent.items() if job_id in started_at]
    return harness.latency_result(latencies, args.jobs)


SEED_FINISHED = """
INSERT INTO procrastinate_jobs (queue_name, task_name, status, args, attempts)
SELECT 'default', %(task)s, 'succeeded', '{}', 1
FROM generate_series(1, %(jobs)s) AS n
"""


async def seed_finished(args):
    started = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(args.dsn, autocommit=True) as conn:
        await conn.execute(SEED_FINISHED, {"task": harness.NOOP, "jobs": args.jobs})
        await conn.execute("VACUUM ANALYZE procrastinate_jobs")
    return {"jobs": args.jobs, "seconds": time.perf_counter() - started}


def main():
    logging.basicConfig(level=logging.WARNING)
    args = harness.parse_args()
    operation = globals()[args.op]
    harness.emit(**asyncio.run(operation(args)))


if __name__ == "__main__":
    main()

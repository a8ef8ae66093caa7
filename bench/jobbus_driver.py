"""The jobbus driver: one benchmark operation per invocation, through jobbus's public API.

    python -m bench.jobbus_driver drain --dsn postgresql://.../db --concurrency 200

Run from the repository root with the project's venv; prints one `RESULT {json}` line.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from argparse import Namespace
from collections.abc import Sequence
from typing import Any

import psycopg

from bench import apps, harness
from jobbus import App
from jobbus import schema as schema_module

SCHEMA = "jobbus"
FILL_CHUNK = 10_000
WARM_UP = 20


def _app(args: Namespace) -> App:
    return apps.make_app(args.dsn, encrypted=bool(args.encrypt))


def setup(args: Namespace) -> dict[str, Any]:
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        applied = schema_module.migrate(conn, SCHEMA)
    return {"migrations": len(applied)}


async def enqueue_single(args: Namespace) -> dict[str, Any]:
    app = _app(args)
    configuration = harness.payload(args.payload_bytes)
    async with app:
        for _ in range(WARM_UP):  # the pool's connections and prepared plans are warm
            await app.schedule(harness.NOOP, configuration)
        await asyncio.sleep(harness.wait_until(args.start_at))
        started = time.time()
        for _ in range(args.jobs):
            await app.schedule(harness.NOOP, configuration)
        ended = time.time()
    return harness.enqueue_result(args.jobs, started, ended)


async def enqueue_concurrent(args: Namespace) -> dict[str, Any]:
    """`--concurrency` coroutines share one App, each scheduling one job per call until `--jobs` are in."""
    app = _app(args)
    configuration = harness.payload(args.payload_bytes)
    left = args.jobs

    async def producer() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await app.schedule(harness.NOOP, configuration)

    async with app:
        await asyncio.gather(*(app.schedule(harness.NOOP, configuration) for _ in range(args.concurrency)))
        await asyncio.sleep(harness.wait_until(args.start_at))
        started = time.time()
        await asyncio.gather(*(producer() for _ in range(args.concurrency)))
        ended = time.time()
    return harness.enqueue_result(args.jobs, started, ended)


async def enqueue_bulk(args: Namespace) -> dict[str, Any]:
    app = _app(args)
    configuration = harness.payload(args.payload_bytes)
    async with app:
        await app.schedule_many(harness.NOOP, [configuration] * WARM_UP)
        started = time.perf_counter()
        ids = await app.schedule_many(harness.NOOP, [configuration] * args.jobs)
        elapsed = time.perf_counter() - started
    assert len(ids) == args.jobs
    return {"rate": args.jobs / elapsed, "seconds": elapsed}


async def fill(args: Namespace) -> dict[str, Any]:
    """`jobs` no-op jobs in queue `default`. Its limits are stored first, and cleared without `--limit`:
    the schema outlives a variant, and a limit left by the previous one would throttle this one."""
    limit = harness.parse_limit(args.limit)
    app = _app(args)
    configuration = harness.payload(args.payload_bytes)
    async with app:
        await app.set_queue(
            "default",
            concurrency=limit[1] if limit is not None and limit[0] == "queue" else None,
            concurrency_per_key=1 if limit is not None and limit[0] == "keys" else None,
        )
        for start in range(0, args.jobs, FILL_CHUNK):
            count = min(FILL_CHUNK, args.jobs - start)
            if limit is not None and limit[0] == "keys":
                keys = limit[1]
                await app.schedule_many(
                    {"type": harness.NOOP, "concurrency_key": f"k{(start + i) % keys}"} for i in range(count)
                )
            else:
                await app.schedule_many(harness.NOOP, [configuration] * count)
    return {"jobs": args.jobs}


async def drain(args: Namespace) -> dict[str, Any]:
    app = apps.make_app(args.dsn, batch_size=args.handler_batch or None, encrypted=bool(args.encrypt))
    apps.STARTS.clear()
    started, cpu = time.time(), harness.cpu_seconds()
    await app.run_worker(concurrency=args.concurrency, stop_when_empty=True, install_signal_handlers=False)
    ended, cpu = time.time(), harness.cpu_seconds() - cpu
    return harness.drain_result(apps.STARTS, started, ended, cpu)


async def latency(args: Namespace) -> dict[str, Any]:
    """An idle worker; jobs scheduled one at a time, `interval` apart; schedule call → handler start."""
    app = apps.make_app(args.dsn, by_id=True)
    configuration = harness.payload(args.payload_bytes)
    apps.STARTED_AT.clear()
    sent: dict[uuid.UUID, float] = {}
    async with app:
        worker = asyncio.create_task(
            app.run_worker(concurrency=args.concurrency, limit=args.jobs, install_signal_handlers=False)
        )
        await asyncio.sleep(harness.IDLE_SECONDS)
        start = time.perf_counter()
        for index in range(args.jobs):
            await asyncio.sleep(harness.paced(start, index, args.interval))
            before = time.perf_counter()
            job_id = await app.schedule(harness.NOOP, configuration)
            sent[job_id] = before
        await asyncio.wait_for(worker, timeout=60)
    latencies = [apps.STARTED_AT[job_id] - at for job_id, at in sent.items() if job_id in apps.STARTED_AT]
    return harness.latency_result(latencies, args.jobs)


SEED_FINISHED = """
INSERT INTO jobbus.job (id, type, queue, status, configuration_data, result, attempts, max_attempts,
                        available_at, created_at, started_at, finished_at)
SELECT jobbus.uuid_generate_v7(), %(type)s, 'default', 'completed', '{}', NULL, 1, 3,
       now() - make_interval(secs => n), now() - make_interval(secs => n), now() - make_interval(secs => n),
       now() - make_interval(secs => n)
FROM generate_series(1, %(jobs)s) AS n
"""


def seed_finished(args: Namespace) -> dict[str, Any]:
    """`jobs` completed rows in one INSERT ... SELECT generate_series, then VACUUM ANALYZE.

    The vacuum stands in for autovacuum, which a production table of that size has long had.
    """
    started = time.perf_counter()
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(SEED_FINISHED, {"type": harness.NOOP, "jobs": args.jobs})
        conn.execute("VACUUM ANALYZE jobbus.job")
    return {"jobs": args.jobs, "seconds": time.perf_counter() - started}


def main(argv: Sequence[str] | None = None) -> None:
    args = harness.parse_args(argv)
    result: dict[str, Any]
    if args.op == "setup":
        result = setup(args)
    elif args.op == "seed_finished":
        result = seed_finished(args)
    else:
        operations = {
            "enqueue_single": enqueue_single,
            "enqueue_bulk": enqueue_bulk,
            "enqueue_concurrent": enqueue_concurrent,
            "fill": fill,
            "drain": drain,
            "latency": latency,
        }
        result = asyncio.run(operations[args.op](args))
    harness.emit(**result)


if __name__ == "__main__":
    main()

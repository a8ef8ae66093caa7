# mypy: ignore-errors
"""The pgqueuer driver: runs in bench/.venv-peers, one operation per invocation.

Uses pgqueuer's public API the way its README and docs show it: an asyncpg connection wrapped in
`AsyncpgDriver` (the faster of its drivers in pgqueuer's own benchmark docs), `Queries.enqueue` with
scalars for one job and with lists for a batch, `PgQueuer.entrypoint` for the handler and
`PgQueuer.run(batch_size=..., max_concurrent_tasks=..., mode=drain)` for the worker.
Schema: `Queries.install()` with the default (durable, logged) tables.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import asyncpg
from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, PgQueuer, Queries
from pgqueuer.domain.types import QueueExecutionMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import harness

FILL_CHUNK = 10_000
WARM_UP = 20


async def _queries(dsn):
    conn = await asyncpg.connect(dsn)
    return conn, Queries(AsyncpgDriver(conn))


async def setup(args):
    conn, queries = await _queries(args.dsn)
    await queries.install()
    await conn.close()
    return {"installed": True}


async def enqueue_single(args):
    conn, queries = await _queries(args.dsn)
    for _ in range(WARM_UP):
        await queries.enqueue(harness.NOOP, None)
    await asyncio.sleep(harness.wait_until(args.start_at))
    started = time.time()
    for _ in range(args.jobs):
        await queries.enqueue(harness.NOOP, None)
    ended = time.time()
    await conn.close()
    return harness.enqueue_result(args.jobs, started, ended)


async def enqueue_concurrent(args):
    """`--concurrency` coroutines share one pool (asyncpg, 10 connections like jobbus's default pool)
    through `AsyncpgPoolDriver`, each enqueueing one job per call until `--jobs` are in."""
    pool = await asyncpg.create_pool(args.dsn, min_size=10, max_size=10)
    queries = Queries(AsyncpgPoolDriver(pool))
    left = args.jobs

    async def producer():
        nonlocal left
        while left > 0:
            left -= 1
            await queries.enqueue(harness.NOOP, None)

    await asyncio.gather(*(queries.enqueue(harness.NOOP, None) for _ in range(args.concurrency)))
    await asyncio.sleep(harness.wait_until(args.start_at))
    started = time.time()
    await asyncio.gather(*(producer() for _ in range(args.concurrency)))
    ended = time.time()
    await pool.close()
    return harness.enqueue_result(args.jobs, started, ended)


async def enqueue_bulk(args):
    conn, queries = await _queries(args.dsn)
    await queries.enqueue([harness.NOOP] * WARM_UP, [None] * WARM_UP, [0] * WARM_UP)
    started = time.perf_counter()
    ids = await queries.enqueue([harness.NOOP] * args.jobs, [None] * args.jobs, [0] * args.jobs)
    elapsed = time.perf_counter() - started
    assert len(ids) == args.jobs
    await conn.close()
    return {"rate": args.jobs / elapsed, "seconds": elapsed}


async def fill(args):
    conn, queries = await _queries(args.dsn)
    left = args.jobs
    while left > 0:
        chunk = min(left, FILL_CHUNK)
        await queries.enqueue([harness.NOOP] * chunk, [None] * chunk, [0] * chunk)
        left -= chunk
    await conn.close()
    return {"jobs": args.jobs}


def _worker(conn, on_start, limit=None):
    """`limit` ("queue", N): the entrypoint's `concurrency_limit` (pgqueuer has no per-key limit)."""
    if limit is not None and limit[0] != "queue":
        raise SystemExit(f"pgqueuer has no equivalent of --limit {limit[0]}=N")
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint(harness.NOOP, concurrency_limit=limit[1] if limit else 0)
    async def noop(job) -> None:
        on_start(job)

    return pgq


def _run_kwargs(args):
    batch = args.batch or 10
    # max_concurrent_tasks must be >= 2 * batch_size; 0 means unlimited (pgqueuer's default).
    limit = args.concurrency if args.concurrency >= 2 * batch else None
    return {"batch_size": batch, "max_concurrent_tasks": limit}


async def drain(args):
    conn = await asyncpg.connect(args.dsn)
    stamps = []
    pgq = _worker(conn, lambda job: stamps.append(time.time()), harness.parse_limit(args.limit))
    started = time.time()
    await pgq.run(mode=QueueExecutionMode.drain, **_run_kwargs(args))
    ended = time.time()
    await conn.close()
    return harness.drain_result(stamps, started, ended)


async def latency(args):
    conn = await asyncpg.connect(args.dsn)
    producer, queries = await _queries(args.dsn)
    started_at = {}
    done = asyncio.Event()

    def on_start(job):
        started_at[job.id] = time.perf_counter()
        if len(started_at) >= args.jobs:
            done.set()

    pgq = _worker(conn, on_start)
    worker = asyncio.create_task(pgq.run(**_run_kwargs(args)))
    await asyncio.sleep(harness.IDLE_SECONDS)
    sent = {}
    start = time.perf_counter()
    for index in range(args.jobs):
        await asyncio.sleep(harness.paced(start, index, args.interval))
        before = time.perf_counter()
        (job_id,) = await queries.enqueue(harness.NOOP, None)
        sent[job_id] = before
    await asyncio.wait_for(done.wait(), timeout=60)
    pgq.shutdown.set()
    await asyncio.wait_for(worker, timeout=30)
    await producer.close()
    await conn.close()
    latencies = [started_at[job_id] - at for job_id, at in sent.items() if job_id in started_at]
    return harness.latency_result(latencies, args.jobs)


SEED_FINISHED = """
INSERT INTO pgqueuer_log (created, job_id, status, priority, entrypoint, aggregated)
SELECT now() - make_interval(secs => n), -n, 'successful', 0, $1, true
FROM generate_series(1, $2::int) AS n
"""


async def seed_finished(args):
    """pgqueuer deletes a finished job from its queue table; what stays is its pgqueuer_log row."""
    started = time.perf_counter()
    conn = await asyncpg.connect(args.dsn)
    await conn.execute(SEED_FINISHED, harness.NOOP, args.jobs)
    await conn.execute("VACUUM ANALYZE pgqueuer_log")
    await conn.close()
    return {"jobs": args.jobs, "seconds": time.perf_counter() - started}


def main():
    args = harness.parse_args()
    operation = globals()[args.op]
    harness.emit(**asyncio.run(operation(args)))


if __name__ == "__main__":
    main()

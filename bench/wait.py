"""How `App.wait` scales: N coroutines wait on one App while an in-process worker (its own App) runs
their jobs. Prints the connections the waiting App holds and how long after each job's outcome was
committed its waiter woke.

    JOBBUS_DSN=postgresql://... python -m bench.wait --waiters 1000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime

import psycopg

import jobbus


async def measure(dsn: str, waiters: int, concurrency: int) -> None:
    producer = jobbus.App(dsn=dsn)
    worker_app = jobbus.App(dsn=dsn)

    @worker_app.job("bench.wait")
    async def noop(job: jobbus.JobExecution) -> None:
        return None

    async with producer:
        ids = await producer.schedule_many("bench.wait", [{} for _ in range(waiters)])
        woke: dict[object, float] = {}

        async def wait_one(job_id: object) -> jobbus.Job:
            job = await producer.wait(job_id, timeout=300)  # type: ignore[arg-type]
            woke[job_id] = time.time()
            return job

        tasks = [asyncio.create_task(wait_one(job_id)) for job_id in ids]
        await asyncio.sleep(1.0)
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        connections = int(row[0]) if row else -1
        started = time.perf_counter()
        async with worker_app:
            await worker_app.run_worker(concurrency=concurrency, stop_when_empty=True, install_signal_handlers=False)
        drained = time.perf_counter() - started
        jobs = await asyncio.gather(*tasks)
        all_woken = time.perf_counter() - started
    lags = sorted(
        (woke[job.id] - job.finished_at.timestamp()) * 1000 for job in jobs if isinstance(job.finished_at, datetime)
    )
    rows = [
        ("waiters", f"{waiters}"),
        ("connections while waiting", f"{connections} (pool_max_size {producer.settings.pool_max_size} + 1 LISTEN)"),
        ("worker drain", f"{drained:.2f} s"),
        ("all waiters woken", f"{all_woken:.2f} s after the worker started"),
        ("wake lag p50", f"{statistics.median(lags):.1f} ms after the outcome's transaction began"),
        ("wake lag p99", f"{lags[int(len(lags) * 0.99) - 1]:.1f} ms"),
        ("measured at", datetime.now(UTC).isoformat(timespec="seconds")),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=None, help="PostgreSQL DSN (default: JOBBUS_DSN)")
    parser.add_argument("--waiters", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    dsn = args.dsn or jobbus.App().dsn
    asyncio.run(measure(dsn, args.waiters, args.concurrency))


if __name__ == "__main__":
    main()

"""What one claim of a queue with per-key limits costs when its keys are at their limits.

    python bench/keyed_claims.py --admin-dsn postgresql://postgres@127.0.0.1:5432/postgres [--keys 10002]

Creates a scratch database, fills a queue with `--keys` keys that each have one job running and one
queued, and times claims of a worker that can take nothing (every key at `concurrency_per_key=1`, or
with its `rate_limit_per_key` spent), then with 5 free keys beside them. Prints the median and the
range of `--claims` claims per case: the claim statement's time, without its commit (a WAL flush,
10-20 ms on a shared disk, whatever the claim did). Numbers go to docs/benchmarks.md ("Flow control: claims on
10,000 keys") with the commit they were measured at.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg

import jobbus
from jobbus.store import MaintenanceStore, run_sync


def _claim_ms(app: jobbus.App, conn: psycopg.Connection[Any], limit: int) -> tuple[float, int]:
    pairs = run_sync(conn, MaintenanceStore("jobbus").queued_pairs())
    limited = run_sync(conn, app.queue_store.limited_queues())
    statement = app.store.claim_jobs(
        worker_id="bench",
        limit=limit,
        pairs=pairs,
        lease_seconds=600,
        max_payload_bytes=2**20,
        limited_queues=limited,
    )
    with conn.transaction():  # the statement alone: its commit (a WAL flush) is not timed
        started = time.perf_counter()
        jobs = run_sync(conn, statement).jobs
        took = (time.perf_counter() - started) * 1000
    return took, len(jobs)


def _case(dsn: str, keys: int, claims: int, *, rate: bool, vacuum: bool) -> None:
    app = jobbus.App(dsn=dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE jobbus.job")
        conn.execute("DELETE FROM jobbus.queue_setting")
        if rate:
            app.sync.set_queue("keyed", rate_limit_per_key=jobbus.RateLimit(1, per=timedelta(hours=1)))
        else:
            app.sync.set_queue("keyed", concurrency_per_key=1)
        conn.execute(
            "INSERT INTO jobbus.job (id, type, queue, max_attempts, concurrency_key)"
            " SELECT gen_random_uuid(), 't', 'keyed', 3, 'key-' || lpad(n::text, 6, '0')"
            " FROM generate_series(1, %s) AS n, generate_series(1, 2)",
            (keys,),
        )
        conn.execute("VACUUM ANALYZE jobbus.job")
        took, n = _claim_ms(app, conn, keys + 100)  # one of each key: every key at its limit
        print(f"  first claim, {n} of {keys} keys: {took:.0f} ms")
        if vacuum:
            conn.execute("VACUUM jobbus.queue_key, jobbus.queue_key_note, jobbus.job")
        name = "rate budget spent" if rate else "at concurrency_per_key=1"
        for label, free in ((f"{keys} keys {name}, nothing free", 0), ("... and 5 free keys", 5)):
            times, taken = [], []
            for _ in range(claims):
                for _ in range(free):
                    app.sync.schedule("t", {}, queue="keyed", concurrency_key=f"free-{uuid.uuid4()}")
                took, n = _claim_ms(app, conn, 50)
                times.append(took)
                taken.append(n)
            print(
                f"  {label}: median {statistics.median(times):.2f} ms,"
                f" {min(times):.2f}-{max(times):.2f} ms over {claims} claims, took {sum(taken)} of {free * claims}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--keys", type=int, default=10_002)
    parser.add_argument("--claims", type=int, default=20)
    parser.add_argument("--vacuum", action="store_true", help="vacuum after the first claim (as autovacuum would)")
    args = parser.parse_args()
    name = f"jobbus_keyed_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = psycopg.conninfo.make_conninfo(args.admin_dsn, dbname=name)
    try:
        jobbus.App(dsn=dsn).sync.migrate()
        for rate in (False, True):
            _case(dsn, args.keys, args.claims, rate=rate, vacuum=args.vacuum)
    finally:
        with psycopg.connect(args.admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()

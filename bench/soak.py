"""Soak: a steady stream of jobs for a long time, watching for leaks and unbounded growth.

    .venv/bin/python bench/soak.py --minutes 30 --rate 200

A producer schedules `--rate` jobs/s; one worker process (the real CLI) runs them; every `--prune-every`
seconds finished jobs older than a minute are pruned. Pruning bounds the table only together with
vacuum: when the server runs without autovacuum (some test servers do), the soak runs `VACUUM` on the
job table after each prune itself and says so. Every sample prints the worker's RSS, the job
table and index sizes, the queue depth and the connections the database holds; the summary compares
the first and the last samples. Runs against `BENCH_DSN` in a database of its own, dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import jobbus
from jobbus import schema

ROOT = Path(__file__).resolve().parent.parent

app = jobbus.App()


@app.job("soak.work")
async def work(job: jobbus.JobExecution) -> dict[str, Any]:
    await job.checkpoint({"step": 1})
    await job.progress(1, 1)
    return {"n": job.configuration["n"]}


@dataclass
class Sample:
    elapsed_s: float
    worker_rss_mib: float
    table_mib: float
    indexes_mib: float
    queued: int
    finished: int
    connections: int


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _sample(conn: psycopg.Connection[Any], pid: int, start: float) -> Sample:
    row = conn.execute(
        "SELECT pg_table_size('jobbus.job'), pg_indexes_size('jobbus.job'),"
        " (SELECT count(*) FROM jobbus.job WHERE status = 'queued'),"
        " (SELECT count(*) FROM jobbus.job WHERE finished_at IS NOT NULL),"
        " (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database())"
    ).fetchone()
    assert row is not None
    return Sample(
        round(time.monotonic() - start, 1),
        round(_rss_mib(pid), 1),
        round(row[0] / 2**20, 2),
        round(row[1] / 2**20, 2),
        int(row[2]),
        int(row[3]),
        int(row[4]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=float, default=200, help="jobs per second offered")
    parser.add_argument("--sample-every", type=float, default=30)
    parser.add_argument("--prune-every", type=float, default=30)
    parser.add_argument("--concurrency", type=int, default=20)
    args = parser.parse_args()

    server = os.environ.get("BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    name = f"jobbus_soak_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(server, dbname=name)
    try:
        _soak(dsn, args)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def _soak(dsn: str, args: argparse.Namespace) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        schema.migrate(conn, "jobbus")
    env = {**os.environ, "JOBBUS_DSN": dsn}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobbus",
            "worker",
            "--app",
            "bench.soak:app",
            "--concurrency",
            str(args.concurrency),
            "--log-level",
            "WARNING",
        ],
        cwd=ROOT,
        env=env,
    )
    producer = jobbus.App(dsn=dsn)
    samples: list[Sample] = []
    start = time.monotonic()
    scheduled = pruned = 0
    next_sample = next_prune = start
    print(f"soak on {conninfo_to_dict(dsn).get('dbname')}: {args.minutes} min at {args.rate:g} jobs/s")
    try:
        with producer.sync, psycopg.connect(dsn, autocommit=True) as probe:
            autovacuum = probe.execute("SHOW autovacuum").fetchone() == ("on",)
            if not autovacuum:
                print("the server runs without autovacuum: VACUUM jobbus.job after each prune stands in for it")
            while (now := time.monotonic()) - start < args.minutes * 60:
                due = int((now - start) * args.rate) - scheduled
                if due > 0:
                    producer.sync.schedule_many("soak.work", [{"n": scheduled + i} for i in range(due)])
                    scheduled += due
                if now >= next_prune:
                    pruned += producer.sync.prune(timedelta(minutes=1))
                    if not autovacuum:
                        probe.execute("VACUUM jobbus.job")
                    next_prune = now + args.prune_every
                if now >= next_sample:
                    samples.append(_sample(probe, worker.pid, start))
                    print(samples[-1], flush=True)
                    next_sample = now + args.sample_every
                time.sleep(0.05)
            samples.append(_sample(probe, worker.pid, start))
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    first, last = samples[1] if len(samples) > 1 else samples[0], samples[-1]
    print(f"\nscheduled {scheduled}, pruned {pruned}, worker exit {worker.returncode}")
    peak_rss = max(s.worker_rss_mib for s in samples)
    print(f"worker RSS  {first.worker_rss_mib} MiB -> {last.worker_rss_mib} MiB (max {peak_rss})")
    print(f"job table   {first.table_mib} MiB -> {last.table_mib} MiB (max {max(s.table_mib for s in samples)})")
    print(f"indexes     {first.indexes_mib} MiB -> {last.indexes_mib} MiB (max {max(s.indexes_mib for s in samples)})")
    print(f"connections max {max(s.connections for s in samples)}; queued at end {last.queued}")


if __name__ == "__main__":
    main()

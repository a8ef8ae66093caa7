"""Steady stream: 1,000 jobs/s for 20 minutes with retention on: `make bench-steady`.

    .venv/bin/python bench/steady.py                      # 20 minutes at 1,000 jobs/s
    .venv/bin/python bench/steady.py --minutes 5 --dsn postgresql://postgres@127.0.0.1:5499/postgres

A producer in this process schedules `--rate` jobs/s (one `schedule_many` call every 20 ms, paced on
absolute times); one worker process (the real CLI, `bench.apps:app`, no-op handler) runs them, with
`retention_completed_seconds` set to `--retention` so that its leader's cleaner deletes finished jobs
in batches while the stream goes on. Every `--sample-every` seconds it prints and keeps one sample:
the job table's heap and index sizes, live and dead tuples, autovacuum runs, the queued backlog, the
rows deleted so far, the load average, and the pickup latency p50/p99 of the jobs claimed since the
previous sample (`started_at - available_at`, both the database's clock: from the insert's
transaction to the claim's). The summary compares the first full minute with the last.

Run it against a server with autovacuum on, as production runs (the shared test server has it off;
the script says so in its output). Runs in a database of its own, dropped at the end; the samples go
to `bench/results/steady-latest.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/steady.py` puts bench/ first, not the repository root
    sys.path.insert(0, str(ROOT))

import jobbus  # noqa: E402
from bench import capacity, harness  # noqa: E402
from jobbus import schema  # noqa: E402

RAW = ROOT / "bench" / "results" / "steady-latest.json"
TICK = 0.02

SAMPLE_SQL = """
SELECT pg_table_size('jobbus.job'), pg_indexes_size('jobbus.job'),
       s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.vacuum_count, s.n_tup_del,
       (SELECT count(*) FROM jobbus.job WHERE status = 'queued'),
       (SELECT count(*) FROM jobbus.job),
       (SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - available_at))
          FROM jobbus.job WHERE started_at > %(since)s),
       (SELECT percentile_disc(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - available_at))
          FROM jobbus.job WHERE started_at > %(since)s),
       (SELECT count(*) FROM jobbus.job WHERE started_at > %(since)s),
       now()
FROM pg_stat_user_tables AS s WHERE s.relid = 'jobbus.job'::regclass
"""


@dataclass
class Sample:
    minute: float
    table_mib: float
    indexes_mib: float
    live_tuples: int
    dead_tuples: int
    autovacuums: int
    vacuums: int
    deleted: int
    queued: int
    rows: int
    pickup_p50_ms: float
    pickup_p99_ms: float
    claimed: int
    scheduled: int
    #: CPU of the whole server (postmaster and every process it started) and of the worker process, in
    #: cores over the interval since the previous sample; NaN when the server is not on this machine.
    server_cores: float
    worker_cores: float
    load1: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=os.environ.get("BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--rate", type=float, default=1000, help="jobs per second offered")
    parser.add_argument("--sample-every", type=float, default=60, help="seconds between samples")
    parser.add_argument("--retention", type=float, default=120, help="retention_completed_seconds of the worker")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--output", type=Path, default=RAW)
    return parser.parse_args(argv)


def interrupt(signum: int, frame: object) -> None:
    """SIGTERM stops the stream like Ctrl-C: the worker is stopped and the database dropped."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, interrupt)
    name = f"jbb_steady_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(args.dsn, dbname=name)
    try:
        samples, info = asyncio.run(stream(dsn, args))
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    summarize(samples, info)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps({"settings": info, "samples": [asdict(s) for s in samples]}, indent=1), encoding="utf-8"
    )
    print(f"samples written to {args.output}")
    return 0


def start_worker(dsn: str, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBBUS_")}
    env.update(JOBBUS_DSN=dsn, JOBBUS_RETENTION_COMPLETED_SECONDS=str(args.retention))
    argv = [sys.executable, "-m", "jobbus", "worker", "--app", "bench.apps:app"]
    argv += ["--concurrency", str(args.concurrency), "--log-level", "WARNING"]
    return subprocess.Popen(argv, cwd=ROOT, env=env)


async def stream(dsn: str, args: argparse.Namespace) -> tuple[list[Sample], dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        schema.migrate(conn, "jobbus")
        settings = {
            name: str(conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()[0])  # type: ignore[index]
            for name in ("server_version", "autovacuum", "fsync", "synchronous_commit", "shared_buffers")
        }
    info: dict[str, Any] = {
        "minutes": args.minutes,
        "rate": args.rate,
        "retention_completed_seconds": args.retention,
        "concurrency": args.concurrency,
        "server": settings,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    print(f"steady stream: {args.minutes:g} min at {args.rate:g} jobs/s, retention {args.retention:g} s; {settings}")
    if settings["autovacuum"] != "on":
        print("note: this server runs without autovacuum; dead tuples are only reclaimed by VACUUM")
    worker = start_worker(dsn, args)
    producer = jobbus.App(dsn=dsn)
    samples: list[Sample] = []
    scheduled = 0
    try:
        async with producer:
            with psycopg.connect(dsn, autocommit=True) as probe:
                since = probe.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
                clock = CpuClock(probe, worker.pid)
                start = time.monotonic()
                next_sample = start + args.sample_every
                tick = 0
                while (now := time.monotonic()) - start < args.minutes * 60:
                    due = int((now - start) * args.rate) - scheduled
                    if due > 0:
                        await producer.schedule_many(harness.NOOP, [{}] * due)
                        scheduled += due
                    if now >= next_sample:
                        sample, since = take_sample(probe, since, (now - start) / 60, scheduled, clock)
                        samples.append(sample)
                        print(sample, flush=True)
                        next_sample += args.sample_every
                    tick += 1
                    await asyncio.sleep(max(0.0, start + tick * TICK - time.monotonic()))
                sample, since = take_sample(probe, since, (time.monotonic() - start) / 60, scheduled, clock)
                samples.append(sample)
                print(sample, flush=True)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    info["scheduled"] = scheduled
    info["worker_exit"] = worker.returncode
    return samples, info


class CpuClock:
    """CPU seconds of the server (read from its postmaster.pid: needs the server on this machine, and a
    server of its own for the figure to mean anything) and of the worker process, between two reads."""

    def __init__(self, conn: psycopg.Connection[Any], worker_pid: int) -> None:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
        self.postmaster: int | None = None
        with contextlib.suppress(OSError, ValueError, TypeError):
            self.postmaster = int((Path(str(row[0] if row else "")) / "postmaster.pid").read_text().split()[0])
        self.worker = worker_pid
        self.last = (time.monotonic(), self.server_seconds(), capacity.process_cpu_seconds(worker_pid) or math.nan)

    def server_seconds(self) -> float:
        if self.postmaster is None:
            return math.nan
        try:
            own = Path(f"/proc/{self.postmaster}/stat").read_text().rsplit(")", 1)[1].split()
            children = Path(f"/proc/{self.postmaster}/task/{self.postmaster}/children").read_text().split()
        except OSError:
            return math.nan
        total = sum(int(v) for v in own[11:15]) / capacity.CLOCK_TICKS  # utime stime cutime cstime
        return total + sum(capacity.process_cpu_seconds(int(pid)) or 0.0 for pid in children)

    def cores(self) -> tuple[float, float]:
        now = (time.monotonic(), self.server_seconds(), capacity.process_cpu_seconds(self.worker) or math.nan)
        elapsed = now[0] - self.last[0]
        server, worker = (now[1] - self.last[1]) / elapsed, (now[2] - self.last[2]) / elapsed
        self.last = now
        return server, worker


def take_sample(
    conn: psycopg.Connection[Any], since: Any, minute: float, scheduled: int, clock: CpuClock
) -> tuple[Sample, Any]:
    server_cores, worker_cores = clock.cores()
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(SAMPLE_SQL, {"since": since}).fetchone()
    assert row is not None
    p50 = float(row[9]) * 1000 if row[9] is not None else float("nan")
    p99 = float(row[10]) * 1000 if row[10] is not None else float("nan")
    sample = Sample(
        minute=round(minute, 2),
        table_mib=round(row[0] / 2**20, 1),
        indexes_mib=round(row[1] / 2**20, 1),
        live_tuples=int(row[2]),
        dead_tuples=int(row[3]),
        autovacuums=int(row[4]),
        vacuums=int(row[5]),
        deleted=int(row[6]),
        queued=int(row[7]),
        rows=int(row[8]),
        pickup_p50_ms=round(p50, 2),
        pickup_p99_ms=round(p99, 2),
        claimed=int(row[11]),
        scheduled=scheduled,
        server_cores=round(server_cores, 3),
        worker_cores=round(worker_cores, 3),
        load1=round(os.getloadavg()[0], 2),
    )
    return sample, row[12]


def summarize(samples: list[Sample], info: dict[str, Any]) -> None:
    if not samples:
        print("no samples")
        return
    first, last = samples[0], samples[-1]
    print(f"\nscheduled {info['scheduled']:,} in {info['minutes']:g} min, worker exit {info['worker_exit']}")
    for label, attr in (("table MiB", "table_mib"), ("indexes MiB", "indexes_mib"), ("rows", "rows")):
        values = [getattr(s, attr) for s in samples]
        print(f"{label:<12} first {getattr(first, attr)} last {getattr(last, attr)} max {max(values)}")
    print(f"dead tuples  max {max(s.dead_tuples for s in samples):,}; autovacuum runs {last.autovacuums}")
    print(f"pickup p99   max {max(s.pickup_p99_ms for s in samples)} ms; queued at end {last.queued}")
    print(f"load average {min(s.load1 for s in samples)}-{max(s.load1 for s in samples)}")
    busy = samples[1:] or samples
    server = statistics.median(s.server_cores for s in busy)
    worker = statistics.median(s.worker_cores for s in busy)
    jobs = info["rate"]
    print(f"CPU (median of the samples after the first): server {server:.2f} cores, worker {worker:.2f} cores")
    print(f"  server {server / jobs * 1000:.3f} ms per job, worker {worker / jobs * 1000:.3f} ms per job")


if __name__ == "__main__":
    sys.exit(main())

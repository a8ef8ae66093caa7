"""What serving several cells costs one worker process (SPEC 23): `make bench-cells`.

    .venv/bin/python bench/cells.py                         # 100,000 jobs, 1, 2 and 3 cells, 3 rounds
    .venv/bin/python bench/cells.py --jobs 20000 --rounds 1  # a short check that it works

Each round drains the same number of no-op jobs with one `jobbus worker` process (the real CLI, the
benchmark app `bench.apps:app`, `--concurrency` in all) over 1, 2 and 3 cells, each a database of the
server at BENCH_DSN: one cell is an ordinary single-database worker (`JOBBUS_DSN`), N cells a worker
given `JOBBUS_CELLS` with the jobs spread evenly over them. The drains are interleaved round by round.
Per drain: the steady rate (first to last handler start, as bench/run.py defines it), the rate from
start to exit, the worker process's CPU per job and the machine's other busy time per job (the
database's backends, from /proc/stat), so that what N cells add to one process shows beside what
they add to the database. On one server the cells share its CPU: the figures say what one process
pays to serve N cells, not what N servers would give (docs/capacity.md#cells).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.capacity import process_cpu_seconds  # noqa: E402
from bench.suite import DEFAULT_DSN, Server, clean_env, log, run_driver  # noqa: E402

DB_PREFIX = "jbb_cells_"


def busy_seconds() -> float:
    """Every CPU's busy time so far (all ticks but idle and iowait), from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text(encoding="ascii").split("\n", 1)[0].split()[1:9]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def drain(server: Server, names: list[str], jobs: int, concurrency: int) -> dict[str, float]:
    """Fill `jobs` spread over the databases `names`, then drain them with one worker process."""
    driver = [sys.executable, "-m", "bench.jobbus_driver"]
    for index, name in enumerate(names):
        dsn = server.dsn_for(name)
        with server.connect(name) as conn:
            conn.execute("TRUNCATE jobbus.job CASCADE")
        share = jobs // len(names) + (1 if index < jobs % len(names) else 0)
        run_driver([*driver, "fill", "--dsn", dsn, "--jobs", str(share)])
        with server.connect(name) as conn:
            conn.execute("VACUUM ANALYZE jobbus.job")
    server.checkpoint()
    server.sample_noise()
    with tempfile.TemporaryDirectory() as tmp:
        stamps = Path(tmp) / "stamps.json"
        if len(names) == 1:
            where = {"JOBBUS_DSN": server.dsn_for(names[0])}
        else:
            where = {"JOBBUS_CELLS": ";".join(f"c{i}={server.dsn_for(n)}" for i, n in enumerate(names))}
        env = clean_env(BENCH_STAMPS_FILE=str(stamps), **where)
        argv = [sys.executable, "-m", "jobbus", "worker", "--app", "bench.apps:app", "--stop-when-empty"]
        argv += ["--concurrency", str(concurrency), "--log-level", "WARNING"]
        busy, started = busy_seconds(), time.time()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        worker_cpu = 0.0
        while proc.poll() is None:
            worker_cpu = process_cpu_seconds(proc.pid) or worker_cpu
            time.sleep(0.05)
        ended = time.time()
        machine = busy_seconds() - busy
        output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        if proc.returncode != 0 or not stamps.exists():
            raise SystemExit(f"the worker exited {proc.returncode}: {output[-2000:]}")
        summary = json.loads(stamps.read_text(encoding="utf-8"))
    count = int(summary["count"])
    if count != jobs:
        raise SystemExit(f"{count} handler runs for {jobs} jobs over {len(names)} cell(s)")
    steady = (count - 1) / (summary["last"] - summary["first"])
    return {
        "steady": steady,
        "wall": count / (ended - started),
        "worker_us": worker_cpu * 1e6 / count,
        "rest_us": max(0.0, machine - worker_cpu) * 1e6 / count,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=os.environ.get("BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cells", default="1,2,3", help="the cell counts to measure, comma-separated")
    args = parser.parse_args(argv)
    counts = [int(part) for part in args.cells.split(",")]
    server = Server(args.dsn, quiet_threshold=0.5)
    names = [f"{DB_PREFIX}{os.getpid()}_{i}" for i in range(max(counts))]
    figures: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
    try:
        for name in names:
            server.create_database(name)
            run_driver([sys.executable, "-m", "bench.jobbus_driver", "setup", "--dsn", server.dsn_for(name)])
        for round_ in range(args.rounds):
            for n in counts:
                result = drain(server, names[:n], args.jobs, args.concurrency)
                figures[n].append(result)
                log(
                    f"round {round_ + 1}, {n} cell(s): {result['steady']:,.0f} jobs/s steady, {result['wall']:,.0f} "
                    f"start to exit, worker {result['worker_us']:.1f} µs/job, the rest {result['rest_us']:.1f} µs/job"
                )
    finally:
        for name in names:
            server.drop_database(name)
    print(_table(figures, args))
    return 0


def _table(figures: dict[int, list[dict[str, float]]], args: argparse.Namespace) -> str:
    def cell(values: list[float], digits: int) -> str:
        if not values:
            return "-"
        return f"{statistics.median(values):,.{digits}f} ({min(values):,.{digits}f}–{max(values):,.{digits}f})"

    lines = [
        f"{args.jobs:,} no-op jobs per drain, one worker process at c{args.concurrency}, {args.rounds} rounds "
        "(median, min–max)",
        "",
        "| cells | steady (jobs/s) | start to exit (jobs/s) | worker CPU (µs/job) | the rest (µs/job) |",
        "|---|---|---|---|---|",
    ]
    for n, runs in figures.items():
        values: dict[str, list[float]] = {k: [r[k] for r in runs if not math.isnan(r[k])] for k in runs[0]}
        lines.append(
            f"| {n} | {cell(values['steady'], 0)} | {cell(values['wall'], 0)} | {cell(values['worker_us'], 1)} "
            f"| {cell(values['rest_us'], 1)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

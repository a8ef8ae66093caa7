"""What one enqueue's round trip is made of: the server, the driver and jobbus, apart.

    .venv/bin/python -m bench.round_trips                  # 2,000 calls per figure, 3 interleaved rounds
    .venv/bin/python -m bench.round_trips --gap-ms 20      # each call after 20 ms of idling

In a fresh database with the jobbus schema, one connection each, prepared statements, one call at a
time: `SELECT 1` (the round trip alone); jobbus's one-job insert (`insert_job`, as `app.schedule`
sends it) through a bare psycopg connection (the driver's floor for the same server work); and
`app.schedule` itself. With `pgbench` on PATH, the same insert through libpq alone (`pgbench -M
prepared`, the id drawn by the server): what the server and a C client make of it. Prints wall time
and this process's CPU time per call (getrusage), the median of the rounds.

`--gap-ms` sleeps between two calls, as an idle worker's jobs arrive: what waking the machine's cores
for each call adds to it (the idle pickup scenario of `make bench` schedules one job every 20 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import psycopg

from bench import apps, harness
from bench.suite import Server, add_server_arguments
from jobbus import schema as schema_module
from jobbus.requests import JobRequest
from jobbus.store import Statement

Call = Callable[[], Awaitable[object]]


async def timed(call: Call, calls: int, gap: float) -> tuple[float, float]:
    """(wall µs, CPU µs) per call; a gap's sleep is outside both."""
    wall = cpu = 0.0
    for _ in range(calls):
        if gap:
            await asyncio.sleep(gap)
        started, cpu_started = time.perf_counter(), harness.cpu_seconds()
        await call()
        wall += time.perf_counter() - started
        cpu += harness.cpu_seconds() - cpu_started
    return wall / calls * 1e6, cpu / calls * 1e6


def libpq_statement(query: str, params: Mapping[str, Any]) -> str:
    """The insert with its parameters written in, for pgbench; the id is the server's."""
    literals = {
        name: "NULL" if value is None else "'{}'".format(str(value).replace("'", "''"))
        for name, value in params.items()
    }
    literals["id"] = "gen_random_uuid()"
    text = "\n".join(line for line in query.splitlines() if not line.lstrip().startswith("--"))
    text = re.sub(r"%\((\w+)\)s", lambda m: literals[m.group(1)], text).replace("%%", "%")
    return " ".join(text.split()) + ";\n"


def pgbench_rate(dsn: str, statement: str, seconds: int) -> float | None:
    """Calls per second of the statement through pgbench (one client, prepared); None without pgbench
    or when it fails (a server it cannot reach as given, say)."""
    pgbench = shutil.which("pgbench")
    if pgbench is None:
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(statement)
        script.flush()
        argv = [pgbench, "-n", "-c", "1", "-T", str(seconds), "-M", "prepared", "-f", script.name, dsn]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"pgbench failed, its figure is left out: {done.stderr.strip()[:200]}")
        return None
    tps = re.search(r"tps = ([\d.]+)", done.stdout)
    return float(tps.group(1)) if tps else None


async def measure(dsn: str, calls: int, rounds: int, gap: float) -> dict[str, list[tuple[float, float]]]:
    app = apps.make_app(dsn)
    figures: dict[str, list[tuple[float, float]]] = {}
    async with app, await psycopg.AsyncConnection.connect(dsn, **app.settings.connection_kwargs) as conn:
        spec = app.registry.build_job_spec(JobRequest(harness.NOOP, {}))
        statement = app.store.insert_jobs([spec])
        assert isinstance(statement, Statement)  # one job: the one-row insert, never a COPY
        query, params = statement.query.encode(), dict(statement.params)

        async def select_one() -> object:
            return await (await conn.execute(b"SELECT 1", prepare=True)).fetchall()

        async def bare_insert() -> object:
            params["id"] = uuid.uuid4()
            return await (await conn.execute(query, params, prepare=True)).fetchall()

        async def schedule() -> object:
            return await app.schedule(harness.NOOP, {})

        cases: dict[str, Call] = {
            "SELECT 1, psycopg": select_one,
            "jobbus's insert, bare psycopg": bare_insert,
            "app.schedule": schedule,
        }
        for call in cases.values():  # connections warm, statements prepared
            for _ in range(20):
                await call()
        for _ in range(rounds):
            for name, call in cases.items():
                figures.setdefault(name, []).append(await timed(call, calls, gap))
        text = libpq_statement(statement.query, statement.params)
    libpq = pgbench_rate(dsn, text, 5) if not gap else None  # pgbench cannot idle between calls
    if libpq:
        figures["jobbus's insert, pgbench (libpq)"] = [(1e6 / libpq, math.nan)]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--calls", type=int, default=2000, help="calls per figure and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gap-ms", type=float, default=0.0, help="idle milliseconds before each call")
    args = parser.parse_args()
    server = Server(args.dsn)
    name = f"bench_round_trips_{os.getpid()}"
    dsn = server.create_database(name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            schema_module.migrate(conn, "jobbus")
        print(f"load average before: {os.getloadavg()[0]:.2f}; {args.calls:,} calls x {args.rounds} rounds, "
              f"gap {args.gap_ms:g} ms")  # fmt: skip
        figures = asyncio.run(measure(dsn, args.calls, args.rounds, args.gap_ms / 1000))
    finally:
        server.drop_database(name)
    print(f"{'call':34s} {'wall µs':>8s} {'calls/s':>8s} {'CPU µs':>7s}   rounds (wall µs)")
    for label, values in figures.items():
        wall = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        spread = " / ".join(f"{v[0]:.0f}" for v in values)
        shown_cpu = "-" if math.isnan(cpu) else f"{cpu:.0f}"
        print(f"{label:34s} {wall:8.0f} {1e6 / wall:8,.0f} {shown_cpu:>7s}   {spread}")


if __name__ == "__main__":
    main()

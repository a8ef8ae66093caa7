"""The per-job cost gate: what one worker process does per job on a fixed drain, and what a producer does per
job it enqueues, against a committed baseline.

    JOBBUS_TEST_DSN=postgresql://postgres@127.0.0.1:5432/test .venv/bin/python -m bench.gate
    .venv/bin/python -m bench.gate --update      # write the figures measured now as the new baseline

A fresh database gets `--jobs` no-op jobs; a real `Worker` (concurrency `--concurrency`,
`stop_when_empty`) drains them twice, in this process:

* under `cProfile`, counting every Python function call the process makes during the drain
  (`calls_per_job`): a count, not a time, so the machine's load does not move it;
* without a profiler, timing the process's own CPU (`resource.getrusage(RUSAGE_SELF)`, user + system)
  during the drain (`cpu_us_per_job`): a time, so the machine's load does move it (cache and frequency
  effects of the other processes), which is why only the counts fail the gate by default. The same
  drain counts the objects Python's cyclic garbage collector found unreachable
  (`cycle_objects_per_job`): what reference counting could not free. An attempt that is a reference
  cycle leaves a dozen objects per job to the collector, which walked every live attempt to find them
  (a third of a drain's CPU); this figure fails the gate above `CYCLE_OBJECTS_CEILING`, whatever the
  baseline. So does `batched_cycle_objects_per_job`, the same count for a drain of the same jobs by a
  batch handler of `BATCH_SIZE` (a batch and its attempts refer to each other until its slot is freed).

Before the drain, the producer's side is counted the same way, on an open App: `enqueue_bulk_calls_per_job`
while `--jobs` jobs are scheduled by `schedule_many(type, configurations)` (5,000 a call), and
`enqueue_single_calls_per_job` over `SINGLES` `schedule` calls of one job each.

`--batch-size N` counts instead the calls per job of the same drain with the no-op handler a batch
handler of `N` (`batched_calls_per_job`, printed only: no baseline, no gate).

`--payload-bytes N` gives every job a configuration of `N` characters of text instead of `{}`, and
`--encrypt` runs the producer and the worker with an encryption key (`bench.apps.BENCH_ENCRYPTION_KEY`),
so that every payload is sealed when scheduled and opened before its handler: the same figures, printed
only (no baseline, no gate); run the two with the same `--payload-bytes` to see what the key costs.

The gate fails (exit status 1) when a count (`COUNTS`) is more than `--tolerance` (15 %) above
bench/gate-baseline.json, with a message naming the figure; `--cpu` makes `cpu_us_per_job` fail
the same way (for a quiet machine). Exit status 0 when within; the figures go to stdout as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import os
import pstats
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

import jobbus
from bench.harness import BENCH_ENCRYPTION_KEY
from jobbus import schema as schema_module

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "bench" / "gate-baseline.json"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
NOOP = "gate.noop"
FIGURES = (
    "calls_per_job",
    "enqueue_bulk_calls_per_job",
    "enqueue_single_calls_per_job",
    "cpu_us_per_job",
    "cycle_objects_per_job",
)
#: The figures that fail the gate by default against the baseline: counts, which the machine's load does not move.
COUNTS = FIGURES[:3]
#: Objects per job the cyclic collector may free during the drain (the worker's own start and stop leave
#: a few hundred in all, well under 0.1 per job of 5,000).
CYCLE_OBJECTS_CEILING = 1.0
#: The batch size of the drain by a batch handler whose objects left to the collector are counted too
#: (`batched_cycle_objects_per_job`): a batch and its attempts refer to each other.
BATCH_SIZE = 100
#: One-job `schedule` calls counted for `enqueue_single_calls_per_job` (after `WARM_UP` that are not:
#: psycopg prepares a statement on its fifth execution).
SINGLES = 200
WARM_UP = 10


async def _noop(job: jobbus.JobExecution) -> None:
    return None


async def _noop_batch(batch: jobbus.JobBatch[jobbus.JobExecution]) -> None:
    return None


def _database_dsn(base: str, name: str) -> str:
    return psycopg.conninfo.make_conninfo(base, dbname=name)


def _recreate(base: str, name: str) -> str:
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = _database_dsn(base, name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        schema_module.migrate(conn, "jobbus")
    return dsn


def _drop(base: str, name: str) -> None:
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@dataclass(frozen=True)
class Payload:
    """What each job carries (`configuration`) and the keys the App seals it with (none by default)."""

    configuration: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] = ()


def _app(dsn: str, batch_size: int | None = None, payload: Payload = Payload()) -> jobbus.App:
    app = jobbus.App(dsn=dsn, encryption_keys=payload.keys)
    if batch_size is None:
        app.job(NOOP)(_noop)
    else:
        app.job(NOOP, batch_size=batch_size)(_noop_batch)
    return app


async def _fill(dsn: str, jobs: int, profile: cProfile.Profile | None = None, payload: Payload = Payload()) -> None:
    """`jobs` no-op jobs, 5,000 a `schedule_many`; the profiler (if any) runs only while they are scheduled."""
    async with _app(dsn, payload=payload) as app:
        with profile or contextlib.nullcontext():
            for start in range(0, jobs, 5_000):
                await app.schedule_many(NOOP, [payload.configuration] * min(5_000, jobs - start))


async def _schedule_singly(dsn: str, profile: cProfile.Profile, payload: Payload) -> None:
    """`SINGLES` jobs of another type, one `schedule` each, profiled after `WARM_UP` calls; then deleted."""
    async with _app(dsn, payload=payload) as app:
        for _ in range(WARM_UP):
            await app.schedule("gate.single", payload.configuration)
        with profile:
            for _ in range(SINGLES):
                await app.schedule("gate.single", payload.configuration)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM jobbus.job")


def _calls_per_job(profile: cProfile.Profile, jobs: int) -> float:
    calls: int = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    return round(calls / jobs, 1)


async def _drain(dsn: str, concurrency: int, batch_size: int | None = None, payload: Payload = Payload()) -> int:
    app = _app(dsn, batch_size, payload)
    return await app.run_worker(concurrency=concurrency, stop_when_empty=True, install_signal_handlers=False)


def _completed(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM jobbus.job WHERE status = 'completed'").fetchone()
    assert row is not None
    return int(row[0])


def _check_drained(dsn: str, code: int, jobs: int, what: str) -> None:
    """A drain that did not exit 0 with every job completed measured nothing: the gate stops, saying so."""
    done = _completed(dsn)
    if code != 0 or done != jobs:
        raise SystemExit(f"gate: the {what} drain ended with code {code}, {done} of {jobs} jobs completed")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _run(main: Callable[[], Coroutine[Any, Any, int]], profile: cProfile.Profile | None) -> int:
    """One drain in a fresh event loop; the profiler (if any) runs only while the loop does."""
    if profile is not None:
        profile.enable()
    try:
        return asyncio.run(main())
    finally:
        if profile is not None:
            profile.disable()


def measure(
    base: str, jobs: int, concurrency: int, show: int = 0, dump: str | None = None, payload: Payload = Payload()
) -> dict[str, Any]:
    name = f"jobbus_gate_{os.getpid()}"
    figures: dict[str, Any] = {}
    try:
        # The producer's counts: one job per `schedule`, then the fill by `schedule_many`.
        dsn = _recreate(base, name)
        profile = cProfile.Profile()
        asyncio.run(_schedule_singly(dsn, profile, payload))
        figures["enqueue_single_calls_per_job"] = _calls_per_job(profile, SINGLES)
        profile = cProfile.Profile()
        asyncio.run(_fill(dsn, jobs, profile, payload))
        figures["enqueue_bulk_calls_per_job"] = _calls_per_job(profile, jobs)
        # The count: a drain under cProfile, every Python-level call of the process.
        profile = cProfile.Profile()
        code = _run(lambda: _drain(dsn, concurrency, payload=payload), profile)
        _check_drained(dsn, code, jobs, "profiled")
        stats = pstats.Stats(profile)
        figures["calls_per_job"] = _calls_per_job(profile, jobs)
        if show:
            _show(stats, jobs, show)
        if dump:
            stats.dump_stats(dump)
        # The time: the same drain without a profiler, the process's own CPU.
        dsn = _recreate(base, name)
        asyncio.run(_fill(dsn, jobs, payload=payload))
        with _collected() as collected:
            before = _cpu()
            code = _run(lambda: _drain(dsn, concurrency, payload=payload), None)
            cpu = _cpu() - before
        _check_drained(dsn, code, jobs, "timed")
        figures["cpu_us_per_job"] = round(cpu * 1e6 / jobs, 1)
        figures["cycle_objects_per_job"] = round(collected[0] / jobs, 2)
        figures["batched_cycle_objects_per_job"] = _batched_cycle_objects(base, name, jobs, concurrency, payload)
    finally:
        _drop(base, name)
    return figures


def _batched_cycle_objects(base: str, name: str, jobs: int, concurrency: int, payload: Payload) -> float:
    """Objects per job the cyclic collector freed during a drain of the same jobs by a batch handler."""
    dsn = _recreate(base, name)
    asyncio.run(_fill(dsn, jobs, payload=payload))
    with _collected() as collected:
        code = _run(lambda: _drain(dsn, max(1, concurrency // 10), BATCH_SIZE, payload), None)
    _check_drained(dsn, code, jobs, "batched")
    return round(collected[0] / jobs, 2)


def measure_batched(
    base: str, jobs: int, concurrency: int, batch_size: int, show: int = 0, dump: str | None = None
) -> dict[str, Any]:
    """`calls_per_job` of the same drain with the no-op handler a batch handler of `batch_size` (no baseline)."""
    name = f"jobbus_gate_{os.getpid()}"
    try:
        dsn = _recreate(base, name)
        asyncio.run(_fill(dsn, jobs))
        profile = cProfile.Profile()
        code = _run(lambda: _drain(dsn, concurrency, batch_size), profile)
        _check_drained(dsn, code, jobs, "batched")
        if show:
            _show(pstats.Stats(profile), jobs, show)
        if dump:
            pstats.Stats(profile).dump_stats(dump)
        return {"batched_calls_per_job": _calls_per_job(profile, jobs), "batch_size": batch_size}
    finally:
        _drop(base, name)


@contextlib.contextmanager
def _collected() -> Iterator[list[int]]:
    """Counts, in its one item, the objects the cyclic collector finds unreachable in the block and in
    a full collection at its end (what the block left for a later collection)."""
    found = [0]

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            found[0] += info["collected"]

    gc.collect()
    gc.callbacks.append(count)
    try:
        yield found
        gc.collect()
    finally:
        gc.callbacks.remove(count)


def _show(stats: pstats.Stats, jobs: int, top: int) -> None:
    """The functions that make the most calls, per job (to stderr): where the count comes from."""
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][1])  # type: ignore[attr-defined]
    print("calls/job  tottime µs/job  function (under cProfile)", file=sys.stderr)
    for (path, line, name), (_, calls, tottime, _, _) in rows[:top]:
        where = path.split("/site-packages/")[-1].split("/src/")[-1]
        print(f"{calls / jobs:9.2f}  {tottime * 1e6 / jobs:14.2f}  {name} ({where}:{line})", file=sys.stderr)


def _commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def compare(figures: dict[str, Any], baseline: dict[str, Any], tolerance: float, gated: tuple[str, ...]) -> list[str]:
    """One message per gated figure more than `tolerance` above its baseline."""
    failures = []
    for figure in gated:
        now, then = float(figures[figure]), float(baseline[figure])
        if now > then * (1 + tolerance):
            failures.append(
                f"gate: {figure} regressed: {now} per job against a baseline of {then} "
                f"(+{(now / then - 1) * 100:.1f} %, allowed +{tolerance * 100:.0f} %; "
                f"baseline from commit {baseline.get('commit', '?')} in {BASELINE.relative_to(ROOT)})"
            )
    return failures


def cycles(figures: dict[str, Any]) -> list[str]:
    """A message for each drain (one job a call, a batch handler's) that left more than
    `CYCLE_OBJECTS_CEILING` objects per job to the collector."""
    failures = []
    for figure in ("cycle_objects_per_job", "batched_cycle_objects_per_job"):
        found = float(figures.get(figure, 0.0))
        if found > CYCLE_OBJECTS_CEILING:
            failures.append(
                f"gate: {figure} is {found}: the drain left {found} objects per job that only the cyclic "
                f"garbage collector could free (at most {CYCLE_OBJECTS_CEILING} allowed); something of each "
                "attempt is a reference cycle (run the drain with gc.set_debug(gc.DEBUG_SAVEALL) and count the "
                "types in gc.garbage)"
            )
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=os.environ.get("JOBBUS_TEST_DSN", DEFAULT_DSN))
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--cpu", action="store_true", help="fail on cpu_us_per_job too (quiet machines only)")
    parser.add_argument("--show", type=int, default=0, metavar="N", help="print the N most called functions")
    parser.add_argument("--dump", metavar="PATH", help="write the profile (pstats format) to PATH")
    parser.add_argument("--update", action="store_true", help=f"write the figures to {BASELINE.name}")
    parser.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help="count calls per job of the drain with a batch handler of N instead (no baseline, no gate)",
    )
    parser.add_argument(
        "--payload-bytes", type=int, default=0, metavar="N", help="each job's configuration N characters of text"
    )
    parser.add_argument("--encrypt", action="store_true", help="seal every payload with an encryption key")
    args = parser.parse_args(argv)
    payload = Payload(
        {"data": "x" * args.payload_bytes} if args.payload_bytes else {},
        (BENCH_ENCRYPTION_KEY,) if args.encrypt else (),
    )
    if args.batch_size is not None:
        batched = measure_batched(args.dsn, args.jobs, args.concurrency, args.batch_size, args.show, args.dump)
        print(json.dumps({**batched, "jobs": args.jobs, "concurrency": args.concurrency, "commit": _commit()}))
        return 0
    started = time.monotonic()
    figures = measure(args.dsn, args.jobs, args.concurrency, args.show, args.dump, payload)
    load = os.getloadavg()[0]
    report = {
        **figures,
        "jobs": args.jobs,
        "concurrency": args.concurrency,
        "commit": _commit(),
        "load_average": round(load, 2),
        "seconds": round(time.monotonic() - started, 1),
    }
    if payload != Payload():  # another workload than the baseline's: figures only
        report.update(payload_bytes=args.payload_bytes, encrypted=args.encrypt)
        print(json.dumps(report))
        return 0
    print(json.dumps(report))
    if args.update:
        BASELINE.write_text(
            json.dumps({k: report[k] for k in (*FIGURES, "jobs", "concurrency", "commit", "load_average")}, indent=1)
            + "\n",
            encoding="utf-8",
        )
        return 0
    baseline = json.loads(BASELINE.read_text(encoding="utf-8"))
    if (baseline["jobs"], baseline["concurrency"]) != (args.jobs, args.concurrency):
        print(
            f"gate: the baseline was measured on {baseline['jobs']} jobs at concurrency {baseline['concurrency']}",
            file=sys.stderr,
        )
        return 2
    failures = compare(figures, baseline, args.tolerance, (*COUNTS, "cpu_us_per_job") if args.cpu else COUNTS)
    failures += cycles(figures)
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

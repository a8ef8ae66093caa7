"""`jobbus bench`: throughput and latency of jobbus against your own database, in a throwaway schema.

Two modes:

- ``burn-down``: schedule ``--jobs`` no-op jobs with `App.schedule_many`, then drain them with one
  in-process worker (``stop_when_empty``). The jobs/s figure is the steady rate between the first and
  the last handler start, so connection setup and the final flush are outside it.
- ``steady``: offer ``--rate`` jobs/s (paced `schedule_many` calls every 10 ms) while the worker runs,
  until ``--jobs`` have run. The latency percentiles (schedule call → handler start) are what a job
  waits at that load.

The jobs live in a dedicated schema (``jobbus_bench`` unless ``--schema``), migrated for the run and
dropped afterwards unless ``--keep``. The application's schema is never touched: the configured
schema (``JOBBUS_SCHEMA``, default ``jobbus``) is refused, and so is any schema that holds jobs other
than the benchmark's own.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import click
import psycopg
from psycopg import sql
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from jobbus import schema as schema_module
from jobbus.app import App
from jobbus.cli import exit_codes
from jobbus.cli.errors import UsageProblem, fail, probe_database, run
from jobbus.cli.loading import settings_from_env
from jobbus.execution import JobExecution
from jobbus.settings import validate_schema_name

#: The only job type the benchmark schedules, runs and deletes.
BENCH_TYPE = "jobbus.bench.noop"
DEFAULT_SCHEMA = "jobbus_bench"
#: Jobs per `schedule_many` call when filling the backlog (one round trip each).
SCHEDULE_CHUNK = 5_000
#: Steady mode: the producer schedules what is due every TICK seconds.
TICK = 0.01


class BenchRefused(Exception):
    """The chosen schema is not one the benchmark may write to and drop."""


@dataclass
class _Probe:
    """What the benchmark handler notes: when each job started, and how long after it was scheduled."""

    started: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class BenchReport:
    mode: str
    schema: str
    jobs: int
    jobs_run: int
    concurrency: int
    offered_rate: float | None
    jobs_per_second: float
    wall_jobs_per_second: float
    schedule_jobs_per_second: float
    latency_ms: dict[str, float]


@click.command("bench")
@click.option("--dsn", envvar="JOBBUS_DSN", metavar="DSN", help="PostgreSQL DSN (default: JOBBUS_DSN).")
@click.option(
    "--mode",
    type=click.Choice(["burn-down", "steady"]),
    default="burn-down",
    show_default=True,
    help="burn-down: drain a backlog as fast as possible; steady: offer --rate jobs/s.",
)
@click.option("--jobs", type=click.IntRange(min=1), default=10_000, show_default=True, help="Jobs to run.")
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=1_000.0,
    show_default=True,
    metavar="R",
    help="Steady mode: jobs/s offered.",
)
@click.option("--concurrency", type=click.IntRange(min=1), default=200, show_default=True, help="Worker concurrency.")
@click.option(
    "--schema",
    "schema_name",
    default=DEFAULT_SCHEMA,
    show_default=True,
    metavar="NAME",
    help="Throwaway schema for the benchmark's jobs.",
)
@click.option("--keep", is_flag=True, help="Keep the schema and the jobs afterwards (default: drop them).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON document.")
def bench_command(
    dsn: str | None,
    mode: str,
    jobs: int,
    rate: float,
    concurrency: int,
    schema_name: str,
    keep: bool,
    as_json: bool,
) -> None:
    """Measure jobs/s and schedule→start latency on your own database, in a throwaway schema.

    \b
    burn-down  schedule --jobs no-op jobs, then drain them with one worker (jobs/s it sustains)
    steady     offer --rate jobs/s while the worker runs (latency at that load)

    The jobs live in their own schema (default jobbus_bench), migrated for the run and dropped
    after it unless --keep. Your application's schema is never touched.

    \b
    Examples:
      jobbus bench --dsn postgresql://localhost/app --jobs 50000 --concurrency 200
      jobbus bench --mode steady --rate 2000 --jobs 20000
    """
    try:
        schema = validate_schema_name(schema_name)
        settings = settings_from_env(dsn)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if not settings.dsn:
        raise click.UsageError("no database: pass --dsn or set JOBBUS_DSN")
    if schema == settings.schema:
        raise UsageProblem(
            f"--schema {schema}: that is the application's schema; the benchmark needs a throwaway one "
            f"(default {DEFAULT_SCHEMA})"
        )
    target_dsn = settings.dsn

    async def body() -> int:
        await probe_database(target_dsn)
        try:
            created = await asyncio.to_thread(prepare_schema, target_dsn, schema)
        except BenchRefused as exc:
            return fail(str(exc), exit_codes.FAILURE)
        try:
            offered = rate if mode == "steady" else None
            report = await run_bench(target_dsn, schema, mode=mode, jobs=jobs, rate=offered, concurrency=concurrency)
        finally:
            await asyncio.to_thread(cleanup_schema, target_dsn, schema, created=created, keep=keep)
        if as_json:
            click.echo(json.dumps(asdict(report), indent=2))
        else:
            print_report(report, keep=keep)
        return exit_codes.OK

    sys.exit(run(body))


# -- the schema -------------------------------------------------------------------------------------


def prepare_schema(dsn: str, schema: str) -> bool:
    """Migrate the benchmark schema; returns whether it was created by this run.

    An existing schema is used only when it is a jobbus schema holding nothing but benchmark jobs
    (a leftover of `--keep`); those are deleted first.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = %s)", (schema,)).fetchone()
        existed = bool(row and row[0])
        if existed:
            row = conn.execute("SELECT to_regclass(format('%%I.job', %s::text)) IS NOT NULL", (schema,)).fetchone()
            if not (row and row[0]):
                raise BenchRefused(f"schema {schema} exists and is not a jobbus schema: choose another --schema")
            others = conn.execute(
                sql.SQL("SELECT count(*) FROM {}.job WHERE type <> %s").format(sql.Identifier(schema)), (BENCH_TYPE,)
            ).fetchone()
            if others and others[0]:
                raise BenchRefused(
                    f"schema {schema} holds {others[0]} job(s) that are not benchmark jobs: choose another --schema"
                )
        schema_module.migrate(conn, schema)
        if existed:
            _delete_bench_jobs(conn, schema)
    return not existed


def cleanup_schema(dsn: str, schema: str, *, created: bool, keep: bool) -> None:
    """Drop the schema this run created; in a schema that existed before, delete only the benchmark's jobs."""
    if keep:
        return
    with psycopg.connect(dsn, autocommit=True) as conn:
        if created:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        else:
            _delete_bench_jobs(conn, schema)


def _delete_bench_jobs(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(sql.SQL("DELETE FROM {}.job WHERE type = %s").format(sql.Identifier(schema)), (BENCH_TYPE,))


# -- the run ----------------------------------------------------------------------------------------


async def run_bench(
    dsn: str, schema: str, *, mode: str, jobs: int, rate: float | None, concurrency: int
) -> BenchReport:
    """Run the benchmark in `schema` (already migrated) and return its figures."""
    app = App(dsn=dsn, schema=schema)
    probe = _Probe()

    @app.job(BENCH_TYPE)
    async def noop(job: JobExecution) -> None:
        now = time.time()
        probe.started.append(now)
        probe.latencies.append(now - float(job.configuration["sent"]))

    console = Console(stderr=True)
    progress = Progress(
        TextColumn("{task.description:<11}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
    )
    async with app:
        with progress:
            if mode == "burn-down":
                scheduling = progress.add_task("scheduling", total=jobs, rate="")
                began = time.perf_counter()
                left = jobs
                while left > 0:
                    chunk = min(left, SCHEDULE_CHUNK)
                    await app.schedule_many(BENCH_TYPE, [{"sent": time.time()}] * chunk)
                    left -= chunk
                    progress.update(scheduling, advance=chunk)
                schedule_rate = jobs / (time.perf_counter() - began)
                progress.update(scheduling, rate=f"{schedule_rate:,.0f} jobs/s")
                draining = progress.add_task("running", total=jobs, rate="")
                ticker = asyncio.create_task(_tick(progress, draining, probe))
                started = time.time()
                try:
                    await app.run_worker(concurrency=concurrency, stop_when_empty=True, install_signal_handlers=False)
                finally:
                    ticker.cancel()
            else:
                assert rate is not None
                draining = progress.add_task("running", total=jobs, rate="")
                ticker = asyncio.create_task(_tick(progress, draining, probe))
                started = time.time()
                worker = asyncio.create_task(
                    app.run_worker(concurrency=concurrency, limit=jobs, install_signal_handlers=False)
                )
                try:
                    schedule_rate = await _offer(app, jobs, rate, worker)
                    await worker
                finally:
                    ticker.cancel()
                    if not worker.done():
                        worker.cancel()
            ended = time.time()
            _show(progress, draining, probe)
    return _report(mode, schema, jobs, concurrency, rate, probe, started, ended, schedule_rate)


async def _offer(app: App, jobs: int, rate: float, worker: asyncio.Task[int]) -> float:
    """Schedule `jobs` at `rate` jobs/s, in one `schedule_many` per tick; returns the rate achieved."""
    began = time.perf_counter()
    sent = 0
    while sent < jobs and not worker.done():
        due = min(jobs, math.floor(rate * (time.perf_counter() - began)) + 1)
        if due > sent:
            count = min(due - sent, SCHEDULE_CHUNK)
            await app.schedule_many(BENCH_TYPE, [{"sent": time.time()}] * count)
            sent += count
        await asyncio.sleep(TICK)
    return sent / (time.perf_counter() - began)


async def _tick(progress: Progress, task: TaskID, probe: _Probe) -> None:
    while True:
        _show(progress, task, probe)
        await asyncio.sleep(0.1)


def _show(progress: Progress, task: TaskID, probe: _Probe) -> None:
    done = len(probe.started)
    rate = _steady_rate(probe.started)
    progress.update(task, completed=done, rate=f"{rate:,.0f} jobs/s" if not math.isnan(rate) else "")


def _steady_rate(stamps: Sequence[float]) -> float:
    if len(stamps) < 2 or stamps[-1] <= stamps[0]:
        return math.nan
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of `values` (nan when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]


def _report(
    mode: str,
    schema: str,
    jobs: int,
    concurrency: int,
    rate: float | None,
    probe: _Probe,
    started: float,
    ended: float,
    schedule_rate: float,
) -> BenchReport:
    ms = [value * 1000.0 for value in probe.latencies]
    return BenchReport(
        mode=mode,
        schema=schema,
        jobs=jobs,
        jobs_run=len(probe.started),
        concurrency=concurrency,
        offered_rate=rate,
        jobs_per_second=_steady_rate(probe.started),
        wall_jobs_per_second=len(probe.started) / (ended - started) if ended > started else math.nan,
        schedule_jobs_per_second=schedule_rate,
        latency_ms={
            "p50": percentile(ms, 0.50),
            "p95": percentile(ms, 0.95),
            "p99": percentile(ms, 0.99),
            "max": max(ms, default=math.nan),
        },
    )


def print_report(report: BenchReport, *, keep: bool) -> None:
    console = Console()
    table = Table(
        title=f"jobbus bench ({report.mode})", show_header=False, title_justify="left", caption_justify="left"
    )
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("jobs run", f"{report.jobs_run:,} of {report.jobs:,}")
    table.add_row("concurrency", str(report.concurrency))
    if report.offered_rate is not None:
        table.add_row("offered", f"{report.offered_rate:,.0f} jobs/s")
        table.add_row("scheduled", f"{report.schedule_jobs_per_second:,.0f} jobs/s")
    else:
        table.add_row("schedule_many", f"{report.schedule_jobs_per_second:,.0f} jobs/s")
    table.add_row("throughput", f"{report.jobs_per_second:,.0f} jobs/s (first to last handler start)")
    table.add_row("wall", f"{report.wall_jobs_per_second:,.0f} jobs/s (worker start to exit)")
    what = "schedule → start" if report.mode == "steady" else "schedule → start, incl. the wait in the backlog"
    for name in ("p50", "p95", "p99", "max"):
        table.add_row(f"latency {name}", f"{report.latency_ms[name]:,.2f} ms")
    table.caption = f"latency: {what}; schema {report.schema} " + ("kept" if keep else "dropped")
    console.print(table)
    if report.offered_rate is not None and report.jobs_per_second < 0.95 * report.offered_rate:
        console.print(
            f"[yellow]the worker ran {report.jobs_per_second:,.0f} jobs/s, below the {report.offered_rate:,.0f} "
            "offered: latency grew with the backlog (try a higher --concurrency or a lower --rate)[/yellow]"
        )

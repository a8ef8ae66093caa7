"""`jobbus demo`: a guided run of a realistic workload, on the embedded PostgreSQL by default.

It schedules a few groups of jobs (thumbnails with progress and checkpoints, flaky e-mails that fail
and retry, invoices of which one fails for good, and a long index rebuild that gets cancelled while
it runs), runs a worker in this process with live progress bars, then prints what happened and what
to try next. The handlers below are ordinary jobbus handlers: `jobbus worker --app
jobbus.cli.demo:create_app` runs them against any database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shlex
import shutil
import signal
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from jobbus.app import App
from jobbus.cli import exit_codes
from jobbus.cli.dashboard import StopSignals, bind_port, require_dashboard_extra, serve_dashboard, url_of
from jobbus.cli.errors import PortInUse, UsageProblem, fail, probe_database, run
from jobbus.cli.output import console, errors_masked, one_line, shown, styled
from jobbus.errors import NonRetryableError, Snooze
from jobbus.execution import JobExecution, SyncJobExecution
from jobbus.models import GroupProgress, JobStatus
from jobbus.requests import JobRequest

#: The demo must never hang CI: past this, the long job is cancelled and the run winds down.
DEADLINE_SECONDS = 45.0
THUMBNAILS = 240
EMAILS = 40
INVOICES = 12


def create_app(dsn: str | None = None) -> App:
    """The demo App: fast retries and heartbeats so the whole story fits in a few seconds."""
    app = App(
        dsn=dsn,
        retry_base_delay_seconds=0.2,
        retry_max_delay_seconds=1.0,
        retry_jitter=0.2,
        heartbeat_interval_seconds=0.5,
        poll_interval_seconds=0.1,
        lease_seconds=30,
        pool_max_size=20,
    )

    @app.job("demo.thumbnail", queue="media")
    async def thumbnail(job: JobExecution) -> dict[str, Any]:
        """Render each size; the checkpoint makes a retried attempt skip sizes already done."""
        sizes = list(job.configuration["sizes"])
        done = int(job.execution_data.get("done", 0))
        for index in range(done, len(sizes)):
            await asyncio.sleep(random.uniform(0.01, 0.04))  # stand-in for real work
            await job.checkpoint({"done": index + 1})
            await job.progress(index + 1, len(sizes))
        return {"image": job.configuration["image"], "sizes": sizes}

    @app.job("demo.send_email", queue="emails", max_attempts=3)
    def send_email(job: SyncJobExecution) -> dict[str, Any]:
        """A sync handler (runs in a thread). Flaky mail servers fail once, bounces fail every time."""
        time.sleep(random.uniform(0.02, 0.1))
        if job.configuration.get("bounce"):
            raise ConnectionRefusedError(f"550 mailbox unavailable: {job.configuration['to']}")
        if job.configuration.get("flaky") and job.attempt == 1:
            raise TimeoutError("SMTP server did not answer within 10 s")
        return {"sent_to": job.configuration["to"], "attempt": job.attempt}

    @app.job("demo.import_invoice", queue="billing")
    async def import_invoice(job: JobExecution) -> dict[str, Any]:
        """A bad input is not worth retrying: NonRetryableError fails the job at once."""
        await asyncio.sleep(random.uniform(0.05, 0.2))
        if job.configuration["currency"] not in ("EUR", "USD", "GBP"):
            raise NonRetryableError(
                f"invoice {job.configuration['number']}: currency {job.configuration['currency']!r} is not supported"
            )
        return {"imported": job.configuration["number"]}

    @app.job("demo.fetch_rates", queue="billing")
    async def fetch_rates(job: JobExecution) -> dict[str, Any]:
        """Not ready yet: Snooze puts the job back for later without spending an attempt."""
        if not job.execution_data.get("waited"):
            await job.checkpoint({"waited": True})
            raise Snooze(0.3)  # the exchange rates are not published yet
        return {"rates": "published"}

    @app.job("demo.render_report", queue="billing", timeout=0.3)
    async def render_report(job: JobExecution) -> dict[str, Any]:
        """A timeout per type: the first attempt hangs, is cancelled at 0.3 s and retried."""
        await asyncio.sleep(2.0 if job.attempt == 1 and job.configuration.get("hangs") else 0.05)
        return {"pages": 3}

    @app.job("demo.rebuild_index", queue="maintenance")
    async def rebuild_index(job: JobExecution) -> None:
        """Long and cooperative: reports progress and returns as soon as cancellation is requested."""
        steps = int(job.configuration.get("steps", 600))
        for step in range(steps):
            if job.cancellation_requested:
                return  # recorded as cancelled, not completed
            await job.progress(step, steps)
            await asyncio.sleep(0.1)

    return app


@dataclass(frozen=True, slots=True)
class _Group:
    key: str
    label: str
    id: uuid.UUID


@click.command("demo")
@click.option("--dsn", envvar="JOBBUS_DSN", metavar="DSN", help="Use this server instead of the embedded one.")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the embedded PostgreSQL keeps its data.  [default: $XDG_CACHE_HOME/jobbus/demo-pgdata, "
    "or ~/.cache/jobbus/demo-pgdata]",
)
@click.option("--concurrency", type=click.IntRange(1, 64), default=16, show_default=True, help="Jobs at once.")
@click.option(
    "--dashboard",
    is_flag=True,
    help="After the demo, serve the dashboard on its data (and keep the embedded server) until Ctrl-C.",
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8787, show_default=True, help="The dashboard's port (127.0.0.1)."
)
@click.option("--reset", is_flag=True, help="Remove the embedded server's data directory, then exit.")
@click.option("--verbose", is_flag=True, help="Show the worker's log lines.")
def demo_command(
    dsn: str | None, data_dir: Path | None, concurrency: int, dashboard: bool, port: int, reset: bool, verbose: bool
) -> None:
    """A guided run: schedule a realistic mix of jobs, work them off with live progress, show the result.

    With no --dsn and no JOBBUS_DSN it starts the embedded PostgreSQL (the `embedded` extra) in
    --data-dir, says so in one line, and stops it at exit. Takes a few seconds. With --dashboard the
    server stays up after the demo and the dashboard (the `dashboard` extra) serves its jobs on
    http://127.0.0.1:8787 until Ctrl-C or SIGTERM (exit 0).

    \b
    Examples:
      jobbus demo
      jobbus demo --dashboard
      jobbus demo --reset
      JOBBUS_DSN=postgresql://localhost/scratch jobbus demo
    """
    from jobbus.embedded import demo_data_dir

    data_dir = data_dir if data_dir is not None else demo_data_dir()
    if reset:
        if dashboard:
            raise UsageProblem("--reset removes the demo's data and exits: run `jobbus demo --dashboard` after it")
        sys.exit(_reset(data_dir))
    logging.basicConfig(
        level=logging.INFO if verbose else logging.CRITICAL,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not verbose:
        logging.getLogger("jobbus").setLevel(logging.CRITICAL)
    sock: socket.socket | None = None
    if dashboard:  # before the demo runs: a missing extra or a taken port is said at once
        require_dashboard_extra("jobbus demo --dashboard")
        try:
            sock = bind_port("127.0.0.1", port)
        except PortInUse as exc:
            sys.exit(fail(str(exc), exit_codes.UNAVAILABLE))
    embedded = not dsn
    if embedded:
        from jobbus.embedded import start_embedded

        try:
            with _signals_after_start():
                dsn = start_embedded(data_dir)
        except RuntimeError as exc:
            sys.exit(fail(str(exc), exit_codes.CONFIG))
    assert dsn is not None

    async def body() -> int:
        await probe_database(dsn)
        return await _demo(create_app(dsn), embedded=embedded, concurrency=concurrency, dashboard=sock, verbose=verbose)

    try:
        sys.exit(run(body))
    finally:
        if sock is not None:
            sock.close()


@contextlib.contextmanager
def _signals_after_start() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while the embedded server starts (interrupted half-way, it would be
    left running with nobody to stop it), then act on one that came; from then on SIGTERM is Ctrl-C:
    by default it would end the process with no exit handler, so the server would not be stopped."""
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda sig, _: received.append(sig)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous[signal.SIGINT])
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    if received:
        raise KeyboardInterrupt


def _reset(data_dir: Path) -> int:
    from jobbus.embedded import remove_data_dir

    try:
        removed = remove_data_dir(data_dir)
    except RuntimeError as exc:
        return fail(str(exc), exit_codes.FAILURE)
    console().print(shown(f"removed {data_dir}" if removed else f"nothing to remove: {data_dir} does not exist"))
    return exit_codes.OK


async def _demo(
    app: App, *, embedded: bool, concurrency: int, dashboard: socket.socket | None = None, verbose: bool = False
) -> int:
    out = console()
    async with app:
        applied = await app.migrate()
        if applied:
            out.print(shown(f"migrated schema {app.settings.schema} to version {applied[-1].version}"))
        if embedded:  # the demo's own database: forget what earlier runs left
            await app.prune(timedelta(0), ("completed", "failed", "cancelled"))
        groups, long_job = await _schedule(app)
        out.print(
            f"scheduled {THUMBNAILS} thumbnails, {EMAILS} e-mails (some flaky, one bouncing), {INVOICES} invoices "
            f"(one with a bad currency), 3 reports (one not ready yet, one that hangs past its timeout) and 1 long "
            f"index rebuild; running a worker with concurrency {concurrency}"
        )
        started = time.monotonic()
        worker = asyncio.create_task(
            app.run_worker(
                stop_when_empty=True,
                concurrency=concurrency,
                install_signal_handlers=False,
                poll_interval=0.1,
                worker_id=f"demo-{os.getpid()}",
                shutdown_timeout=5.0,
            ),
            name="jobbus-demo-worker",
        )
        try:
            final, problem = await _show_progress(app, groups, long_job, worker)
            code = await asyncio.wait_for(worker, timeout=15.0)
        finally:
            if not worker.done():
                worker.cancel()
                with contextlib.suppress(BaseException):
                    await worker
        elapsed = time.monotonic() - started
        out.print(await _summary(app, groups, final))
        out.print(await _notable(app, groups))
        out.print(Text(f"done in {elapsed:.1f} s (worker exit code {code})", style="bold"))
        jobbus = _jobbus_command()
        if embedded and dashboard is None:
            out.print(shown(f"look at these jobs in the dashboard: {jobbus} demo --dashboard  (jobbus[dashboard])"))
        out.print(_next_steps(embedded, jobbus, dashboard=dashboard is not None))
        if problem is not None:
            return fail(problem, exit_codes.FAILURE)
        if dashboard is not None:
            with StopSignals() as stopping:  # before it says where it serves: a signal from then on stops it
                out.print(
                    Text(f"dashboard on {url_of(dashboard)} with the demo's jobs; Ctrl-C stops it", style="bold")
                    + Text(" and the embedded PostgreSQL" if embedded else "", style="bold")
                )
                await serve_dashboard(app, dashboard, log_level="INFO" if verbose else "WARNING", stopping=stopping)
            out.print("dashboard stopped" + (", stopping the embedded PostgreSQL" if embedded else ""))
    return exit_codes.OK


async def _schedule(app: App) -> tuple[list[_Group], uuid.UUID]:
    run_id = uuid.uuid4().hex[:6]
    groups = [
        _Group("thumbnails", "thumbnails (progress + checkpoints)", uuid.uuid4()),
        _Group("emails", "e-mails (flaky, retried)", uuid.uuid4()),
        _Group("invoices", "invoices (one non-retryable)", uuid.uuid4()),
        _Group("reports", "reports (one snoozed, one timed out)", uuid.uuid4()),
        _Group("maintenance", "index rebuild (cancelled while running)", uuid.uuid4()),
    ]
    by_key = {g.key: g.id for g in groups}
    (long_job,) = await app.schedule_many(
        "demo.rebuild_index", [{"index": "products", "steps": 600}], group_id=by_key["maintenance"], priority=10
    )
    await app.schedule_many(
        "demo.send_email",
        [{"to": f"customer{i}@example.com", "flaky": i % 5 == 2, "bounce": i == EMAILS - 1} for i in range(EMAILS)],
        group_id=by_key["emails"],
        priority=5,
    )
    await app.schedule_many(
        "demo.import_invoice",
        [
            {"number": f"INV-{1000 + i}", "currency": "XYZ" if i == 7 else ("EUR", "USD", "GBP")[i % 3]}
            for i in range(INVOICES)
        ],
        group_id=by_key["invoices"],
    )
    await app.schedule_many(
        [
            JobRequest("demo.fetch_rates", {"date": "today"}, group_id=by_key["reports"]),
            JobRequest("demo.render_report", {"report": "daily", "hangs": True}, group_id=by_key["reports"]),
            JobRequest("demo.render_report", {"report": "weekly"}, group_id=by_key["reports"]),
        ]
    )
    await app.schedule_many(
        "demo.thumbnail",
        [{"image": f"{run_id}-img-{i:04d}.jpg", "sizes": [128, 512]} for i in range(THUMBNAILS)],
        group_id=by_key["thumbnails"],
    )
    return groups, long_job


async def _show_progress(
    app: App, groups: list[_Group], long_job: uuid.UUID, worker: asyncio.Task[int]
) -> tuple[dict[str, GroupProgress], str | None]:
    """Live bars per group until the worker exits; cancels the long job once everything else is done.

    Returns the last counts and, when the story did not go as planned, why.
    """
    progress = Progress(
        TextColumn("{task.description}", justify="left"),
        BarColumn(bar_width=30),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console(),
        refresh_per_second=8,
    )
    tasks: dict[str, TaskID] = {g.key: progress.add_task(g.label, total=None, detail="") for g in groups}
    deadline = time.monotonic() + DEADLINE_SECONDS
    cancel_sent = False
    final: dict[str, GroupProgress] = {}
    with progress:
        while True:
            final = {g.key: await app.group_progress(g.id) for g in groups}
            for key, counts in final.items():
                progress.update(tasks[key], total=counts.total, completed=_terminal(counts), detail=_detail(counts))
            if worker.done():
                break
            late = time.monotonic() > deadline
            if not cancel_sent:
                others_done = all(_terminal(c) == c.total for k, c in final.items() if k != "maintenance")
                job = await app.find(long_job)
                if late or (others_done and job is not None and job.status is JobStatus.RUNNING):
                    await app.cancel(long_job)
                    cancel_sent = True
            if time.monotonic() > deadline + 10:
                return final, f"the demo did not finish within {DEADLINE_SECONDS:.0f} s"
            await asyncio.wait({worker}, timeout=0.15)
    if late:
        return final, f"the demo took longer than {DEADLINE_SECONDS:.0f} s"
    if not cancel_sent:
        return final, "the worker stopped before the long job could be cancelled"
    return final, None


def _terminal(counts: GroupProgress) -> int:
    return counts.completed + counts.failed + counts.cancelled


def _detail(counts: GroupProgress) -> str:
    parts = [f"[green]{counts.completed} ok[/]"]
    if counts.running:
        parts.append(f"[yellow]{counts.running} running[/]")
    if counts.failed:
        parts.append(f"[red]{counts.failed} failed[/]")
    if counts.cancelled:
        parts.append(f"[magenta]{counts.cancelled} cancelled[/]")
    return " ".join(parts)


async def _summary(app: App, groups: list[_Group], final: dict[str, GroupProgress]) -> Table:
    table = Table(title="what happened", title_justify="left")
    for column in ("group", "jobs", "completed", "failed", "cancelled", "retried"):
        table.add_column(column, justify="left" if column == "group" else "right")
    for group in groups:
        jobs = await app.list_jobs(group_id=group.id, limit=10_000)
        counts = final[group.key]
        retried = sum(1 for job in jobs if job.attempts > 1)
        table.add_row(
            group.label,
            str(counts.total),
            str(counts.completed),
            str(counts.failed),
            str(counts.cancelled),
            str(retried),
        )
    return table


async def _notable(app: App, groups: list[_Group]) -> Table:
    table = Table(title="jobs that did not complete", title_justify="left")
    table.add_column("id", no_wrap=True)
    table.add_column("type", no_wrap=True)
    table.add_column("status")
    table.add_column("attempts", justify="right")
    table.add_column("why")
    for group in groups:
        for job in await app.list_jobs(group_id=group.id, status=["failed", "cancelled"], limit=20):
            why = (
                one_line(errors_masked(job).last_error, 90)
                if job.status is JobStatus.FAILED
                else "cancelled while running"
            )
            status, attempts = styled(job.status.value), f"{job.attempts}/{job.max_attempts}"
            table.add_row(str(job.id), shown(job.type), status, attempts, shown(why))
    return table


def _jobbus_command() -> str:
    """How to run `jobbus` again from this shell: `jobbus` when that is the one on PATH, otherwise the
    path this run used (`.venv/bin/jobbus` after `make demo`), relative to the current directory."""
    on_path = shutil.which("jobbus")
    invoked = Path(sys.argv[0])
    if invoked.name == "jobbus":
        if on_path is not None and Path(on_path).resolve() == invoked.resolve():
            return "jobbus"
        return shlex.quote(_relative(invoked))
    if on_path is not None:
        return "jobbus"
    return f"{shlex.quote(_relative(Path(sys.executable)))} -m jobbus"  # run as `python -m jobbus`


def _relative(path: Path) -> str:
    absolute = path.absolute()
    with contextlib.suppress(ValueError):
        return str(absolute.relative_to(Path.cwd()))
    return str(absolute)


def _next_steps(embedded: bool, jobbus: str, *, dashboard: bool = False) -> Text:
    """A walk-through a new user can follow literally, each step building on the one before."""
    text = Text()
    text.append("\nNext, against your own PostgreSQL", style="bold")
    if embedded:
        text.append(
            " (the embedded demo server stops with the dashboard)"
            if dashboard
            else " (the embedded demo server stops now)"
        )
    text.append(":\n", style="bold")
    activate = Path(sys.executable).parent / "activate"
    if jobbus != "jobbus" and activate.exists():
        text.append(f"  (after `source {_relative(activate)}`, plain `jobbus` works too)\n", style="dim")
    emails = "--queue emails --config"
    for command, why in (
        ("createdb app", "an empty database for jobbus (skip if you have one)"),
        ("export JOBBUS_DSN=postgresql://localhost/app", "where jobbus lives (export it in every terminal below)"),
        (f"{jobbus} migrate", "create or upgrade the schema"),
        (
            f"{jobbus} worker --app jobbus.cli.demo:create_app",
            "in a second terminal, in this directory: runs these demo handlers until Ctrl-C",
        ),
        (f'{jobbus} schedule demo.send_email {emails} \'{{"to": "you@example.com"}}\'', "enqueue an e-mail"),
        (
            f'{jobbus} schedule demo.send_email {emails} \'{{"to": "nobody@example.com", "bounce": true}}\'',
            "one that bounces: it fails 3 times",
        ),
        (f"{jobbus} status", "queues, oldest waiting job, workers"),
        (f"{jobbus} dashboard", "the same and more in a browser, live, at http://127.0.0.1:8787 (jobbus[dashboard])"),
        (f"{jobbus} jobs list --status failed", "what failed, and why (the bounce)"),
        (f"{jobbus} pause --queue emails --wait", "stop claiming e-mails during an incident; lasts until resumed"),
        (f"{jobbus} resume --queue emails --wait", "claim them again"),
        (f"{jobbus} drain --all --wait", "let workers finish what is available and exit, e.g. before a deploy"),
    ):
        text.append(f"  {command}\n", style="cyan")
        text.append(f"      {why}\n", style="dim")
    return text

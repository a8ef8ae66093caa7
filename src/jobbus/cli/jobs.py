"""`jobbus jobs list|show|cancel|retry|delete|run-now|update`: look at jobs and act on one or many."""

from __future__ import annotations

import json
import sys
import uuid
from datetime import datetime, timedelta

import click
from rich.console import Group
from rich.table import Table
from rich.text import Text

from jobbus import views
from jobbus.app import App
from jobbus.cli import exit_codes
from jobbus.cli.cells import CellTarget, admin_cells, cell_option, reachable, report_unreachable
from jobbus.cli.errors import UsageProblem, fail, run
from jobbus.cli.options import check_names, dsn_option, json_option, parse_duration
from jobbus.cli.output import (
    Column,
    admin_app,
    console,
    errors_masked,
    fitted_table,
    human_seconds,
    human_time,
    job_dict,
    job_status_text,
    one_line,
    print_json,
    progress_text,
    shown,
)
from jobbus.cli.schedule import parse_when
from jobbus.cli.suggest import SuggestingGroup
from jobbus.encryption import placeholder
from jobbus.errors import InvalidJobError
from jobbus.joblog import history_logs
from jobbus.models import JOB_VIEWS, Job, JobStatus
from jobbus.requests import validate_tags
from jobbus.views import Cursor, Filters

STATUSES = [s.value for s in JobStatus]
#: What `jobs list --status` accepts: the statuses, and the views of queued jobs.
STATUS_CHOICES = [*STATUSES, *JOB_VIEWS]


def _job_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise UsageProblem(f"{text!r} is not a job id (a UUID like 0190f3c4-...)") from None


@click.group("jobs", cls=SuggestingGroup)
def jobs_group() -> None:
    """List jobs, show one, cancel one, retry a failed one, delete one, run a queued one now, change
    queued ones.

    \b
    Examples:
      jobbus jobs list --status failed --queue emails
      jobbus jobs show 0190f3c4-8f2e-7a71-9c1e-2b1f0e6d4a10
      jobbus jobs cancel 0190f3c4-8f2e-7a71-9c1e-2b1f0e6d4a10
      jobbus jobs retry 0190f3c4-8f2e-7a71-9c1e-2b1f0e6d4a10
      jobbus jobs delete 0190f3c4-8f2e-7a71-9c1e-2b1f0e6d4a10
      jobbus jobs run-now 0190f3c4-8f2e-7a71-9c1e-2b1f0e6d4a10
      jobbus jobs update --queue emails --tag tenant:42 --set-queue emails-slow
    """


@jobs_group.command("list")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(STATUS_CHOICES),
    help="Filter by status, or by a view of queued jobs: scheduled, retrying, waiting (repeatable).",
)
@click.option("--queue", "queues", multiple=True, metavar="Q", help="Filter by queue (repeatable).")
@click.option("--type", "types", multiple=True, metavar="T", help="Filter by job type (repeatable).")
@click.option("--name", metavar="NAME", help="Only jobs of this name (a periodic job's, a Django task's path, ...).")
@click.option(
    "--search",
    metavar="TEXT",
    help="Only jobs holding TEXT (any case) in their type, name, unique key, last error or configuration.",
)
@click.option("--group-id", metavar="UUID", help="Only jobs of this group.")
@click.option(
    "--tag", "tags", multiple=True, metavar="TAG", help="Only jobs with this tag (repeatable: with every one)."
)
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True, help="At most N jobs.")
@click.option("--after", metavar="CURSOR", help="Where the previous page ended (what it printed, or its last job id).")
@click.option("--oldest", is_flag=True, help="Without one --status: the oldest jobs first (default: the newest).")
@json_option
@cell_option
@dsn_option
def list_command(
    statuses: tuple[str, ...],
    queues: tuple[str, ...],
    types: tuple[str, ...],
    name: str | None,
    search: str | None,
    group_id: str | None,
    tags: tuple[str, ...],
    limit: int,
    after: str | None,
    oldest: bool,
    as_json: bool,
    cells: tuple[str, ...],
    dsn: str | None,
) -> None:
    """List jobs, filtered; page with --after. Every matching job is reached, page after page.

    \b
    With one --status, in the order of the dashboard's tab of that status: queued jobs and their
    views by when they run next, running ones the latest start first, finished ones the latest
    finish first. Without, or with several, in creation order, the newest first.

    \b
    Statuses: queued, running, completed, failed, cancelled (as `jobbus status` and the dashboard),
    and the views of queued jobs: scheduled (available later, never attempted), retrying (queued
    again after a failed attempt) and waiting (parked in a durable sleep or wait).

    \b
    Examples:
      jobbus jobs list --status failed --search "not found"
      jobbus jobs list --status scheduled --queue emails --limit 20
      jobbus jobs list --type report.render --json | jq -r '.[].id'
      jobbus jobs list --status failed --after 'WyIwMTkw...'   # the next page: what the last one printed
      jobbus jobs list --oldest                               # creation order
      jobbus jobs list --tag tenant:42 --tag urgent           # jobs with both tags

    --json prints a list of objects with every column of the job (ids as strings, ISO 8601 times),
    its view (`retrying`, `waiting`, ...), `next_run_at` (a queued job's next start) and
    `waiting_for` (what a parked job waits for).

    With cells (JOBBUS_CELLS): the jobs of every cell, or of those given with --cell, in one order
    (a page reads a page of each cell and keeps the first --limit); each has its `cell` (a column,
    and a key of --json).
    """
    check_names("--queue", queues)
    check_names("--type", types)
    tag_list = _tags("--tag", tags)
    group = _job_id(group_id) if group_id else None
    in_view = len(statuses) == 1

    filters = Filters(queues, types, name, search, group, tags=tag_list)

    async def one_page(app: App, cursor: Cursor | None) -> tuple[list[Job], str | None]:
        """A page of one database: its jobs and where the next one starts (None: nothing further)."""
        if in_view:
            page = await views.page(app, statuses[0], filters, cursor=cursor, limit=limit)
            return await views.jobs_of(app, page), page.next.encode() if page.next is not None else None
        jobs = await app.list_jobs(
            status=list(statuses) or None,
            queue=list(queues) or None,
            type=list(types) or None,
            group_id=group,
            after=cursor.id if cursor else None,
            limit=limit,
            newest_first=not oldest,
            name=name,
            search=search,
            tag=tag_list or None,
        )
        return jobs, str(jobs[-1].id) if len(jobs) == limit else None

    async def body() -> int:
        async with admin_cells(dsn, cells) as targets:
            open_targets = reachable(targets)
            cursor = await _cursor(open_targets, statuses[0] if in_view else None, after) if after else None
            pages = [(where, *await one_page(app, cursor)) for where, app in open_targets]
        shown_jobs, more = _merged(pages, statuses[0] if in_view else None, filters, oldest, limit)
        tagged = [(where, errors_masked(job)) for where, job in shown_jobs]
        if as_json:
            print_json([where.tagged(job_dict(job)) for where, job in tagged])
            return report_unreachable(targets)
        con = console()
        if not tagged:
            con.print(Text("no jobs match", style="dim"))
        else:
            con.print(_jobs_table(tagged, con.width))
            if more is not None:
                con.print(Text(f"more: --after {more}", style="dim"))
        return report_unreachable(targets)

    sys.exit(run(body))


def _merged(
    pages: list[tuple[CellTarget, list[Job], str | None]], view: str | None, filters: Filters, oldest: bool, limit: int
) -> tuple[list[tuple[CellTarget, Job]], str | None]:
    """The page of several cells: their pages merged into the list's one order, the first `limit` kept,
    and where the next page starts (the same cursor reads each cell's next page). One database's page is
    what it read."""
    if len(pages) == 1:
        where, jobs, more = pages[0]
        return [(where, job) for job in jobs], more
    if view is not None:
        key, descending = views.order_of(view, filters)
    else:
        key, descending = (lambda job: (job.id,)), not oldest
    placed = sorted(
        ((where, job) for where, jobs, _ in pages for job in jobs), key=lambda p: key(p[1]), reverse=descending
    )
    kept = placed[:limit]
    if not kept or (len(placed) <= limit and all(more is None for _, _, more in pages)):
        return kept, None
    last = kept[-1][1]
    return kept, views.cursor_after(view, last).encode() if view is not None else str(last.id)


async def _cursor(targets: list[tuple[CellTarget, App]], view: str | None, after: str) -> Cursor:
    """Where the page starts: a cursor as a page printed it, or the id of the last job seen (read again,
    in whichever cell holds it, for its place in `view`; without a view the id is the place)."""
    try:
        job_id = uuid.UUID(after)
    except ValueError:
        if view is None:
            raise UsageProblem(f"--after {after!r} is not a job id") from None
        cursor = Cursor.decode(after)
        if cursor is None:
            raise UsageProblem(f"--after {after!r} is neither a cursor a page printed nor a job id") from None
        return cursor
    if view is None:
        return Cursor(job_id)
    for _, app in targets:
        job = await app.find(job_id)
        if job is not None:
            return views.cursor_after(view, job)
    raise UsageProblem(f"--after {after}: no job has this id (any more); start again without --after")


def _tags(option: str, given: tuple[str, ...]) -> tuple[str, ...]:
    """Tags an option names, validated as a job's (bad usage, exit 64, before the database is reached)."""
    try:
        return validate_tags(option, list(given)) or ()
    except InvalidJobError as exc:
        raise UsageProblem(str(exc)) from None


_CELL_COLUMN = Column("cell", rank=1)
_JOB_COLUMNS = [
    Column("id", rank=0),
    Column("type", rank=2),
    Column("queue", rank=3),
    Column("status", rank=1),
    Column("attempts", rank=4, justify="right"),
    Column("created", rank=7),
    Column("when", rank=5),
    Column("last error", rank=6, flexible=True),
    Column("tags", rank=8),
]


def _jobs_table(jobs: list[tuple[CellTarget, Job]], width: int) -> Table:
    cells = any(where.name is not None for where, _ in jobs)
    rows: list[list[str | Text]] = [
        [
            *([shown(where.name or "")] if cells else []),
            str(job.id),
            shown(job.type),
            shown(job.queue),
            job_status_text(job),
            f"{job.attempts}/{job.max_attempts}",
            human_time(job.created_at),
            _when(job),
            shown(one_line(job.last_error, 60), style="red"),
            shown(", ".join(job.tags)),
        ]
        for where, job in jobs
    ]
    return fitted_table(width, [_CELL_COLUMN, *_JOB_COLUMNS] if cells else _JOB_COLUMNS, rows)


def _when(job: Job) -> str:
    """The moment that matters for the job's status: when a queued one runs next (what a parked one
    waits for), when a running one started, when a finished one finished."""
    if job.view == "waiting":
        until = f"until {human_time(job.next_run_at)}" if job.next_run_at else "until woken"
        return f"waits for {job.waiting_for or '?'} {until}"
    if job.status is JobStatus.QUEUED:
        return f"runs {human_time(job.available_at)}"
    if job.status is JobStatus.RUNNING:
        return f"started {human_time(job.started_at)}"
    return f"finished {human_time(job.finished_at)}"


@jobs_group.command("show")
@click.argument("job_id", metavar="ID")
@click.option("--logs", "with_logs", is_flag=True, help="Also print what the handler logged, attempt by attempt.")
@json_option
@dsn_option
def show_command(job_id: str, with_logs: bool, as_json: bool, dsn: str | None) -> None:
    """Show every field of one job: configuration, checkpoint, progress, result, error, timeline.

    --logs also prints the lines each attempt's handler logged (time, level, message), oldest first;
    --json always includes them, in each `history` entry's `logs`.

    \b
    Examples:
      jobbus jobs show 0190f3c4-8f2e-7a71-9c1e-2b1f0e6d4a10 --json | jq .execution_data
      jobbus jobs show 0190f3c4-8f2e-7a71-9c1e-2b1f0e6d4a10 --logs

    Exit codes: 0 ok, 1 no such job, 64 not a UUID.
    """
    ident = _job_id(job_id)

    async def body() -> int:
        async with admin_app(dsn) as app:
            job = await app.find(ident)
        if job is None:
            return fail(f"job {ident} does not exist", exit_codes.FAILURE)
        job = errors_masked(job)
        if as_json:
            print_json(job_dict(job))
        else:
            console().print(_job_detail(job))
            if with_logs:
                console().print(_job_logs(job))
        return exit_codes.OK

    sys.exit(run(body))


def _job_detail(job: Job) -> Group:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value")

    def dumped(value: object) -> str:
        return placeholder(value) or json.dumps(value, indent=2, ensure_ascii=False, default=str)

    rows: list[tuple[str, str | Text]] = [
        ("id", str(job.id)),
        ("type", shown(job.type)),
        ("queue", shown(job.queue)),
        ("name", shown(job.name or "-")),
        ("status", job_status_text(job)),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("priority", str(job.priority)),
        ("group", str(job.group_id) if job.group_id else "-"),
        ("parent", str(job.parent_id) if job.parent_id else "-"),
        ("unique key", shown(job.unique_key or "-")),
        ("concurrency key", shown(job.concurrency_key or "-")),
        ("weight", str(job.weight)),
        ("tags", shown(", ".join(job.tags) or "-")),
        ("timeout", f"{job.timeout_seconds:g} s" if job.timeout_seconds is not None else "-"),
        ("progress", progress_text(job)),
        ("worker", shown(job.worker_id or "-")),
        ("created", human_time(job.created_at)),
        ("available", human_time(job.available_at)),
        ("expires", human_time(job.expires_at)),
        ("started", human_time(job.started_at)),
        ("finished", human_time(job.finished_at)),
        ("lease expires", human_time(job.lease_expires_at)),
        ("cancel requested", human_time(job.cancellation_requested_at)),
        ("configuration", shown(dumped(job.configuration_data))),
        ("checkpoint", shown(dumped(job.execution_data))),
        ("result", shown(dumped(job.result)) if job.result is not None else "-"),
    ]
    for field, value in rows:
        table.add_row(field, value)
    parts: list[Table | Text] = [table]
    if job.steps:
        parts.append(Text("steps:", style="bold"))
        steps = Table(box=None, pad_edge=False)
        steps.add_column("step", no_wrap=True)
        steps.add_column("result")
        for name, result in job.steps.items():
            text = placeholder(result) or json.dumps(result, ensure_ascii=False, default=str)
            steps.add_row(shown(name), shown(one_line(text, 100)))
        parts.append(steps)
    if job.history:
        parts.append(Text("history:", style="bold"))
        parts.append(_history_table(job))
    if job.last_error:
        parts.append(Text("last error:", style="bold red"))
        parts.append(shown(job.last_error, style="red"))
    latest = latest_traceback(job)
    if latest is not None:
        attempt, text = latest
        parts.append(Text(f"traceback of attempt {attempt}:", style="bold red"))
        parts.append(shown(text.rstrip("\n")))
    return Group(*parts)


def _job_logs(job: Job) -> Group:
    """Each attempt's logged lines, oldest first: time, level, message (a traceback on its lines)."""
    parts: list[Text] = []
    for entry in job.history:
        lines = history_logs(entry)
        if not lines:
            continue
        heading = f"logs of attempt {entry.get('attempt', '?')} ({entry.get('outcome', '?')}):"
        parts.append(shown(heading, style="bold"))
        dropped = entry.get("logs_dropped")
        if isinstance(dropped, int) and dropped > 0:
            parts.append(Text(f"  ({dropped:,} earlier lines dropped: an attempt keeps its last 64 KiB)", style="dim"))
        for line in lines:
            moment = _moment(line.get("at"))
            when = moment.astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if moment else "?"
            level = str(line.get("level", ""))
            parts.append(
                Text.assemble(
                    f"  {when} ",
                    shown(f"{level:<8}", style=_LEVEL_STYLES.get(level, "")),
                    " ",
                    shown(str(line.get("message", "")).replace("\n", "\n    ")),
                )
            )
    if not parts:
        parts.append(Text("no attempt logged anything", style="dim"))
    return Group(*parts)


_LEVEL_STYLES = {"WARNING": "yellow", "ERROR": "red", "CRITICAL": "bold red"}


def latest_traceback(job: Job) -> tuple[str, str] | None:
    """The attempt number and traceback of the latest attempt that stored one."""
    for entry in reversed(job.history):
        if isinstance(entry, dict) and isinstance(entry.get("traceback"), str):
            return str(entry.get("attempt", "?")), entry["traceback"]
    return None


def _history_table(job: Job) -> Table:
    """How each attempt ended, oldest first."""
    table = Table(box=None, pad_edge=False)
    for column in ("attempt", "outcome", "at", "took", "worker", "detail"):
        table.add_column(column, no_wrap=column != "detail")
    for entry in job.history:
        detail = entry.get("error") or (f"for {entry['delay_seconds']:g} s" if "delay_seconds" in entry else "")
        took = entry.get("seconds")
        table.add_row(
            str(entry.get("attempt", "")),
            shown(str(entry.get("outcome", ""))),
            human_time(_moment(entry.get("at"))),
            human_seconds(float(took)) if isinstance(took, int | float) else "-",
            shown(str(entry.get("worker_id", ""))),
            shown(one_line(str(detail), 80)),
        )
    return table


def _moment(value: object) -> datetime | None:
    """A history entry's `at` (ISO 8601 from PostgreSQL), None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


@jobs_group.command("cancel")
@click.argument("job_id", metavar="ID")
@dsn_option
def cancel_command(job_id: str, dsn: str | None) -> None:
    """Cancel a job: a queued one at once; a running one is asked to stop (its handler sees
    `cancellation_requested` and returns, then the job is recorded cancelled). A finished job is left
    as it is.

    \b
    Example:
      jobbus jobs cancel 0190f3c4-8f2e-7a71-9c1e-2b1f0e6d4a10

    Exit codes: 0 done (also when the job had already finished), 1 no such job, 64 not a UUID.
    """
    ident = _job_id(job_id)

    async def body() -> int:
        async with admin_app(dsn) as app:
            before = await app.find(ident)  # only to word the message; cancel() itself is atomic
            status = await app.cancel(ident)
        if before is not None and before.status.is_terminal:
            click.echo(f"job {ident} had already finished ({status.value}); nothing changed")
        elif status is JobStatus.CANCELLED:
            click.echo(f"job {ident} cancelled")
        elif status is JobStatus.RUNNING:
            click.echo(f"job {ident} is running: cancellation requested, its handler stops at its next check")
        else:
            click.echo(f"job {ident} had already finished ({status.value}); nothing changed")
        return exit_codes.OK

    sys.exit(run(body))


@jobs_group.command("retry")
@click.argument("job_id", metavar="ID")
@click.option("--at", "at_text", metavar="ISO8601", help="Run no earlier than this (default: now).")
@dsn_option
def retry_command(job_id: str, at_text: str | None, dsn: str | None) -> None:
    """Requeue a failed job with its attempts reset to 0.

    \b
    Example:
      jobbus jobs list --status failed --json | jq -r '.[].id' | xargs -n1 jobbus jobs retry

    Exit codes: 0 requeued, 1 no such job or not failed, 64 not a UUID or a bad --at.
    """
    ident = _job_id(job_id)
    at = parse_when(at_text) if at_text else None

    async def body() -> int:
        async with admin_app(dsn) as app:
            await app.retry(ident, available_at=at)
        click.echo(f"job {ident} requeued" + (f" for {human_time(at)}" if at else ""))
        return exit_codes.OK

    sys.exit(run(body))


@jobs_group.command("delete")
@click.argument("job_id", metavar="ID")
@dsn_option
def delete_command(job_id: str, dsn: str | None) -> None:
    """Delete a queued or finished job (a running one: cancel it first). A queued member of a group
    counts as done for the group's callback; a parent waiting for its children stops waiting for it.

    \b
    Example:
      jobbus jobs delete 0190f3c4-8f2e-7a71-9c1e-2b1f0e6d4a10

    Exit codes: 0 deleted, 1 no such job or running, 64 not a UUID.
    """
    ident = _job_id(job_id)

    async def body() -> int:
        async with admin_app(dsn) as app:
            await app.delete(ident)
        click.echo(f"job {ident} deleted")
        return exit_codes.OK

    sys.exit(run(body))


@jobs_group.command("run-now")
@click.argument("job_id", metavar="ID")
@dsn_option
def run_now_command(job_id: str, dsn: str | None) -> None:
    """Make a queued job (scheduled for later, waiting to retry, or parked) available at once.

    \b
    Example:
      jobbus jobs run-now 0190f3c4-8f2e-7a71-9c1e-2b1f0e6d4a10

    Exit codes: 0 done, 1 no such job or not queued, 64 not a UUID.
    """
    ident = _job_id(job_id)

    async def body() -> int:
        async with admin_app(dsn) as app:
            await app.run_now(ident)
        click.echo(f"job {ident} is available now")
        return exit_codes.OK

    sys.exit(run(body))


@jobs_group.command("update")
@click.argument("job_id", metavar="[ID]", required=False)
@click.option("--queue", metavar="Q", help="Every queued job of this queue.")
@click.option("--type", "job_type", metavar="T", help="Every queued job of this type.")
@click.option(
    "--tag", "tags", multiple=True, metavar="TAG", help="Every queued job with this tag (repeatable: every one)."
)
@click.option("--set-priority", type=click.IntRange(-(2**31), 2**31 - 1), metavar="N", help="The new priority.")
@click.option("--set-queue", metavar="Q", help="Move the jobs to this queue.")
@click.option(
    "--set-available-at",
    "available_text",
    metavar="WHEN",
    help="When the jobs become available: now, a delay from now (30s, 15m, 1h30m) or an ISO 8601 time.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the count as JSON on stdout.")
@dsn_option
def update_command(
    job_id: str | None,
    queue: str | None,
    job_type: str | None,
    tags: tuple[str, ...],
    set_priority: int | None,
    set_queue: str | None,
    available_text: str | None,
    as_json: bool,
    dsn: str | None,
) -> None:
    """Change queued jobs: one by its ID, or every queued job that matches --queue, --type and --tag.

    Running and finished jobs are never changed: a job a worker claims meanwhile is left as it is and
    not counted. Filters change the jobs in batches of 1,000, each its own transaction; progress goes
    to stderr, the count to stdout.

    \b
    Examples:
      jobbus jobs update 0190f3c4-8f2e-7a71-9c1e-2b1f0e6d4a10 --set-priority 10
      jobbus jobs update --queue emails --tag tenant:42 --set-queue emails-slow
      jobbus jobs update --type report.render --set-available-at 2h
      jobbus jobs update --tag backfill --set-available-at 2026-05-01T02:00:00Z --set-priority -5

    Exit codes: 0 done (also when no job matched), 1 the job does not exist or is not queued,
    64 bad usage (no change, no filter, an ID and filters both, a bad value).
    """
    if job_id is not None and (queue is not None or job_type is not None or tags):
        raise UsageProblem("give a job ID or --queue/--type/--tag filters, not both")
    if job_id is None and queue is None and job_type is None and not tags:
        raise UsageProblem("give a job ID or at least one of --queue, --type, --tag")
    if set_priority is None and set_queue is None and available_text is None:
        raise UsageProblem("give at least one change: --set-priority, --set-queue, --set-available-at")
    check_names("--queue", [queue] if queue is not None else [])
    check_names("--type", [job_type] if job_type is not None else [])
    check_names("--set-queue", [set_queue] if set_queue is not None else [])
    tag_list = _tags("--tag", tags)
    available_at = _available_at(available_text) if available_text is not None else None
    ident = _job_id(job_id) if job_id is not None else None

    async def body() -> int:
        async with admin_app(dsn) as app:
            if ident is not None:
                await app.update(ident, priority=set_priority, queue=set_queue, available_at=available_at)
                changed = 1
            else:
                err = sys.stderr
                progress = err.isatty()

                def report(count: int) -> None:
                    if progress:
                        err.write(f"\r{count} jobs changed so far")
                        err.flush()

                changed = await app.update_many(
                    queue=queue,
                    type=job_type,
                    tag=tag_list or None,
                    set_priority=set_priority,
                    set_queue=set_queue,
                    set_available_at=available_at,
                    on_batch=report,
                )
                if progress:
                    err.write("\r\x1b[K")
        if as_json:
            print_json({"updated": changed})
        elif ident is not None:
            click.echo(f"job {ident} updated")
        else:
            click.echo(f"{changed} job{'' if changed == 1 else 's'} updated")
        return exit_codes.OK

    sys.exit(run(body))


def _available_at(text: str) -> datetime | timedelta:
    """--set-available-at: `now`, a delay from now (a duration), or an aware ISO 8601 time."""
    if text.strip().lower() == "now":
        return timedelta(0)
    if text.strip()[:1].isdigit() and text.strip()[-1:].lower() in "smhdw" and ":" not in text:
        return parse_duration(text, "--set-available-at")
    return parse_when(text, "--set-available-at")

"""`jobbus periodic list|add|remove|pause|resume|run`: periodic jobs at run time."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from jobbus.cli import exit_codes
from jobbus.cli.errors import UsageProblem, run
from jobbus.cli.options import check_names, dsn_option, json_option, parse_duration
from jobbus.cli.output import admin_app, console, human_time, print_json, shown
from jobbus.cli.schedule import parse_config
from jobbus.cli.suggest import SuggestingGroup
from jobbus.errors import InvalidJobError
from jobbus.periodic import Periodic


@click.group("periodic", cls=SuggestingGroup)
def periodic_group() -> None:
    """Periodic jobs: list them, add one at run time, remove, pause, resume, or run one now.

    Periodic jobs declared in code (`app.periodic(...)`) are stored by the workers that declare them;
    ones added here are stored until removed. The leader enqueues one job per due tick, fleet-wide.

    \b
    Examples:
      jobbus periodic list
      jobbus periodic add nightly-report --type report.render --cron '0 3 * * *' --timezone Europe/Paris
      jobbus periodic add heartbeat --type ops.ping --every 30s
      jobbus periodic pause nightly-report
      jobbus periodic run nightly-report
    """


@periodic_group.command("list")
@json_option
@dsn_option
def list_command(as_json: bool, dsn: str | None) -> None:
    """Every periodic job: schedule, state, next and last run, last job."""

    async def body() -> int:
        async with admin_app(dsn) as app:
            periodics = await app.list_periodic()
        if as_json:
            print_json([periodic_dict(p) for p in periodics])
        elif not periodics:
            console().print(Text("no periodic jobs (declare one with app.periodic(...) or `jobbus periodic add`)"))
        else:
            console().print(periodic_table(periodics))
        return exit_codes.OK

    sys.exit(run(body))


@periodic_group.command("add")
@click.argument("name")
@click.option("--type", "job_type", required=True, metavar="T", help="The job type each tick enqueues.")
@click.option("--cron", metavar="EXPR", help="A 5-field cron expression, e.g. '0 3 * * *'.")
@click.option("--every", metavar="DURATION", help="An interval instead of --cron: 30s, 15m, 1h.")
@click.option("--config", "config_json", metavar="JSON", help="The configuration of each job, a JSON object.")
@click.option("--timezone", default="UTC", show_default=True, metavar="TZ", help="For --cron, e.g. Europe/Paris.")
@click.option("--queue", metavar="Q", help="The jobs' queue (default: the type's, else 'default').")
@click.option("--priority", type=click.IntRange(-(2**31), 2**31 - 1), metavar="N", help="The jobs' priority.")
@click.option("--overlap/--no-overlap", default=False, show_default=True, help="Enqueue while the last still runs.")
@json_option
@dsn_option
def add_command(
    name: str,
    job_type: str,
    cron: str | None,
    every: str | None,
    config_json: str | None,
    timezone: str,
    queue: str | None,
    priority: int | None,
    overlap: bool,
    as_json: bool,
    dsn: str | None,
) -> None:
    """Add a periodic job (or redefine one added here before); exactly one of --cron and --every.

    \b
    Examples:
      jobbus periodic add nightly-report --type report.render --cron '0 3 * * *' --timezone Europe/Paris
      jobbus periodic add heartbeat --type ops.ping --every 30s --config '{"target": "db"}'
    """
    check_names("NAME", [name])
    check_names("--type", [job_type])
    if queue is not None:
        check_names("--queue", [queue])
    if (cron is None) == (every is None):
        raise UsageProblem("periodic add needs exactly one of --cron EXPR and --every DURATION")
    interval = parse_duration(every, "--every") if every is not None else None
    configuration = parse_config(config_json)

    async def body() -> int:
        async with admin_app(dsn) as app:
            try:
                added = await app.add_periodic(
                    name,
                    type=job_type,
                    cron=cron,
                    every=interval,
                    configuration=configuration,
                    timezone=timezone,
                    queue=queue,
                    priority=priority,
                    overlap=overlap,
                )
            except InvalidJobError as exc:
                raise UsageProblem(str(exc)) from None
        if as_json:
            print_json(periodic_dict(added))
        else:
            next_run = human_time(added.next_run_at, added.timezone if added.cron else None)
            click.echo(f"periodic {name} added: next run {next_run}")
        return exit_codes.OK

    sys.exit(run(body))


def _named_action(action: str, summary: str) -> click.Command:
    @click.command(action)
    @click.argument("name")
    @dsn_option
    def command(name: str, dsn: str | None) -> None:
        check_names("NAME", [name])

        async def body() -> int:
            async with admin_app(dsn) as app:
                if action == "remove":
                    await app.remove_periodic(name)
                elif action == "pause":
                    await app.pause_periodic(name)
                elif action == "resume":
                    await app.resume_periodic(name)
                else:
                    job_id = await app.run_periodic(name)
                    click.echo(str(job_id))
                    return exit_codes.OK
            click.echo(f"periodic {name} {action}d" if action != "remove" else f"periodic {name} removed")
            return exit_codes.OK

        sys.exit(run(body))

    command.help = f"{summary}\n\nAn unknown NAME exits 1."
    command.short_help = summary
    return command


for _action, _summary in (
    ("remove", "Delete a periodic job (one declared in code comes back when its workers start)."),
    ("pause", "Stop enqueuing a periodic job's ticks until resumed (durable)."),
    ("resume", "Enqueue a paused periodic job's ticks again."),
    ("run", "Enqueue one job of a periodic job now, beside its schedule; prints its id."),
):
    periodic_group.add_command(_named_action(_action, _summary))


def periodic_dict(periodic: Periodic) -> dict[str, Any]:
    return {
        "name": periodic.name,
        "type": periodic.type,
        "cron": periodic.cron,
        "every_seconds": periodic.every.total_seconds() if periodic.every is not None else None,
        "timezone": periodic.timezone,
        "enabled": periodic.enabled,
        "next_run_at": periodic.next_run_at,
        "last_run_at": periodic.last_run_at,
        "last_job_id": periodic.last_job_id,
        "queue": periodic.queue,
        "priority": periodic.priority,
        "overlap": periodic.overlap,
        "configuration": periodic.configuration,
        "source": periodic.source,
    }


def periodic_table(periodics: list[Periodic]) -> Table:
    table = Table(title="periodic jobs", title_justify="left")
    for column in ("name", "type", "schedule", "state", "next run", "last run", "source"):
        table.add_column(column, no_wrap=column in ("name", "next run", "last run"))
    for p in periodics:
        schedule = f"{p.cron} ({p.timezone})" if p.cron else f"every {p.every.total_seconds():g} s" if p.every else ""
        table.add_row(
            shown(p.name),
            shown(p.type),
            shown(schedule),
            Text("running" if p.enabled else "paused", style="green" if p.enabled else "yellow"),
            human_time(p.next_run_at, p.timezone if p.cron else None) if p.enabled else "-",
            human_time(p.last_run_at, p.timezone if p.cron else None),
            p.source,
        )
    return table

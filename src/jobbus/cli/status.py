"""`jobbus status`: queues by status, the oldest waiting job, throughput, workers."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from dataclasses import replace
from typing import Any

import click
import psycopg
import psycopg_pool
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from jobbus import control
from jobbus.cli import exit_codes
from jobbus.cli.cells import CellTarget, admin_cells, cell_option, report_unreachable
from jobbus.cli.errors import first_line, run
from jobbus.cli.options import FiniteFloatRange, dsn_option, json_option
from jobbus.cli.output import Column, console, fitted_table, human_seconds, print_json, shown, status_dict
from jobbus.cli.periodic import periodic_table
from jobbus.cli.queues import limits_table
from jobbus.errors import DatabaseUnavailableError
from jobbus.views import Count


@click.command("status")
@json_option
@click.option("--watch", is_flag=True, help="Refresh in place until Ctrl-C.")
@click.option(
    "--interval",
    type=FiniteFloatRange(min=0.1, max=3600),
    default=2.0,
    show_default=True,
    metavar="S",
    help="Seconds between refreshes with --watch.",
)
@cell_option
@dsn_option
def status_command(as_json: bool, watch: bool, interval: float, cells: tuple[str, ...], dsn: str | None) -> None:
    """Show every queue: jobs by status, the oldest waiting job, throughput, failures, and the workers.

    \b
    Columns: available (queued, can run now), scheduled (queued for later), running, completed,
    failed, cancelled; "oldest wait" is how long the oldest available job has waited; "done/min"
    is jobs completed in the last minute; "failed/h" is failures in the last hour. A warning names
    the queued jobs no live worker can take (`unhandled` in --json): no live worker handles their
    type in their queue, or none is alive.

    \b
    Examples:
      jobbus status
      jobbus status --watch --interval 1
      jobbus status --json | jq '.queues[] | select(.available > 1000)'

    With cells (JOBBUS_CELLS): a part per cell (every cell, or those given with --cell), and a cell
    that cannot be reached is named; --json prints {"cells": [...]}, each cell's status as above with its
    `cell` in it and in each of its queue and unhandled entries, and "unreachable" naming those it
    could not read.

    Exit codes: 0 ok, 64 bad usage, 69 database (or a cell's) unreachable, 78 schema missing.
    """
    if as_json and watch:
        raise click.UsageError("--json and --watch do not go together; poll `jobbus status --json` instead")

    async def body() -> int:
        if watch:
            return await _watch(dsn, cells, interval)
        async with admin_cells(dsn, cells) as targets:
            reports = await _reports(targets)
        if as_json:
            print_json(_status_json(reports))
        else:
            con = console()
            con.print(_render_reports(reports, con.width))
        return report_unreachable(targets) or max((t.exit_code for t, _ in reports), default=exit_codes.OK)

    sys.exit(run(body))


#: What each target said: its report, or (a cell only) the target with why it could not be read.
Reports = list[tuple[CellTarget, control.StatusReport | None]]


async def _reports(targets: list[CellTarget]) -> Reports:
    """Each target's status. A single database's failure is the command's; a cell's is that cell's (the
    target is returned with the problem and exit 69), so the others are still shown."""
    reports: Reports = []
    for target in targets:
        if target.app is None:
            reports.append((target, None))
        elif target.name is None:
            reports.append((target, await control.queue_status(target.app)))
        else:
            try:
                reports.append((target, await control.queue_status(target.app)))
            except (psycopg.OperationalError, psycopg_pool.PoolTimeout, DatabaseUnavailableError) as exc:
                problem = f"cannot read its status: {first_line(exc)}"
                reports.append((replace(target, app=None, problem=problem, exit_code=exit_codes.UNAVAILABLE), None))
    return reports


def _status_json(reports: Reports) -> dict[str, Any]:
    if reports and reports[0][0].name is None:
        report = reports[0][1]
        assert report is not None
        return status_dict(report)
    cells: list[dict[str, Any]] = []
    for target, report in reports:
        if report is None:
            continue
        data = status_dict(report)
        data["queues"] = [target.tagged(q) for q in data["queues"]]
        data["unhandled"] = [target.tagged(u) for u in data["unhandled"]]
        cells.append(target.tagged(data))
    unreachable = [{"cell": t.name, "error": t.problem} for t, report in reports if report is None]
    return {"cells": cells, "unreachable": unreachable}


def _render_reports(reports: Reports, width: int) -> Group:
    parts: list[Group | Text] = []
    for target, report in reports:
        if target.name is None:
            assert report is not None
            return render_status(report, width)
        if report is None:
            parts.append(Text(f"cell {target.name}: {target.problem}", style="bold red"))
        else:
            parts.append(Group(Text(f"cell {target.name}", style="bold underline"), render_status(report, width)))
    return Group(*parts)


async def _watch(dsn: str | None, cells: tuple[str, ...], interval: float) -> int:
    """Redraw every `interval` seconds; Ctrl-C (or SIGTERM) ends it with exit 0."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with admin_cells(dsn, cells) as targets:
            con = console()
            with Live(_render_reports(await _reports(targets), con.width), console=con, auto_refresh=False) as live:
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), interval)
                    live.update(_render_reports(await _reports(targets), con.width), refresh=True)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return exit_codes.OK


_QUEUE_COLUMNS = [
    Column("queue", rank=0),
    Column("available", rank=1, justify="right", short="avail"),
    Column("scheduled", rank=5, justify="right", short="sched"),
    Column("running", rank=2, justify="right", short="run"),
    Column("completed", rank=7, justify="right", short="done"),
    Column("failed", rank=3, justify="right"),
    Column("cancelled", rank=9, justify="right", short="cancel"),
    Column("oldest wait", rank=4, justify="right", short="oldest"),
    Column("done/min", rank=6, justify="right", short="/min"),
    Column("failed/h", rank=8, justify="right", short="fail/h"),
]


def render_status(report: control.StatusReport, width: int) -> Group:
    data = status_dict(report)
    rows: list[list[str | Text]] = []
    for q in report.queues:
        name = shown(q.queue)
        if q.paused or report.paused_all:
            name.append(" (paused)", style="yellow")
        rows.append(
            [
                name,
                _count(q.available, "cyan"),
                _count(q.scheduled, "cyan"),
                _count(q.running, "yellow"),
                _count(q.completed, "green"),
                _count(q.failed, "red"),
                _count(q.cancelled, "magenta"),
                human_seconds(q.oldest_waiting_seconds),
                str(q.completed_last_minute),
                _count(q.failed_last_hour, "red"),
            ]
        )
    footer: list[str | Text] | None = None
    if not rows:
        rows.append([Text("no jobs yet", style="dim"), *[""] * 9])
    else:
        t = data["totals"]

        def total(name: str) -> str:
            return str(Count.total(getattr(q, name) for q in report.queues))

        footer = [
            Text("total", style="bold"),
            total("available"),
            total("scheduled"),
            total("running"),
            total("completed"),
            total("failed"),
            total("cancelled"),
            human_seconds(t["oldest_waiting_seconds"]),
            total("completed_last_minute"),
            total("failed_last_hour"),
        ]
    table = fitted_table(width, _QUEUE_COLUMNS, rows, title="queues", footer=footer)
    w = data["workers"]
    states = ", ".join(f"{w[s]} {s}" for s in ("running", "paused", "draining", "stopping") if w[s])
    line = Text(f"workers: {w['live']} live", style="bold")
    if states:
        line.append(f" ({states})", style="")
    line.append(f", {w['in_flight']} job(s) in flight of {w['capacity']} slot(s)", style="")
    if w["gone"]:
        line.append(f", {w['gone']} gone", style="red")
    if w["stopped"]:
        line.append(f", {w['stopped']} stopped", style="dim")
    parts: list[Table | Text] = [table, line]
    if data["unhandled"]:
        nobody = "no worker is alive" if not w["live"] else "no live worker handles them"
        parts.append(Text(f"warning: queued jobs nobody can take ({nobody}):", style="bold yellow"))
        for u in data["unhandled"]:
            entry = shown(f"  {u['queued']} of type {u['type']} in queue {u['queue']}", style="yellow")
            parts.append(entry)
    paused = data["paused"]
    if paused["all"] or paused["queues"] or paused["workers"]:
        what = (["ALL WORKERS"] if paused["all"] else []) + [f"queue {q}" for q in paused["queues"]]
        what += [f"worker {w}" for w in paused["workers"]]
        parts.append(shown(f"paused: {', '.join(what)} (jobbus resume ... to lift)", style="yellow"))
    if report.limits:
        parts.append(limits_table(list(report.limits), report.usage))
    if report.periodics:
        parts.append(periodic_table(list(report.periodics)))
    return Group(*parts)


def _count(value: Count, style: str) -> Text:
    return Text(str(value), style=style if value.value else "dim")

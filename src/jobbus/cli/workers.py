"""`jobbus workers`: the worker registry."""

from __future__ import annotations

import sys

import click
from rich.table import Table
from rich.text import Text

from jobbus import control
from jobbus.cli.cells import admin_cells, cell_option, reachable, report_unreachable
from jobbus.cli.errors import run
from jobbus.cli.options import dsn_option, json_option
from jobbus.cli.output import (
    Column,
    console,
    fitted_table,
    human_seconds,
    print_json,
    shown,
    styled,
    worker_dict,
)


@click.command("workers")
@json_option
@click.option("--live", "live_only", is_flag=True, help="Only workers that are alive (not stopped, not gone).")
@cell_option
@dsn_option
def workers_command(as_json: bool, live_only: bool, cells: tuple[str, ...], dsn: str | None) -> None:
    """List registered workers: id, host, pid, state, queues, jobs in flight, done, failed, last seen.

    \b
    State is what the worker reports (running, paused, draining, stopping, stopped), or "gone" when a
    worker that did not stop has not refreshed its row for lease_seconds (it died or lost the
    database). "done" counts the jobs it finished (completed + failed) since it started. Rows of
    workers stopped or gone for more than 24 hours are forgotten when this runs.

    \b
    Examples:
      jobbus workers
      jobbus workers --live --json | jq -r '.[].id'

    With cells (JOBBUS_CELLS): the workers of every cell, or of those given with --cell, each
    entry of --json with its `cell`.

    Exit codes: 0 ok, 64 bad usage, 69 database (or a cell's) unreachable, 78 schema missing.
    """

    async def body() -> int:
        async with admin_cells(dsn, cells) as targets:
            found = [(where, await control.list_workers(app)) for where, app in reachable(targets)]
        shown_workers = [(where, [w for w in workers if w.live or not live_only]) for where, workers in found]
        if as_json:
            print_json([where.tagged(worker_dict(w)) for where, workers in shown_workers for w in workers])
        else:
            con = console()
            for where, workers in shown_workers:
                con.print(render_workers(workers, con.width, where.name))
        return report_unreachable(targets)

    sys.exit(run(body))


_WORKER_COLUMNS = [
    Column("id", rank=0),
    Column("host", rank=6),
    Column("pid", rank=7, justify="right"),
    Column("state", rank=1),
    Column("queues", rank=3, flexible=True),
    Column("in flight", rank=2, justify="right", short="slots"),
    Column("done", rank=5, justify="right"),
    Column("failed", rank=4, justify="right"),
    Column("last seen", rank=8, justify="right", short="seen"),
]


def render_workers(workers: list[control.WorkerInfo], width: int, cell: str | None = None) -> Table | Text:
    if not workers:
        where = "" if cell is None else f" in cell {cell}"
        return Text(f"no workers registered{where} (start one with `jobbus worker --app module:app`)", style="dim")
    rows: list[list[str | Text]] = [
        [
            shown(w.id),
            shown(w.host),
            str(w.pid),
            styled(w.display_state),
            shown(",".join(w.queues)) if w.queues is not None else Text("*", style="dim"),
            f"{w.in_flight}/{w.concurrency}",
            str(w.done),
            Text(str(w.failed), style="red" if w.failed else "dim"),
            f"{human_seconds(w.seen_seconds_ago)} ago",
        ]
        for w in workers
    ]
    return fitted_table(width, _WORKER_COLUMNS, rows, title="workers" if cell is None else f"workers of cell {cell}")

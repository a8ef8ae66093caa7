"""`jobbus queue set|list`: fleet-wide limits of queues (flow control)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Mapping
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from jobbus import control
from jobbus.app import App
from jobbus.cli import exit_codes
from jobbus.cli.cells import CellTarget, admin_cells, reachable, report_unreachable
from jobbus.cli.errors import UsageProblem, fail, run
from jobbus.cli.options import check_names, dsn_option, json_option
from jobbus.cli.output import admin_app, console, print_json, shown
from jobbus.cli.suggest import SuggestingGroup
from jobbus.errors import InvalidJobError
from jobbus.limits import KEEP, Keep, QueueSettings, RateLimit
from jobbus.views import Count


@click.group("queue", cls=SuggestingGroup)
def queue_group() -> None:
    """Limits of queues, fleet-wide: concurrency, per-key concurrency, rate limits.

    \b
    Examples:
      jobbus queue set emails --concurrency 20 --concurrency-per-key 1 --rate 100/1m
      jobbus queue set emails --rate none          # remove one limit, keep the others
      jobbus queue list
      jobbus queue move reports --to eu            # cells: wait until no job is left elsewhere
    """


def _count(option: str, text: str | None) -> int | Keep | None:
    if text is None:
        return KEEP
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        raise UsageProblem(f"{option} takes a whole number or none, got {text!r}") from None
    if value < 1:
        raise UsageProblem(f"{option} must be at least 1 (or none to remove the limit), got {value}")
    return value


def _rate(option: str, text: str | None) -> RateLimit | Keep | None:
    if text is None:
        return KEEP
    if text.strip().lower() == "none":
        return None
    try:
        return RateLimit.parse(text)
    except InvalidJobError as exc:
        raise UsageProblem(f"{option}: {exc}") from None


@queue_group.command("set")
@click.argument("queue")
@click.option("--concurrency", metavar="N|none", help="At most N jobs of the queue run at once, fleet-wide.")
@click.option("--concurrency-per-key", metavar="N|none", help="At most N jobs of one concurrency_key at once.")
@click.option("--rate", metavar="N/PERIOD|none", help="At most N jobs started in any rolling PERIOD (1s, 1m, 30s).")
@click.option("--rate-per-key", metavar="N/PERIOD|none", help="The same, per concurrency_key.")
@json_option
@dsn_option
def set_command(
    queue: str,
    concurrency: str | None,
    concurrency_per_key: str | None,
    rate: str | None,
    rate_per_key: str | None,
    as_json: bool,
    dsn: str | None,
) -> None:
    """Set (or with `none` remove) limits of QUEUE; limits not given are kept. Running workers apply a
    change within one poll interval.

    \b
    Examples:
      jobbus queue set emails --concurrency 20
      jobbus queue set tenants --concurrency-per-key 1            # one job per tenant at a time
      jobbus queue set partner-api --rate 100/1m --rate-per-key 10/1m
      jobbus queue set emails --concurrency none --rate none
    """
    check_names("QUEUE", [queue])
    limits = {
        "concurrency": _count("--concurrency", concurrency),
        "concurrency_per_key": _count("--concurrency-per-key", concurrency_per_key),
        "rate_limit": _rate("--rate", rate),
        "rate_limit_per_key": _rate("--rate-per-key", rate_per_key),
    }
    if all(value is KEEP for value in limits.values()):
        raise UsageProblem(
            "queue set needs at least one of --concurrency, --concurrency-per-key, --rate, --rate-per-key"
        )

    async def body() -> int:
        async with admin_app(dsn) as app:
            settings = await app.set_queue(queue, **limits)  # type: ignore[arg-type]
        if as_json:
            print_json(queue_dict(settings))
        else:
            console().print(shown(f"queue {queue}: {describe(settings)}"))
        return exit_codes.OK

    sys.exit(run(body))


@queue_group.command("list")
@json_option
@dsn_option
def list_command(as_json: bool, dsn: str | None) -> None:
    """Every queue that has limits, and how close it is to them now."""

    async def body() -> int:
        async with admin_app(dsn) as app:
            settings = await app.list_queues()
            usage = await app.queue_usage()
        if as_json:
            print_json([queue_dict(s, usage.get(s.queue)) for s in settings])
        elif not settings:
            console().print(Text("no queue has limits (jobbus queue set QUEUE --concurrency N ...)", style="dim"))
        else:
            console().print(limits_table(settings, usage))
        return exit_codes.OK

    sys.exit(run(body))


def describe(settings: QueueSettings) -> str:
    parts = []
    if settings.concurrency is not None:
        parts.append(f"concurrency {settings.concurrency}")
    if settings.concurrency_per_key is not None:
        parts.append(f"{settings.concurrency_per_key} per key")
    if settings.rate_limit is not None:
        parts.append(f"rate {settings.rate_limit}")
    if settings.rate_limit_per_key is not None:
        parts.append(f"rate per key {settings.rate_limit_per_key}")
    return ", ".join(parts) or "no limits"


def queue_dict(settings: QueueSettings, usage: tuple[int, int | None] | None = None) -> dict[str, Any]:
    def rate(limit: RateLimit | None) -> dict[str, Any] | None:
        return None if limit is None else {"count": limit.count, "per_seconds": limit.per.total_seconds()}

    data: dict[str, Any] = {
        "queue": settings.queue,
        "concurrency": settings.concurrency,
        "concurrency_per_key": settings.concurrency_per_key,
        "rate_limit": rate(settings.rate_limit),
        "rate_limit_per_key": rate(settings.rate_limit_per_key),
    }
    if usage is not None:
        data["running"], data["started_in_window"] = usage
    return data


def limits_table(settings: list[QueueSettings], usage: dict[str, tuple[int, int | None]]) -> Table:
    table = Table(title="queue limits", title_justify="left")
    for column in ("queue", "running / concurrency", "per key", "started / rate", "rate per key"):
        table.add_column(column, no_wrap=True)
    for s in settings:
        running, started = usage.get(s.queue, (0, None))
        table.add_row(
            shown(s.queue),
            f"{running} / {s.concurrency}" if s.concurrency is not None else f"{running} / -",
            str(s.concurrency_per_key) if s.concurrency_per_key is not None else "-",
            f"{started or 0} / {s.rate_limit}" if s.rate_limit is not None else "-",
            str(s.rate_limit_per_key) if s.rate_limit_per_key is not None else "-",
        )
    return table


@queue_group.command("move")
@click.argument("queue")
@click.option("--to", "to_cell", required=True, metavar="CELL", help="The cell the queue's jobs live in from now on.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    metavar="S",
    help="Give up after S seconds (exit 1), naming what is left; default: wait until it is done.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1, max=3600),
    default=2.0,
    show_default=True,
    metavar="S",
    help="Seconds between two looks at the other cells.",
)
@dsn_option
def move_command(queue: str, to_cell: str, timeout: float | None, interval: float, dsn: str | None) -> None:
    """Wait until QUEUE has no job left in any cell but CELL, showing what is left: the last step of
    moving a queue to another cell without losing a job.

    \b
    The move (docs/cells.md): first place the queue in its new cell in every producer and worker
    (queue_cells / JOBBUS_QUEUE_CELLS: QUEUE=CELL), so that new jobs go there, with workers serving
    both cells; the jobs already in the old cell run there. This command then watches the other
    cells until none holds a queued (scheduled included) or running job of the queue, printing what
    is left at each look, and exits 0. Nothing is copied between databases.

    \b
    Examples:
      JOBBUS_QUEUE_CELLS="reports=eu" jobbus queue move reports --to eu
      jobbus queue move reports --to eu --timeout 3600

    Exit codes: 0 the queue has no job left outside CELL, 1 --timeout passed first, 64 bad usage
    (no cells, an unknown cell, or queue_cells placing QUEUE in another cell), 69 a cell unreachable.
    """
    check_names("queue", (queue,))

    async def body() -> int:
        app = App(dsn=dsn)
        async with admin_cells(dsn, (), app=app) as targets:
            placement = _check_move(targets, queue, to_cell, app.settings.queue_cells or {})
            unreachable = report_unreachable(targets)
            if unreachable:
                return unreachable
            others = [(where, app) for where, app in reachable(targets) if where.name != to_cell]
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                left = [(where.name, await _left_in(app, queue)) for where, app in others]
                left = [(name, counts) for name, counts in left if any(count.value for count in counts)]
                if not left:
                    click.echo(f"queue {queue}: no job left outside cell {to_cell}{placement}")
                    return exit_codes.OK
                click.echo(f"queue {queue}: " + "; ".join(_described(name, counts) for name, counts in left))
                if deadline is not None and time.monotonic() >= deadline:
                    return fail(f"queue {queue} still has jobs outside cell {to_cell} after {timeout:g} s", 1)
                await asyncio.sleep(
                    interval if deadline is None else min(interval, max(0.0, deadline - time.monotonic()))
                )

    sys.exit(run(body))


def _check_move(targets: list[CellTarget], queue: str, to_cell: str, queue_cells: Mapping[str, str]) -> str:
    """Refuse a move without cells, to an unknown cell, or that the configured queue_cells contradicts (new
    jobs would still go elsewhere). Returns a note for the final line when queue_cells is not configured."""
    names = [target.name for target in targets]
    if names == [None]:
        raise UsageProblem("queue move: no cells are configured (JOBBUS_CELLS)")
    if to_cell not in names:
        raise UsageProblem(f"--to {to_cell!r}: no such cell (the cells are {', '.join(str(n) for n in names)})")
    placed = queue_cells.get(queue, names[0])
    if placed != to_cell:
        raise UsageProblem(
            f"queue {queue} is placed in cell {placed} by this environment's queue_cells: set "
            f"JOBBUS_QUEUE_CELLS to include {queue}={to_cell} (in producers and workers too) so that new jobs go "
            f"to {to_cell}, then run this again"
        )
    return "" if queue_cells else " (no JOBBUS_QUEUE_CELLS here: check that producers place it there)"


async def _left_in(app: App, queue: str) -> tuple[Count, Count, Count]:
    """(available, scheduled, running) jobs of `queue` in one cell, as `jobbus status` counts them (exact
    below its cap, an estimate that says so above it: never zero while a job is left)."""
    for status in (await control.queue_status(app)).queues:
        if status.queue == queue:
            return status.available, status.scheduled, status.running
    return Count(0), Count(0), Count(0)


def _described(cell: str | None, counts: tuple[Count, Count, Count]) -> str:
    available, scheduled, running = counts
    return f"cell {cell}: {available} available, {scheduled} scheduled for later, {running} running"

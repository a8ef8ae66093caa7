"""`--cell NAME`: which cells an operator's command acts on (SPEC 23), and the open App of each.

A command over an App with cells acts on every cell, or on those named with `--cell`; a cell it cannot
reach (or whose schema is missing) is named on stderr and sets the exit status, while the command does
its work in the others. Over an App without cells, `--cell` is a usage error and nothing changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from jobbus.app import App
from jobbus.cli import exit_codes
from jobbus.cli.errors import BadDsn, DatabaseUnavailable, UsageProblem, probe_database
from jobbus.cli.output import admin_app, for_operators
from jobbus.errors import DatabaseUnavailableError, SchemaError

F = TypeVar("F", bound=Callable[..., Any])


def cell_option(func: F) -> F:
    """`--cell NAME`, repeatable: the cells the command acts on (default: every cell)."""
    return click.option(
        "--cell",
        "cells",
        multiple=True,
        metavar="NAME",
        help="Act on this cell only (repeatable; default: every cell of JOBBUS_CELLS).",
    )(func)


@dataclass(frozen=True, slots=True)
class CellTarget:
    """One database a command acts on: a cell (`name`) or the App's one database (`name` None). `app` is
    None when it could not be reached; `problem` then says why and `exit_code` what it means."""

    name: str | None
    app: App | None
    problem: str | None = None
    exit_code: int = exit_codes.OK

    @property
    def label(self) -> str:
        return f"cell {self.name}" if self.name is not None else "the database"

    def tagged(self, entry: dict[str, Any]) -> dict[str, Any]:
        """`entry` (a job, queue, worker or unhandled entry of --json) with its `cell`, when there are cells."""
        return entry if self.name is None else {**entry, "cell": self.name}


@contextlib.asynccontextmanager
async def admin_cells(
    dsn: str | None, names: Sequence[str], *, check_schema: bool = True, app: App | None = None
) -> AsyncIterator[list[CellTarget]]:
    """The open targets of a command: the one database (--dsn or JOBBUS_DSN, as `admin_app`), or each cell
    of JOBBUS_CELLS named by `names` (all when empty), in cell order. A cell that is down or has no schema
    is a target without an App, so that the command serves the others and reports it (`unreachable`).
    `app`, when given, is that App already made (its settings read once)."""
    app = App(dsn=dsn) if app is None else app
    if not app.cells:
        if names:
            raise UsageProblem("--cell: no cells are configured (JOBBUS_CELLS, or --dsn names one database)")
        async with admin_app(dsn, check_schema=check_schema, app=app) as single:
            yield [CellTarget(None, single)]
        return
    unknown = [name for name in names if name not in app.cells]
    if unknown:
        raise UsageProblem(f"--cell {unknown[0]!r}: no such cell (the cells are {', '.join(app.cells)})")
    for_operators(app)  # as admin_app: an operator's count is never cut short
    targets: list[CellTarget] = []
    async with app:
        for name in names or list(app.cells):
            targets.append(await _open_cell(name, app.cells[name], check_schema))
        yield targets


async def _open_cell(name: str, cell: App, check_schema: bool) -> CellTarget:
    try:
        await probe_database(cell.dsn, attempts=1)
        if check_schema:
            await cell.check_schema()
    except (DatabaseUnavailable, DatabaseUnavailableError) as exc:
        return CellTarget(name, None, str(exc), exit_codes.UNAVAILABLE)
    except (SchemaError, BadDsn) as exc:
        return CellTarget(name, None, str(exc), exit_codes.CONFIG)
    return CellTarget(name, cell)


def reachable(targets: Sequence[CellTarget]) -> list[tuple[CellTarget, App]]:
    """The targets whose database is open, with their App."""
    return [(target, target.app) for target in targets if target.app is not None]


def report_unreachable(targets: Sequence[CellTarget]) -> int:
    """Name each target the command could not act on (stderr); the exit status they call for (0: none).
    A cell that is down gives 69 and one without its schema 78, as a single database would."""
    code = exit_codes.OK
    for target in targets:
        if target.app is None:
            click.echo(f"jobbus: {target.label}: {target.problem}", err=True)
            code = code if code == exit_codes.UNAVAILABLE else target.exit_code
    return code

"""A cells App for the dashboard's tests (SPEC 23), and the test databases that are its cells.

`cells_app` is the one place that builds it: an App whose `cells` are ordinary single-database Apps,
one per cell, in cell order, opened and closed with it, as `jobbus.App(cells=...)` gives them.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Mapping

import jobbus
from tests.dbserver import fresh_database


class _CellsApp(jobbus.App):
    """An App over cells as the dashboard sees one: `cells` maps each name to the App of that cell."""

    def __init__(self, cells: Mapping[str, str]) -> None:
        super().__init__(dsn=next(iter(cells.values())))
        self._cell_apps = {name: jobbus.App(dsn=dsn) for name, dsn in cells.items()}

    @property
    def cells(self) -> Mapping[str, jobbus.App]:
        return self._cell_apps

    async def open(self, *, timeout: float | None = None) -> None:
        for cell in self._cell_apps.values():
            with contextlib.suppress(jobbus.DatabaseUnavailableError):  # a cell that is down stops only itself
                await cell.open(timeout=timeout)

    async def close(self) -> None:
        for cell in self._cell_apps.values():
            await cell.close()


def cells_app(cells: Mapping[str, str]) -> jobbus.App:
    """An App over `cells` (name → DSN, in cell order)."""
    return _CellsApp(cells)


@contextlib.contextmanager
def cell_databases(admin_dsn: str, template: str, names: list[str]) -> Iterator[dict[str, str]]:
    """A fresh migrated database per cell name, dropped afterwards."""
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(fresh_database(admin_dsn, template)) for name in names}


def unreachable_dsn() -> str:
    """The DSN of a server that is not there: a local port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/nothing"

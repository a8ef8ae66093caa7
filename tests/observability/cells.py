"""A cells App for the dashboard's tests (SPEC 23), and the test databases that are its cells.

`cells_app` is the one place that builds it: `jobbus.App(cells=...)`.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Mapping

import jobbus
from tests.dbserver import fresh_database


def cells_app(cells: Mapping[str, str]) -> jobbus.App:
    """An App over `cells` (name → DSN, in cell order)."""
    return jobbus.App(cells=dict(cells))


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

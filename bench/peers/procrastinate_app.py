# mypy: ignore-errors
"""The procrastinate app of the benchmarks, in its own module as procrastinate's docs advise."""

from __future__ import annotations

import sys
from pathlib import Path

import procrastinate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import harness


def make_app(dsn, on_start=None):
    """An app with one no-op task named `bench.noop`; `on_start(job)` runs when the task starts."""
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name=harness.NOOP, pass_context=True)
    async def noop(context) -> None:
        if on_start is not None:
            on_start(context.job)

    return app, noop

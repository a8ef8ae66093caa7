"""Deliberately wrong `defer` calls: tests/test_tasks.py runs mypy on this file and expects its errors.

Excluded from the suite's own mypy run (pyproject.toml); every other line must type-check.
"""

from __future__ import annotations

import jobbus

app = jobbus.App(dsn="postgresql://localhost/never-connected")


@app.task("orders.confirm")
async def confirm(order_id: int, *, note: str = "") -> None:
    pass


async def produce() -> None:
    await confirm.defer(42, note="fine")
    confirm.defer_sync(42)
    await confirm.defer("42")
    confirm.defer_sync(42, urgent=True)
    await confirm.options(queue="mail").defer(note="x")

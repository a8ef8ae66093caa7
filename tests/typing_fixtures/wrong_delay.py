"""Deliberately wrong `delay` calls: tests/test_celery_verbs.py runs mypy on this file and expects its
errors. Excluded from the suite's own mypy run (pyproject.toml); every other line must type-check.
"""

from __future__ import annotations

from datetime import timedelta

import jobbus

app = jobbus.App(dsn="postgresql://localhost/never-connected")


@app.task("orders.confirm")
async def confirm(order_id: int, *, note: str = "") -> None:
    pass


def produce() -> None:
    confirm.delay(42, note="fine")
    confirm.apply_async((42,), {"note": "fine"}, countdown=timedelta(seconds=5), expires=60, queue="mail")
    confirm.delay("42")
    confirm.delay(42, urgent=True)
    confirm.apply_async((42,), countdown="soon")

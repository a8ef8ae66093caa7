"""Deliberately wrong job, handler and periodic options: tests/test_producer.py runs mypy on this file
and expects an error on each line of `wrong()`. The options are declared once, as TypedDicts, and mypy
still checks every keyword and its type. Excluded from the suite's own mypy run (pyproject.toml).
"""

from __future__ import annotations

from datetime import timedelta

import jobbus

app = jobbus.App(dsn="postgresql://localhost/never-connected")


@app.task("orders.confirm", queue="orders", max_attempts=3, timeout=timedelta(minutes=1))
async def confirm(order_id: int) -> None:
    pass


async def right() -> None:
    await app.schedule("orders.confirm", {"order_id": 1}, queue="orders", available_at=timedelta(minutes=5))
    app.sync.schedule_many("orders.confirm", [{"order_id": 2}], priority=1, expires=60)
    await confirm.options(unique_key="order:3", then=jobbus.JobRequest("orders.ship")).defer(3)
    app.periodic("nightly", type="orders.confirm", cron="0 3 * * *", configuration={"order_id": 4})
    await app.add_periodic("hourly", type="orders.confirm", every=timedelta(hours=1), overlap=True)


async def wrong() -> None:
    await app.schedule("orders.confirm", queu="orders")
    app.sync.schedule("orders.confirm", priority="high")
    await app.schedule_many("orders.confirm", [{}], unique_kye="k")
    await confirm.options(queu="orders").defer(1)
    app.periodic("hourly", type="orders.confirm", evry=3600)
    await app.add_periodic("hourly", type="orders.confirm", every="1h")
    app.job("orders.cancel", retries=3)
    app.task("orders.refund", priority="low")

"""What the bus tests share: a message, a bus that knows it, and ways to run a worker and read the jobs."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import jobbus
from jobbus.bus import MessageBus


@dataclass(frozen=True)
class OrderPlaced:
    order_id: int
    total: Decimal


def order_bus(app: jobbus.App) -> MessageBus:
    bus = MessageBus(app)
    bus.message("order.placed")(OrderPlaced)
    return bus


async def run_worker(app: jobbus.App, *, concurrency: int = 4) -> None:
    """Run the app's worker in this process until no job is available."""
    code = await app.run_worker(stop_when_empty=True, concurrency=concurrency, install_signal_handlers=False)
    assert code == 0


async def execute(app: jobbus.App, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    async with app.pool.connection() as conn:
        cursor = await conn.execute(query, params)
        return await cursor.fetchall() if cursor.description else []


async def bus_jobs(app: jobbus.App) -> list[jobbus.Job]:
    """Every job of the test's database: all of them are bus jobs here."""
    return await app.list_jobs()

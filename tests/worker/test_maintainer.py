"""The maintainer: each maintenance service in its own loop while the worker leads; one failing
service never stops the others, and closing stops them all (the election then starts them again)."""

from __future__ import annotations

import asyncio
from typing import TypeVar

import jobbus
from jobbus.store import MaintenanceStore, Statement, run_async
from jobbus.worker.services.maintainer import Maintainer
from jobbus.worker.services.queue_stats import QueueSampler
from tests.processes import eventually, query

T = TypeVar("T")


class _Broken:
    """A service with a bug: every round raises (not a database error, so not retried at once)."""

    name = "broken"
    interval = 0.05

    def __init__(self) -> None:
        self.rounds = 0

    async def run_once(self) -> None:
        self.rounds += 1
        raise RuntimeError("a bug in this service")


def _samples(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM jobbus.queue_stat WHERE queue = 'mail'")[0][0])


async def test_a_failing_service_never_stops_the_others_and_closing_stops_them_all(app: jobbus.App, dsn: str) -> None:
    async def run(statement: Statement[T]) -> T:
        async with app.pool.connection() as conn:
            return await run_async(conn, statement)

    await app.schedule("mail.send", queue="mail")
    broken = _Broken()
    sampler = QueueSampler(maintenance=MaintenanceStore(app.settings.schema), run=run, interval=0.05)
    maintainer = Maintainer([broken, sampler])
    await _runs_then_stops(maintainer, broken, dsn)
    await _runs_then_stops(maintainer, broken, dsn)  # deposed, then elected again


async def _runs_then_stops(maintainer: Maintainer, broken: _Broken, dsn: str) -> None:
    broken.rounds = 0
    enough = _samples(dsn) + 3
    maintainer.start()
    await eventually(lambda: _samples(dsn) >= enough, timeout=10, what="three rounds of the sampler")
    assert broken.rounds == 1  # tried again a minute later, not in a tight loop
    await maintainer.close(1.0)
    stopped = _samples(dsn)
    await asyncio.sleep(0.3)
    assert _samples(dsn) == stopped
